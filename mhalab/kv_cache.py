"""The KV cache: keys and values kept from earlier tokens, so decoding computes each only once."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache", "layer_caches"]


class KVCache:
    """One attention layer's keys and values so far, ``k``/``v`` ``[B, G, T, dk]`` (only the K/V heads).

    Pass the same cache to every decoding step of one layer; a model keeps one per layer.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.size(-2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``[B, G, T_new, dk]`` keys and values; return all of them so far."""
        if self.k is not None and (k.shape[:2] != self.k.shape[:2] or k.size(-1) != self.k.size(-1)):
            raise ValueError(
                f"cannot append keys of shape {tuple(k.shape)} to a cache holding {tuple(self.k.shape)}: "
                "batch, heads and d_k must match (use a fresh KVCache for a new batch or another layer)"
            )
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)  # [B, G, T + T_new, dk]
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    @property
    def values_per_token(self) -> int:
        """Numbers stored per token (per sequence in the batch): keys plus values, all K/V heads."""
        if self.k is None:
            raise ValueError("the cache is empty: decode at least one token before reading its size")
        return (self.k.numel() + self.v.numel()) // (self.k.size(0) * self.k.size(-2))

    @property
    def bytes_per_token(self) -> int:
        """Bytes stored per token (per sequence in the batch)."""
        return self.values_per_token * self.k.element_size()


def layer_caches(kv_caches: list[KVCache] | None, n_layers: int) -> tuple[int, list[KVCache | None]]:
    """How many tokens the caches already hold (0 without caches), and each layer's cache (or None)."""
    if kv_caches is None:
        return 0, [None] * n_layers
    if len(kv_caches) != n_layers:
        raise ValueError(f"pass one KVCache per layer: expected {n_layers}, got {len(kv_caches)}")
    return len(kv_caches[0]), kv_caches
