"""One way to look inside any model: named activations, read with a cache or changed by hooks, with
TransformerLens's names and calls, as methods of every model (:class:`HookedRootModule`).

Every activation that can be read has a :class:`~mhalab.hook_points.HookPoint`, named by its place, in every
model of the course (the toy ``Transformer`` and ``EncoderDecoder``, MiniLM, SmolLM2: all built from
:class:`mhalab.blocks.Block`). The axes, documented here once (B batch, pos / query_pos positions, key_pos key
positions, H query heads, G K/V heads, d_head head size, D d_model, F d_mlp); the last column is the name
TransformerLens's bridge (3 and 4) gives the same activation, which mhalab accepts as an alias wherever a name is
taken (:func:`hook_aliases`)::

    hook_embed                       token embeddings                 [B, pos, D]            embed.hook_out
    hook_pos_embed                   position-table rows (if a table) [B, pos, D]            pos_embed.hook_out
    blocks.{i}.hook_resid_pre        residual stream into block i     [B, pos, D]            blocks.{i}.hook_in
    blocks.{i}.ln1.hook_scale        the norm's divisor sqrt(var+eps) [B, pos, 1]            (same)
    blocks.{i}.ln1.hook_normalized   the norm's output, before weight [B, pos, D]            (same)
    blocks.{i}.attn.hook_q           queries (before rotary)          [B, pos, H, d_head]    blocks.{i}.attn.q.hook_out
    blocks.{i}.attn.hook_k, hook_v   keys, values (before rotary)     [B, pos, G, d_head]    attn.k.hook_out, v.hook_out
    blocks.{i}.attn.hook_rot_q, _k   after rotary (rotary models)     as hook_q, hook_k      (HookedTransformer's)
    blocks.{i}.attn.hook_attn_scores Q Kᵀ/√d_head + mask, pre-softmax  [B, H, query_pos, key_pos] (same) (**)
    blocks.{i}.attn.hook_pattern     attention weights (pre-dropout)  [B, H, query_pos, key_pos] (same)
    blocks.{i}.attn.hook_z           each head's output before W_O    [B, pos, H, d_head]    blocks.{i}.attn.o.hook_in
    blocks.{i}.attn.hook_result      each head's output after W_O     [B, pos, H, D]         (same) (***)
    blocks.{i}.hook_attn_out         attention's output (after W_O)   [B, pos, D]            blocks.{i}.attn.hook_out
    blocks.{i}.hook_resid_mid        ... plus the attention           [B, pos, D]            blocks.{i}.ln2.hook_in (*)
    blocks.{i}.ln2.hook_scale, ...   the MLP's norm, as ln1's         [B, pos, 1], [B, pos, D] (same)
    blocks.{i}.mlp.hook_pre          fc_in(x) (gated: gate(x))        [B, pos, F]            (same)
    blocks.{i}.mlp.hook_pre_linear   a gated MLP's up(x)              [B, pos, F]            (same)
    blocks.{i}.mlp.hook_post         after the activation (gated:     [B, pos, F]            (same)
                                     act(gate(x)) * up(x))
    blocks.{i}.hook_mlp_out          the MLP's output                 [B, pos, D]            blocks.{i}.mlp.hook_out
    blocks.{i}.hook_resid_post       ... plus the MLP: block's output [B, pos, D]            blocks.{i}.hook_out (*)
    ln_final.hook_scale, ...         the final norm, as ln1's         [B, pos, 1], [B, pos, D] (same)

(*) Pre-norm blocks only: in a post-norm block the bridge's ``hook_out`` is after the norm, mhalab's
``hook_resid_post`` before it, so there is no one-to-one alias. HookedTransformer's names (the first column) are
mhalab's; the bridge keeps them as aliases of its own. The norms are a block's ``ln1``, ``ln2`` (and a decoder
block's ``ln3``), numbered in the order they run (:class:`~mhalab.blocks.Block`); with
``normalization_type=None`` there are none. (**) HookedTransformer documents ``hook_attn_scores`` as the scores
before the softmax, and mhalab fires that; TransformerLens 4.3's bridge fires it with the weights after the
softmax (equal to its ``hook_pattern``), while its own ``hook_q`` and ``hook_k`` multiplied out give mhalab's.
(***) Only with ``use_attn_result`` (``model.set_use_attn_result(True)`` or ``ModelConfig(use_attn_result=True)``,
as TransformerLens: it costs H times ``hook_attn_out``'s memory); asked for by name without it, it is refused with
what to do, and ``cache.stack_head_results()`` computes the same from ``hook_z``. Points TransformerLens has and
mhalab does not (a SoLU MLP's ``hook_mid``, ``use_split_qkv_input``'s inputs) are refused by name.

An attention-only block (``ModelConfig(attn_only=True)``) has no ``hook_resid_mid`` and no ``hook_mlp_out``;
in a pre-norm block ``resid_mid = resid_pre + attn_out`` and ``resid_post = resid_mid + mlp_out`` exactly. In a
post-norm block (MiniLM, BERT) the residual points are those sums *before* the norm that follows them, as in
TransformerLens's BERT, so the next block's ``hook_resid_pre`` is the normed ``hook_resid_post``. Models without
a position table (rotary SmolLM2, ``positional_embedding_type="rotary"`` or ``"none"``) have no ``hook_pos_embed``.

With grouped-query attention ``hook_k``/``hook_v`` hold only the G K/V heads, as stored (query head j reads
K/V head ``j // (H // G)``). With a KV cache, ``hook_q/k/v`` hold the new positions only; the scores and
pattern cover every key. Masked scores are ``-inf``.

An :class:`~mhalab.encoder_decoder.EncoderDecoder` names its stacks T5-style, as TransformerLens's HookedEncoderDecoder:
``encoder.{i}.*`` (attention ``encoder.{i}.attn``) and ``decoder.{i}.*`` with ``decoder.{i}.attn`` (causal
self-attention), ``decoder.{i}.hook_cross_attn_out``, ``decoder.{i}.hook_resid_mid_cross`` (after the
cross-attention) and ``decoder.{i}.cross_attn.*`` (queries ``[B, pos, H, d_head]`` from the decoder, keys and
values ``[B, key_pos, H, d_head]`` from the encoder's output); the source's embeddings are ``hook_embed`` and
``hook_pos_embed``, the target's ``hook_decoder_embed`` and ``hook_decoder_pos_embed``. Short keys such as
``cache["pattern", 0]`` (which mean ``blocks.0.attn.hook_pattern``, as in TransformerLens) are refused there
with the full names that exist.

The calls, as in TransformerLens::

    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    cache["pattern", 0][0, 3]                    # = cache["blocks.0.attn.hook_pattern"][0, 3]: head 3's pattern
    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", ablate_heads([3]))])
    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", ablate_heads([3]))]):
        logits, cache = model.run_with_cache(tokens, names_filter=["blocks.1.attn.hook_pattern"])

(``ablate_heads`` and the other hooks that act on chosen heads are in :mod:`mhalab.head_interventions`.)

A hook is called ``fn(activation, hook=point)`` (``hook.name`` is the point's full name) and returns a replacement
of the same shape, or None to keep the activation; ``def fn(act, *, hook)`` works. A ``names_filter`` (and the
name in a ``fwd_hooks`` pair) is None (every point), one exact name, a list of names, or a predicate
``fn(name) -> bool`` (it sees the first column's names); a name no point has raises. Globs are mhalab's extension,
only through :func:`glob_filter` (``names_filter=glob_filter("*.hook_pattern")``). The output keeps its graph, as
in TransformerLens (only the cached activations are detached): wrap a call in ``torch.no_grad()`` when no gradient
is wanted. ``bwd_hooks`` get each point's gradient during ``backward()`` (keep them with ``reset_hooks_end=False``
until then), and ``run_with_cache(incl_bwd=True)`` caches ``name + "_grad"`` for a scalar output, as there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

from torch import Tensor, nn

from .activation_cache import ActivationCache, _slice_pos
from .attention import MultiHeadAttention
from .hook_names import GlobFilter, get_act_name, glob_filter, grouped_names, hook_aliases
from .hook_points import HookFn, HookPoint, name_hook_points

__all__ = [
    "HookFn", "HookPoint", "HookedRootModule", "ActivationCache", "get_act_name", "glob_filter", "hook_aliases",
    "hook_points", "attention_modules", "hooks_attached", "run_with_hooks", "run_with_cache",
]

NamesFilter = str | Sequence[str] | Callable[[str], bool] | None
HookList = Iterable[tuple[NamesFilter, HookFn]]
_QKVZ = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_rot_q", "hook_rot_k")


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by full name, in the order the model holds them (each gets its ``name``)."""
    return name_hook_points(model)


def attention_modules(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """Every attention layer of ``model`` by name (``blocks.0.attn``, ...), in order."""
    found = {name: module for name, module in model.named_modules() if isinstance(module, MultiHeadAttention)}
    if not found:
        raise ValueError(f"{type(model).__name__} holds no mhalab.MultiHeadAttention, "
                         "so it has no attention to look at")
    return found


def _select(model: nn.Module, names: NamesFilter, available: list[str]) -> list[str]:
    """The hook-point names ``names`` picks: None = all; an exact name (or the bridge's name for it); a list of
    them; a predicate. A name no point has, or a glob_filter pattern that picks none, raises KeyError."""
    if names is None or (callable(names) and not isinstance(names, str)):
        # hook_result where it does not fire is left out, as TransformerLens's caches leave it out
        available = [n for n in available if not (n.endswith("hook_result") and not _result_is_on(model, n))]
    if names is None:
        return available
    if isinstance(names, GlobFilter):
        for pattern in names.patterns:
            if not any(GlobFilter((pattern,))(n) for n in available):
                raise KeyError(f"no hook point of {type(model).__name__} matches {pattern!r}; "
                               f"it has {len(available)}: {grouped_names(available)}")
    if callable(names) and not isinstance(names, str):
        return [n for n in available if names(n)]
    if isinstance(names, str) or not isinstance(names, Iterable):
        names = [names]
    chosen: list[str] = []
    aliases: dict[str, str] | None = None
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a hook-point name must be a str such as 'blocks.0.attn.hook_pattern', got {name!r}")
        if name not in available:
            if any(c in name for c in "*?["):
                raise KeyError(f"{name!r}: a string is one exact name, as in TransformerLens; for every match use "
                               f"glob_filter({name!r}) or a predicate such as lambda name: name.endswith(...)")
            aliases = hook_aliases(model) if aliases is None else aliases
            if name not in aliases:
                raise KeyError(f"{type(model).__name__} has no hook point {name!r}; it has {len(available)}: "
                               f"{grouped_names(available)}")
            name = aliases[name]
        if name.endswith("hook_result"):
            _validate_result_is_on(model, name)
        if name not in chosen:
            chosen.append(name)
    return chosen


def _result_is_on(model: nn.Module, name: str) -> bool:
    """Whether the ``hook_result`` point ``name`` fires: only with its layer's ``use_attn_result``."""
    return getattr(model.get_submodule(name.rpartition(".")[0]) if "." in name else model, "use_attn_result", True)


def _validate_result_is_on(model: nn.Module, name: str) -> None:
    """Refuse to attach to ``hook_result`` where it will not fire: it is computed only with ``use_attn_result``."""
    if not _result_is_on(model, name):
        raise ValueError(f"{name} fires only when each head's output after W_O is computed on its own, "
                         "[batch, pos, head, d_model] per layer: switch it on with model.set_use_attn_result(True) "
                         "(TransformerLens's switch; or ModelConfig(use_attn_result=True)), or read it after a run "
                         "from hook_z with cache.stack_head_results() or cache.compute_head_results()")


def _add_hooks(model: nn.Module, points: dict[str, HookPoint], pairs: HookList, dir: str, level: int | None,
               is_permanent: bool = False, prepend: bool = False) -> None:
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"fwd_hooks and bwd_hooks are lists of (name, hook) pairs, got {pair!r}")
        names, fn = pair
        for name in _select(model, names, list(points)):
            points[name].add_hook(fn, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)


def _reset(points: Iterable[HookPoint], clear_contexts: bool, direction: str, including_permanent: bool,
           level: int | None) -> None:
    for point in points:
        if clear_contexts:
            point.clear_context()
        point.remove_hooks(direction, including_permanent=including_permanent, level=level)


@contextlib.contextmanager
def hooks_attached(model: nn.Module, fwd_hooks: HookList = (), bwd_hooks: HookList = (),
                   reset_hooks_end: bool = True, clear_contexts: bool = False) -> Iterator[nn.Module]:
    """What ``model.hooks(...)`` runs: attach ``(name_or_filter, fn)`` pairs for the ``with`` body and remove them
    after (also on error) unless ``reset_hooks_end=False``; ``bwd_hooks`` get the activation's gradient."""
    points = hook_points(model)
    level = getattr(model, "context_level", 0) + 1
    model.context_level = level
    try:
        _add_hooks(model, points, fwd_hooks, "fwd", level)
        _add_hooks(model, points, bwd_hooks, "bwd", level)
        yield model
    finally:
        if reset_hooks_end:
            _reset(points.values(), clear_contexts, "both", False, level)
        model.context_level = level - 1


def run_with_hooks(model: nn.Module, *model_args: Any, fwd_hooks: HookList = (), bwd_hooks: HookList = (),
                   reset_hooks_end: bool = True, clear_contexts: bool = False, **model_kwargs: Any) -> Any:
    """What ``model.run_with_hooks(...)`` runs: ``model(*model_args, **model_kwargs)`` with the hooks attached."""
    if bwd_hooks and reset_hooks_end:
        warnings.warn("the hooks are removed at the end of run_with_hooks, before any backward pass, so bwd_hooks "
                      "will not run: pass reset_hooks_end=False and call model.reset_hooks() after backward()")
    with hooks_attached(model, fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
        return model(*model_args, **model_kwargs)


def run_with_cache(
    model: nn.Module, *model_args: Any, names_filter: NamesFilter = None, device: Any = None,
    remove_batch_dim: bool = False, incl_bwd: bool = False, reset_hooks_end: bool = True,
    clear_contexts: bool = False, pos_slice: Any = None, return_cache_object: bool = True, **model_kwargs: Any,
) -> tuple[Any, ActivationCache | dict[str, Tensor]]:
    """What ``model.run_with_cache(...)`` runs: the output (with its graph) and an :class:`ActivationCache` of
    the points ``names_filter`` picks (all by default), detached, on ``device``; ``incl_bwd`` also calls
    ``backward()`` on the (scalar) output and caches each gradient as ``name + "_grad"``."""
    if "fwd_hooks" in model_kwargs:
        raise TypeError("run_with_cache takes no fwd_hooks (as in TransformerLens): attach them around it, "
                        "`with model.hooks(fwd_hooks=[...]): logits, cache = model.run_with_cache(tokens)`")
    points = hook_points(model)
    chosen = _select(model, names_filter, list(points))
    stored: dict[str, Tensor] = {}

    def keep(act: Tensor, name: str) -> None:
        act = act.detach().to(device)
        act = act[0] if remove_batch_dim else act
        if pos_slice is not None and act.dim() >= 2:
            act = _slice_pos(act, pos_slice, -3 if name.split(".")[-1].removesuffix("_grad") in _QKVZ else -2)
        stored[name] = act

    def save(act: Tensor, *, hook: HookPoint) -> None:
        keep(act, hook.name)
        if incl_bwd and act.requires_grad:
            act.register_hook(lambda grad, name=hook.name: keep(grad, f"{name}_grad"))

    with hooks_attached(model, [(chosen, save)], reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts):
        output = model(*model_args, **model_kwargs)
        if incl_bwd:
            if not (isinstance(output, Tensor) and output.numel() == 1):
                raise ValueError("incl_bwd calls backward() on the model's output, which must then be a scalar (in "
                                 "TransformerLens a loss); for logits, attach bwd_hooks with model.run_with_hooks")
            output.backward()
    ordered = {name: stored[name] for name in chosen if name in stored}
    ordered.update({f"{n}_grad": stored[f"{n}_grad"] for n in chosen if f"{n}_grad" in stored})
    if not return_cache_object:
        return output, ordered
    return output, ActivationCache(ordered, model, has_batch_dim=not remove_batch_dim)


class HookedRootModule(nn.Module):
    """The base of every mhalab model: TransformerLens's ``HookedRootModule`` calls as methods.

    ``model.run_with_cache(*args, names_filter=...)``, ``model.run_with_hooks(*args, fwd_hooks=[...])``,
    ``with model.hooks(fwd_hooks=[...]):``, ``model.add_hook(name, fn)``, ``model.reset_hooks()``, with
    TransformerLens's keywords; ``model.hook_dict`` is every point by name (see the module's table).
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            found = getattr(type(self), name, None)
            if isinstance(found, property):  # a property that raised AttributeError: let its own message through
                found.fget(self)
            raise

    @property
    def hook_dict(self) -> dict[str, HookPoint]:
        """Every hook point by full name, in order."""
        return hook_points(self)

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """TransformerLens's switch: with True every attention layer computes each head's output after W_O on its
        own and fires ``hook_result`` ``[B, pos, H, D]`` (memory H times attn_out's); the config says so too."""
        if not isinstance(use_attn_result, bool):
            raise TypeError(f"use_attn_result must be True or False, got {use_attn_result!r}")
        for attn in attention_modules(self).values():
            attn.use_attn_result = use_attn_result
        config = getattr(self, "config", None)
        if dataclasses.is_dataclass(config) and hasattr(config, "use_attn_result"):
            self.config = dataclasses.replace(config, use_attn_result=use_attn_result)

    def hook_points(self) -> list[HookPoint]:
        """Every hook point, in order."""
        return list(self.hook_dict.values())

    def add_hook(self, name: NamesFilter, hook: HookFn, dir: Literal["fwd", "bwd"] = "fwd",
                 is_permanent: bool = False, level: int | None = None, prepend: bool = False) -> None:
        """Attach ``hook`` to the points ``name`` picks until ``reset_hooks()`` (or for good: ``is_permanent``)."""
        _add_hooks(self, self.hook_dict, [(name, hook)], dir, level, is_permanent, prepend)

    def add_perma_hook(self, name: NamesFilter, hook: HookFn, dir: Literal["fwd", "bwd"] = "fwd") -> None:
        """A hook that ``reset_hooks()`` keeps (``reset_hooks(including_permanent=True)`` removes it)."""
        self.add_hook(name, hook, dir=dir, is_permanent=True)

    def reset_hooks(self, clear_contexts: bool = True, direction: Literal["fwd", "bwd", "both"] = "both",
                    including_permanent: bool = False, level: int | None = None) -> None:
        """Remove the hooks attached (all but permanent ones, unless ``including_permanent``)."""
        _reset(self.hook_points(), clear_contexts, direction, including_permanent, level)

    def hooks(self, fwd_hooks: HookList = (), bwd_hooks: HookList = (), reset_hooks_end: bool = True,
              clear_contexts: bool = False) -> contextlib.AbstractContextManager:
        """``with model.hooks(fwd_hooks=[(name, fn)]):`` the hooks are attached for the body only."""
        return hooks_attached(self, fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts)

    def run_with_hooks(self, *model_args: Any, fwd_hooks: HookList = (), bwd_hooks: HookList = (),
                       reset_hooks_end: bool = True, clear_contexts: bool = False, **model_kwargs: Any) -> Any:
        """``self(*model_args, **model_kwargs)`` with ``fwd_hooks`` (and ``bwd_hooks``) attached for this call."""
        return run_with_hooks(self, *model_args, fwd_hooks=fwd_hooks, bwd_hooks=bwd_hooks,
                              reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts, **model_kwargs)

    def run_with_cache(self, *model_args: Any, names_filter: NamesFilter = None, device: Any = None,
                       remove_batch_dim: bool = False, incl_bwd: bool = False, reset_hooks_end: bool = True,
                       clear_contexts: bool = False, pos_slice: Any = None, return_cache_object: bool = True,
                       **model_kwargs: Any) -> tuple[Any, ActivationCache | dict[str, Tensor]]:
        """The output (keeping its graph) and an :class:`ActivationCache` of the points ``names_filter`` picks."""
        return run_with_cache(self, *model_args, names_filter=names_filter, device=device,
                              remove_batch_dim=remove_batch_dim, incl_bwd=incl_bwd, reset_hooks_end=reset_hooks_end,
                              clear_contexts=clear_contexts, pos_slice=pos_slice,
                              return_cache_object=return_cache_object, **model_kwargs)

