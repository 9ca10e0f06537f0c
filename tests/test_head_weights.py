"""mhalab.head_weights: the weights folded as TransformerLens folds them (a norm's scale into the weights that read
it; after a LayerNorm, those weights centred over d_model), and the unembedding refused where there is no single one."""

import pytest
import torch
from small_models import _toy

from mhalab import circuits as C
from mhalab.head_weights import head_weights


def test_a_layernorms_folded_weights_are_centred_and_rmsnorms_are_not():
    ln, rms = _toy(), _toy(normalization_type="RMS")
    for W in (ln.W_Q, ln.W_K, ln.W_V, ln.W_U):
        assert W.mean(-2).abs().max() < 1e-12  # no component along the all-ones direction a LayerNorm never outputs
    assert rms.W_Q.mean(-2).abs().max() > 1e-3
    raw = head_weights(ln, fold_ln=False)
    scale = ln.blocks[0].ln1.weight.detach()[:, None]
    assert torch.allclose(ln.W_Q[0], raw.W_Q[0] * scale - (raw.W_Q[0] * scale).mean(-2, keepdim=True))
    assert torch.allclose(rms.W_Q[0], head_weights(rms, fold_ln=False).W_Q[0] * rms.blocks[0].ln1.weight[:, None])
    assert torch.equal(head_weights(_toy(normalization_type=None)).W_Q,  # no norm: nothing to fold
                       head_weights(_toy(normalization_type=None), fold_ln=False).W_Q)
    # what folding keeps: the logits, through the norm's normalisation alone
    tokens = torch.randint(0, 13, (2, 10))
    _, cache = ln.run_with_cache(tokens)
    resid = cache.accumulated_resid(apply_ln=True)[-1]
    assert torch.allclose(resid @ ln.W_U + ln.b_U, ln(tokens), atol=1e-12)


def test_a_model_of_several_targets_has_no_single_unembedding():
    """n_targets=2 puts [2 V, D] in the head: reading it as W_U [D, V] would give the wrong columns, so every way to
    W_U refuses, the model's own attribute included; the attention's circuits do not need it."""
    model = _toy(n_targets=2, attn_only=True)
    for read in (lambda: model.W_U, lambda: model.b_U, lambda: head_weights(model),
                 lambda: C.full_ov_circuit(model, 0, 0), lambda: C.logit_lens(model, torch.tensor([[1, 2]]))):
        with pytest.raises(ValueError, match="predicts 2 targets per position"):
            read()
    assert C.QK(model).shape == (3, 4, 16, 16)
