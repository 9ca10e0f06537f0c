"""What a computation holds in memory: every tensor its operators create, and the most bytes of them alive at once.

:func:`footprint` runs a function once under a ``TorchDispatchMode`` that sees each operator PyTorch
dispatches, records every *new* storage (not views of what it was given) with the operator, shape and
size, and follows each one until it is freed. That is how notebook 04 shows that the explicit attention
path materialises the ``[B, H, L, S]`` scores and weights while the fused kernel
(``F.scaled_dot_product_attention``) hands back only its output and one number per query and head.

What it cannot see is scratch memory a kernel allocates and frees inside itself (a fused kernel's tiles):
the count is what the operators hand back to PyTorch, exactly and the same on every machine.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["NewTensor", "Footprint", "footprint"]


@dataclass(frozen=True)
class NewTensor:
    """One storage an operator created: ``op`` (e.g. ``"aten._softmax"``), its ``shape``, ``dtype`` and ``bytes``."""

    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    bytes: int


@dataclass(frozen=True)
class Footprint:
    """What one call created: ``tensors`` (every new storage, in order), ``peak_bytes`` (the most bytes of
    them alive at one time) and ``kept_bytes`` (still alive when the call returned: its result, and what
    autograd saved for the backward pass)."""

    tensors: tuple[NewTensor, ...]
    peak_bytes: int
    kept_bytes: int

    @property
    def largest(self) -> NewTensor | None:
        """The biggest tensor the call created (the first of equals), or None if it created none."""
        return max(self.tensors, key=lambda t: t.bytes, default=None)

    def with_shape(self, shape) -> list[NewTensor]:
        """The created tensors of exactly this ``shape`` (e.g. ``(B, H, L, S)``: every score-sized tensor)."""
        shape = tuple(shape)
        return [t for t in self.tensors if t.shape == shape]

    def __repr__(self) -> str:
        return (f"Footprint({len(self.tensors)} new tensors, {sum(t.bytes for t in self.tensors):,} bytes in all, "
                f"peak {self.peak_bytes:,} bytes alive at once, {self.kept_bytes:,} kept)")


class _Tracker(TorchDispatchMode):
    """Records new storages and keeps a running total of the bytes of those still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: list[NewTensor] = []
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, tensors seen that use it]
        self.current = self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:  # the last tensor we saw on this storage is gone, so is the storage
            self.current -= entry[0]
            del self.live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0:
                continue
            if key not in self.live:
                if key in given:  # a view of (or an in-place write to) a tensor from outside the call
                    continue
                self.live[key] = [size, 0]
                self.tensors.append(NewTensor(str(func.overloadpacket), tuple(t.shape), t.dtype, size))
                self.current += size
                self.peak = max(self.peak, self.current)
            self.live[key][1] += 1
            weakref.finalize(t, self._release, key)  # runs when this tensor is freed
        return out


def footprint(fn: Callable[[], Any]) -> tuple[Any, Footprint]:
    """Run ``fn()`` once; return ``(its result, Footprint)`` of the tensors its operators created.

    Sizes are storage bytes, independent of the machine and of timing. Tensors that ``fn`` receives from
    outside (closed over, or arguments bound with ``functools.partial``) are not counted; kernel-internal
    scratch is not seen.
    """
    if not callable(fn):
        raise TypeError(f"footprint needs a function of no arguments, e.g. lambda: layer(x), got {type(fn).__name__}")
    tracker = _Tracker()
    with tracker:
        result = fn()
    return result, Footprint(tuple(tracker.tensors), tracker.peak, tracker.current)
