"""Hooks that act on chosen heads, at a hook point whose axes hold the heads (:mod:`mhalab.hooks` lists every
point's axes): :func:`ablate_heads` (a head's output set to zero, or to its mean), :func:`gate_heads` (each head's
output times a gate, whose gradient is the head's importance) and :func:`patch_heads` (heads copied from a clean
run into a corrupted one). Each returns a hook ``fn(activation, hook=point)`` for ``model.run_with_hooks`` or
``model.hooks``::

    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", ablate_heads([3]))])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from .hook_points import HookFn, HookPoint

__all__ = ["ablate_heads", "gate_heads", "patch_heads"]


def _head_axis(hook: HookPoint) -> int:
    """Where the heads are: 2 in ``[B, pos, head, d_head]`` points, 1 in ``[B, head, query_pos, key_pos]``."""
    point = (hook.name or "").rsplit(".", 1)[-1]
    if point in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_rot_q", "hook_rot_k"):
        return 2
    if point in ("hook_pattern", "hook_attn_scores"):
        return 1
    raise ValueError(f"{hook.name} has no head axis; heads live in an attention layer's hook_q, hook_k, hook_v, "
                     "hook_rot_q, hook_rot_k, hook_z, hook_attn_scores and hook_pattern")


def _head_index(heads: Sequence[int], hook: HookPoint, activation: Tensor, axis: int) -> Tensor:
    index = torch.as_tensor(heads, dtype=torch.long).flatten()
    if index.numel() and not (0 <= int(index.min()) and int(index.max()) < activation.size(axis)):
        raise IndexError(f"{hook.name} has heads 0..{activation.size(axis) - 1}; cannot use heads {index.tolist()}")
    return index.to(activation.device)


def ablate_heads(heads: Sequence[int], means: Tensor | None = None) -> HookFn:
    """A hook for a ``hook_z`` point ``[B, pos, H, d_head]`` that makes heads ``heads`` output zero, or ``means``.

    ``means`` is ``[H, d_head]`` or ``[pos, H, d_head]`` (e.g. each head's mean output over a reference
    batch): mean ablation removes what a head says about *this* input, not its average contribution.
    """

    def hook_fn(z: Tensor, hook: HookPoint) -> Tensor:  # z: [B, pos, H, d_head]
        if _head_axis(hook) != 2:
            raise ValueError(f"ablate_heads works on [batch, pos, head, d_head] points such as hook_z, not {hook.name}")
        index = _head_index(heads, hook, z, 2)
        if means is not None and means.dim() == 3 and means.size(0) != z.size(1):
            raise ValueError(
                f"mean ablation on {hook.name}: the means are per position for sequences of length {means.size(0)}, "
                f"but this input has length {z.size(1)}; take the means on a reference batch of the same length"
            )
        z = z.clone()
        z[:, :, index] = 0.0 if means is None else means.to(z)[..., index, :]  # [(pos,) len(heads), d_head] broadcast
        return z

    return hook_fn


def gate_heads(gates: Tensor) -> HookFn:
    """A hook for a ``hook_z`` point that multiplies each head's output by its gate, ``gates [H]`` or ``[B, H]``.

    A gate that requires grad gives ``dL/d gate``: Michel et al.'s (2019) head importance.
    """

    def hook_fn(z: Tensor, hook: HookPoint) -> Tensor:  # z: [B, pos, H, d_head]
        B, _, H, _ = z.shape
        if gates.shape not in ((H,), (B, H)):
            raise ValueError(f"gates for {hook.name} must be [n_heads] = [{H}] or [batch, n_heads] = [{B}, {H}], "
                             f"got {tuple(gates.shape)}")
        return z * gates.view(-1, 1, H, 1).to(device=z.device, dtype=z.dtype)  # gates as [1 or B, 1, H, 1]

    return hook_fn


def patch_heads(clean: Tensor | Mapping[str, Tensor], heads: Sequence[int]) -> HookFn:
    """A hook that copies heads ``heads`` of an activation from a clean run into this (corrupted) run.

    ``clean`` is that point's clean activation, or a cache of the clean run (the hook reads ``clean[hook.name]``,
    so one hook serves many points). Works on ``hook_q``, ``hook_k``, ``hook_v``, ``hook_rot_q``, ``hook_rot_k``,
    ``hook_z`` (heads on axis 2) and ``hook_attn_scores``, ``hook_pattern`` (axis 1). With grouped-query
    attention the heads of ``hook_k``/``hook_v`` are K/V heads: patching K/V head g changes every query head
    that reads it (``g * H // G`` to ``(g + 1) * H // G - 1``).
    """

    def hook_fn(activation: Tensor, hook: HookPoint) -> Tensor:
        source = clean[hook.name] if isinstance(clean, Mapping) else clean
        if not isinstance(source, Tensor) or source.shape != activation.shape:
            got = tuple(source.shape) if isinstance(source, Tensor) else type(source).__name__
            raise ValueError(f"patch_heads on {hook.name}: the clean activation is {got}, this run's is "
                             f"{tuple(activation.shape)}; run both with inputs of the same shape")
        axis = _head_axis(hook)
        index = _head_index(heads, hook, activation, axis)
        patched = activation.clone()
        patched.index_copy_(axis, index, source.to(activation).index_select(axis, index))
        return patched

    return hook_fn
