"""Masks: which keys a query may see, in the two conventions PyTorch uses.

:func:`causal_mask` answers in ``F.scaled_dot_product_attention``'s convention (True = may
attend); :func:`combine_masks` takes ``torch.nn.MultiheadAttention``'s (True = forbidden) and
turns every mask into one float tensor added to the scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask", "as_additive", "combine_masks"]


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


def as_additive(mask: Tensor, name: str, dtype: torch.dtype, device: torch.device) -> Tensor:
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



def combine_masks(
    B: int,
    H: int,
    L: int,
    S: int,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    is_causal: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor | None:
    """All masks of ``torch.nn.MultiheadAttention.forward`` (bool True = forbidden, or float added)
    as one float tensor broadcastable to ``[B, H, L, S]``, or None if there are none."""
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
        total = as_additive(key_padding_mask, "key_padding_mask", dtype, device)[:, None, None, :]  # [B, 1, 1, S]
    if attn_mask is not None:
        shape = tuple(attn_mask.shape)
        additive = as_additive(attn_mask, "attn_mask", dtype, device)
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
        additive = as_additive(~allowed, "causal mask", dtype, device)  # [L, S]
        total = additive[None, None] if total is None else total + additive
    return total
