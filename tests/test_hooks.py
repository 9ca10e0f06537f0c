"""mhalab.hooks: named activations inside MultiHeadAttention, read with a cache and changed by hooks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mhalab.attention import MultiHeadAttention
from mhalab.hooks import (
    ablate_heads, attention_modules, gate_heads, hook_points, hooks_attached, run_with_cache, run_with_hooks,
)

D, H = 16, 4


class TwoLayers(nn.Module):
    """The smallest model with the course's names: blocks.{i}.attn."""

    def __init__(self, **options):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Module() for _ in range(2))
        for block in self.blocks:
            block.attn = MultiHeadAttention(D, H, **options)

    def forward(self, x, is_causal=False):
        for block in self.blocks:
            x = x + block.attn(x, is_causal=is_causal)[0]
        return x


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TwoLayers().eval()


def test_names_follow_the_model(model):
    assert list(hook_points(model)) == [
        "blocks.0.attn.pattern", "blocks.0.attn.z", "blocks.1.attn.pattern", "blocks.1.attn.z"
    ]
    assert list(attention_modules(model)) == ["blocks.0.attn", "blocks.1.attn"]


@pytest.mark.parametrize("is_causal", [False, True])
def test_cache_holds_what_need_weights_returns(model, is_causal):
    x = torch.randn(2, 5, D)
    out, cache = run_with_cache(model, x, is_causal=is_causal)
    torch.testing.assert_close(out, model(x, is_causal=is_causal))  # caching changes nothing (explicit path = fused, to rounding)
    attn = model.blocks[0].attn
    _, weights = attn(x, is_causal=is_causal, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(cache["blocks.0.attn.pattern"], weights)
    assert cache["blocks.0.attn.z"].shape == (2, 5, H, D // H)  # [B, L, H, dk]
    if is_causal:
        assert cache["blocks.0.attn.pattern"].triu(1).abs().max() == 0  # no weight on later keys


def test_z_is_the_input_of_w_o(model):
    x = torch.randn(2, 5, D)
    _, cache = run_with_cache(model, x, names="blocks.0.attn.z")
    assert list(cache) == ["blocks.0.attn.z"]
    attn = model.blocks[0].attn
    z = cache["blocks.0.attn.z"]
    torch.testing.assert_close(attn.out_proj(z.flatten(2)), attn(x)[0])


def test_glob_and_predicate_pick_names(model):
    x = torch.randn(1, 3, D)
    assert list(run_with_cache(model, x, names="*.pattern")[1]) == ["blocks.0.attn.pattern", "blocks.1.attn.pattern"]
    assert list(run_with_cache(model, x, names=lambda n: n.startswith("blocks.1"))[1]) == ["blocks.1.attn.pattern", "blocks.1.attn.z"]


def test_unknown_name_is_refused_with_the_names_there_are(model):
    with pytest.raises(KeyError, match="blocks.0.attn.pattern"):
        run_with_cache(model, torch.randn(1, 3, D), names="blocks.0.attention.pattern")


def test_ablating_a_head_equals_removing_its_w_o_slice(model):
    x = torch.randn(2, 5, D)
    ablated = run_with_hooks(model, x, hooks=[("blocks.1.attn.z", ablate_heads([3]))])
    dk = D // H
    with torch.no_grad():
        model.blocks[1].attn.out_proj.weight[:, 3 * dk : 4 * dk] = 0
    torch.testing.assert_close(ablated, model(x))


def test_mean_ablation_writes_the_means(model):
    x = torch.randn(2, 5, D)
    means = torch.randn(H, D // H)
    _, cache = run_with_cache(model, x, names="blocks.0.attn.z", hooks=[("blocks.0.attn.z", ablate_heads([0, 2], means))])
    z = cache["blocks.0.attn.z"]
    assert torch.equal(z[:, :, 0], means[0].expand(2, 5, -1)) and torch.equal(z[:, :, 2], means[2].expand(2, 5, -1))


def test_a_hook_can_replace_the_pattern(model):
    """Uniform attention over the keys: the output is then the mean of the values."""
    x = torch.randn(1, 4, D)
    attn = model.blocks[0].attn
    uniform = lambda pattern, name: torch.full_like(pattern, 1 / pattern.size(-1))  # noqa: E731
    with hooks_attached(attn, [("pattern", uniform)]):
        out, _ = attn(x)
    v = torch.nn.functional.linear(x, *[p.split(D)[2] for p in (attn.qkv_proj.weight, attn.qkv_proj.bias)])
    expected = attn.out_proj(v.mean(dim=1, keepdim=True).expand(-1, 4, -1))
    torch.testing.assert_close(out, expected)


def test_hooks_are_removed_after_an_error(model):
    def broken(activation, name):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_with_hooks(model, torch.randn(1, 3, D), hooks=[("*.z", broken)])
    assert not any(point.active for point in hook_points(model).values())


def test_a_hook_must_keep_the_shape(model):
    with pytest.raises(ValueError, match="returned shape"):
        run_with_hooks(model, torch.randn(1, 3, D), hooks=[("blocks.0.attn.z", lambda z, n: z[:, :1])])


def test_ablating_a_head_that_does_not_exist(model):
    with pytest.raises(IndexError, match="heads 0..3"):
        run_with_hooks(model, torch.randn(1, 3, D), hooks=[("blocks.0.attn.z", ablate_heads([4]))])


def test_without_hooks_the_fused_path_runs(model, monkeypatch):
    """No hook and no need_weights: the explicit path (attention_weights) is never called."""
    import mhalab.attention as attention

    calls = []
    original = attention.attention_weights
    monkeypatch.setattr(attention, "attention_weights", lambda *a, **k: calls.append(1) or original(*a, **k))
    model(torch.randn(1, 3, D))
    assert calls == []
    run_with_cache(model, torch.randn(1, 3, D), names="*.pattern")
    assert len(calls) == 2


def test_gqa_pattern_has_one_map_per_query_head():
    torch.manual_seed(0)
    model = TwoLayers(n_kv_heads=2, rope_base=10000.0).eval()
    _, cache = run_with_cache(model, torch.randn(1, 6, D), is_causal=True)
    assert cache["blocks.0.attn.pattern"].shape == (1, H, 6, 6)
    assert cache["blocks.0.attn.z"].shape == (1, 6, H, D // H)


@pytest.mark.parametrize("need_weights", [False, True])
def test_per_example_gates_switch_a_head_off_in_one_sequence_only(model, need_weights):
    """gate_heads with [B, H]: sequence 0 loses head 0, sequence 1 loses head 3, on either attention path."""
    attn = model.blocks[0].attn
    x = torch.randn(2, 5, D)
    gates = torch.ones(2, H)
    gates[0, 0] = gates[1, 3] = 0.0
    with hooks_attached(attn, [("z", gate_heads(gates))]):
        gated, _ = attn(x, need_weights=need_weights)
    for b, head in ((0, 0), (1, 3)):
        expected = run_with_hooks(attn, x, hooks=[("z", ablate_heads([head]))])[0]
        torch.testing.assert_close(gated[b], expected[b])


def test_gates_scale_heads_and_check_their_shape(model):
    attn = MultiHeadAttention(D, H, bias=False)
    x = torch.randn(2, 3, D)
    doubled = run_with_hooks(attn, x, hooks=[("z", gate_heads(torch.full((H,), 2.0)))])[0]
    torch.testing.assert_close(doubled, 2 * attn(x)[0])
    with pytest.raises(ValueError, match=r"gates for z must be \[n_heads\] = \[4\] or \[batch, n_heads\] = \[2, 4\]"):
        run_with_hooks(attn, x, hooks=[("z", gate_heads(torch.ones(3, H)))])


def test_gate_gradients_reach_the_gates(model):
    """What head importance needs: dL/d gate through the hook, one number per head."""
    gates = torch.ones(H, requires_grad=True)
    out = run_with_hooks(model, torch.randn(2, 5, D), hooks=[("blocks.1.attn.z", gate_heads(gates))])
    (grad,) = torch.autograd.grad(out.square().sum(), gates)
    assert grad.shape == (H,) and (grad != 0).all()


def test_per_position_means(model):
    x = torch.randn(2, 5, D)
    means = torch.randn(5, H, D // H)  # [L, H, dk]
    _, cache = run_with_cache(model, x, names="blocks.0.attn.z", hooks=[("blocks.0.attn.z", ablate_heads([1], means))])
    assert torch.equal(cache["blocks.0.attn.z"][:, :, 1], means[:, 1].expand(2, -1, -1))
    with pytest.raises(ValueError, match="same length"):
        run_with_hooks(model, torch.randn(2, 4, D), hooks=[("blocks.0.attn.z", ablate_heads([1], means))])


def test_pattern_hooks_fire_once_per_attention_call_in_order():
    """What notebook 06 counts: one call per block, in order, each with all of its heads."""
    from mhalab.models import EncoderDecoder, ModelConfig

    torch.manual_seed(0)
    model = EncoderDecoder(ModelConfig(vocab_size=10, d_model=16, n_heads=4, n_layers=2)).eval()
    src, tgt = torch.randint(0, 10, (2, 7)), torch.randint(0, 10, (2, 5))
    calls = []
    with hooks_attached(model, [("*.pattern", lambda pattern, name: calls.append((name, tuple(pattern.shape))))]):
        model(src, tgt)
        assert calls == [
            ("encoder.0.attn.pattern", (2, H, 7, 7)), ("encoder.1.attn.pattern", (2, H, 7, 7)),
            ("decoder.0.self_attn.pattern", (2, H, 5, 5)), ("decoder.0.cross_attn.pattern", (2, H, 5, 7)),
            ("decoder.1.self_attn.pattern", (2, H, 5, 5)), ("decoder.1.cross_attn.pattern", (2, H, 5, 7)),
        ]
        calls.clear()
        model.generate(src[:1], 3, bos_id=0)  # the encoder once, then the decoder once per new token
    assert [name for name, _ in calls[:2]] == ["encoder.0.attn.pattern", "encoder.1.attn.pattern"]
    decoder = calls[2:]
    assert len(decoder) == 3 * 4 and all(shape[2] == 1 for _, shape in decoder)  # one query per step
    assert [shape[3] for name, shape in decoder if name == "decoder.0.self_attn.pattern"] == [1, 2, 3]  # the cache grows
    model(src, tgt)
    assert len(calls) == 14  # the hooks are gone after the with block
