"""One way to look inside any model: named activations, read with a cache or changed by hooks, with
TransformerLens's names and calls.

Every activation that can be read has a :class:`~mhalab.hook_points.HookPoint`, named by its place, in every
model of the course (the toy ``Transformer`` and ``EncoderDecoder``, MiniLM, SmolLM2: all built from
:class:`mhalab.models.Block`). The axes, documented here once (B batch, pos / query_pos positions, key_pos key
positions, H query heads, G K/V heads, d_head head size, D d_model)::

    hook_embed                          token embeddings                 [B, pos, D]
    hook_pos_embed                      position-table rows (if a table) [B, pos, D]
    blocks.{i}.hook_resid_pre           residual stream into block i     [B, pos, D]
    blocks.{i}.hook_attn_out            attention's output (after W_O)   [B, pos, D]
    blocks.{i}.hook_resid_mid           ... plus the attention           [B, pos, D]
    blocks.{i}.hook_mlp_out             the MLP's output                 [B, pos, D]
    blocks.{i}.hook_resid_post          ... plus the MLP: block's output [B, pos, D]
    blocks.{i}.attn.hook_q              queries (before rotary)          [B, pos, H, d_head]
    blocks.{i}.attn.hook_k, hook_v      keys, values (before rotary)     [B, pos, G, d_head]
    blocks.{i}.attn.hook_rot_q, _rot_k  after rotary (rotary models)     as hook_q, hook_k
    blocks.{i}.attn.hook_attn_scores    Q Kᵀ/√d_head + mask, pre-softmax  [B, H, query_pos, key_pos]
    blocks.{i}.attn.hook_pattern        attention weights (pre-dropout)  [B, H, query_pos, key_pos]
    blocks.{i}.attn.hook_z              each head's output before W_O    [B, pos, H, d_head]

An attention-only block (``ModelConfig(attn_only=True)``) has no ``hook_resid_mid`` and no ``hook_mlp_out``;
in a pre-norm block ``resid_mid = resid_pre + attn_out`` and ``resid_post = resid_mid + mlp_out`` exactly. In a
post-norm block (MiniLM, BERT) the residual points are those sums *before* the norm that follows them, as in
TransformerLens's BERT, so the next block's ``hook_resid_pre`` is the normed ``hook_resid_post``. Models without
a position table (rotary SmolLM2, ``positions="rotary"`` or ``"none"``) have no ``hook_pos_embed``.

With grouped-query attention ``hook_k``/``hook_v`` hold only the G K/V heads, as stored (query head j reads
K/V head ``j // (H // G)``). With a KV cache, ``hook_q/k/v`` hold the new positions only; the scores and
pattern cover every key. Masked scores are ``-inf``.

An :class:`~mhalab.models.EncoderDecoder` names its stacks T5-style, as TransformerLens's HookedEncoderDecoder:
``encoder.{i}.*`` (attention ``encoder.{i}.attn``) and ``decoder.{i}.*`` with ``decoder.{i}.attn`` (causal
self-attention), ``decoder.{i}.hook_cross_attn_out``, ``decoder.{i}.hook_resid_mid_cross`` (after the
cross-attention) and ``decoder.{i}.cross_attn.*`` (queries ``[B, pos, H, d_head]`` from the decoder, keys and
values ``[B, key_pos, H, d_head]`` from the encoder's output); the source's embeddings are ``hook_embed`` and
``hook_pos_embed``, the target's ``hook_decoder_embed`` and ``hook_decoder_pos_embed``. Short keys such as
``cache["pattern", 0]`` (which mean ``blocks.0.attn.hook_pattern``, as in TransformerLens) are refused there
with the full names that exist::

    logits, cache = run_with_cache(model, tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    cache["pattern", 0][0, 3]                    # = cache["blocks.0.attn.hook_pattern"][0, 3]: head 3's pattern
    logits = run_with_hooks(model, tokens, fwd_hooks=[("blocks.1.attn.hook_z", ablate_heads([3]))])

A hook function ``fn(activation, hook)`` (``hook.name`` is the point's full name) returns a replacement of the
same shape, or None to keep the activation. Names in ``names_filter`` and ``fwd_hooks`` may also be globs
(``"*.hook_pattern"``), lists of names, or predicates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import re
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .hook_points import HookFn, HookPoint, name_hook_points

__all__ = [
    "HookFn", "HookPoint", "ActivationCache", "get_act_name", "hook_points", "attention_modules", "hooks_attached",
    "run_with_hooks", "run_with_cache", "ablate_heads", "gate_heads", "patch_heads",
]

NamesFilter = Union[None, str, Sequence[str], Callable[[str], bool]]

_ATTN_NAMES = ("q", "k", "v", "z", "rot_q", "rot_k", "result", "pattern", "attn_scores")
_MLP_NAMES = ("pre", "post", "mid", "pre_linear")
_NAME_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
                 "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_LAYER_TYPE_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """A hook point's full name from a short one, by TransformerLens's ``utils.get_act_name`` rules:
    ``("pattern", 0)`` -> ``blocks.0.attn.hook_pattern``, ``("resid_pre", 2)`` -> ``blocks.2.hook_resid_pre``,
    ``"embed"`` -> ``hook_embed``; a full name (with a dot, or starting ``hook_``) comes back as it is."""
    if not isinstance(name, str):
        raise TypeError(f"a hook-point name must be a str such as 'pattern' or 'blocks.0.attn.hook_pattern', got {name!r}")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    compact = re.fullmatch(r"([a-z_]+)(\d+)([a-z]?.*)", name)  # TransformerLens's "pattern0", "k6a"
    if compact is not None and layer is None:
        name, layer, layer_type = compact.group(1), int(compact.group(2)), compact.group(3) or None
    name = _NAME_ALIASES.get(name, name)
    if name in _ATTN_NAMES:
        layer_type = "attn"
    elif name in _MLP_NAMES:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPE_ALIASES:
        layer_type = _LAYER_TYPE_ALIASES[layer_type]
    prefix = "" if layer is None else f"blocks.{layer}."
    return f"{prefix}{layer_type}.hook_{name}" if layer_type else f"{prefix}hook_{name}"


def _describe(names: Iterable[str]) -> str:
    """Names grouped by template (``blocks.{i}.attn.hook_q for i in 0..29``), so a long list stays readable."""
    groups: dict[str, list[int]] = {}
    for name in names:
        template = re.sub(r"\.\d+\.", ".{i}.", name, count=1)
        found = re.search(r"\.(\d+)\.", name)
        groups.setdefault(template, []).append(int(found.group(1)) if found and template != name else -1)
    parts = []
    for template, layers in groups.items():
        if template.count("{i}"):
            parts.append(f"{template} (i = {min(layers)}..{max(layers)})" if len(layers) > 1 else template.replace("{i}", str(layers[0])))
        else:
            parts.append(template)
    return ", ".join(parts)


@dataclasses.dataclass(eq=False, repr=False)  # a record of its fields: it travels to a grading kernel as configs do
class ActivationCache(Mapping):
    """The activations of one run by full name, read as ``cache["blocks.0.attn.hook_pattern"]``, ``cache["pattern", 0]``
    (short name and layer, :func:`get_act_name`; a negative layer counts from the last) or ``cache["hook_embed"]``.
    Built as ``ActivationCache(activations, model_name)``."""

    _activations: dict[str, Tensor]
    _model_name: str = "the model"

    def _resolve(self, key: Any) -> str:
        if isinstance(key, str):
            return key if key in self._activations else get_act_name(key)
        if isinstance(key, tuple) and 1 <= len(key) <= 3:
            name, *rest = key
            layer = rest[0] if rest else None
            if isinstance(layer, int) and layer < 0:
                layers = {int(m.group(1)) for n in self._activations if (m := re.match(r"blocks\.(\d+)\.", n))}
                layer = (max(layers) + 1 if layers else 0) + layer
            return get_act_name(name, layer, rest[1] if len(rest) > 1 else None)
        raise TypeError(f"index a cache with a name ('blocks.0.attn.hook_pattern') or (short name, layer) "
                        f"such as ('pattern', 0), got {key!r}")

    def __getitem__(self, key: Any) -> Tensor:
        name = self._resolve(key)
        if name in self._activations:
            return self._activations[name]
        suffix = name.split(".")[-1]
        layer = re.match(r"blocks\.(\d+)\.", name)
        nearby = [n for n in self._activations if n.endswith(f".{suffix}") and (layer is None or f".{layer.group(1)}." in n)]
        hint = f"; the {suffix} points at that layer are {', '.join(nearby)} (read them by full name)" if nearby else ""
        raise KeyError(f"{key!r} means {name!r}, which this cache of {self._model_name} does not hold{hint}. "
                       f"It holds {len(self._activations)}: {_describe(self._activations)}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._activations)

    def __len__(self) -> int:
        return len(self._activations)

    def __contains__(self, key: object) -> bool:
        try:
            return self._resolve(key) in self._activations
        except TypeError:
            return False

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations of {self._model_name}: {_describe(self._activations)})"


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by full name, in the order the model holds them (each gets its ``name``)."""
    return name_hook_points(model)


def attention_modules(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """Every attention layer of ``model`` by name (``blocks.0.attn``, ...), in order."""
    found = {name: module for name, module in model.named_modules() if isinstance(module, MultiHeadAttention)}
    if not found:
        raise ValueError(f"{type(model).__name__} holds no mhalab.MultiHeadAttention, so it has no attention to look at")
    return found


def _select(model: nn.Module, names: NamesFilter, available: list[str]) -> list[str]:
    """The hook-point names that ``names`` picks: None = all; a name or glob; a list of them; a predicate."""
    if names is None:
        return available
    if callable(names):
        return [n for n in available if names(n)]
    chosen: list[str] = []
    for pattern in [names] if isinstance(names, str) else names:
        if not isinstance(pattern, str):
            raise TypeError(f"a hook-point name must be a str such as 'blocks.0.attn.hook_pattern', got {pattern!r}")
        matched = fnmatch.filter(available, pattern)
        if not matched:
            raise KeyError(f"no hook point of {type(model).__name__} matches {pattern!r}; "
                           f"it has {len(available)}: {_describe(available)}")
        chosen += [n for n in matched if n not in chosen]
    return chosen


@contextlib.contextmanager
def hooks_attached(model: nn.Module, fwd_hooks: Iterable[tuple[NamesFilter, HookFn]]) -> Iterator[nn.Module]:
    """Attach ``(name_or_filter, fn)`` pairs for the ``with`` body, and remove them after (also on error).

    ``name_or_filter`` is a hook-point name, a glob (``"blocks.*.attn.hook_z"``), a list of them or a predicate.
    """
    points = hook_points(model)
    with contextlib.ExitStack() as attached:  # removes every handle on leaving, also on error
        for names, fn in fwd_hooks:
            if not callable(fn):
                raise TypeError(f"a hook must be a function fn(activation, hook), got {type(fn).__name__}")
            for name in _select(model, names, list(points)):
                attached.callback(points[name].add_hook(fn).remove)
        yield model


def run_with_hooks(model: nn.Module, *args: Any, fwd_hooks: Iterable[tuple[NamesFilter, HookFn]] = (), **kwargs: Any) -> Any:
    """``model(*args, **kwargs)`` with ``fwd_hooks`` attached for this one call."""
    with hooks_attached(model, fwd_hooks):
        return model(*args, **kwargs)


def run_with_cache(
    model: nn.Module, *args: Any, names_filter: NamesFilter = None,
    fwd_hooks: Iterable[tuple[NamesFilter, HookFn]] = (), **kwargs: Any,
) -> tuple[Any, ActivationCache]:
    """``model(*args, **kwargs)`` and an :class:`ActivationCache` of the points ``names_filter`` picks (all by default).

    No gradients; the model's train/eval mode is left as it is. ``fwd_hooks`` run before their point is
    cached, so the cache shows what the model used. Caching ``hook_attn_scores`` or ``hook_pattern`` makes
    attention take its explicit path (the fused kernel never forms the pattern).
    """
    stored: dict[str, Tensor] = {}

    def store(activation: Tensor, hook: HookPoint) -> None:
        stored[hook.name] = activation.detach()

    chosen = _select(model, names_filter, list(hook_points(model)))
    with torch.no_grad(), hooks_attached(model, [*fwd_hooks, (chosen, store)]):
        output = model(*args, **kwargs)
    return output, ActivationCache({name: stored[name] for name in chosen if name in stored}, type(model).__name__)


# ------------------------------------------------------------------ heads: ablate, gate, patch
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
