"""The KV cache: keys and values kept from earlier tokens, so decoding computes each only once."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache"]


class KVCache:
    """The keys and values one attention layer has already computed, for token-by-token decoding.

    ``k`` and ``v`` are ``[B, G, T, dk]`` after ``T`` tokens: only the K/V heads are
    stored (G = H for multi-head attention, fewer with grouped-query attention).  Pass the
    same cache to every decoding step of one layer; a model keeps one per layer.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.size(-2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``[B, G, T_new, dk]`` keys and values; return all of them so far."""
        if self.k is None:
            self.k, self.v = k, v
        else:
            if k.shape[:2] != self.k.shape[:2] or k.size(-1) != self.k.size(-1):
                raise ValueError(
                    f"cannot append keys of shape {tuple(k.shape)} to a cache holding "
                    f"{tuple(self.k.shape)}: batch, heads and d_k must match (use a fresh KVCache "
                    "for a new batch or another layer)"
                )
            self.k = torch.cat([self.k, k], dim=-2)  # [B, G, T + T_new, dk]
            self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def reset(self) -> None:
        self.k = self.v = None

    @property
    def values_per_token(self) -> int:
        """Numbers stored per token (per sequence in the batch): keys plus values, all K/V heads."""
        if self.k is None:
            raise ValueError("the cache is empty: decode at least one token before reading its size")
        batch, tokens = self.k.size(0), self.k.size(-2)
        return (self.k.numel() + self.v.numel()) // (batch * tokens)

    @property
    def bytes_per_token(self) -> int:
        """Bytes stored per token (per sequence in the batch)."""
        return self.values_per_token * self.k.element_size()
