"""mhalab.activation_cache: TransformerLens's ActivationCache reads (stack_activation, accumulated_resid)."""

from __future__ import annotations

import pytest
import torch

from mhalab.models import ModelConfig, Transformer


@pytest.fixture
def run():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_vocab=11, d_model=16, n_heads=4, n_layers=3, causal=True)).eval()
    with torch.no_grad():
        return model.run_with_cache(torch.randint(0, 11, (2, 5)))


def test_stack_activation_stacks_layers(run):
    _, cache = run
    stacked = cache.stack_activation("pattern")
    assert stacked.shape == (3, 2, 4, 5, 5) and torch.equal(stacked[2], cache["pattern", 2])
    assert cache.stack_activation("z", layer=2).shape[0] == 2  # the layers before 2


def test_accumulated_resid_as_transformerlens(run):
    _, cache = run
    resid, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "2_pre", "final_post"] and resid.shape == (4, 2, 5, 16)
    assert torch.equal(resid[-1], cache["resid_post", -1])
    resid, labels = cache.accumulated_resid(layer=1, incl_mid=True, pos_slice=-1, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre"] and resid.shape == (3, 2, 16)
    normed = cache.accumulated_resid(apply_ln=True)  # each component through the final norm's normalisation
    assert torch.allclose(normed.mean(-1), torch.zeros(()), atol=1e-6)
    assert torch.allclose(normed.pow(2).mean(-1), torch.ones(()), atol=1e-3)


def test_a_short_name_mhalab_lacks_is_a_key_error_that_says_so(run):
    _, cache = run
    with pytest.raises(KeyError, match="no hook point 'mid'"):
        cache["mid", 0]
    assert ("mid", 0) not in cache and ("result", 0) not in cache and ("pattern", 0) in cache


def test_to_and_remove_batch_dim(run):
    _, cache = run
    with pytest.raises(ValueError, match="batch of one"):
        cache.remove_batch_dim()
    assert cache.to("cpu")["z", 0].device.type == "cpu"
