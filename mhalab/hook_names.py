"""Hook-point names: short names to full ones (:func:`get_act_name`), the ``hook_in``/``hook_out`` names of
TransformerLens's bridge (3 and 4) to mhalab's (:func:`hook_aliases`), globs as an explicit extension
(:func:`glob_filter`). The table of names and axes is in :mod:`mhalab.hooks`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from torch import nn

from .hook_points import HookPoint, name_hook_points

__all__ = ["get_act_name", "hook_aliases", "glob_filter", "GlobFilter", "SHORT_NAMES"]

_ATTN = ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z", "result")
_MLP = ("pre", "pre_linear", "post")
_NORM = ("scale", "normalized")
_BLOCK = ("resid_pre", "attn_out", "resid_mid", "cross_attn_out", "resid_mid_cross", "mlp_out", "resid_post")
_MODEL = ("embed", "pos_embed", "decoder_embed", "decoder_pos_embed")
#: The short names :func:`get_act_name` knows: every point some mhalab model has.
SHORT_NAMES = _MODEL + _BLOCK + _ATTN + _MLP + _NORM
_SYNONYMS = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
             "mlp_pre": "pre", "mlp_post": "post"}
# TransformerLens points mhalab's models do not have, and what to read instead.
_ABSENT = {
    "mid": "a SoLU MLP's middle; mhalab has none",
    "attn_in": "use_split_qkv_input's attention input; read hook_resid_pre (pre-norm: the norm's input)",
    "q_input": "use_split_qkv_input's query input; mhalab has none", "k_input": "mhalab has no hook_k_input",
    "v_input": "mhalab has no hook_v_input", "mlp_in": "use_hook_mlp_in's MLP input; read hook_resid_mid",
}


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """A hook point's full name from a short one, by TransformerLens's ``utils.get_act_name`` rules:
    ``("pattern", 0)`` -> ``blocks.0.attn.hook_pattern``, ``("resid_pre", 2)`` -> ``blocks.2.hook_resid_pre``,
    ``("pre", 1)`` -> ``blocks.1.mlp.hook_pre``, ``("scale", 0, "ln1")`` -> ``blocks.0.ln1.hook_scale``,
    ``"scale"`` -> ``ln_final.hook_scale``, ``"embed"`` -> ``hook_embed``; a full name (with a dot, or starting
    ``hook_``) comes back as it is.

    Only names some mhalab model has (:data:`SHORT_NAMES`); TransformerLens names mhalab lacks (``mid``,
    ``q_input``, ...) raise ValueError saying what to read instead."""
    if not isinstance(name, str):
        raise TypeError(f"a hook-point name must be a str such as 'pattern' or 'blocks.0.attn.hook_pattern', "
                        f"got {name!r}")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    compact = re.fullmatch(r"([a-z_]+?)(\d+)([a-z]?.*)", name)  # TransformerLens's "pattern0", "k6a", "scale4ln1"
    if compact is not None and layer is None:
        name, layer, layer_type = compact.group(1), int(compact.group(2)), compact.group(3) or None
    name = _SYNONYMS.get(name, name)
    if name not in SHORT_NAMES:
        why = f" (TransformerLens's hook_{name}: {_ABSENT[name]})" if name in _ABSENT else ""
        raise ValueError(f"mhalab has no hook point {name!r}{why}. Short names are: {', '.join(SHORT_NAMES)}")
    if name in _MODEL:
        if layer is not None:
            raise ValueError(f"hook_{name} belongs to the model, not to a block: ask for {name!r} without a layer")
        return f"hook_{name}"
    if name in _NORM:
        if layer is None:
            return f"ln_final.hook_{name}"
        if layer_type not in ("ln1", "ln2", "ln3"):
            raise ValueError(f"{name!r} is in each of a block's norms: give the norm as layer_type, e.g. "
                             f"get_act_name({name!r}, {layer}, 'ln1') (ln1 before the attention, ln2 before the "
                             f"MLP), or no layer for ln_final's")
        return f"blocks.{layer}.{layer_type}.hook_{name}"
    if layer is None:
        raise ValueError(f"{name!r} is in every block: give the layer, e.g. get_act_name({name!r}, 0)")
    prefix = "attn." if name in _ATTN else "mlp." if name in _MLP else ""
    fits = {"attn.": ("a", "attn", "attention"), "mlp.": ("m", "mlp"), "": ()}[prefix]
    if layer_type not in (None, "", "b", "block", "blocks", *fits):
        raise ValueError(f"layer_type {layer_type!r} does not fit {name!r}; leave it out (mhalab infers it)")
    return f"blocks.{layer}.{prefix}hook_{name}"


def hook_aliases(model: nn.Module) -> dict[str, str]:
    """The names TransformerLens's bridge (3 and 4) gives the points of ``model`` that map one to one:
    ``{alias: mhalab name}``.

    ``embed.hook_out`` (= ``hook_embed``), ``pos_embed.hook_out``, and per block ``b``: ``b.hook_in``
    (``hook_resid_pre``), ``b.attn.hook_out`` (``hook_attn_out``), ``b.mlp.hook_out`` (``hook_mlp_out``),
    ``b.cross_attn.hook_out``; pre-norm blocks also ``b.hook_out`` (``hook_resid_post``) and, without
    cross-attention, ``b.ln2.hook_in`` (``hook_resid_mid``); per attention ``a``: ``a.q.hook_out``,
    ``a.k.hook_out``, ``a.v.hook_out`` (``hook_q/k/v``) and ``a.o.hook_in`` (``hook_z``). A post-norm block's
    ``hook_out`` is after its norm in the bridge, mhalab's ``hook_resid_post`` before it: no alias.
    """
    points = name_hook_points(model)
    aliases = {f"{short}.hook_out": f"hook_{short}" for short in ("embed", "pos_embed") if f"hook_{short}" in points}
    for path, module in model.named_modules():
        has = lambda point: isinstance(getattr(module, point, None), HookPoint)  # noqa: E731
        if has("hook_resid_pre"):
            aliases[f"{path}.hook_in"] = f"{path}.hook_resid_pre"
            for sub, point in (("attn", "hook_attn_out"), ("mlp", "hook_mlp_out"),
                               ("cross_attn", "hook_cross_attn_out")):
                if has(point):
                    aliases[f"{path}.{sub}.hook_out"] = f"{path}.{point}"
            if not getattr(module, "post_norm", False):
                aliases[f"{path}.hook_out"] = f"{path}.hook_resid_post"
                if has("hook_mlp_out") and not has("hook_cross_attn_out"):
                    aliases[f"{path}.ln2.hook_in"] = f"{path}.hook_resid_mid"
        if has("hook_q") and has("hook_z"):
            aliases.update({f"{path}.{x}.hook_out": f"{path}.hook_{x}" for x in "qkv"})
            aliases[f"{path}.o.hook_in"] = f"{path}.hook_z"
    return aliases


def grouped_names(names: Iterable[str]) -> str:
    """Names grouped by template (``blocks.{i}.attn.hook_q (i = 0..29)``), so a long list stays readable."""
    groups: dict[str, list[int]] = {}
    for name in names:
        template = re.sub(r"\.\d+\.", ".{i}.", name, count=1)
        found = re.search(r"\.(\d+)\.", name)
        groups.setdefault(template, []).append(int(found.group(1)) if found and template != name else -1)
    parts = []
    for template, layers in groups.items():
        if "{i}" not in template:
            parts.append(template)
        elif len(layers) > 1:
            parts.append(f"{template} (i = {min(layers)}..{max(layers)})")
        else:
            parts.append(template.replace("{i}", str(layers[0])))
    return ", ".join(parts)


class GlobFilter:
    """A ``names_filter`` predicate from shell globs (``"*.hook_pattern"``): mhalab's extension, see
    :func:`glob_filter`. A glob that picks no point of the model raises, naming the points there are."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.patterns = patterns

    def __call__(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns)

    def __repr__(self) -> str:
        return f"glob_filter({', '.join(map(repr, self.patterns))})"


def glob_filter(*patterns: str) -> GlobFilter:
    """A predicate for ``names_filter`` or ``fwd_hooks`` that picks the names matching any of the shell globs
    ``patterns``: ``glob_filter("*.hook_pattern")``. In TransformerLens a string is one exact name; this is
    mhalab's only glob, and the same predicate works in TransformerLens (it is a plain ``fn(name) -> bool``)."""
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"glob_filter takes one or more str globs such as '*.hook_pattern', got {patterns!r}")
    return GlobFilter(patterns)
