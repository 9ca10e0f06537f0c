"""mhalab's :class:`~mhalab.attention.MultiHeadAttention` and ``torch.nn.MultiheadAttention``, one into the other
with the same weights: :func:`from_torch` and :func:`to_torch`. Both stack W_Q, W_K, W_V by rows in the same order
and layout (torch's ``in_proj_weight``, mhalab's ``qkv_proj``), so only the names differ; torch's module holds the
paper's attention only (no grouped-query heads, no head size of its own, no rotary positions)."""

from __future__ import annotations

from torch import nn

from .attention import MultiHeadAttention

__all__ = ["from_torch", "to_torch"]


def from_torch(m: nn.MultiheadAttention) -> MultiHeadAttention:
    """A ``MultiHeadAttention`` with the same weights and ``batch_first`` as a ``torch.nn.MultiheadAttention``."""
    if not isinstance(m, nn.MultiheadAttention):
        raise TypeError(f"from_torch expects a torch.nn.MultiheadAttention, got {type(m).__name__}")
    if not m._qkv_same_embed_dim:
        raise ValueError("from_torch supports only kdim == vdim == embed_dim (one in_proj_weight)")
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError("from_torch does not support add_bias_kv or add_zero_attn")
    w = m.in_proj_weight
    ours = MultiHeadAttention(m.embed_dim, m.num_heads, m.dropout, m.in_proj_bias is not None,
                              batch_first=m.batch_first, device=w.device, dtype=w.dtype)
    ours.load_state_dict({k.replace("in_proj_", "qkv_proj."): v for k, v in m.state_dict().items()})
    return ours


def to_torch(attn: MultiHeadAttention) -> nn.MultiheadAttention:
    """A ``torch.nn.MultiheadAttention`` with the same weights and ``batch_first`` (paper's attention only)."""
    if not attn.is_standard:
        raise ValueError(f"torch.nn.MultiheadAttention cannot hold this module ({attn.extra_repr()}): it needs "
                         "n_key_value_heads == n_heads, d_head == d_model / n_heads and rotary_base=None")
    w = attn.qkv_proj.weight
    m = nn.MultiheadAttention(attn.d_model, attn.n_heads, dropout=attn.dropout, bias=attn.bias,
                              batch_first=attn.batch_first, device=w.device, dtype=w.dtype)
    m.load_state_dict({k.replace("qkv_proj.", "in_proj_"): v for k, v in attn.state_dict().items()})
    return m
