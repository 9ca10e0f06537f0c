"""Scaled dot-product attention, the single operation, as functions written to be read: :func:`attention_scores`
(Q Kᵀ / sqrt(d_k) + mask, before the softmax), :func:`softmax_over_keys`, :func:`attention_weights` (the two in
turn) and :func:`scaled_dot_product_attention` (the weights times V). :mod:`mhalab.attention` runs them per head.

Shapes: ``...`` any leading axes (batch, heads), L query length, S key/value length, dk query and key size (the
paper's d_k), dv value size. Masks follow ``F.scaled_dot_product_attention``: bool True = **may** attend
(:func:`mhalab.masks.causal_allowed_mask`), or float added to the scores. A query that may see no key gets zero
weights and a zero output, not NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["attention_scores", "softmax_over_keys", "attention_weights", "scaled_dot_product_attention"]


def attention_scores(q: Tensor, k: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """Q Kᵀ / sqrt(d_k) + mask: ``q [..., L, dk]``, ``k [..., S, dk]`` -> ``[..., L, S]`` (before the softmax).

    ``mask`` broadcasts to ``[..., L, S]``: bool True where a query may attend (else ``-inf``), or float added.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # [..., L, S]: how well each query matches each key
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))  # forbidden pairs will get zero weight
    return scores + mask


def softmax_over_keys(scores: Tensor) -> Tensor:
    """``scores [..., L, S]`` -> weights ``[..., L, S]``; a row of all ``-inf`` (a query that may see no key)
    gets all zeros, not NaN."""
    if scores.size(-1) == 0:
        return scores.softmax(dim=-1)  # no keys at all: an empty [..., L, 0]
    # softmax of an all -inf row is 0/0: a query that sees nothing gets nothing. Found from the row maxima
    # ([..., L, 1]), and fixed only where such a row exists, so an unmasked call makes no second [L, S] tensor.
    blind = scores.amax(dim=-1, keepdim=True) == float("-inf")  # [..., L, 1]
    if not bool(blind.any()):
        return scores.softmax(dim=-1)  # [..., L, S]: one weighting over the keys per query
    # Finite scores in those rows before the softmax, zeros after: zeroing NaN weights afterwards alone
    # would leave the softmax's backward multiplying by them, and every gradient NaN.
    return scores.masked_fill(blind, 0.0).softmax(dim=-1).masked_fill(blind, 0.0)


def attention_weights(q: Tensor, k: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """softmax(Q Kᵀ / sqrt(d_k) + mask): ``q [..., L, dk]``, ``k [..., S, dk]`` -> ``[..., L, S]``.

    ``mask`` broadcasts to ``[..., L, S]``: bool True where a query may attend, or float added to the
    scores. A query that may see no key gets an all-zero row, not NaN.
    """
    return softmax_over_keys(attention_scores(q, k, mask=mask))


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(Q Kᵀ / sqrt(d_k) + mask) V: ``q [..., L, dk]``, ``k [..., S, dk]``, ``v [..., S, dv]``.

    Returns ``(out [..., L, dv], weights [..., L, S])``; ``mask`` as in :func:`attention_weights`.
    Dropout acts on the output only: the weights returned are the softmax before it.
    """
    weights = attention_weights(q, k, mask=mask)  # [..., L, S]
    out = F.dropout(weights, p=dropout_p) @ v  # [..., L, dv]: weighted sum of the values
    return out, weights
