"""The KV cache: keys and values kept from earlier tokens, so decoding computes each only once."""

from __future__ import annotations

from torch import Tensor

from .arguments import validate_int

__all__ = ["KVCache", "layer_caches", "cache_state"]


class KVCache:
    """One attention layer's keys and values so far, ``k``/``v`` ``[B, G, T, d_head]`` (only the K/V heads).

    Pass the same cache to every decoding step of one layer; a model keeps one per layer. The storage is
    allocated ahead (``max_len`` positions if given, else doubling as it fills), so appending a token copies
    only that token, not everything so far; ``k`` and ``v`` are views of the filled part.
    """

    def __init__(self, max_len: int | None = None) -> None:
        if max_len is not None:
            validate_int("max_len", max_len, 1)
        self.max_len = max_len
        self._k: Tensor | None = None  # [B, G, capacity, d_head]
        self._v: Tensor | None = None
        self._length = 0

    def __len__(self) -> int:
        return self._length

    @property
    def k(self) -> Tensor | None:
        """The keys so far ``[B, G, T, d_head]`` (a view), or None before the first append."""
        return None if self._k is None else self._k.narrow(-2, 0, self._length)

    @property
    def v(self) -> Tensor | None:
        """The values so far ``[B, G, T, d_head]`` (a view), or None before the first append."""
        return None if self._v is None else self._v.narrow(-2, 0, self._length)

    @property
    def capacity(self) -> int:
        """Positions allocated (filled or not)."""
        return 0 if self._k is None else self._k.size(-2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``[B, G, T_new, d_head]`` keys and values; return all of them so far."""
        if self._k is not None and (k.shape[:2] != self._k.shape[:2] or k.size(-1) != self._k.size(-1)):
            raise ValueError(
                f"cannot append keys of shape {tuple(k.shape)} to a cache holding {tuple(self.k.shape)}: "
                "batch, heads and d_head must match (use a fresh KVCache for a new batch or another layer)"
            )
        if k.shape != v.shape:
            raise ValueError(f"keys {tuple(k.shape)} and values {tuple(v.shape)} must have the same shape")
        new_length = self._length + k.size(-2)
        if self.max_len is not None and new_length > self.max_len:
            raise ValueError(f"this KVCache holds at most max_len={self.max_len} positions; appending "
                             f"{k.size(-2)} to {self._length} would make {new_length}: build it with a larger max_len")
        if new_length > self.capacity:
            self._grow(new_length, k, v)
        self._k.narrow(-2, self._length, k.size(-2)).copy_(k)  # only the new positions are copied
        self._v.narrow(-2, self._length, v.size(-2)).copy_(v)
        self._length = new_length
        return self.k, self.v

    def _grow(self, needed: int, k: Tensor, v: Tensor) -> None:
        """Reallocate to hold ``needed`` positions: ``max_len`` if given, else at least double."""
        capacity = self.max_len if self.max_len is not None else max(needed, 2 * self.capacity, 16)
        B, G, _, dk = k.shape
        new_k = k.new_empty(B, G, capacity, dk)  # [B, G, capacity, d_head]
        new_v = v.new_empty(B, G, capacity, dk)
        if self._k is not None:
            new_k.narrow(-2, 0, self._length).copy_(self.k)  # the old positions move once per doubling
            new_v.narrow(-2, 0, self._length).copy_(self.v)
        self._k, self._v = new_k, new_v

    @property
    def values_per_token(self) -> int:
        """Numbers stored per token (per sequence in the batch): keys plus values, all K/V heads."""
        if self._length == 0:
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


def cache_state(kv_cache: KVCache | None, query: Tensor, key: Tensor, *, self_attention: bool,
                is_causal: bool) -> tuple[int, bool]:
    """``(past, reuse_memory)`` for an attention layer called with ``kv_cache``: the tokens already in a
    self-attention cache, and whether a cross-attention cache already holds the memory's keys/values (projected on
    the first call, reused on later ones). ``query [B, L, D]``, ``key [B, S, D]``."""
    if kv_cache is None:
        return 0, False
    if self_attention:
        if query.size(1) > 1 and not is_causal:
            raise ValueError(f"{query.size(1)} tokens at once into a kv_cache need is_causal=True: a cache holds "
                             "a causal decoder's keys; without the mask, earlier tokens would see later ones")
        return len(kv_cache), False
    if len(kv_cache) == 0:
        return 0, False
    if key.size(1) != len(kv_cache) or key.size(0) != kv_cache.k.size(0):
        raise ValueError(f"this cross-attention kv_cache holds the keys of a memory [batch {kv_cache.k.size(0)}, "
                         f"length {len(kv_cache)}], but key is [batch {key.size(0)}, length {key.size(1)}]: "
                         "use a fresh KVCache for each new encoder output")
    return 0, True
