"""Masks: which keys a query may see, in the two conventions PyTorch uses, each helper named by what True means.

- ``F.scaled_dot_product_attention`` and :func:`mhalab.dot_product_attention.scaled_dot_product_attention`: bool True =
  **may attend** (:func:`causal_allowed_mask`).
- ``torch.nn.MultiheadAttention`` and :class:`mhalab.MultiHeadAttention` (``attn_mask``, ``key_padding_mask``):
  bool True = **forbidden** (:func:`causal_forbidden_mask`, :func:`forbidden_as_additive`,
  :func:`combine_forbidden_masks`). :func:`validate_forbidden_mask` refuses a mask that is plainly the other one.

Float masks are added to the scores in both.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "causal_allowed_mask", "causal_forbidden_mask", "forbidden_as_additive", "combine_forbidden_masks",
    "validate_forbidden_mask",
]

_CONVENTIONS = (
    "MultiHeadAttention reads a bool mask as torch.nn.MultiheadAttention does, True = forbidden; a mask with "
    "True = may attend is F.scaled_dot_product_attention's convention (mhalab.masks.causal_allowed_mask). "
)


def causal_allowed_mask(
    query_len: int, key_len: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Boolean ``[L, S]``, True where query i **may attend** to key j (j <= i): for ``scaled_dot_product_attention``.

    With ``key_len > query_len`` the queries are the *last* ones (decoding with a KV cache).
    """
    key_len = query_len if key_len is None else key_len
    rows = torch.arange(query_len, device=device)[:, None] + (key_len - query_len)  # absolute query positions
    return torch.arange(key_len, device=device)[None, :] <= rows


def causal_forbidden_mask(
    query_len: int, key_len: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Boolean ``[L, S]``, True where query i is **forbidden** key j (j > i): for ``MultiHeadAttention(attn_mask=)``.

    The complement of :func:`causal_allowed_mask`; ``is_causal=True`` does the same without a tensor.
    """
    return ~causal_allowed_mask(query_len, key_len, device=device)


def forbidden_as_additive(mask: Tensor, name: str, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A bool (True = forbidden) or float mask as float scores to add: ``-inf`` where forbidden."""
    if not isinstance(mask, Tensor):
        kind = type(mask).__name__
        raise TypeError(f"{name} must be a tensor (bool: True = forbidden, or float: added), got {kind}")
    if mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but the inputs are on {device}; "
                         f"move it with .to({str(device)!r})")
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(mask, float("-inf"))
    if mask.is_floating_point():
        return mask.to(dtype)
    raise TypeError(
        f"{name} must be a bool tensor (True = forbidden) or a float tensor (added to the scores), "
        f"got dtype {mask.dtype}"
    )


def validate_forbidden_mask(mask: Tensor, name: str, L: int, S: int, *, self_attention: bool) -> None:
    """Refuse a bool ``attn_mask [..., L, S]`` or ``key_padding_mask [B, S]`` that is plainly True = may attend.

    Plainly: it forbids some query every key (a whole row), or, in self-attention, every query its own
    position. A float mask is never refused (``-inf`` says what it means). Shapes are checked elsewhere.
    """
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.numel() == 0:
        return
    float_hint = (f"If you do mean to forbid these, pass a float mask with -inf there "
                  f"(e.g. torch.zeros({list(mask.shape)}).masked_fill(mask, float('-inf'))).")
    if name == "key_padding_mask":
        if mask.dim() == 2 and bool(mask.all(dim=-1).any()):
            b = int(mask.all(dim=-1).nonzero()[0, 0])
            raise ValueError(
                f"key_padding_mask marks every key of sequence {b} as padding, so its queries could see nothing. "
                f"{_CONVENTIONS}key_padding_mask is True = padding; a Hugging Face attention_mask (1 = real token) "
                f"is the opposite: pass attention_mask == 0. {float_hint}"
            )
        return
    if mask.dim() < 2 or mask.shape[-2:] != (L, S):
        return  # the shape check names the right shapes
    if bool(mask.all(dim=-1).any()):
        raise ValueError(
            f"{name} forbids some query every key (a whole row of the [{L}, {S}] mask is True). {_CONVENTIONS}"
            f"Pass ~mask, or causal_forbidden_mask({L}, {S}), or is_causal=True. {float_hint}"
        )
    if self_attention and L <= S:
        queries = torch.arange(L, device=mask.device)
        own = mask[..., queries, queries + (S - L)]  # [..., L]: each query's own position (queries are the last L)
        if bool(own.all()):
            raise ValueError(
                f"{name} forbids every query its own position. {_CONVENTIONS}"
                f"Pass ~mask, or causal_forbidden_mask({L}, {S}), or is_causal=True. {float_hint}"
            )


def combine_forbidden_masks(
    B: int, H: int, L: int, S: int, key_padding_mask: Tensor | None, attn_mask: Tensor | None,
    is_causal: bool, dtype: torch.dtype, device: torch.device,
) -> Tensor | None:
    """``torch.nn.MultiheadAttention``'s masks (True = forbidden) as one float tensor broadcastable to
    ``[B, H, L, S]``, or None."""
    parts = []
    if key_padding_mask is not None:
        padding = forbidden_as_additive(key_padding_mask, "key_padding_mask", dtype, device)
        if padding.shape != (B, S):
            raise ValueError(
                f"key_padding_mask must have shape [batch, key_len] = [{B}, {S}], got {tuple(padding.shape)}"
            )
        parts.append(padding[:, None, None, :])  # [B, 1, 1, S]
    if attn_mask is not None:
        additive = forbidden_as_additive(attn_mask, "attn_mask", dtype, device)
        if additive.shape not in ((L, S), (B * H, L, S), (B, H, L, S)):
            raise ValueError(
                f"attn_mask must have shape [L, S] = [{L}, {S}], [batch * n_heads, L, S] = "
                f"[{B * H}, {L}, {S}] or [batch, n_heads, L, S] = [{B}, {H}, {L}, {S}], got {tuple(additive.shape)}"
            )
        # [L, S] -> [1, 1, L, S]; torch's [B*H, L, S] (batch-major) -> [B, H, L, S]
        parts.append(additive.view(1, 1, L, S) if additive.dim() == 2 else additive.view(B, H, L, S))
    if is_causal and L > 1:  # (one new token may see every cached key: nothing to mask)
        causal = causal_forbidden_mask(L, S, device=device)  # [L, S]
        later = forbidden_as_additive(causal, "causal mask", dtype, device)
        parts.append(later.view(1, 1, L, S))
    return sum(parts[1:], parts[0]) if parts else None
