"""The hook point: an identity layer that names one activation, so hooks can read or replace it.

Kept in a module of its own so that attention, models and hooks can all import it without cycles.
Names, axes and the calls that use them are in :mod:`mhalab.hooks`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

__all__ = ["HookPoint", "HookFn", "LensHandle", "name_hook_points"]

#: A hook function ``fn(activation, *, hook)``, called with ``hook=`` the :class:`HookPoint` (``hook.name``), as
#: TransformerLens calls it; it returns a replacement of the same shape, or None to leave the activation as it is.
HookFn = Callable[..., Tensor | None]


@dataclass
class LensHandle:
    """One attached hook, as TransformerLens keeps it: torch's handle, whether ``reset_hooks`` spares it
    (``is_permanent``) and the ``model.hooks()`` context that added it (``context_level``)."""

    hook: RemovableHandle
    is_permanent: bool = False
    context_level: int | None = None


def _validate_hook_fn(fn: Any, where: str | None) -> None:
    """Refuse a hook that cannot be called as ``fn(activation, hook=point)``, before any model runs."""
    if not callable(fn):
        raise TypeError(f"a hook must be a function fn(activation, hook), got {type(fn).__name__}")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    takes_hook = "hook" in params and params["hook"].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not takes_hook and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        named = ", ".join(params) or "no parameters"
        raise TypeError(f"hooks are called as fn(activation, hook=point), as in TransformerLens, so the hook's second "
                        f"parameter must be named 'hook'; {getattr(fn, '__name__', 'this hook')} takes ({named})"
                        + (f" (attaching to {where})" if where else ""))


class HookPoint(nn.Module):
    """An identity layer that names an activation (``blocks.0.attn.hook_pattern``), as in TransformerLens.

    ``name`` is the full dotted path from the model the hooks are attached to; :func:`mhalab.hooks.hook_points`
    sets it (None until then). ``is_hooked`` tells whether anything is attached, so a layer can skip work
    (the attention pattern) that nobody reads. ``ctx`` is a dict hooks may keep state in between calls
    (emptied by ``model.reset_hooks()``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.name: str | None = None
        self.fwd_hooks: list[LensHandle] = []
        self.bwd_hooks: list[LensHandle] = []
        self.ctx: dict = {}

    def forward(self, x: Tensor) -> Tensor:
        return x

    def __call__(self, x: Tensor) -> Tensor:
        # Unhooked, a point is one attribute test: nn.Module.__call__'s bookkeeping, paid ~400 times per
        # token by SmolLM2, is skipped (any hook, also torch's global ones, takes the ordinary path).
        if not (self._forward_hooks or self._forward_pre_hooks or _module._global_forward_hooks
                or _module._global_forward_pre_hooks):
            return x
        return super().__call__(x)

    @property
    def is_hooked(self) -> bool:
        """True when a hook is attached (someone reads or replaces this activation, or its gradient)."""
        return bool(self._forward_hooks)

    def layer(self) -> int | None:
        """The block index in ``name`` (``blocks.3.attn.hook_q`` -> 3), or None for ``hook_embed``."""
        found = re.search(r"\.(\d+)\.", f".{self.name or ''}.")
        return int(found.group(1)) if found else None

    def add_hook(self, hook: HookFn, dir: Literal["fwd", "bwd"] = "fwd", is_permanent: bool = False,
                 level: int | None = None, prepend: bool = False) -> RemovableHandle:
        """Attach ``hook(activation, hook=self)`` (``dir="fwd"``) or ``hook(gradient, hook=self)`` (``"bwd"``, the
        gradient of this activation, during ``backward()``); returns a handle whose ``remove()`` takes it off."""
        _validate_hook_fn(hook, self.name)
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        alive = [True]

        def call(module: nn.Module, inputs: tuple, output: Tensor) -> Tensor | None:
            if dir == "bwd":
                if output.requires_grad:  # the gradient hook lives with this run's graph, while attached
                    output.register_hook(lambda grad: self._checked(hook(grad, hook=self), grad) if alive[0] else None)
                return None
            return self._checked(hook(output, hook=self), output)

        handle = self.register_forward_hook(call, prepend=prepend)
        handle_remove = handle.remove

        def remove() -> None:
            alive[0] = False
            handle_remove()

        handle.remove = remove  # type: ignore[method-assign]
        hooks = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
        lens = LensHandle(handle, is_permanent, level)
        hooks.insert(0, lens) if prepend else hooks.append(lens)
        return handle

    def _checked(self, replaced: Any, original: Tensor) -> Tensor | None:
        if replaced is not None:
            if not isinstance(replaced, Tensor):
                raise TypeError(f"the hook on {self.name} returned {type(replaced).__name__}; "
                                "return a tensor of the same shape, or None to keep the activation")
            if replaced.shape != original.shape:
                raise ValueError(f"the hook on {self.name} returned shape {tuple(replaced.shape)}, "
                                 f"expected {tuple(original.shape)}")
        return replaced

    def remove_hooks(self, dir: Literal["fwd", "bwd", "both"] = "fwd", including_permanent: bool = False,
                     level: int | None = None) -> None:
        """Remove hooks (TransformerLens's rules): all but permanent ones, or only those of context ``level``."""
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        for kind in ("fwd", "bwd"):
            if dir in (kind, "both"):
                kept = []
                for handle in getattr(self, f"{kind}_hooks"):
                    if including_permanent or (not handle.is_permanent and level in (None, handle.context_level)):
                        handle.hook.remove()
                    else:
                        kept.append(handle)
                setattr(self, f"{kind}_hooks", kept)

    def clear_context(self) -> None:
        """Empty ``ctx``."""
        self.ctx = {}

    def extra_repr(self) -> str:
        return "" if self.name is None else repr(self.name)


def name_hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Give every :class:`HookPoint` of ``model`` its full name; returns them by name, in the model's order."""
    points = {name: module for name, module in model.named_modules() if isinstance(module, HookPoint)}
    for name, point in points.items():
        point.name = name
    return points
