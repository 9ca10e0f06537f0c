"""mhalab.circuits against direct D x D (and V x V) computations in float64, on small random models and SmolLM2:
the weights folded as TransformerLens folds them (a norm's scale into the weights that read it; after a LayerNorm,
those weights centred over d_model)."""

import pytest
import torch
from small_models import _direct, _fold, _toy

from mhalab import circuits as C
from mhalab.factored_matrix import FactoredMatrix
from mhalab.head_weights import head_weights


def _unembedding(model):
    """W_U [D, V] folded, and b_U [V] with the final LayerNorm's bias folded in, float64."""
    W_U = model.head.weight.double().T
    return _fold(model.ln_final, W_U).detach(), (model.ln_final.bias.double() @ W_U + model.head.bias).detach()


@pytest.mark.parametrize("mode", "QKV")
def test_composition_scores_against_the_full_product(mode):
    model = _toy(n_key_value_heads=2)
    scores = C.all_composition_scores(model, mode)
    heads = _direct(model)
    for l1, h1, l2, h2 in [(0, 1, 1, 3), (0, 0, 2, 2), (1, 3, 2, 0)]:
        W_Q, W_K, W_V, W_O = heads[l2][h2]
        left = heads[l1][h1][2] @ heads[l1][h1][3]
        right = {"Q": W_Q @ W_K.T, "K": W_K @ W_Q.T, "V": W_V @ W_O}[mode]
        assert torch.allclose(scores[l1, h1, l2, h2], (left @ right).norm() / (left.norm() * right.norm()), atol=1e-12)
    assert (scores[1, :, :2] == 0).all() and (scores[2] == 0).all()  # only from an earlier layer to a later one


def test_random_baseline_is_one_over_root_d_model():
    scores = C.composition_baseline(64, 16, n=400)
    assert abs(float(scores.pow(2).mean()) * 64 - 1) < 0.05  # E[score²] = 1 / d_model for Gaussian factors


def test_full_circuits_and_copying_score():
    model = _toy(positional_embedding_type="standard")
    W_Q, W_K, W_V, W_O = _direct(model)[2][1]
    W_E, W_pos = model.embed.tokens.weight.double().detach(), model.embed.positions.weight.double().detach()
    W_U = _unembedding(model)[0]
    assert torch.allclose(C.full_qk_circuit(model, 2, 1).AB, W_E @ W_Q @ W_K.T @ W_E.T, atol=1e-10)
    assert torch.allclose(C.positional_qk_circuit(model, 2, 1).AB, W_pos @ W_Q @ W_K.T @ W_pos.T, atol=1e-10)
    full = W_E @ W_V @ W_O @ W_U
    assert torch.allclose(C.full_ov_circuit(model, 2, 1).AB, full, atol=1e-10)
    eig = torch.linalg.eigvals(full)
    assert torch.allclose(C.copying_score(C.full_ov_circuit(model, 2, 1)), eig.real.sum() / eig.abs().sum(), atol=1e-10)
    identity = FactoredMatrix(torch.eye(5, 3, dtype=torch.float64), torch.eye(3, 5, dtype=torch.float64) * 2)
    assert float(C.copying_score(identity)) == 1.0  # maps each token to itself: copies
    assert float(C.copying_score(FactoredMatrix(-identity.A, identity.B))) == -1.0  # suppresses


def test_direct_logit_attribution_adds_up_to_the_logit_difference():
    model = _toy()
    tokens = torch.randint(0, 13, (2, 10), generator=torch.Generator().manual_seed(1))
    right, wrong = torch.randint(0, 13, (2, 10)), 4
    dla = C.direct_logit_attribution(model, tokens, right, wrong)  # [N, H, B, T]
    assert dla.shape == (3, 4, 2, 10)
    # The rest of the final residual: embeddings and the attention biases; then b_U, the final LayerNorm's bias in it.
    logits, cache = model.run_with_cache(tokens)
    emb = model.embed.tokens(tokens) + model.embed.positions.weight[:10]
    rest = (emb + sum(b.attn.out_proj.bias for b in model.blocks)).detach()
    W_U, b_U = _unembedding(model)
    direction = W_U.T[right] - W_U.T[wrong]
    rest_dla = (cache.apply_ln_to_stack(rest[None])[0] * direction).sum(-1)
    expected = logits.gather(-1, right[..., None])[..., 0] - logits[..., wrong]
    assert torch.allclose(dla.sum((0, 1)) + rest_dla + b_U[right] - b_U[wrong], expected, atol=1e-9)
    # the same through the cache's own calls, TransformerLens's: every head's result, and the rest
    heads = cache.stack_head_results()  # computed from hook_z, and detached as every cached activation is
    assert not heads.requires_grad and not dla.requires_grad
    stack = torch.cat([heads, rest[None]])
    attributed = cache.logit_attrs(stack, right, torch.full_like(right, wrong)).sum(0)
    assert torch.allclose(attributed + b_U[right] - b_U[wrong], expected, atol=1e-9)


def test_logit_lens_ends_at_the_models_logits():
    model = _toy(attn_only=False)
    tokens = torch.randint(0, 13, (3, 7))
    lens = C.logit_lens(model, tokens)
    assert lens.shape == (4, 3, 7, 13)
    assert torch.allclose(lens[-1], model(tokens), atol=1e-12)
    embedded = model.embed.tokens(tokens) + model.embed.positions.weight[:7]
    assert torch.allclose(lens[0], model.head(model.ln_final(embedded)), atol=1e-12)


def test_bad_input_gets_clear_errors():
    model = _toy()
    with pytest.raises(IndexError, match="layer 3 is out of range"):
        C.full_ov_circuit(model, 3, 0)
    with pytest.raises(IndexError, match="head 4 is out of range"):
        C.full_qk_circuit(model, 0, 4)
    with pytest.raises(ValueError, match="mode must be 'Q', 'K' or 'V'"):
        C.all_composition_scores(model, "O")
    with pytest.raises(ValueError, match="no position table"):
        C.positional_qk_circuit(_toy(positional_embedding_type="rotary"), 0, 0)
    with pytest.raises(TypeError, match="circuits reads a mhalab Transformer"):
        C.QK(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="the same m"):
        FactoredMatrix(torch.ones(4, 2), torch.ones(3, 4))


def test_minilm_has_no_unembedding(minilm):
    with pytest.raises(ValueError, match="no unembedding"):
        C.full_ov_circuit(minilm, 0, 0)
    with pytest.raises(ValueError, match="no unembedding"):
        C.logit_lens(minilm, torch.tensor([[101, 102]]))
    assert C.positional_qk_circuit(minilm, 0, 0).shape == (512, 512)


def test_smollm2_grouped_query_heads(smollm2):
    w = head_weights(smollm2)
    assert w.W_K.shape == (30, 3, 576, 64) and w.W_Q.shape == (30, 9, 576, 64) and w.n_key_value_heads == 3
    qk, ov = C.QK(w), C.OV(w)
    for layer in (0, 17):
        a = smollm2.blocks[layer].attn
        scale = smollm2.blocks[layer].ln1.weight.double()[:, None]  # RMSNorm: folded, not centred
        q, k, v = a.qkv_proj.weight.double().split([9 * 64, 3 * 64, 3 * 64])
        for h in (0, 4, 8):
            g = h // 3  # the K/V head query head h reads
            W_Q, W_K = scale * q[h * 64:(h + 1) * 64].T, scale * k[g * 64:(g + 1) * 64].T
            W_V, W_O = scale * v[g * 64:(g + 1) * 64].T, a.out_proj.weight.double()[:, h * 64:(h + 1) * 64].T
            for fm, full in ((qk[layer, h], W_Q @ W_K.T), (ov[layer, h], W_V @ W_O)):
                fm = FactoredMatrix(fm.A.double(), fm.B.double())
                assert torch.allclose(fm.AB, full, atol=1e-9)
                assert torch.allclose(fm.norm(), full.norm(), rtol=1e-9)
                assert torch.allclose(fm.S, torch.linalg.svdvals(full)[:64], rtol=1e-6, atol=1e-9)
    # K-composition of L16H0 into L17H4 (which reads K/V head 1), against the full product
    left = FactoredMatrix(w.W_V[16, 0].double(), w.W_O[16, 0].double())
    right = FactoredMatrix(w.W_K[17, 4 // 3].double(), w.W_Q[17, 4].double().T)
    full = left.AB @ right.AB
    expected = full.norm() / (left.AB.norm() * right.AB.norm())
    assert torch.allclose(C.composition_scores(left, right), expected, rtol=1e-9)
    assert torch.allclose(smollm2.all_composition_scores("K")[16, 0, 17, 4].double(), expected, rtol=1e-4)
    assert torch.equal(qk.B[17, 3], qk.B[17, 5]) and not torch.equal(qk.B[17, 2], qk.B[17, 3])  # shared K/V head
    tokens = torch.tensor([[0, 504, 3458, 282, 4649]])
    lens = C.logit_lens(smollm2, tokens)
    assert torch.allclose(lens[-1], smollm2(tokens), atol=1e-4)
    dla = C.direct_logit_attribution(smollm2, tokens, tokens)
    assert dla.shape == (30, 9, 1, 5)


def test_the_exercises_references_agree_with_circuits():
    from mhalab import labs

    model = _toy()
    w = head_weights(model)
    copying = labs.exercise("12", 2).reference(w.W_E, w.W_V[1, 2], w.W_O[1, 2], w.W_U)
    assert abs(copying - float(C.copying_score(C.full_ov_circuit(model, 1, 2)))) < 1e-9
    W_QK, rank = labs.exercise("12", 1).reference(model, 2, 3)
    unfolded = C.QK(head_weights(model, fold_ln=False))[2, 3]
    assert torch.allclose(W_QK, unfolded.AB, atol=1e-12) and rank == int(unfolded.rank()) == 4
