"""One way to look inside any model: named activations, read with a cache or changed by hooks.

Every :class:`~mhalab.attention.MultiHeadAttention` holds two hook points, named by its place::

    blocks.0.attn.pattern   attention weights      [batch, head, query, key]
    blocks.0.attn.z         each head's output     [batch, query, head, d_head]  (before W_O)

(an encoder-decoder has ``encoder.0.attn``, ``decoder.0.self_attn`` and ``decoder.0.cross_attn``)::

    logits, cache = run_with_cache(model, tokens, names="*.pattern")   # cache["blocks.0.attn.pattern"]
    logits = run_with_hooks(model, tokens, hooks=[("blocks.1.attn.z", ablate_heads([3]))])

A hook ``hook(activation, name)`` returns a replacement of the same shape, or None to keep it.
"""

from __future__ import annotations

import contextlib
import fnmatch
from functools import partial
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

import torch
from torch import Tensor, nn

from .attention import HookPoint, MultiHeadAttention

__all__ = [
    "Hook", "hook_points", "attention_modules", "hooks_attached", "run_with_hooks", "run_with_cache",
    "ablate_heads", "gate_heads",
]

Hook = Callable[[Tensor, str], Union[Tensor, None]]
Names = Union[None, str, Sequence[str], Callable[[str], bool]]


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by name, in the order the model holds them."""
    return {name: module for name, module in model.named_modules() if isinstance(module, HookPoint)}


def attention_modules(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """Every attention layer of ``model`` by name (``blocks.0.attn``, ...), in order."""
    found = {name: module for name, module in model.named_modules() if isinstance(module, MultiHeadAttention)}
    if not found:
        raise ValueError(f"{type(model).__name__} holds no mhalab.MultiHeadAttention, so it has no attention to look at")
    return found


def _select(model: nn.Module, names: Names, available: list[str]) -> list[str]:
    """The hook-point names that ``names`` picks: None = all; a name or glob; a list of them; a predicate."""
    if names is None:
        return available
    if callable(names):
        return [n for n in available if names(n)]
    chosen: list[str] = []
    for pattern in [names] if isinstance(names, str) else names:
        if not isinstance(pattern, str):
            raise TypeError(f"a hook-point name must be a str such as 'blocks.0.attn.pattern', got {pattern!r}")
        matched = fnmatch.filter(available, pattern)
        if not matched:
            shown = ", ".join(available[:6]) + (", ..." if len(available) > 6 else "")
            raise KeyError(f"no hook point of {type(model).__name__} matches {pattern!r}; it has {len(available)}: {shown}")
        chosen += [n for n in matched if n not in chosen]
    return chosen


@contextlib.contextmanager
def hooks_attached(model: nn.Module, hooks: Iterable[tuple[Any, Hook]]) -> Iterator[None]:
    """Attach ``(names, hook)`` pairs for the ``with`` body, and remove them after (also on error).

    ``names`` is a hook-point name, a glob (``"blocks.*.attn.z"``), a list of them or a predicate.
    """
    points = hook_points(model)
    with contextlib.ExitStack() as attached:  # removes every handle on leaving, also on error
        for names, hook in hooks:
            if not callable(hook):
                raise TypeError(f"a hook must be a function hook(activation, name), got {type(hook).__name__}")
            for name in _select(model, names, list(points)):
                attached.enter_context(points[name].register_forward_hook(partial(_call_hook, hook, name)))
        yield


def _call_hook(hook: Hook, name: str, module: nn.Module, inputs: tuple, output: Tensor) -> Tensor | None:
    replaced = hook(output, name)
    if replaced is not None and replaced.shape != output.shape:
        raise ValueError(f"the hook on {name} returned shape {tuple(replaced.shape)}, expected {tuple(output.shape)}")
    return replaced


def run_with_hooks(model: nn.Module, *args: Any, hooks: Iterable[tuple[Any, Hook]], **kwargs: Any) -> Any:
    """``model(*args, **kwargs)`` with ``hooks`` attached for this one call."""
    with hooks_attached(model, hooks):
        return model(*args, **kwargs)


def run_with_cache(
    model: nn.Module, *args: Any, names: Names = None, hooks: Iterable[tuple[Any, Hook]] = (), **kwargs: Any
) -> tuple[Any, dict[str, Tensor]]:
    """``model(*args, **kwargs)`` and a dict of the activations ``names`` picks (all by default).

    No gradients; the model's train/eval mode is left as it is. Extra ``hooks`` run before their
    point is cached, so the cache shows what the model used.
    """
    cache: dict[str, Tensor] = {}

    def store(activation: Tensor, name: str) -> None:
        cache[name] = activation.detach()

    chosen = _select(model, names, list(hook_points(model)))
    with torch.no_grad(), hooks_attached(model, [*hooks, (chosen, store)]):
        output = model(*args, **kwargs)
    return output, {name: cache[name] for name in chosen if name in cache}


def ablate_heads(heads: Sequence[int], means: Tensor | None = None) -> Hook:
    """A hook for a ``z`` point ``[B, L, H, dk]`` that makes heads ``heads`` output zero, or ``means``.

    ``means`` is ``[H, d_head]`` or ``[L, H, d_head]`` (e.g. each head's mean output over a reference
    batch): mean ablation removes what a head says about *this* input, not its average contribution.
    """
    index = torch.as_tensor(heads, dtype=torch.long).flatten()

    def hook(z: Tensor, name: str) -> Tensor:  # z: [B, L, H, dk]
        if index.numel() and not (0 <= int(index.min()) and int(index.max()) < z.size(2)):
            raise IndexError(f"{name} has heads 0..{z.size(2) - 1}; cannot ablate heads {index.tolist()}")
        if means is not None and means.dim() == 3 and means.size(0) != z.size(1):
            raise ValueError(
                f"mean ablation on {name}: the means are per position for sequences of length {means.size(0)}, "
                f"but this input has length {z.size(1)}; take the means on a reference batch of the same length"
            )
        z = z.clone()
        z[:, :, index] = 0.0 if means is None else means[..., index, :].to(z)  # [(L,) len(heads), dk] broadcast
        return z

    return hook


def gate_heads(gates: Tensor) -> Hook:
    """A hook for a ``z`` point that multiplies each head's output by its gate, ``gates [H]`` or ``[B, H]``.

    A gate that requires grad gives ``dL/d gate``: Michel et al.'s (2019) head importance.
    """

    def hook(z: Tensor, name: str) -> Tensor:  # z: [B, L, H, dk]
        B, _, H, _ = z.shape
        if gates.shape not in ((H,), (B, H)):
            raise ValueError(f"gates for {name} must be [n_heads] = [{H}] or [batch, n_heads] = [{B}, {H}], got {tuple(gates.shape)}")
        return z * gates.view(-1, 1, H, 1).to(device=z.device, dtype=z.dtype)  # gates as [1 or B, 1, H, 1]

    return hook
