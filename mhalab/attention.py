"""Scaled dot-product attention and multi-head attention, written to be read.

Shapes use these names throughout:

    B  batch             H   heads (n_heads)
    L  query length      S   key/value length
    D  d_model           dk  d_k = d_model / n_heads

Two mask conventions exist in PyTorch and both appear here, on purpose:

* :func:`scaled_dot_product_attention` follows
  ``torch.nn.functional.scaled_dot_product_attention``: a boolean mask is
  True where attention is **allowed**.
* :class:`MultiHeadAttention` follows ``torch.nn.MultiheadAttention``: a
  boolean ``attn_mask`` or ``key_padding_mask`` is True where attention is
  **forbidden** ("ignore this key").  That is the one trap when swapping
  between the two APIs.  Float masks are added to the scores in both.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "scaled_dot_product_attention",
    "causal_mask",
    "valid_head_counts",
    "check_head_count",
    "HeadProjections",
    "KVCache",
    "MultiHeadAttention",
]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k) + mask) V, one line per step.

    Args:
        q: queries ``[..., L, dk]``.
        k: keys ``[..., S, dk]``.
        v: values ``[..., S, dv]``.
        mask: optional, broadcastable to ``[..., L, S]``. Boolean: True where a
            query **may** attend (as in ``F.scaled_dot_product_attention``).
            Float: added to the scores (use ``-inf`` to forbid).
        dropout_p: dropout on the attention weights (applied only to the
            output; the returned weights are the softmax before dropout).

    Returns:
        ``(out, weights)``: ``out`` is ``[..., L, dv]``, ``weights`` is
        ``[..., L, S]`` and each row sums to 1 over the keys.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # [..., L, S]: how well each query matches each key
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))  # forbidden pairs get zero weight
        else:
            scores = scores + mask
    weights = scores.softmax(dim=-1)  # [..., L, S]: one weighting over the keys per query
    mixed = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = mixed @ v  # [..., L, dv]: weighted sum of the values
    return out, weights


def causal_mask(
    query_len: int, key_len: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Boolean ``[L, S]`` mask, True where query i may attend to key j (j <= i).

    When ``key_len > query_len`` the queries are the *last* ``query_len``
    positions (as when decoding with a KV cache), so query i sits at absolute
    position ``key_len - query_len + i``.
    """
    key_len = query_len if key_len is None else key_len
    offset = key_len - query_len
    rows = torch.arange(query_len, device=device)[:, None] + offset
    cols = torch.arange(key_len, device=device)[None, :]
    return cols <= rows


def valid_head_counts(d_model: int) -> list[int]:
    """Every n_heads that divides ``d_model`` (so that d_k = d_model / n_heads is whole)."""
    return [h for h in range(1, d_model + 1) if d_model % h == 0]


def check_head_count(d_model: int, n_heads: int) -> int:
    """Validate ``(d_model, n_heads)`` and return d_k, or raise a ValueError/TypeError that says the fix."""
    for name, value in (("d_model", d_model), ("n_heads", n_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if d_model < 1:
        raise ValueError(f"d_model must be at least 1, got d_model={d_model}")
    if n_heads < 1:
        raise ValueError(
            f"n_heads must be at least 1, got n_heads={n_heads}; "
            f"valid head counts for d_model={d_model}: {_short_list(valid_head_counts(d_model))}"
        )
    if d_model % n_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}: each head works in "
            f"d_k = d_model / n_heads dimensions, which must be a whole number. "
            f"Valid head counts for d_model={d_model}: {_short_list(valid_head_counts(d_model))}"
        )
    return d_model // n_heads


def _short_list(values: list[int], limit: int = 24) -> str:
    if len(values) <= limit:
        return ", ".join(map(str, values))
    return ", ".join(map(str, values[: limit - 2])) + ", ..., " + ", ".join(map(str, values[-2:]))


class HeadProjections(NamedTuple):
    """The slices of the projections that belong to one head (views: they share storage).

    ``W_Q, W_K, W_V`` are ``[d_model, d_k]`` (a row vector x maps to ``x @ W_Q``);
    ``W_O`` is ``[d_k, d_model]`` (the head's output maps to ``o @ W_O``).
    Biases are ``[d_k]`` (``b_O`` is shared by all heads, so it is not split) or None.
    """

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    b_Q: Tensor | None
    b_K: Tensor | None
    b_V: Tensor | None


class KVCache:
    """The keys and values one attention layer has already computed, for token-by-token decoding.

    ``k`` and ``v`` are ``[B, H, T, dk]`` after ``T`` tokens.  Pass the same
    cache to every decoding step of one layer; a model keeps one per layer.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.size(-2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``[B, H, T_new, dk]`` keys and values; return all of them so far."""
        if self.k is None:
            self.k, self.v = k, v
        else:
            if k.shape[:2] != self.k.shape[:2] or k.size(-1) != self.k.size(-1):
                raise ValueError(
                    f"cannot append keys of shape {tuple(k.shape)} to a cache holding "
                    f"{tuple(self.k.shape)}: batch, heads and d_k must match (use a fresh KVCache "
                    "for a new batch or another layer)"
                )
            self.k = torch.cat([self.k, k], dim=-2)  # [B, H, T + T_new, dk]
            self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def reset(self) -> None:
        self.k = self.v = None

    @property
    def values_per_token(self) -> int:
        """Numbers stored per token (per sequence in the batch): keys plus values, all heads."""
        if self.k is None:
            raise ValueError("the cache is empty: decode at least one token before reading its size")
        batch, tokens = self.k.size(0), self.k.size(-2)
        return (self.k.numel() + self.v.numel()) // (batch * tokens)

    @property
    def bytes_per_token(self) -> int:
        """Bytes stored per token (per sequence in the batch)."""
        return self.values_per_token * self.k.element_size()


class MultiHeadAttention(nn.Module):
    """Multi-head attention: h heads of width d_k = d_model / h, concatenated and mixed by W_O.

    A drop-in for ``torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True)``:
    the same ``forward`` arguments and mask meanings (a boolean mask is True where
    attention is *forbidden*), returning ``(out, weights)``.

    The projections are stored as one ``qkv_proj`` (``d_model -> 3 d_model``: W_Q,
    W_K, W_V stacked, each head's slice contiguous) and ``out_proj`` (W_O).
    ``head_projections(i)`` gives head i's views into them.

    ``forward`` runs ``torch.nn.functional.scaled_dot_product_attention`` (fused
    kernels) unless ``need_weights=True``, in which case it runs the explicit math of
    :func:`scaled_dot_product_attention` and returns the weights.  Both give the same
    output.
    """

    def __init__(self, d_model: int, n_heads: int, *, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_k = check_head_count(d_model, n_heads)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # Same initialisation as torch.nn.MultiheadAttention, so the two train alike.
        nn.init.xavier_uniform_(self.qkv_proj.weight)
        if self.qkv_proj.bias is not None:
            nn.init.zeros_(self.qkv_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    @property
    def bias(self) -> bool:
        return self.qkv_proj.bias is not None

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, d_k={self.d_k}, bias={self.bias}, dropout={self.dropout}"

    # ----------------------------------------------------------------- heads
    def head_projections(self, i: int) -> HeadProjections:
        """Views of W_Q, W_K, W_V (``[d_model, d_k]``) and W_O (``[d_k, d_model]``) for head ``i``."""
        if not 0 <= i < self.n_heads:
            raise IndexError(f"head index {i} is out of range: this module has heads 0..{self.n_heads - 1}")
        D, dk = self.d_model, self.d_k
        w, b = self.qkv_proj.weight, self.qkv_proj.bias  # w: [3D, D] (rows: outputs)
        rows = [slice(p * D + i * dk, p * D + (i + 1) * dk) for p in range(3)]  # Q, K, V rows of head i
        W_Q, W_K, W_V = (w[r].t() for r in rows)  # each [D, dk]
        b_Q, b_K, b_V = (b[r] for r in rows) if b is not None else (None, None, None)
        W_O = self.out_proj.weight[:, i * dk : (i + 1) * dk].t()  # [dk, D]: head i's columns of W_O
        return HeadProjections(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V)

    def split_heads(self, x: Tensor) -> Tensor:
        """``[B, T, D] -> [B, H, T, dk]``: a view (reshape + transpose), no copy."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # [B, T, H, dk] -> [B, H, T, dk]

    def merge_heads(self, x: Tensor) -> Tensor:
        """``[B, H, T, dk] -> [B, T, D]``: concatenate the heads along the feature axis."""
        B, H, T, dk = x.shape
        return x.transpose(1, 2).reshape(B, T, H * dk)  # [B, T, H, dk] -> [B, T, D]

    # --------------------------------------------------------------- forward
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_attn_weights: bool = True,
        head_mask: Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value`` (self-attention when they are omitted).

        Args:
            query: ``[B, L, D]``.
            key, value: ``[B, S, D]`` for cross-attention; omitted (None) for self-attention.
            key_padding_mask: ``[B, S]``; bool True = ignore that key, or float added to the scores.
            attn_mask: ``[L, S]``, ``[B * H, L, S]`` or ``[B, H, L, S]``; bool True = forbidden,
                or float added to the scores.
            is_causal: forbid attending to later positions (decoder self-attention). Unlike
                torch's module it needs no ``attn_mask`` beside it. When there are more keys than
                queries (decoding with a cache) the queries are the *last* L positions.
            need_weights: also return the attention weights (runs the explicit path). With
                dropout in training mode they are the softmax before dropout (torch's module
                returns them after dropout); in eval mode the two agree.
            average_attn_weights: return weights ``[B, L, S]`` averaged over heads (as torch
                does) instead of ``[B, H, L, S]``.
            head_mask: ``[H]`` or ``[B, H]``, multiplies each head's output before W_O
                (0 switches a head off).
            kv_cache: a :class:`KVCache` for incremental self-attention decoding: the new
                keys/values are appended to it and the queries attend to all of them.

        Returns:
            ``(out, weights)``: ``out`` is ``[B, L, D]``; ``weights`` is None unless
            ``need_weights``.
        """
        self_attention = key is None and value is None
        if self_attention:
            key = value = query
        elif key is None or value is None:
            raise ValueError("pass both key and value for cross-attention, or neither for self-attention")
        if kv_cache is not None and not self_attention:
            raise ValueError("kv_cache is for self-attention decoding; cross-attention keys do not grow")
        self._check_inputs(query, key, value)
        B, L, D = query.shape

        past = 0 if kv_cache is None else len(kv_cache)  # tokens already in the cache
        S = past + key.size(1)  # every key the queries will see

        # Check and build the masks before anything is computed or appended to the cache.
        head_scale = None if head_mask is None else self._check_head_mask(head_mask, B, query)  # [B or 1, H, 1, 1]
        # Only is_causal, over a square score matrix: the fused kernel builds the causal mask itself
        # (and skips the masked blocks). Otherwise all masks become one float tensor added to the scores.
        fused_causal = (
            is_causal and not need_weights and attn_mask is None and key_padding_mask is None and past == 0 and L == S
        )
        mask = None if fused_causal else self._combine_masks(
            B, L, S, past, key_padding_mask, attn_mask, is_causal, query.dtype, query.device
        )  # None, or float [B or 1, H or 1, L, S] added to the scores

        # Project: one matmul for self-attention, three slices of the same weight for cross-attention.
        if self_attention:
            q, k, v = self.qkv_proj(query).split(D, dim=-1)  # 3 x [B, L, D]
        else:
            w_q, w_k, w_v = self.qkv_proj.weight.split(D, dim=0)
            b_q, b_k, b_v = self.qkv_proj.bias.split(D) if self.bias else (None, None, None)
            q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)  # [B, H, T, dk]
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # [B, H, past + L, dk]: the new keys/values join the old ones

        dropout_p = self.dropout if self.training else 0.0

        if need_weights:
            heads, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=dropout_p)
        else:
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=fused_causal)
            weights = None
        # heads: [B, H, L, dk]

        if head_scale is not None:
            heads = heads * head_scale  # switch off or scale whole heads before they are mixed by W_O

        out = self.out_proj(self.merge_heads(heads))  # concat heads -> [B, L, D], then mix with W_O
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # [B, L, S]
        return out, weights

    # -------------------------------------------------------------- checking
    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3:
                raise ValueError(
                    f"{name} must be 3-D [batch, seq, d_model] (batch first), got shape {tuple(t.shape)}; "
                    "add a batch axis with .unsqueeze(0) for a single sequence"
                )
            if t.size(-1) != self.d_model:
                raise ValueError(
                    f"{name} has width {t.size(-1)} in its last dimension, but this module has "
                    f"d_model={self.d_model}; project it to {self.d_model} features or build "
                    f"MultiHeadAttention({t.size(-1)}, n_heads)"
                )
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if key.size(1) != value.size(1):
            raise ValueError(
                f"key and value must have the same length (one value per key), got key length "
                f"{key.size(1)} and value length {value.size(1)}"
            )
        if not (query.size(0) == key.size(0) == value.size(0)):
            raise ValueError(
                f"query, key and value must have the same batch size, got {query.size(0)}, "
                f"{key.size(0)} and {value.size(0)}"
            )

    @staticmethod
    def _as_additive(mask: Tensor, name: str, dtype: torch.dtype, device: torch.device) -> Tensor:
        if mask.device != device:
            raise ValueError(f"{name} is on {mask.device} but the inputs are on {device}; move it with .to({str(device)!r})")
        if mask.dtype == torch.bool:
            # True means "ignore": -inf there, 0 elsewhere.
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
        if mask.is_floating_point():
            return mask.to(dtype)
        raise TypeError(
            f"{name} must be a bool tensor (True = ignore) or a float tensor (added to the scores), "
            f"got dtype {mask.dtype}"
        )

    def _combine_masks(
        self,
        B: int,
        L: int,
        S: int,
        past: int,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        is_causal: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> Tensor | None:
        """All masks as one float tensor broadcastable to ``[B, H, L, S]``, or None if there are none."""
        H = self.n_heads
        for name, mask in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if mask is not None and not isinstance(mask, Tensor):
                raise TypeError(f"{name} must be a tensor (bool: True = ignore, or float: added), got {type(mask).__name__}")
        total: Tensor | None = None
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (B, S):
                raise ValueError(
                    f"key_padding_mask must have shape [batch, key_len] = [{B}, {S}], "
                    f"got {tuple(key_padding_mask.shape)}"
                )
            total = self._as_additive(key_padding_mask, "key_padding_mask", dtype, device)[:, None, None, :]  # [B, 1, 1, S]
        if attn_mask is not None:
            shape = tuple(attn_mask.shape)
            additive = self._as_additive(attn_mask, "attn_mask", dtype, device)
            if shape == (L, S):
                additive = additive[None, None]  # [1, 1, L, S]
            elif shape == (B * H, L, S):
                additive = additive.view(B, H, L, S)  # torch's [B*H, L, S] layout, batch-major
            elif shape == (B, H, L, S):
                pass
            else:
                raise ValueError(
                    f"attn_mask must have shape [L, S] = [{L}, {S}], [batch * n_heads, L, S] = "
                    f"[{B * H}, {L}, {S}] or [batch, n_heads, L, S] = [{B}, {H}, {L}, {S}], got {shape}"
                )
            total = additive if total is None else total + additive
        if is_causal and L > 1:  # (one new token may see every cached key: nothing to mask)
            allowed = causal_mask(L, S, device=device)  # bottom-right aligned when decoding with a cache
            additive = self._as_additive(~allowed, "causal mask", dtype, device)  # [L, S]
            total = additive[None, None] if total is None else total + additive
        elif past > 0 and L > 1:
            raise ValueError(
                "decoding several tokens at once with a kv_cache needs is_causal=True "
                "(otherwise earlier new tokens would see later ones)"
            )
        return total

    def _check_head_mask(self, head_mask: Tensor, B: int, query: Tensor) -> Tensor:
        """``head_mask`` as a ``[B or 1, H, 1, 1]`` multiplier in the query's dtype."""
        H = self.n_heads
        if not isinstance(head_mask, Tensor):
            raise TypeError(f"head_mask must be a tensor of shape [n_heads] or [batch, n_heads], got {type(head_mask).__name__}")
        if head_mask.device != query.device:
            raise ValueError(f"head_mask is on {head_mask.device} but the inputs are on {query.device}")
        shape = tuple(head_mask.shape)
        if shape == (H,):
            return head_mask.view(1, H, 1, 1).to(query.dtype)
        if shape == (B, H):
            return head_mask.view(B, H, 1, 1).to(query.dtype)
        raise ValueError(f"head_mask must have shape [n_heads] = [{H}] or [batch, n_heads] = [{B}, {H}], got {shape}")

    # ------------------------------------------------------------ conversion
    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A ``MultiHeadAttention`` with the same weights as a ``torch.nn.MultiheadAttention``.

        The result is batch first whatever ``m.batch_first`` was.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"from_torch expects a torch.nn.MultiheadAttention, got {type(m).__name__}")
        if not m._qkv_same_embed_dim:
            raise ValueError("from_torch supports only kdim == vdim == embed_dim (one in_proj_weight)")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("from_torch does not support add_bias_kv or add_zero_attn")
        ours = cls(m.embed_dim, m.num_heads, bias=m.in_proj_bias is not None, dropout=m.dropout)
        ours = ours.to(device=m.in_proj_weight.device, dtype=m.in_proj_weight.dtype)
        with torch.no_grad():
            # torch stacks W_Q, W_K, W_V in the same order and layout.
            ours.qkv_proj.weight.copy_(m.in_proj_weight)
            ours.out_proj.weight.copy_(m.out_proj.weight)
            if ours.bias:
                ours.qkv_proj.bias.copy_(m.in_proj_bias)
                ours.out_proj.bias.copy_(m.out_proj.bias)
        return ours

    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention(batch_first=True)`` with the same weights."""
        w = self.qkv_proj.weight
        m = nn.MultiheadAttention(
            self.d_model, self.n_heads, dropout=self.dropout, bias=self.bias, batch_first=True,
            device=w.device, dtype=w.dtype,
        )
        with torch.no_grad():
            m.in_proj_weight.copy_(w)
            m.out_proj.weight.copy_(self.out_proj.weight)
            if self.bias:
                m.in_proj_bias.copy_(self.qkv_proj.bias)
                m.out_proj.bias.copy_(self.out_proj.bias)
        return m
