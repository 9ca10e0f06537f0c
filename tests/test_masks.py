"""mhalab.masks: each helper says what True means, and MultiHeadAttention refuses a mask of the other convention."""

from __future__ import annotations

import pytest
import torch

import mhalab
from mhalab.attention import MultiHeadAttention
from mhalab.dot_product_attention import scaled_dot_product_attention
from mhalab.masks import causal_allowed_mask, causal_forbidden_mask

D, H = 16, 4


def test_the_package_exports_both_helpers_by_what_true_means():
    assert mhalab.causal_allowed_mask is causal_allowed_mask and mhalab.causal_forbidden_mask is causal_forbidden_mask
    assert not hasattr(mhalab, "causal_mask"), "the old name meant True = may attend beside a True = forbidden module"
    assert torch.equal(causal_forbidden_mask(3), torch.tensor([[0, 1, 1], [0, 0, 1], [0, 0, 0]], dtype=torch.bool))


def test_each_helper_goes_with_its_function():
    """The right pairings agree with each other and with is_causal."""
    torch.manual_seed(0)
    m = MultiHeadAttention(D, H).eval()
    x = torch.randn(2, 5, D)
    causal, _ = m(x, is_causal=True, need_weights=False)
    forbidden, _ = m(x, attn_mask=causal_forbidden_mask(5), need_weights=False)
    torch.testing.assert_close(forbidden, causal)
    q, k, v = (torch.randn(2, H, 5, 4) for _ in range(3))
    out, _ = scaled_dot_product_attention(q, k, v, mask=causal_allowed_mask(5))
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("mask, why", [
    (causal_allowed_mask(4), "forbids some query every key"),  # the trap of issue 17: it silently saw the future
    (torch.eye(4, dtype=torch.bool) | torch.ones(4, 4, dtype=torch.bool).triu(2),
     "forbids every query its own position"),
    # per head, [B*H, L, S]
    (torch.eye(4, dtype=torch.bool).expand(2 * H, 4, 4), "forbids every query its own position"),
])
def test_a_may_attend_mask_given_as_attn_mask_is_refused(mask, why):
    m = MultiHeadAttention(D, H)
    with pytest.raises(ValueError, match=why) as info:
        m(torch.randn(2, 4, D), attn_mask=mask)
    message = str(info.value)
    for words in ("True = forbidden", "True = may attend", "F.scaled_dot_product_attention",
                  "causal_forbidden_mask(4, 4)"):
        assert words in message, f"the message should name {words!r}: {message}"


def test_with_a_cache_the_own_position_is_the_last_key():
    """One new token after 3 cached: its own position is key 3; a mask forbidding only that is refused."""
    m = MultiHeadAttention(D, H).eval()
    cache = mhalab.KVCache()
    m(torch.randn(1, 3, D), kv_cache=cache, is_causal=True, need_weights=False)
    with pytest.raises(ValueError, match="own position"):
        m(torch.randn(1, 1, D), kv_cache=cache, attn_mask=torch.tensor([[False, False, False, True]]))
    assert len(cache) == 3  # refused before anything was appended
    out, _ = m(torch.randn(1, 1, D), kv_cache=cache, attn_mask=torch.tensor([[True, False, False, False]]))
    assert out.shape == (1, 1, D)


def test_cross_attention_has_no_own_position():
    m = MultiHeadAttention(D, H).eval()
    q, kv = torch.randn(1, 3, D), torch.randn(1, 3, D)
    m(q, kv, kv, attn_mask=torch.eye(3, dtype=torch.bool))  # forbidding key i to query i is a choice here


def test_a_hugging_face_style_padding_mask_is_refused():
    m = MultiHeadAttention(D, H)
    real = torch.tensor([[True, True, True, True], [True, True, False, False]])  # 1 = real token, HF's convention
    with pytest.raises(ValueError, match=r"every key of sequence 0 as padding.*attention_mask == 0"):
        m(torch.randn(2, 4, D), key_padding_mask=real)
    m(torch.randn(2, 4, D), key_padding_mask=~real)  # True = padding: accepted


def test_float_masks_are_never_second_guessed():
    m = MultiHeadAttention(D, H).eval()
    blind = torch.zeros(3, 3)
    blind[1] = float("-inf")  # query 1 sees nothing, said explicitly
    out, w = m(torch.randn(1, 3, D), attn_mask=blind, average_attn_weights=False)
    assert w[0, :, 1].abs().max() == 0


def test_wrong_dtype_and_shape_still_get_their_own_errors():
    m = MultiHeadAttention(D, H)
    x = torch.randn(2, 4, D)
    with pytest.raises(TypeError, match="bool tensor .True = forbidden. or a float tensor"):
        m(x, attn_mask=torch.ones(4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attn_mask must have shape \[L, S\] = \[4, 4\]"):
        m(x, attn_mask=torch.ones(4, 5, dtype=torch.bool))
