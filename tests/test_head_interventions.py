"""mhalab.head_interventions: heads switched off (zero or mean), gated and patched, on a bare two-layer attention
model and a small Transformer, against the same change made by hand."""

from __future__ import annotations

import pytest
import torch
from small_models import D, H, TwoLayers

from mhalab.attention import MultiHeadAttention
from mhalab.head_interventions import ablate_heads, gate_heads, patch_heads
from mhalab.hooks import glob_filter, hooks_attached, run_with_cache, run_with_hooks


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TwoLayers().eval()


# ---------------------------------------------------------------------------- ablating and gating
def test_ablating_a_head_equals_removing_its_w_o_slice(model):
    x = torch.randn(2, 5, D)
    ablated = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_z", ablate_heads([3]))])
    dk = D // H
    with torch.no_grad():
        model.blocks[1].attn.out_proj.weight[:, 3 * dk : 4 * dk] = 0
    torch.testing.assert_close(ablated, model(x))


def test_mean_ablation_writes_the_means(model):
    x = torch.randn(2, 5, D)
    means = torch.randn(H, D // H)
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", ablate_heads([0, 2], means))]):
        _, cache = model.run_with_cache(x, names_filter="blocks.0.attn.hook_z")
    z = cache["blocks.0.attn.hook_z"]
    assert torch.equal(z[:, :, 0], means[0].expand(2, 5, -1)) and torch.equal(z[:, :, 2], means[2].expand(2, 5, -1))


def test_ablating_a_head_that_does_not_exist(model):
    with pytest.raises(IndexError, match="heads 0..3"):
        model.run_with_hooks(torch.randn(1, 3, D), fwd_hooks=[("blocks.0.attn.hook_z", ablate_heads([4]))])


@pytest.mark.parametrize("need_weights", [False, True])
def test_per_example_gates_switch_a_head_off_in_one_sequence_only(model, need_weights):
    """gate_heads with [B, H]: sequence 0 loses head 0, sequence 1 loses head 3, on either attention path."""
    attn = model.blocks[0].attn
    x = torch.randn(2, 5, D)
    gates = torch.ones(2, H)
    gates[0, 0] = gates[1, 3] = 0.0
    with hooks_attached(attn, [("hook_z", gate_heads(gates))]):
        gated, _ = attn(x, need_weights=need_weights)
    for b, head in ((0, 0), (1, 3)):
        expected = run_with_hooks(attn, x, fwd_hooks=[("hook_z", ablate_heads([head]))])[0]
        torch.testing.assert_close(gated[b], expected[b])


def test_gates_scale_heads_and_check_their_shape(model):
    attn = MultiHeadAttention(D, H, bias=False)
    x = torch.randn(2, 3, D)
    doubled = run_with_hooks(attn, x, fwd_hooks=[("hook_z", gate_heads(torch.full((H,), 2.0)))])[0]
    torch.testing.assert_close(doubled, 2 * attn(x)[0])
    with pytest.raises(ValueError,
                       match=r"gates for hook_z must be \[n_heads\] = \[4\] or \[batch, n_heads\] = \[2, 4\]"):
        run_with_hooks(attn, x, fwd_hooks=[("hook_z", gate_heads(torch.ones(3, H)))])


def test_gate_gradients_reach_the_gates(model):
    """What head importance needs: dL/d gate through the hook, one number per head."""
    gates = torch.ones(H, requires_grad=True)
    out = model.run_with_hooks(torch.randn(2, 5, D), fwd_hooks=[("blocks.1.attn.hook_z", gate_heads(gates))])
    (grad,) = torch.autograd.grad(out.square().sum(), gates)
    assert grad.shape == (H,) and (grad != 0).all()


def test_per_position_means(model):
    x = torch.randn(2, 5, D)
    means = torch.randn(5, H, D // H)  # [L, H, dk]
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", ablate_heads([1], means))]):
        _, cache = model.run_with_cache(x, names_filter="blocks.0.attn.hook_z")
    assert torch.equal(cache["blocks.0.attn.hook_z"][:, :, 1], means[:, 1].expand(2, -1, -1))
    with pytest.raises(ValueError, match="same length"):
        model.run_with_hooks(torch.randn(2, 4, D), fwd_hooks=[("blocks.0.attn.hook_z", ablate_heads([1], means))])


# ---------------------------------------------------------------------------- patching
def test_patching_one_heads_keys_changes_the_pattern_of_that_head_only(toy):
    """The field's basic experiment: copy head 2's keys in layer 1 from a clean run into a corrupted one."""
    clean, corrupted = torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8))
    _, clean_cache = toy.run_with_cache(clean)
    _, corrupt_cache = toy.run_with_cache(corrupted, names_filter=glob_filter("*.hook_pattern"))
    with toy.hooks(fwd_hooks=[("blocks.1.attn.hook_k", patch_heads(clean_cache, [2]))]):
        _, patched = toy.run_with_cache(corrupted, names_filter=glob_filter("*.hook_pattern"))
    before, after = corrupt_cache["pattern", 1], patched["pattern", 1]
    for head in range(H):
        changed = (after[:, head] - before[:, head]).abs().max().item()
        assert (changed > 1e-3) if head == 2 else (changed == 0.0), f"head {head} changed by {changed:.3g}"
    assert torch.equal(patched["pattern", 0], corrupt_cache["pattern", 0])  # an earlier layer: untouched


def test_patching_z_copies_the_clean_heads_and_only_them(toy):
    clean, corrupted = torch.randint(0, 11, (2, 8)), torch.randint(0, 11, (2, 8))
    _, clean_cache = toy.run_with_cache(clean, names_filter=glob_filter("*.hook_z"))
    _, corrupt_cache = toy.run_with_cache(corrupted, names_filter=glob_filter("*.hook_z"))
    with toy.hooks(fwd_hooks=[("blocks.1.attn.hook_z", patch_heads(clean_cache, [0, 3]))]):
        _, patched = toy.run_with_cache(corrupted, names_filter=glob_filter("*.hook_z"))
    z = patched["z", 1]
    assert torch.equal(z[:, :, [0, 3]], clean_cache["z", 1][:, :, [0, 3]])
    assert torch.equal(z[:, :, [1, 2]], corrupt_cache["z", 1][:, :, [1, 2]])
    assert not torch.equal(z, corrupt_cache["z", 1])


def test_patch_heads_on_a_pattern_tensor_and_its_errors():
    attn = MultiHeadAttention(D, H, n_key_value_heads=2).eval()
    x, y = torch.randn(1, 4, D), torch.randn(1, 4, D)
    _, clean = run_with_cache(attn, x, names_filter=["hook_pattern", "hook_k"])
    with hooks_attached(attn, [("hook_pattern", patch_heads(clean["hook_pattern"], [1]))]):
        _, patched = run_with_cache(attn, y, names_filter="hook_pattern")
    assert torch.equal(patched["hook_pattern"][:, 1], clean["hook_pattern"][:, 1])
    # GQA: hook_k has 2 K/V heads; K/V head 1 serves query heads 2 and 3.
    _, plain = run_with_cache(attn, y, names_filter="hook_pattern")
    with hooks_attached(attn, [("hook_k", patch_heads(clean, [1]))]):
        _, patched = run_with_cache(attn, y, names_filter="hook_pattern")
    changed = (patched["hook_pattern"] - plain["hook_pattern"]).abs().amax(dim=(0, 2, 3))
    assert changed[:2].max() == 0 and changed[2:].min() > 1e-4
    with pytest.raises(IndexError, match="hook_k has heads 0..1"):
        run_with_hooks(attn, y, fwd_hooks=[("hook_k", patch_heads(clean, [2]))])
    with pytest.raises(ValueError, match="same shape"):
        run_with_hooks(attn, torch.randn(1, 5, D), fwd_hooks=[("hook_k", patch_heads(clean, [0]))])
