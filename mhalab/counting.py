"""The arithmetic of multi-head attention: parameters (4 d_model² for any h) and KV cache (2 d_model per
token per layer) against the head count; ``n_key_value_heads`` (grouped-query) and ``d_head`` break both on purpose.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .arguments import validate_head_shape, validate_int
from .attention import MultiHeadAttention
from .kv_cache import KVCache

__all__ = [
    "count_parameters", "AttentionParameters", "attention_parameters", "KVCacheSize", "kv_cache_per_token",
    "CostRow", "CostTable", "cost_table",
]


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters (``requires_grad``) in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


class AttentionParameters(NamedTuple):
    """Parameter counts of one multi-head attention block, by projection (each with its bias, if any)."""

    d_head: int  # the paper's d_k
    per_head_qkv: int  # one head's W_Q + W_K + W_V
    q: int  # all heads' W_Q
    k: int
    v: int
    o: int  # W_O

    @property
    def qkv(self) -> int:
        return self.q + self.k + self.v

    @property
    def total(self) -> int:
        return self.qkv + self.o


def attention_parameters(
    d_model: int, n_heads: int, *, n_key_value_heads: int | None = None, d_head: int | None = None,
    bias: bool = False,
) -> AttentionParameters:
    """h query heads and g K/V heads of ``d_model x d_head`` each, plus ``(h d_head) x d_model`` for W_O.

    Defaults give 4 d_model² whatever h is; ``bias=True`` adds each projection's output width.
    """
    g, d_head = validate_head_shape(d_model, n_heads, n_key_value_heads=n_key_value_heads, d_head=d_head)
    per_head = d_model * d_head + (d_head if bias else 0)  # one head's slice of one projection
    q = n_heads * per_head  # = d_model**2 (+ d_model) when h * d_head = d_model
    k = v = g * per_head  # only the K/V heads: fewer with grouped-query attention
    o = n_heads * d_head * d_model + (d_model if bias else 0)
    return AttentionParameters(d_head, 3 * per_head, q, k, v, o)


class KVCacheSize(NamedTuple):
    """What the KV cache stores per token: ``elements`` numbers, ``bytes`` when a dtype was given."""

    elements: int
    bytes: int | None


def kv_cache_per_token(
    d_model: int, n_heads: int, *, n_key_value_heads: int | None = None, d_head: int | None = None,
    n_layers: int = 1, dtype: torch.dtype | None = None,
) -> KVCacheSize:
    """Keys and values cached per token: ``2 * n_key_value_heads * d_head * n_layers`` (``2 * d_model * n_layers``
    by default)."""
    g, d_head = validate_head_shape(d_model, n_heads, n_key_value_heads=n_key_value_heads, d_head=d_head)
    validate_int("n_layers", n_layers, 1)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32 or torch.bfloat16, got {dtype!r}")
    elements = 2 * g * d_head * n_layers
    return KVCacheSize(elements, None if dtype is None else elements * dtype.itemsize)


class CostRow(NamedTuple):
    """One head count: what a real module and a real cache hold, beside the formulas."""

    heads: int
    d_head: int  # the paper's d_k
    parameters: int  # counted on a real MultiHeadAttention
    parameters_formula: int
    kv_cache: int  # numbers per token per layer, read off a real KVCache after decoding
    kv_cache_formula: int


class CostTable(list):
    """A list of :class:`CostRow` that prints (and shows in a notebook) as a table, one row per head count."""

    def __init__(self, rows, d_model: int, bias: bool):
        super().__init__(rows)
        self.d_model, self.bias = d_model, bias

    def __repr__(self) -> str:
        lines = [f"d_model = {self.d_model}" + (" (with biases)" if self.bias else ""),
                 f"{'heads':>5}  {'d_k':>4}  {'Q, K, V, O parameters':>21}  {'KV cache per token per layer':>28}"]
        lines += [f"{r.heads:>5}  {r.d_head:>4}  {r.parameters:>21,}  {r.kv_cache:>28,}" for r in self]
        return "\n".join(lines)


@torch.no_grad()
def cost_table(d_model: int = 512, heads=(1, 8, 32, 64), *, bias: bool = False, decode_tokens: int = 3) -> CostTable:
    """For each head count, count a real ``MultiHeadAttention``'s parameters and what a real
    :class:`KVCache` stores per token after ``decode_tokens`` steps; raises if a formula disagrees."""
    if isinstance(heads, int) or not all(isinstance(h, int) for h in heads):
        raise TypeError(f"heads must be a sequence of head counts such as (1, 8, 32, 64), got {heads!r}")
    if len(heads) == 0:
        raise ValueError("heads is empty: give at least one head count, e.g. heads=(1, 8, 32, 64)")
    validate_int("decode_tokens", decode_tokens, 1)
    rows = []
    generator = torch.Generator().manual_seed(0)
    for h in heads:
        module = MultiHeadAttention(d_model, h, bias=bias).eval()
        cache = KVCache()
        tokens = torch.randn(1, decode_tokens, d_model, generator=generator)
        for t in range(decode_tokens):
            module(tokens[:, t : t + 1], kv_cache=cache, is_causal=True, need_weights=False)
        row = CostRow(h, module.d_head, count_parameters(module), attention_parameters(d_model, h, bias=bias).total,
                      cache.values_per_token, kv_cache_per_token(d_model, h).elements)
        if row.parameters != row.parameters_formula or row.kv_cache != row.kv_cache_formula:
            raise AssertionError(f"measured and formula disagree: {row}")
        rows.append(row)
    return CostTable(rows, d_model, bias)
