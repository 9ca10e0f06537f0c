"""mhalab.dot_product_attention against torch's F.scaled_dot_product_attention: without a mask, with a bool or a
float mask, rows that sum to one, and dropout on the output only."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from small_models import assert_close, max_diff, rand

from mhalab.dot_product_attention import scaled_dot_product_attention
from mhalab.masks import causal_allowed_mask

L, S = 5, 7  # query length, key length (small: fast)


# --------------------------------------------------------------- basic maths
class TestScaledDotProductAttention:
    def test_matches_torch_without_mask(self):
        q, k, v = rand(2, 3, L, 8), rand(2, 3, S, 8), rand(2, 3, S, 6)
        out, weights = scaled_dot_product_attention(q, k, v)
        assert out.shape == (2, 3, L, 6) and weights.shape == (2, 3, L, S)
        assert_close(out, F.scaled_dot_product_attention(q, k, v))

    def test_matches_torch_with_bool_mask(self):
        q, k, v = rand(2, 3, L, 8), rand(2, 3, S, 8), rand(2, 3, S, 8)
        allowed = torch.rand(L, S) > 0.4
        allowed[:, 0] = True  # every query may see at least one key
        out, weights = scaled_dot_product_attention(q, k, v, mask=allowed)
        assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
        assert (weights[..., ~allowed] == 0).all(), "a forbidden pair got weight"

    def test_matches_torch_with_float_mask(self):
        q, k, v = rand(2, 3, L, 8), rand(2, 3, S, 8), rand(2, 3, S, 8)
        additive = rand(2, 1, L, S)
        out, _ = scaled_dot_product_attention(q, k, v, mask=additive)
        assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=additive))

    def test_rows_sum_to_one(self):
        q, k, v = rand(3, L, 8), rand(3, S, 8), rand(3, S, 8)
        _, weights = scaled_dot_product_attention(q, k, v, mask=causal_allowed_mask(L, S))
        assert_close(weights.sum(-1), torch.ones(3, L), what="row sums")
        assert (weights >= 0).all()

    def test_dropout_only_changes_the_output(self):
        q, k, v = rand(1, L, 8), rand(1, S, 8), rand(1, S, 8)
        out0, w0 = scaled_dot_product_attention(q, k, v)
        out1, w1 = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        assert torch.equal(w0, w1), "the returned weights are the softmax before dropout"
        assert max_diff(out0, out1) > 1e-3, "dropout_p=0.5 left the output unchanged"
