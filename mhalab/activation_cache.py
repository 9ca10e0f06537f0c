"""The activations of one run, by hook-point name: what ``model.run_with_cache`` returns (TransformerLens's
``ActivationCache``: ``cache["pattern", 0]``, ``stack_activation``, ``accumulated_resid``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .hook_names import describe, get_act_name, hook_aliases

__all__ = ["ActivationCache"]


@dataclasses.dataclass(eq=False, repr=False)  # a record of its fields: it travels to a grading kernel as configs do
class ActivationCache(Mapping):
    """Activations by full name, read as ``cache["blocks.0.attn.hook_pattern"]``, ``cache["pattern", 0]`` (short
    name and layer, :func:`~mhalab.hook_names.get_act_name`; a negative layer counts from the last), a
    TransformerLens 3 alias (``cache["blocks.0.hook_in"]``) or ``cache["hook_embed"]``. Activations are detached.

    ``cache_dict`` is the plain ``{name: tensor}`` dict; ``model`` the model it came from (None for a cache built
    by hand: then the layers are counted from the names and TransformerLens 3 aliases are not read).
    """

    cache_dict: dict[str, Tensor]
    model: nn.Module | None = None
    has_batch_dim: bool = True

    def __post_init__(self) -> None:
        self._aliases: dict[str, str] | None = None

    @property
    def _model_name(self) -> str:
        return "the model" if self.model is None else type(self.model).__name__

    def _n_layers(self) -> int:
        if self.model is None:
            names = self.cache_dict
        else:
            names = (n for n, _ in self.model.named_modules())
        layers = {int(m.group(1)) for n in names if (m := re.match(r"blocks\.(\d+)(?:\.|$)", n))}
        return max(layers) + 1 if layers else 0

    def _resolve(self, key: Any) -> str:
        if isinstance(key, str):
            if key in self.cache_dict:
                return key
            if self._aliases is None:
                self._aliases = {} if self.model is None else hook_aliases(self.model)
            return self._aliases.get(key) or get_act_name(key)
        if isinstance(key, tuple) and 1 <= len(key) <= 3:
            name, *rest = key
            layer = rest[0] if rest else None
            if isinstance(layer, int) and layer < 0:
                layer = self._n_layers() + layer
            return get_act_name(name, layer, rest[1] if len(rest) > 1 else None)
        raise TypeError(f"index a cache with a name ('blocks.0.attn.hook_pattern') or (short name, layer) "
                        f"such as ('pattern', 0), got {key!r}")

    def __getitem__(self, key: Any) -> Tensor:
        try:
            name = self._resolve(key)
        except ValueError as error:
            raise KeyError(f"{key!r}: {error}") from None
        if name in self.cache_dict:
            return self.cache_dict[name]
        suffix = name.split(".")[-1]
        layer = re.match(r"blocks\.(\d+)\.", name)
        nearby = [n for n in self.cache_dict
                  if n.endswith(f".{suffix}") and (layer is None or f".{layer.group(1)}." in n)]
        hint = f"; the {suffix} points at that layer are {', '.join(nearby)} (read them by full name)" if nearby else ""
        raise KeyError(f"{key!r} means {name!r}, which this cache of {self._model_name} does not hold{hint}. "
                       f"It holds {len(self.cache_dict)}: {describe(self.cache_dict)}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __contains__(self, key: object) -> bool:
        try:
            return self._resolve(key) in self.cache_dict
        except (TypeError, ValueError):
            return False

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations of {self._model_name}: {describe(self.cache_dict)})"

    def to(self, device: str | torch.device) -> ActivationCache:
        """Move every activation to ``device`` (in place); returns the cache."""
        self.cache_dict = {name: act.to(device) for name, act in self.cache_dict.items()}
        return self

    def remove_batch_dim(self) -> ActivationCache:
        """Drop the batch axis of a batch of one (in place); returns the cache."""
        if self.has_batch_dim:
            for name, act in self.cache_dict.items():
                if act.size(0) != 1:
                    raise ValueError(f"remove_batch_dim needs a batch of one; {name} has batch {act.size(0)}")
            self.cache_dict = {name: act[0] for name, act in self.cache_dict.items()}
            self.has_batch_dim = False
        return self

    def stack_activation(self, activation_name: str, layer: int = -1, sublayer_type: str | None = None) -> Tensor:
        """One activation of every layer before ``layer`` (-1 or None: all), stacked: ``[layers, ...]``."""
        layer = self._n_layers() if layer in (None, -1) else layer
        return torch.stack([self[(activation_name, i, sublayer_type)] for i in range(layer)])

    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice: Any = None, mlp_input: bool = False, return_labels: bool = False) -> Any:
        """The residual stream before each layer up to ``layer`` (None or -1: through the last block's
        ``resid_post``), stacked ``[components, B, pos, D]``, with labels ``0_pre``, (``0_mid``), ...,
        ``final_post`` if ``return_labels``, as TransformerLens's. ``apply_ln`` is not available here."""
        if apply_ln:
            raise NotImplementedError("apply_ln: mhalab's cache does not re-apply the final norm; "
                                      "pass apply_ln=False and apply model.ln_final yourself")
        n_layers = self._n_layers()
        layer = n_layers if layer in (None, -1) else layer
        components, labels = [], []
        for i in range(layer + 1):
            if i == n_layers:
                components.append(self["resid_post", n_layers - 1])
                labels.append("final_post")
                continue
            components.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            if (incl_mid and i < layer) or (mlp_input and i == layer):
                components.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        if pos_slice is not None:
            components = [_slice_pos(c, pos_slice, -2) for c in components]
        stacked = torch.stack(components)
        return (stacked, labels) if return_labels else stacked


def _slice_pos(act: Tensor, pos_slice: Any, dim: int) -> Tensor:
    """TransformerLens's ``pos_slice`` on axis ``dim``: an int drops the axis, a tuple means ``slice(*tuple)``,
    a slice or a list of positions keeps it."""
    if isinstance(pos_slice, int):
        return act.select(dim, pos_slice)
    if isinstance(pos_slice, tuple):
        pos_slice = slice(*pos_slice)
    if isinstance(pos_slice, slice):
        return act[(slice(None),) * (dim % act.dim()) + (pos_slice,)]
    return act.index_select(dim, torch.as_tensor(pos_slice, device=act.device))
