"""mhalab.attention against torch.nn.MultiheadAttention, its own two paths, the KV cache and bad input.

Every equivalence test copies the weights of a real ``torch.nn.MultiheadAttention`` into ours
(``from_torch``) and demands a max abs difference <= 1e-5 in float32. The ``device`` fixture runs
the same tests on CUDA (marked ``gpu``; tests/conftest.py skips them where there is no GPU).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from small_models import TOL, assert_close, max_diff, pair, rand
from torch import nn

from mhalab.arguments import valid_head_counts, validate_head_count
from mhalab.attention import HeadProjections, MultiHeadAttention
from mhalab.counting import count_parameters
from mhalab.kv_cache import KVCache
from mhalab.masks import causal_allowed_mask, causal_forbidden_mask
from mhalab.torch_interop import from_torch, to_torch

B, L, S, D, H = 2, 5, 7, 16, 4  # batch, query length, key length, d_model, heads (small: fast)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return torch.device(request.param)


def forbidden_causal(L_, S_=None, device="cpu"):
    """torch.nn.MultiheadAttention's causal bool mask: True where attention is forbidden."""
    return causal_forbidden_mask(L_, S_, device=device)


# --------------------------------------------------------------- basic maths
def test_causal_masks_are_bottom_right_aligned():
    assert torch.equal(causal_allowed_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    # 2 new queries after 3 cached keys: they sit at positions 3 and 4
    assert torch.equal(causal_allowed_mask(2, 5), torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))
    assert torch.equal(causal_forbidden_mask(2, 5), ~causal_allowed_mask(2, 5))


def test_valid_head_counts():
    assert valid_head_counts(12) == [1, 2, 3, 4, 6, 12]
    assert valid_head_counts(512)[-4:] == [64, 128, 256, 512]
    assert validate_head_count(512, 8) == 64


# ------------------------------------------------- equivalence with torch
class TestMatchesTorch:
    @pytest.mark.parametrize("bias", [True, False])
    @pytest.mark.parametrize("need_weights", [True, False])
    def test_self_attention(self, device, bias, need_weights):
        theirs, ours = pair(bias=bias, device=device)
        x = rand(B, L, D, device=device)
        out, w = ours(x, need_weights=need_weights)
        ref, ref_w = theirs(x, x, x, need_weights=need_weights)
        assert_close(out, ref)
        if need_weights:
            assert_close(w, ref_w, what="averaged weights")
        else:
            assert w is None and ref_w is None

    @pytest.mark.parametrize("bias", [True, False])
    @pytest.mark.parametrize("need_weights", [True, False])
    def test_cross_attention_with_another_key_length(self, device, bias, need_weights):
        theirs, ours = pair(bias=bias, device=device)
        q, k, v = rand(B, L, D, device=device), rand(B, S, D, device=device), rand(B, S, D, device=device)
        out, w = ours(q, k, v, need_weights=need_weights)
        ref, ref_w = theirs(q, k, v, need_weights=need_weights)
        assert out.shape == (B, L, D)
        assert_close(out, ref)
        if need_weights:
            assert w.shape == (B, L, S)
            assert_close(w, ref_w, what="weights")

    @pytest.mark.parametrize("need_weights", [True, False])
    def test_causal(self, device, need_weights):
        theirs, ours = pair(device=device)
        x = rand(B, L, D, device=device)
        forbidden = forbidden_causal(L, device=device)
        # torch needs the mask itself alongside is_causal (is_causal is only a hint there)
        ref, ref_w = theirs(x, x, x, attn_mask=forbidden, is_causal=True, need_weights=need_weights)
        for kwargs in ({"is_causal": True}, {"attn_mask": forbidden}, {"attn_mask": forbidden, "is_causal": True}):
            out, w = ours(x, need_weights=need_weights, **kwargs)
            assert_close(out, ref, what=f"output with {sorted(kwargs)}")
            if need_weights:
                assert_close(w, ref_w, what=f"weights with {sorted(kwargs)}")
                assert (w[:, ~causal_allowed_mask(L, device=device)] == 0).all(), "a query attended to a later key"

    @pytest.mark.parametrize("kind", ["bool", "float"])
    @pytest.mark.parametrize("need_weights", [True, False])
    def test_key_padding(self, device, kind, need_weights):
        theirs, ours = pair(device=device)
        q, kv = rand(B, L, D, device=device), rand(B, S, D, device=device)
        ignore = torch.zeros(B, S, dtype=torch.bool, device=device)
        ignore[0, -2:] = True  # the first sequence is 2 keys shorter
        ignore[1, -4:] = True
        mask = ignore if kind == "bool" else torch.zeros(B, S, device=device).masked_fill(ignore, -1e9)
        out, w = ours(q, kv, kv, key_padding_mask=mask, need_weights=need_weights)
        ref, ref_w = theirs(q, kv, kv, key_padding_mask=mask, need_weights=need_weights)
        assert_close(out, ref)
        if need_weights:
            assert_close(w, ref_w, what="weights")
            assert (w[ignore[:, None, :].expand(B, L, S)] == 0).all(), "a padded key got weight"

    @pytest.mark.parametrize("need_weights", [True, False])
    def test_float_additive_attn_mask(self, device, need_weights):
        theirs, ours = pair(device=device)
        q, kv = rand(B, L, D, device=device), rand(B, S, D, device=device)
        additive = rand(L, S, device=device)
        out, w = ours(q, kv, kv, attn_mask=additive, need_weights=need_weights)
        ref, ref_w = theirs(q, kv, kv, attn_mask=additive, need_weights=need_weights)
        assert_close(out, ref)
        if need_weights:
            assert_close(w, ref_w, what="weights")

    @pytest.mark.parametrize("kind", ["bool", "float"])
    @pytest.mark.parametrize("need_weights", [True, False])
    def test_per_head_3d_mask(self, device, kind, need_weights):
        theirs, ours = pair(device=device)
        q, kv = rand(B, L, D, device=device), rand(B, S, D, device=device)
        if kind == "bool":
            mask = torch.rand(B * H, L, S, device=device) > 0.6  # True = forbidden
            mask[..., 0] = False  # every query keeps at least one key
        else:
            mask = rand(B * H, L, S, device=device)
        out, w = ours(q, kv, kv, attn_mask=mask, need_weights=need_weights, average_attn_weights=False)
        ref, ref_w = theirs(q, kv, kv, attn_mask=mask, need_weights=need_weights, average_attn_weights=False)
        assert_close(out, ref)
        if need_weights:
            assert_close(w, ref_w, what="per-head weights")
        # [B, H, L, S] is the same mask in our layout: batch-major, as torch lays out B * H
        out4, _ = ours(q, kv, kv, attn_mask=mask.view(B, H, L, S), need_weights=need_weights)
        assert_close(out4, ref, what="output with a 4-D mask")

    def test_key_padding_and_attn_mask_together(self, device):
        theirs, ours = pair(device=device)
        x = rand(B, S, D, device=device)
        ignore = torch.zeros(B, S, dtype=torch.bool, device=device)
        ignore[1, -3:] = True
        forbidden = forbidden_causal(S, device=device)
        ref, ref_w = theirs(x, x, x, key_padding_mask=ignore, attn_mask=forbidden, need_weights=True)
        for need_weights in (True, False):
            out, w = ours(x, key_padding_mask=ignore, attn_mask=forbidden, need_weights=need_weights)
            assert_close(out, ref, what=f"output (need_weights={need_weights})")
        out, w = ours(x, key_padding_mask=ignore, is_causal=True, need_weights=True)
        assert_close(out, ref)
        assert_close(w, ref_w, what="weights")

    @pytest.mark.parametrize("bias", [True, False])
    def test_per_head_weights(self, device, bias):
        theirs, ours = pair(bias=bias, device=device)
        x = rand(B, L, D, device=device)
        out, w = ours(x, need_weights=True, average_attn_weights=False)
        ref, ref_w = theirs(x, x, x, need_weights=True, average_attn_weights=False)
        assert w.shape == (B, H, L, L)  # [batch, head, query, key]
        assert_close(out, ref)
        assert_close(w, ref_w, what="per-head weights")
        assert_close(w.sum(-1), torch.ones(B, H, L, device=device), what="row sums")
        _, averaged = ours(x, need_weights=True)
        assert_close(averaged, w.mean(1), what="averaged weights")

    def test_dropout_is_inert_in_eval_mode(self, device):
        theirs, ours = pair(dropout=0.5, device=device)
        x = rand(B, L, D, device=device)
        ref, _ = theirs(x, x, x, need_weights=False)
        for need_weights in (True, False):
            out, _ = ours(x, need_weights=need_weights)
            assert_close(out, ref, what=f"eval output (need_weights={need_weights})")
        ours.train()  # ...and really active in training mode, or the test above proves nothing
        assert max_diff(ours(x)[0], ref) > 1e-3, "dropout=0.5 changed nothing in training mode"

    def test_gradients_match_torch_and_reach_every_projection(self, device):
        theirs, ours = pair(device=device)
        theirs.train(), ours.train()
        x = rand(B, L, D, device=device)
        target = rand(B, L, D, device=device)
        theirs_out, _ = theirs(x, x, x, need_weights=False)
        (theirs_out * target).sum().backward()
        expected = {
            "qkv_proj.weight": theirs.in_proj_weight.grad,
            "qkv_proj.bias": theirs.in_proj_bias.grad,
            "out_proj.weight": theirs.out_proj.weight.grad,
            "out_proj.bias": theirs.out_proj.bias.grad,
        }
        for need_weights in (True, False):
            ours.zero_grad(set_to_none=True)
            out, _ = ours(x, need_weights=need_weights)
            (out * target).sum().backward()
            for name, p in ours.named_parameters():
                assert p.grad is not None, f"no gradient reached {name} (need_weights={need_weights})"
                assert_close(p.grad, expected[name], tol=1e-4, what=f"grad of {name} (need_weights={need_weights})")
                # every head's slice of W_Q, W_K, W_V gets a gradient (no head is cut off)
                if name == "qkv_proj.weight":
                    per_head = p.grad.view(3, H, D // H, D).abs().sum(dim=(2, 3))  # [Q/K/V, head]
                    assert (per_head > 0).all(), f"some projection of some head got no gradient: {per_head}"


# ------------------------------------------- a drop-in for torch.nn.MultiheadAttention
class TestDropIn:
    """The same call as torch's module gives the same answer: defaults, positions, masks, dropout, layout."""

    def test_the_defaults_are_torchs(self):
        import inspect

        ours = inspect.signature(MultiHeadAttention.forward).parameters
        theirs = inspect.signature(nn.MultiheadAttention.forward).parameters
        for name, p in theirs.items():
            if name in ("key", "value"):  # required in torch; ours may omit both for self-attention
                assert ours[name].default is None
                continue
            assert name in ours and ours[name].default == p.default, f"{name}: ours {ours[name]}, torch {p}"
            assert ours[name].kind is p.kind, (
                f"{name} is {ours[name].kind.description} in ours, {p.kind.description} in torch's")
        assert list(ours)[: len(theirs)] == list(theirs), "the positional order differs from torch's"

    def test_the_constructor_takes_torchs_first_arguments_in_order(self):
        """MultiheadAttention(embed_dim, num_heads, dropout, bias) by position, and device=/dtype=; dropout
        and bias used to be keyword-only, so torch's MultiheadAttention(16, 4, 0.1, False) was a TypeError."""
        import inspect

        ours = list(inspect.signature(MultiHeadAttention.__init__).parameters.values())[1:5]
        theirs = list(inspect.signature(nn.MultiheadAttention.__init__).parameters.values())[3:5]
        assert [p.default for p in ours[2:]] == [p.default for p in theirs] and all(
            p.kind is p.POSITIONAL_OR_KEYWORD for p in ours)
        m = MultiHeadAttention(D, H, 0.1, False, dtype=torch.float64)
        assert (m.dropout, m.bias, m.qkv_proj.weight.dtype) == (0.1, False, torch.float64)
        with pytest.raises(TypeError):
            MultiHeadAttention(D, H, 0.1, False, False)  # torch's add_bias_kv: not supported, not silently taken

    def test_default_call_returns_averaged_weights_as_torch(self):
        theirs, ours = pair()
        x = rand(B, L, D)
        (out, w), (ref, ref_w) = ours(x, x, x), theirs(x, x, x)
        assert w is not None and w.shape == ref_w.shape == (B, L, L)
        assert_close(out, ref)
        assert_close(w, ref_w, what="weights")
        assert_close(ours(x)[0], ref, what="self-attention with key and value omitted")

    def test_every_argument_by_position(self):
        theirs, ours = pair()
        q, kv = rand(B, L, D), rand(B, S, D)
        padding = torch.zeros(B, S, dtype=torch.bool)
        padding[1, -2:] = True
        forbidden = torch.rand(L, S) > 0.7
        forbidden[:, 0] = False
        for args in [(padding,), (padding, False), (None, True, forbidden), (padding, True, forbidden, False),
                     (None, True, None, True, False)]:
            out, w = ours(q, kv, kv, *args)
            ref, ref_w = theirs(q, kv, kv, *args)
            assert_close(out, ref, what=f"output for positional {len(args)} extra arguments")
            assert (w is None) == (ref_w is None) and (w is None or w.shape == ref_w.shape)
            if w is not None:
                assert_close(w, ref_w, what=f"weights for positional {len(args)} extra arguments")

    @pytest.mark.parametrize("need_weights", [True, False])
    @pytest.mark.parametrize("mask", ["key_padding bool", "key_padding float", "attn bool", "attn float",
                                      "attn 3-D bool", "causal"])
    def test_each_mask_kind(self, mask, need_weights):
        theirs, ours = pair()
        x = rand(B, L, D)
        padding = torch.zeros(B, L, dtype=torch.bool)
        padding[0, -1] = True
        forbidden = torch.rand(B * H, L, L) > 0.6
        forbidden[..., 0] = False
        kwargs = {
            "key_padding bool": dict(key_padding_mask=padding),
            "key_padding float": dict(key_padding_mask=torch.zeros(B, L).masked_fill(padding, float("-inf"))),
            "attn bool": dict(attn_mask=forbidden[0]),
            "attn float": dict(attn_mask=rand(L, L)),
            "attn 3-D bool": dict(attn_mask=forbidden),
            "causal": dict(attn_mask=forbidden_causal(L), is_causal=True),  # torch needs the mask beside the hint
        }[mask]
        out, w = ours(x, x, x, need_weights=need_weights, **kwargs)
        ref, ref_w = theirs(x, x, x, need_weights=need_weights, **kwargs)
        assert_close(out, ref)
        if need_weights:
            assert_close(w, ref_w, what="weights")

    @pytest.mark.parametrize("need_weights", [True, False])
    def test_dropout_in_training_mode_draws_as_torch_does(self, need_weights):
        """Same seed, same dropout mask: torch drops the weights [B*H, L, S] in the same order as ours
        [B, H, L, S], and returns them after dropout; with need_weights=False both hand dropout to the kernel."""
        theirs, ours = pair(dropout=0.4)
        theirs.train(), ours.train()
        x = rand(B, L, D)
        torch.manual_seed(3)
        ref, ref_w = theirs(x, x, x, need_weights=need_weights, average_attn_weights=False)
        torch.manual_seed(3)
        out, w = ours(x, x, x, need_weights=need_weights, average_attn_weights=False)
        assert_close(out, ref, what="training-mode output")
        if need_weights:
            assert_close(w, ref_w, what="weights after dropout")
            assert (w == 0).float().mean() > 0.2, "the weights returned are not the dropped-out ones"
            assert not torch.allclose(w.sum(-1), torch.ones(B, H, L)), "rows of dropped-out weights do not sum to 1"

    def test_sequence_first_from_torch(self):
        """batch_first=False: [T, B, D] in and out, weights still [B, L, S], as torch."""
        theirs = nn.MultiheadAttention(D, H).eval()  # torch's default: sequence first
        ours = from_torch(theirs).eval()
        assert not ours.batch_first and "batch_first=False" in repr(ours)
        q, kv = rand(L, B, D), rand(S, B, D)
        padding = torch.zeros(B, S, dtype=torch.bool)
        padding[1, -3:] = True
        for args in [(q, kv, kv), (q, kv, kv, padding)]:
            (out, w), (ref, ref_w) = ours(*args), theirs(*args)
            assert out.shape == (L, B, D) and w.shape == (B, L, S)
            assert_close(out, ref)
            assert_close(w, ref_w, what="weights")
        x = rand(L, B, D)
        assert_close(ours(x, is_causal=True, need_weights=False)[0],
                     theirs(x, x, x, attn_mask=forbidden_causal(L), is_causal=True)[0], what="causal, sequence first")
        assert to_torch(ours).batch_first is False
        with pytest.raises(ValueError, match=r"\[seq, batch, d_model\] \(batch_first=False\).*unsqueeze\(1\)"):
            ours(rand(L, D))


# ---------------------------------------------------- our two paths agree
class TestPathsAgree:
    def test_every_option(self, device):
        _, ours = pair(device=device)
        q, kv = rand(B, L, D, device=device), rand(B, S, D, device=device)
        ignore = torch.zeros(B, S, dtype=torch.bool, device=device)
        ignore[0, -1] = True
        cases = [
            dict(),
            dict(key_padding_mask=ignore),
            dict(attn_mask=rand(L, S, device=device)),
            dict(attn_mask=rand(B * H, L, S, device=device), key_padding_mask=ignore),
            dict(is_causal=True),
        ]
        for kwargs in cases:
            out_fast, none = ours(q, kv, kv, need_weights=False, **kwargs)
            out_slow, w = ours(q, kv, kv, need_weights=True, **kwargs)
            assert none is None and w.shape == (B, L, S)
            assert_close(out_fast, out_slow, what=f"paths with {sorted(kwargs)}")

    def test_self_attention_causal(self, device):
        _, ours = pair(device=device)
        x = rand(B, L, D, device=device)
        assert_close(ours(x, is_causal=True, need_weights=False)[0], ours(x, is_causal=True, need_weights=True)[0])


# ------------------------------------------------------------- KV cache
class TestKVCache:
    @pytest.mark.parametrize("need_weights", [True, False])
    def test_token_by_token_equals_full_causal_forward(self, device, need_weights):
        _, ours = pair(device=device)
        T = 6
        x = rand(B, T, D, device=device)
        full, _ = ours(x, is_causal=True)
        cache = KVCache()
        steps = []
        for t in range(T):
            out, _ = ours(x[:, t : t + 1], kv_cache=cache, is_causal=True, need_weights=need_weights)
            steps.append(out)
            assert len(cache) == t + 1
        assert_close(torch.cat(steps, dim=1), full, what="decoded tokens")
        assert cache.values_per_token == 2 * D
        assert cache.bytes_per_token == 2 * D * 4  # float32
        assert cache.k.shape == (B, H, T, D // H)

    def test_one_token_needs_no_is_causal(self, device):
        _, ours = pair(device=device)
        x = rand(B, 4, D, device=device)
        full, _ = ours(x, is_causal=True)
        cache = KVCache()
        steps = [ours(x[:, t : t + 1], kv_cache=cache)[0] for t in range(4)]
        assert_close(torch.cat(steps, dim=1), full)

    @pytest.mark.parametrize("need_weights", [True, False])
    def test_chunks_equal_full_causal_forward(self, device, need_weights):
        _, ours = pair(device=device)
        sizes = [3, 1, 4, 2]
        x = rand(B, sum(sizes), D, device=device)
        full, _ = ours(x, is_causal=True)
        cache = KVCache()
        chunks = [ours(part, kv_cache=cache, is_causal=True, need_weights=need_weights)[0]
                  for part in x.split(sizes, dim=1)]
        assert_close(torch.cat(chunks, dim=1), full, what="decoded chunks")
        assert len(cache) == sum(sizes) and cache.values_per_token == 2 * D

    @pytest.mark.parametrize("n_heads", [1, 2, 8, 16])
    def test_size_per_token_is_2_d_model_whatever_the_heads(self, n_heads):
        m = MultiHeadAttention(D, n_heads).eval()
        cache = KVCache()
        m(rand(3, 2, D), kv_cache=cache, is_causal=True)
        assert cache.values_per_token == 2 * D
        assert len(cache) == 2

    def test_reset_and_misuse(self):
        _, ours = pair()
        cache = KVCache()
        with pytest.raises(ValueError, match="empty"):
            cache.values_per_token
        ours(rand(B, 2, D), kv_cache=cache, is_causal=True)
        with pytest.raises(ValueError, match="is_causal=True"):
            ours(rand(B, 2, D), kv_cache=cache)  # two new tokens without causality
        with pytest.raises(ValueError, match="batch, heads and d_head must match"):
            ours(rand(B + 1, 1, D), kv_cache=cache)
        with pytest.raises(ValueError, match=f"cross-attention kv_cache holds the keys of a memory "
                                             f".batch {B}, length 2.*key is .batch {B}, length {S}.*fresh KVCache"):
            ours(rand(B, 1, D), rand(B, S, D), rand(B, S, D), kv_cache=cache)  # this cache holds 2 positions, not S
        with pytest.raises(ValueError, match="attn_mask must have shape"):
            ours(rand(B, 1, D), kv_cache=cache, attn_mask=torch.zeros(1, 1))  # S is 3 here, not 1
        assert len(cache) == 2, "a refused call must leave the cache as it was"


# ----------------------------------------------------------------- heads
class TestHeads:
    def test_head_projections_are_views(self):
        _, ours = pair()
        dk = D // H
        for i in range(H):
            p = ours.head_projections(i)
            assert isinstance(p, HeadProjections)
            assert p.W_Q.shape == p.W_K.shape == p.W_V.shape == (D, dk) and p.W_O.shape == (dk, D)
            assert p.b_Q.shape == p.b_K.shape == p.b_V.shape == (dk,)
            owners = {"W_Q": ours.qkv_proj.weight, "W_K": ours.qkv_proj.weight, "W_V": ours.qkv_proj.weight,
                      "W_O": ours.out_proj.weight, "b_Q": ours.qkv_proj.bias, "b_K": ours.qkv_proj.bias,
                      "b_V": ours.qkv_proj.bias}
            for name, owner in owners.items():
                view = getattr(p, name)
                assert view._base is owner, f"{name} of head {i} is not a view of the module's parameter"
                assert view.untyped_storage().data_ptr() == owner.untyped_storage().data_ptr(), name
        assert MultiHeadAttention(D, H, bias=False).head_projections(0).b_Q is None

    def test_writing_a_view_changes_the_module(self):
        _, ours = pair()
        dk, i = D // H, 2
        p = ours.head_projections(i)
        with torch.no_grad():
            p.W_Q.fill_(1.0)
            p.W_V.fill_(2.0)
            p.W_O.fill_(3.0)
            p.b_K.fill_(4.0)
        w = ours.qkv_proj.weight
        assert (w[i * dk : (i + 1) * dk] == 1).all()  # head i's rows of W_Q
        assert (w[2 * D + i * dk : 2 * D + (i + 1) * dk] == 2).all()  # ... of W_V
        assert (ours.out_proj.weight[:, i * dk : (i + 1) * dk] == 3).all()  # head i's columns of W_O
        assert (ours.qkv_proj.bias[D + i * dk : D + (i + 1) * dk] == 4).all()
        assert (w[:dk] != 1).any(), "head 0 changed too"

    @pytest.mark.parametrize("bias", [True, False])
    def test_rebuilding_attention_from_the_head_views(self, bias):
        _, ours = pair(bias=bias)
        q_in, kv = rand(B, L, D), rand(B, S, D)
        expected, _ = ours(q_in, kv, kv)
        out = ours.out_proj.bias.clone() if bias else torch.zeros(D)
        for i in range(H):
            p = ours.head_projections(i)
            q, k, v = q_in @ p.W_Q, kv @ p.W_K, kv @ p.W_V  # [B, L or S, dk]
            if bias:
                q, k, v = q + p.b_Q, k + p.b_K, v + p.b_V
            weights = (q @ k.transpose(-2, -1) / math.sqrt(D // H)).softmax(-1)  # [B, L, S]
            out = out + (weights @ v) @ p.W_O  # each head writes its own share of the output
        assert_close(out, expected, what="attention rebuilt head by head")

    def test_head_index_out_of_range(self):
        with pytest.raises(IndexError, match=r"heads 0\.\.3"):
            MultiHeadAttention(D, H).head_projections(H)


# ------------------------------------------------------- property tests
@settings(max_examples=25, deadline=None)
@given(d_model=st.integers(1, 48), bias=st.booleans(), data=st.data())
def test_every_valid_head_count(d_model, bias, data):
    batch, length = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5))
    x = torch.randn(batch, length, d_model)
    for n_heads in valid_head_counts(d_model):
        m = MultiHeadAttention(d_model, n_heads, bias=bias).eval()
        assert m.d_head * n_heads == d_model
        assert count_parameters(m) == 4 * d_model**2 + (4 * d_model if bias else 0)
        out, w = m(x, need_weights=True, average_attn_weights=False)
        assert out.shape == (batch, length, d_model) and w.shape == (batch, n_heads, length, length)
        assert_close(m(x, need_weights=False)[0], out, what=f"paths at d_model={d_model}, n_heads={n_heads}")
    theirs = to_torch(m).eval()
    assert_close(out, theirs(x, x, x)[0], what=f"torch at d_model={d_model}, n_heads={n_heads}")


@settings(max_examples=25, deadline=None)
@given(d_model=st.integers(2, 200), n_heads=st.integers(1, 200))
def test_every_invalid_head_count_is_refused(d_model, n_heads):
    if d_model % n_heads == 0:
        assert validate_head_count(d_model, n_heads) == d_model // n_heads
        return
    with pytest.raises(ValueError) as info:
        MultiHeadAttention(d_model, n_heads)
    message = str(info.value)
    assert f"d_model={d_model}" in message and f"n_heads={n_heads}" in message
    valid = valid_head_counts(d_model)
    assert n_heads not in valid
    assert f"Valid head counts for d_model={d_model}: " + ", ".join(map(str, valid[:3])) in message


# ------------------------------------------------------------ bad input
class TestBadInput:
    def test_indivisible_head_count_lists_the_valid_ones(self):
        with pytest.raises(ValueError) as info:
            MultiHeadAttention(10, 3)
        message = str(info.value)
        assert "d_model=10" in message and "n_heads=3" in message
        assert "1, 2, 5, 10" in message

    def test_long_lists_are_shortened(self):
        with pytest.raises(ValueError, match=r"1, 2, 3, 4, .*\.\.\., 360, 720"):
            MultiHeadAttention(720, 7)

    @pytest.mark.parametrize("n_heads", [0, -4])
    def test_too_few_heads(self, n_heads):
        with pytest.raises(ValueError, match=rf"n_heads must be at least 1, got n_heads={n_heads}.*1, 2, 4, 8, 16"):
            MultiHeadAttention(16, n_heads)

    @pytest.mark.parametrize("d_model, n_heads, name",
                             [(16, 2.0, "n_heads"), ("16", 2, "d_model"), (16, True, "n_heads")])
    def test_not_an_int(self, d_model, n_heads, name):
        with pytest.raises(TypeError, match=rf"{name} must be an int"):
            MultiHeadAttention(d_model, n_heads)

    def test_bad_d_model_and_dropout(self):
        with pytest.raises(ValueError, match="d_model must be at least 1"):
            MultiHeadAttention(0, 1)
        with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
            MultiHeadAttention(16, 4, dropout=1.5)

    @pytest.mark.parametrize("which", ["query", "key", "value"])
    def test_wrong_width(self, which):
        m = MultiHeadAttention(D, H)
        inputs = {"query": rand(B, L, D), "key": rand(B, S, D), "value": rand(B, S, D)}
        inputs[which] = rand(B, inputs[which].size(1), D + 1)
        with pytest.raises(ValueError, match=rf"{which} has width {D + 1}.*d_model={D}"):
            m(inputs["query"], inputs["key"], inputs["value"])

    def test_self_attention_width(self):
        with pytest.raises(ValueError, match=rf"query has width 8 .*d_model={D}.*MultiHeadAttention\(8, n_heads\)"):
            MultiHeadAttention(D, H)(rand(B, L, 8))

    @pytest.mark.parametrize("shape", [(L, D), (1, B, L, D)])
    def test_not_3d(self, shape):
        with pytest.raises(ValueError, match=r"query must be 3-D \[batch, seq, d_model\].*unsqueeze\(0\)"):
            MultiHeadAttention(D, H)(rand(*shape))

    def test_not_a_float_tensor(self):
        m = MultiHeadAttention(D, H)
        with pytest.raises(TypeError, match="query must be a torch.Tensor"):
            m([[0.0] * D])
        with pytest.raises(TypeError, match="floating-point"):
            m(torch.zeros(B, L, D, dtype=torch.long))

    def test_key_and_value_lengths_differ(self):
        with pytest.raises(ValueError, match=rf"same length.*key length {S} and value length {S - 1}"):
            MultiHeadAttention(D, H)(rand(B, L, D), rand(B, S, D), rand(B, S - 1, D))

    def test_batch_sizes_differ(self):
        with pytest.raises(ValueError, match=rf"same batch size, got {B}, {B + 1} and {B + 1}"):
            MultiHeadAttention(D, H)(rand(B, L, D), rand(B + 1, S, D), rand(B + 1, S, D))

    def test_only_key_or_value(self):
        with pytest.raises(ValueError, match="both key and value"):
            MultiHeadAttention(D, H)(rand(B, L, D), rand(B, S, D))

    @pytest.mark.parametrize(
        "shape",
        [(B, S + 1), (B + 1, S), (S,), (1, S), (B, 1), (B, 1, S), (B, L, S)],
        ids=lambda s: "x".join(map(str, s)),
    )
    def test_key_padding_mask_shape(self, shape):
        m = MultiHeadAttention(D, H)
        with pytest.raises(ValueError, match=rf"key_padding_mask must have shape \[batch, key_len\] = \[{B}, {S}\]"):
            m(rand(B, L, D), rand(B, S, D), rand(B, S, D), key_padding_mask=torch.zeros(shape, dtype=torch.bool))

    @pytest.mark.parametrize(
        "shape",
        # each of these would broadcast against [B, H, L, S]: none may be silently accepted
        [(L, S + 1), (S, L), (1, S), (L, 1), (S,), (1, L, S), (B, L, S), (H, L, S), (B * H + 1, L, S),
         (1, H, L, S), (B, 1, L, S), (B, H, 1, S)],
        ids=lambda s: "x".join(map(str, s)),
    )
    def test_attn_mask_shape(self, shape):
        m = MultiHeadAttention(D, H)
        with pytest.raises(ValueError, match=rf"attn_mask must have shape \[L, S\] = \[{L}, {S}\].*got"):
            m(rand(B, L, D), rand(B, S, D), rand(B, S, D), attn_mask=torch.zeros(shape))

    @pytest.mark.parametrize("name", ["attn_mask", "key_padding_mask"])
    @pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.int32])
    def test_mask_dtype(self, name, dtype):
        m = MultiHeadAttention(D, H)
        shape = (L, S) if name == "attn_mask" else (B, S)
        with pytest.raises(TypeError, match=rf"{name} must be a bool tensor .* or a float tensor .*got dtype"):
            m(rand(B, L, D), rand(B, S, D), rand(B, S, D), **{name: torch.zeros(shape, dtype=dtype)})

    def test_mask_not_a_tensor(self):
        with pytest.raises(TypeError, match="attn_mask must be a tensor"):
            MultiHeadAttention(D, H)(rand(B, L, D), attn_mask=[[True] * L] * L)



# ---------------------------------------------------- reduced precision (GPU)
@pytest.mark.gpu
class TestReducedPrecisionOnGPU:
    """bf16/fp16 on CUDA: the fused (flash / memory-efficient) path and the explicit path agree with a
    float32 reference to within the precision of the format, and with torch's module in the same dtype."""

    @pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 2e-2), (torch.float16, 4e-3)], ids=["bf16", "fp16"])
    @pytest.mark.parametrize("is_causal", [False, True])
    def test_fused_and_explicit_paths(self, dtype, tol, is_causal):
        theirs32, ours32 = pair(64, 4, device="cuda")
        x32 = rand(4, 128, 64, device="cuda")
        reference, _ = ours32(x32, is_causal=is_causal)  # float32
        scale = reference.abs().max().item()
        ours = ours32.to(dtype)
        x = x32.to(dtype)
        fused, _ = ours(x, is_causal=is_causal)
        explicit, _ = ours(x, is_causal=is_causal, need_weights=True)
        assert fused.dtype == explicit.dtype == dtype
        for name, out in (("fused", fused), ("explicit", explicit)):
            rel = max_diff(out, reference) / scale
            assert rel <= tol, f"{name} path in {dtype}: relative error {rel:.3g} > {tol}"
        rel = max_diff(fused, explicit) / scale
        assert rel <= tol, f"fused vs explicit in {dtype}: relative error {rel:.3g} > {tol}"
        theirs = theirs32.to(dtype)
        mask = forbidden_causal(128, device="cuda") if is_causal else None
        ref_same_dtype, _ = theirs(x, x, x, attn_mask=mask, is_causal=is_causal, need_weights=False)
        rel = max_diff(fused, ref_same_dtype) / scale
        assert rel <= tol, f"ours vs torch in {dtype}: relative error {rel:.3g} > {tol}"

    def test_mask_on_another_device(self):
        m = MultiHeadAttention(D, H).cuda()
        x = rand(B, L, D, device="cuda")
        with pytest.raises(ValueError, match="attn_mask is on cpu but the inputs are on cuda"):
            m(x, attn_mask=torch.zeros(L, L))

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
    def test_kv_cache_in_reduced_precision(self, dtype):
        _, ours = pair(64, 8, device="cuda")
        ours = ours.to(dtype)
        x = rand(2, 12, 64, device="cuda").to(dtype)
        full, _ = ours(x, is_causal=True)
        cache = KVCache()
        steps = [ours(x[:, t : t + 1], kv_cache=cache, is_causal=True)[0] for t in range(12)]
        rel = max_diff(torch.cat(steps, 1), full) / full.abs().max().item()
        assert rel <= 2e-2
        assert cache.bytes_per_token == 2 * 64 * 2  # two bytes per number


# ------------------------------------------ grouped-query, head size, rotary
def expanded_to_full_heads(gqa: MultiHeadAttention) -> MultiHeadAttention:
    """The multi-head module whose K/V heads are gqa's repeated: each query head gets its own copy."""
    H, G, dk, D_ = gqa.n_heads, gqa.n_key_value_heads, gqa.d_head, gqa.d_model
    full = MultiHeadAttention(D_, H, d_head=dk, bias=gqa.bias, rotary_base=gqa.rotary_base)
    w_q, w_k, w_v = gqa.qkv_proj.weight.split((H * dk, G * dk, G * dk))
    repeat = lambda w: w.view(G, dk, -1).repeat_interleave(H // G, dim=0).reshape(H * dk, -1)  # noqa: E731
    with torch.no_grad():
        full.qkv_proj.weight.copy_(torch.cat([w_q, repeat(w_k), repeat(w_v)]))
        full.out_proj.weight.copy_(gqa.out_proj.weight)
        if gqa.bias:
            b_q, b_k, b_v = gqa.qkv_proj.bias.split((H * dk, G * dk, G * dk))
            full.qkv_proj.bias.copy_(torch.cat([b_q, repeat(b_k[:, None])[:, 0], repeat(b_v[:, None])[:, 0]]))
            full.out_proj.bias.copy_(gqa.out_proj.bias)
    return full.eval()


def randomised(module: MultiHeadAttention) -> MultiHeadAttention:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module.eval()


class TestGroupedQueryAttention:
    @pytest.mark.parametrize("n_key_value_heads", [1, 2, 4])
    @pytest.mark.parametrize("need_weights", [False, True])
    @pytest.mark.parametrize("is_causal", [False, True])
    def test_equals_multi_head_with_repeated_kv_heads(self, n_key_value_heads, need_weights, is_causal):
        torch.manual_seed(0)
        gqa = randomised(MultiHeadAttention(D, H, n_key_value_heads=n_key_value_heads))
        full = expanded_to_full_heads(gqa)
        x = rand(B, L, D)
        ours, w1 = gqa(x, is_causal=is_causal, need_weights=need_weights, average_attn_weights=False)
        theirs, w2 = full(x, is_causal=is_causal, need_weights=need_weights, average_attn_weights=False)
        assert_close(ours, theirs)
        if need_weights:
            assert_close(w1, w2, what="weights")

    def test_n_key_value_heads_equal_to_n_heads_is_the_standard_module_bit_for_bit(self):
        torch.manual_seed(0)
        a = MultiHeadAttention(D, H)
        torch.manual_seed(0)
        b = MultiHeadAttention(D, H, n_key_value_heads=H)
        x = rand(B, L, D)
        assert torch.equal(a(x)[0], b(x)[0]) and b.is_standard

    def test_parameters_and_cache_shrink_with_the_kv_heads(self):
        gqa = MultiHeadAttention(D, H, n_key_value_heads=1, bias=False)
        assert count_parameters(gqa) == 2 * D * D + 2 * D * (D // H)  # W_Q and W_O full, one K and one V head
        cache = KVCache()
        gqa(rand(1, 3, D), kv_cache=cache, is_causal=True)
        assert cache.k.shape == (1, 1, 3, D // H) and cache.values_per_token == 2 * (D // H)

    def test_head_projections_read_the_shared_kv_head(self):
        gqa = MultiHeadAttention(D, H, n_key_value_heads=2)
        assert torch.equal(gqa.head_projections(0).W_K, gqa.head_projections(1).W_K)
        assert not torch.equal(gqa.head_projections(1).W_K, gqa.head_projections(2).W_K)
        assert torch.equal(gqa.head_projections(3).W_V, gqa.head_projections(2).W_V)

    def test_bad_groupings(self):
        grouping = "not a multiple of n_key_value_heads=3.*Valid n_key_value_heads for n_heads=4: 1, 2, 4"
        with pytest.raises(ValueError, match=grouping):
            MultiHeadAttention(D, H, n_key_value_heads=3)
        with pytest.raises(ValueError, match="n_key_value_heads must be between 1 and 4"):
            MultiHeadAttention(D, H, n_key_value_heads=8)


class TestHeadSize:
    def test_head_size_decoupled_from_the_split(self):
        """T5-style: more width in the heads than in the model."""
        m = MultiHeadAttention(D, H, d_head=8, bias=False)
        assert count_parameters(m) == 4 * D * H * 8  # 4 d_model h d_head, no longer 4 d_model^2
        out, w = m(rand(B, L, D), need_weights=True, average_attn_weights=False)
        assert out.shape == (B, L, D) and w.shape == (B, H, L, L)

    def test_head_size_need_not_divide_anything(self):
        m = MultiHeadAttention(10, 3, d_head=7)
        assert m.d_head == 7 and m(rand(1, 2, 10))[0].shape == (1, 2, 10)

    def test_bad_head_size(self):
        with pytest.raises(ValueError, match="d_head must be at least 1"):
            MultiHeadAttention(D, H, d_head=0)


class TestRotary:
    def test_scores_depend_only_on_the_distance(self):
        """RoPE's point: q at position m and k at position n score as a function of m - n."""
        from mhalab.positions import apply_rotary

        torch.manual_seed(0)
        q, k = rand(1, 1, 1, 8), rand(1, 1, 1, 8)
        def score(m, n):
            return (apply_rotary(q, torch.tensor([m]), 100.0) * apply_rotary(k, torch.tensor([n]), 100.0)).sum()
        assert abs(score(5, 2) - score(13, 10)) < 1e-4
        assert abs(score(5, 2) - score(5, 4)) > 1e-3

    def test_rotation_keeps_the_norm(self):
        from mhalab.positions import apply_rotary

        x = rand(2, 3, 6, 8)
        rotated = apply_rotary(x, torch.arange(6), 10000.0)
        assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
        assert_close(rotated[..., 0, :], x[..., 0, :])  # position 0 is not rotated

    def test_odd_head_size_is_refused(self):
        with pytest.raises(ValueError, match="d_head must be even"):
            MultiHeadAttention(9, 3, rotary_base=10000.0)

    def test_bad_base(self):
        with pytest.raises(ValueError, match="rotary_base must be a number above 1"):
            MultiHeadAttention(D, H, rotary_base=0.5)


@pytest.mark.parametrize("options", [{"n_key_value_heads": 2}, {"rotary_base": 10000.0},
                                     {"n_key_value_heads": 1, "rotary_base": 100.0, "d_head": 6}])
@pytest.mark.parametrize("need_weights", [False, True])
def test_cache_decoding_equals_the_full_causal_forward(options, need_weights):
    """Prompt of 3 tokens at once, then one token at a time: positions continue from the cache."""
    torch.manual_seed(0)
    m = randomised(MultiHeadAttention(D, H, **options))
    x = rand(2, 7, D)
    full, _ = m(x, is_causal=True)
    cache = KVCache()
    parts = [m(x[:, :3], kv_cache=cache, is_causal=True, need_weights=need_weights)[0]]
    parts += [m(x[:, t : t + 1], kv_cache=cache, need_weights=need_weights)[0] for t in range(3, 7)]
    assert_close(torch.cat(parts, dim=1), full)
    assert cache.k.shape == (2, m.n_key_value_heads, 7, m.d_head)


# ----------------------------------------------------------- edge cases, errors
@pytest.mark.parametrize("how", ["float attn_mask", "key padding and attn_mask"])
def test_a_query_that_sees_no_key_gets_zeros_on_both_paths(how):
    m = randomised(MultiHeadAttention(D, H, bias=False))
    x = rand(1, 3, D)
    forbidden = torch.zeros(3, 3, dtype=torch.bool)
    forbidden[1] = True  # query 1 may see nothing
    if how == "float attn_mask":  # (a bool mask forbidding a whole row is refused: it looks like True = may attend)
        mask = dict(attn_mask=torch.zeros(3, 3).masked_fill(forbidden, float("-inf")))
    else:  # key 2 is padding, query 1 is forbidden keys 0 and 1: together, all of them
        mask = dict(key_padding_mask=torch.tensor([[False, False, True]]),
                    attn_mask=torch.tensor([[False, False, False], [True, True, False], [False, False, False]]))
    fused, _ = m(x, need_weights=False, **mask)
    explicit, weights = m(x, need_weights=True, average_attn_weights=False, **mask)
    assert not explicit.isnan().any() and not fused.isnan().any()
    assert_close(explicit, fused)
    assert weights[0, :, 1].abs().max() == 0 and torch.allclose(weights[0, :, 0].sum(-1), torch.ones(H))
    assert explicit[0, 1].abs().max() == 0  # no bias: nothing seen, nothing said


def left_padded_causal_batch(device="cpu"):
    """Sequence 1 is left-padded by 2: under the causal mask its first query may see only key 0, which is
    padding, so it sees no key at all (what batched generation with left padding gives)."""
    padding = torch.zeros(B, L, dtype=torch.bool, device=device)
    padding[1, :2] = True
    return dict(key_padding_mask=padding, is_causal=True)


@pytest.mark.parametrize("need_weights", [True, False])
def test_a_query_that_sees_no_key_gives_finite_gradients(device, need_weights):
    """The explicit path zeroed the NaN weights of such a query after the softmax, but the softmax's
    backward still multiplied by them: every gradient was NaN (need_weights=True is the default)."""
    m = randomised(MultiHeadAttention(D, H, bias=False)).to(device)
    x = rand(B, L, D, device=device).requires_grad_()
    out, _ = m(x, need_weights=need_weights, **left_padded_causal_batch(device))
    assert out[1, 0].abs().max() == 0 and not out.isnan().any()
    out.square().sum().backward()
    for name, grad in [("input", x.grad)] + [(n, p.grad) for n, p in m.named_parameters()]:
        assert torch.isfinite(grad).all(), f"the gradient of {name} is not finite"
    assert x.grad[1, 2:].abs().amax(-1).min() > 0  # the real tokens are still learnt from


def test_the_fused_path_zeroes_a_query_that_sees_no_key_where_the_kernel_gives_nan(monkeypatch):
    """MPS's scaled_dot_product_attention returns NaN for a query whose mask row is all -inf: its general
    kernel until torch 2.9 (pytorch/pytorch#156707), its inference kernels later too (#167515), where CPU
    and CUDA give zeros. Simulated on the CPU: a kernel with MPS's plain softmax, on a device declared
    without the zeros. The module gives that query zeros and finite gradients there as well."""
    import mhalab.attention as attention

    def plain_softmax_kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **options):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        return (scores if attn_mask is None else scores + attn_mask).softmax(dim=-1) @ v

    q = k = v = rand(1, 1, 2, 4)
    blind = torch.tensor([[0.0, 0.0], [float("-inf"), float("-inf")]])
    assert plain_softmax_kernel(q, k, v, attn_mask=blind)[0, 0, 1].isnan().all()  # what MPS does
    m = randomised(MultiHeadAttention(D, H, bias=False))
    x = rand(B, L, D).requires_grad_()
    expected, _ = m(x, need_weights=False, **left_padded_causal_batch())
    (grad,) = torch.autograd.grad(expected.square().sum(), x)
    monkeypatch.setattr(F, "scaled_dot_product_attention", plain_softmax_kernel)
    monkeypatch.setattr(attention, "sdpa_zeroes_blind_rows", lambda device: False, raising=False)
    out, _ = m(x, need_weights=False, **left_padded_causal_batch())
    assert not out.isnan().any() and out[1, 0].abs().max() == 0
    assert_close(out, expected, what="output with the NaN-giving kernel")
    (grad_there,) = torch.autograd.grad(out.square().sum(), x)
    assert_close(grad_there, grad, what="input gradient with the NaN-giving kernel")


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("L_, S_", [(0, 0), (0, 3), (3, 0)])
def test_an_empty_sequence_gives_an_empty_result_as_torch(need_weights, L_, S_):
    """No queries, or no keys, give the shapes torch's module gives (out [B, L, D], weights [B, L, S]); a
    query with no key to see gets a zero head output, so only the output bias is left."""
    theirs, ours = pair()
    query, memory = rand(B, L_, D), rand(B, S_, D)
    kv = () if L_ == S_ else (memory, memory)  # self-attention on an empty sequence, else cross-attention
    expected, expected_w = theirs(query, *(kv or (query, query)), need_weights=need_weights)
    out, weights = ours(query, *kv, need_weights=need_weights)
    assert out.shape == expected.shape == (B, L_, D)
    assert torch.allclose(out, ours.out_proj.bias.expand(B, L_, D), atol=TOL)
    if need_weights:
        assert weights.shape == expected_w.shape == (B, L_, S_)
    else:
        assert weights is None


def test_a_prompt_into_an_empty_cache_must_be_causal():
    m = MultiHeadAttention(D, H)
    cache = KVCache()
    with pytest.raises(ValueError, match="need is_causal=True"):
        m(rand(1, 3, D), kv_cache=cache)
    assert len(cache) == 0  # nothing was appended


def test_float64_input_to_a_float32_module_says_what_to_do():
    m = MultiHeadAttention(D, H)
    with pytest.raises(TypeError, match=r"query is torch.float64 but this module's weights are torch.float32: "
                                        r"convert the input with .to\(torch.float32\)"):
        m(rand(1, 3, D).double())


# ------------------------------------------- the KV cache grows without copying everything
def test_the_kv_cache_copies_each_token_once_and_reallocates_rarely():
    """Decoding 200 tokens one at a time: storage doubles (a handful of reallocations), not 200 concatenations."""
    cache, capacities = KVCache(), []
    k = torch.randn(1, 2, 200, 4)
    for t in range(200):
        got_k, got_v = cache.append(k[:, :, t : t + 1], -k[:, :, t : t + 1])
        capacities.append(cache.capacity)
    assert torch.equal(got_k, k) and torch.equal(got_v, -k) and len(cache) == 200
    assert len(set(capacities)) <= 6, f"reallocated {len(set(capacities))} times: {sorted(set(capacities))}"
    assert cache.values_per_token == 2 * 2 * 4 and cache.bytes_per_token == 2 * 2 * 4 * 4


def test_a_kv_cache_with_max_len_allocates_once_and_refuses_more():
    cache = KVCache(max_len=5)
    cache.append(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))
    assert cache.capacity == 5 and cache.k.shape == (1, 1, 2, 4)
    cache.append(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
    with pytest.raises(ValueError, match="at most max_len=5 positions"):
        cache.append(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4))
    assert len(cache) == 5
    with pytest.raises(ValueError, match="max_len must be at least 1"):
        KVCache(max_len=0)


def test_rotary_tables_are_made_once_and_grown_on_demand():
    from mhalab.positions import apply_rotary, rotary_tables

    first = rotary_tables(10, 8, 1234.5, "cpu")
    assert rotary_tables(7, 8, 1234.5, "cpu")[0] is first[0], "a shorter request recomputed the table"
    longer = rotary_tables(first[0].size(0) + 1, 8, 1234.5, "cpu")
    assert longer[0].size(0) >= 2 * first[0].size(0) and torch.equal(longer[0][:10], first[0][:10])
    x = rand(2, 3, 6, 8)
    assert torch.equal(apply_rotary(x, 4, 1234.5), apply_rotary(x, torch.arange(4, 10), 1234.5))
