"""The hook point: an identity layer that names one activation, so hooks can read or replace it.

Kept in a module of its own so that attention, models and hooks can all import it without cycles.
Names, axes and the calls that use them are in :mod:`mhalab.hooks`.
"""

from __future__ import annotations

import re
from typing import Callable, Union

from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

__all__ = ["HookPoint", "HookFn", "name_hook_points"]

#: A hook function ``fn(activation, hook)``: ``hook`` is the :class:`HookPoint` (``hook.name``); it returns a
#: replacement of the same shape, or None to leave the activation as it is.
HookFn = Callable[[Tensor, "HookPoint"], Union[Tensor, None]]


class HookPoint(nn.Module):
    """An identity layer that names an activation (``blocks.0.attn.hook_pattern``), as in TransformerLens.

    ``name`` is the full dotted path from the model the hooks are attached to; :func:`mhalab.hooks.hook_points`
    sets it (None until then). ``is_hooked`` tells whether anything is attached, so a layer can skip work
    (the attention pattern) that nobody reads.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name: str | None = None

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
        """True when a forward hook is attached (someone reads or replaces this activation)."""
        return bool(self._forward_hooks)

    def layer(self) -> int | None:
        """The block index in ``name`` (``blocks.3.attn.hook_q`` -> 3), or None for ``hook_embed``."""
        found = re.search(r"\.(\d+)\.", f".{self.name or ''}.")
        return int(found.group(1)) if found else None

    def add_hook(self, fn: HookFn) -> RemovableHandle:
        """Attach ``fn(activation, hook)``; returns a handle whose ``remove()`` takes it off again."""
        if not callable(fn):
            raise TypeError(f"a hook must be a function fn(activation, hook), got {type(fn).__name__}")

        def call(module: nn.Module, inputs: tuple, output: Tensor) -> Tensor | None:
            replaced = fn(output, self)
            if replaced is not None:
                if not isinstance(replaced, Tensor):
                    raise TypeError(f"the hook on {self.name} returned {type(replaced).__name__}; "
                                    "return a tensor of the same shape, or None to keep the activation")
                if replaced.shape != output.shape:
                    raise ValueError(f"the hook on {self.name} returned shape {tuple(replaced.shape)}, "
                                     f"expected {tuple(output.shape)}")
            return replaced

        return self.register_forward_hook(call)

    def extra_repr(self) -> str:
        return "" if self.name is None else repr(self.name)


def name_hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Give every :class:`HookPoint` of ``model`` its full name; returns them by name, in the model's order."""
    points = {name: module for name, module in model.named_modules() if isinstance(module, HookPoint)}
    for name, point in points.items():
        point.name = name
    return points
