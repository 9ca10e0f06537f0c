"""Masks: which keys a query may see, in the two conventions PyTorch uses.

:func:`causal_mask` answers in ``F.scaled_dot_product_attention``'s convention (True = may attend);
:func:`combine_masks` takes ``torch.nn.MultiheadAttention``'s (True = forbidden) and adds them up.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask", "as_additive", "combine_masks"]


def causal_mask(query_len: int, key_len: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``[L, S]`` mask, True where query i may attend to key j (j <= i).

    With ``key_len > query_len`` the queries are the *last* ones (decoding with a KV cache).
    """
    key_len = query_len if key_len is None else key_len
    rows = torch.arange(query_len, device=device)[:, None] + (key_len - query_len)  # absolute query positions
    return torch.arange(key_len, device=device)[None, :] <= rows


def as_additive(mask: Tensor, name: str, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A bool (True = ignore) or float mask as float scores to add: ``-inf`` where ignored."""
    if not isinstance(mask, Tensor):
        kind = type(mask).__name__
        raise TypeError(f"{name} must be a tensor (bool: True = ignore, or float: added), got {kind}")
    if mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but the inputs are on {device}; move it with .to({str(device)!r})")
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(mask, float("-inf"))
    if mask.is_floating_point():
        return mask.to(dtype)
    raise TypeError(
        f"{name} must be a bool tensor (True = ignore) or a float tensor (added to the scores), got dtype {mask.dtype}"
    )


def combine_masks(
    B: int, H: int, L: int, S: int, key_padding_mask: Tensor | None, attn_mask: Tensor | None,
    is_causal: bool, dtype: torch.dtype, device: torch.device,
) -> Tensor | None:
    """``torch.nn.MultiheadAttention``'s masks as one float tensor broadcastable to ``[B, H, L, S]``, or None."""
    parts = []
    if key_padding_mask is not None:
        padding = as_additive(key_padding_mask, "key_padding_mask", dtype, device)
        if padding.shape != (B, S):
            raise ValueError(
                f"key_padding_mask must have shape [batch, key_len] = [{B}, {S}], got {tuple(padding.shape)}"
            )
        parts.append(padding[:, None, None, :])  # [B, 1, 1, S]
    if attn_mask is not None:
        additive = as_additive(attn_mask, "attn_mask", dtype, device)
        if additive.shape not in ((L, S), (B * H, L, S), (B, H, L, S)):
            raise ValueError(
                f"attn_mask must have shape [L, S] = [{L}, {S}], [batch * n_heads, L, S] = "
                f"[{B * H}, {L}, {S}] or [batch, n_heads, L, S] = [{B}, {H}, {L}, {S}], got {tuple(additive.shape)}"
            )
        # [L, S] -> [1, 1, L, S]; torch's [B*H, L, S] (batch-major) -> [B, H, L, S]
        parts.append(additive.view(1, 1, L, S) if additive.dim() == 2 else additive.view(B, H, L, S))
    if is_causal and L > 1:  # (one new token may see every cached key: nothing to mask)
        later = as_additive(~causal_mask(L, S, device=device), "causal mask", dtype, device)  # [L, S]
        parts.append(later.view(1, 1, L, S))
    return sum(parts[1:], parts[0]) if parts else None
