"""The activations of one run, by hook-point name: what ``model.run_with_cache`` returns, TransformerLens's
``ActivationCache`` with its reads (``cache["pattern", 0]``, ``stack_activation``) and its decompositions of the
residual stream (``accumulated_resid``, ``decompose_resid``, ``stack_head_results``, ``compute_head_results``,
``apply_ln_to_stack``, ``logit_attrs``), with its arguments and shapes. The decompositions read the model's
weights as TransformerLens does in compatibility mode (:mod:`mhalab.head_weights`: W_U with the final norm's scale
folded in), so a norm applied to a stack is its normalisation alone, without weight or bias."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .hook_names import get_act_name, grouped_names, hook_aliases

__all__ = ["ActivationCache"]


@dataclasses.dataclass(eq=False, repr=False)  # a record of its fields: it travels to a grading kernel as configs do
class ActivationCache(Mapping):
    """Activations by full name, read as ``cache["blocks.0.attn.hook_pattern"]``, ``cache["pattern", 0]`` (short
    name and layer, :func:`~mhalab.hook_names.get_act_name`; a negative layer counts from the last), a name of
    TransformerLens's bridge (``cache["blocks.0.hook_in"]``) or ``cache["hook_embed"]``. Activations are detached.

    ``cache_dict`` is the plain ``{name: tensor}`` dict; ``model`` the model it came from (None for a cache built
    by hand: then the layers are counted from the names and the bridge's names are not read).
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
                       f"It holds {len(self.cache_dict)}: {grouped_names(self.cache_dict)}")

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
        return f"ActivationCache({len(self)} activations of {self._model_name}: {grouped_names(self.cache_dict)})"

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
        ``final_post`` if ``return_labels``, as TransformerLens's. ``apply_ln``: through the norm that reads
        layer ``layer``'s input (:meth:`apply_ln_to_stack`); at the end, each component normalised with its own
        statistics (the logit lens: ``cache.accumulated_resid(apply_ln=True) @ model.W_U + model.b_U``)."""
        if self.model is not None:  # (a cache built by hand counts its layers from the names)
            self._model_with_blocks("accumulated_resid")
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
        return self._stacked(components, labels, layer, pos_slice=pos_slice, apply_ln=apply_ln, mlp_input=mlp_input,
                             recompute_ln=layer == n_layers, return_labels=return_labels)

    # ------------------------------------------------------------------ the residual stream, decomposed
    def _model_with_blocks(self, what: str) -> nn.Module:
        """The model, which must be a :class:`~mhalab.models.Transformer` (``blocks.{i}``) for ``what``."""
        if self.model is None or not hasattr(self.model, "blocks"):
            held = "a cache built by hand" if self.model is None else f"a cache of {self._model_name}"
            raise ValueError(f"cache.{what} reads the model's blocks.{{i}} and weights, as TransformerLens's does; "
                             f"this is {held}. Run a mhalab Transformer with model.run_with_cache(tokens)"
                             + ("" if self.model is None else "; an EncoderDecoder's points are read by full name "
                                "(encoder.{i}..., decoder.{i}...)"))
        return self.model

    def decompose_resid(self, layer: int | None = None, mlp_input: bool = False, mode: str = "all",
                        apply_ln: bool = False, pos_slice: Any = None, incl_embeds: bool = True,
                        return_labels: bool = False) -> Any:
        """The residual stream entering layer ``layer`` (None or -1: after the last block) as a stack of what wrote
        it ``[components, B, pos, D]``: ``embed``, ``pos_embed`` (if cached), then each layer's ``attn_out`` and
        ``mlp_out`` (``mode``: "all", "attn" or "mlp"); with ``mlp_input`` also layer ``layer``'s attention.
        Labels as TransformerLens's (``embed``, ``0_attn_out``, ``0_mlp_out``, ...). Biases are in the outputs."""
        model = self._model_with_blocks("decompose_resid")
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        layer = self._n_layers() if layer in (None, -1) else layer
        incl_attn, incl_mlp = mode != "mlp", mode != "attn" and not model.config.attn_only
        components, labels = [], []
        if incl_embeds:
            for name, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
                if name in self.cache_dict:
                    components.append(self[name])
                    labels.append(label)
        for i in range(layer):
            for wanted, short in ((incl_attn, "attn_out"), (incl_mlp, "mlp_out")):
                if wanted:
                    components.append(self[short, i])
                    labels.append(f"{i}_{short}")
        if mlp_input and incl_attn:
            components.append(self["attn_out", layer])
            labels.append(f"{layer}_attn_out")
        return self._stacked(components, labels, layer, pos_slice=pos_slice, apply_ln=apply_ln, mlp_input=mlp_input,
                             return_labels=return_labels)

    def _stacked(self, components: list[Tensor], labels: list[str], layer: int, *, pos_slice: Any, apply_ln: bool,
                 mlp_input: bool, return_labels: bool, recompute_ln: bool = False) -> Any:
        """``components`` (each ``[B, pos, D]``) at ``pos_slice``, stacked ``[components, B, pos, D]``; with
        ``apply_ln``, through the norm reading layer ``layer``'s input (:meth:`apply_ln_to_stack`); with their
        ``labels`` if ``return_labels``. What :meth:`accumulated_resid` and :meth:`decompose_resid` return."""
        if pos_slice is not None:
            components = [_slice_pos(c, pos_slice, -2) for c in components]
        stacked = torch.stack(components)
        if apply_ln:
            stacked = self.apply_ln_to_stack(stacked, layer, mlp_input=mlp_input, pos_slice=pos_slice,
                                             recompute_ln=recompute_ln)
        return (stacked, labels) if return_labels else stacked

    def compute_head_results(self) -> None:
        """Put each head's output ``blocks.{i}.attn.hook_result`` ``[B, pos, H, D]`` (``z_h @ W_O^h``, no bias) into
        the cache, computed from the cached ``hook_z`` (what ``use_attn_result`` would have cached), as
        TransformerLens's; results already there are kept."""
        model = self._model_with_blocks("compute_head_results")
        for i in range(self._n_layers()):
            name = f"blocks.{i}.attn.hook_result"
            if name not in self.cache_dict:
                attn, z = model.blocks[i].attn, self["z", i]  # z [B, pos, H, d]
                with torch.no_grad():  # activations in a cache are detached, as those the run cached
                    result = attn.head_results(z.to(attn.out_proj.weight.device))  # [B, pos, H, D]
                self.cache_dict[name] = result.to(z.device)

    def stack_head_results(self, layer: int = -1, return_labels: bool = False, incl_remainder: bool = False,
                           pos_slice: Any = None, apply_ln: bool = False) -> Any:
        """Every head's output in the layers before ``layer`` (-1 or None: all), ``[layer * H, B, pos, D]``, heads
        in order (labels ``L0H0``, ``L0H1``, ...); ``incl_remainder`` adds the rest of that layer's input stream
        (labelled ``remainder``); ``apply_ln`` puts the stack through that input's norm (:meth:`apply_ln_to_stack`).
        Computed from ``hook_z`` where ``hook_result`` was not cached (:meth:`compute_head_results`)."""
        model = self._model_with_blocks("stack_head_results")
        layer = self._n_layers() if layer in (None, -1) else layer
        self.compute_head_results()
        H = model.blocks[0].attn.n_heads
        parts = [self["result", i] for i in range(layer)]  # each [B, pos, H, D]
        if pos_slice is not None:
            parts = [_slice_pos(p, pos_slice, -3) for p in parts]
        labels = [f"L{i}H{h}" for i in range(layer) for h in range(H)]
        if parts:
            stacked = torch.cat(parts, dim=-2).movedim(-2, 0)  # [..., layer H, D] -> [layer H, ..., D]
        else:  # no layer below: an empty stack of the embeddings' shape
            reference = self["hook_embed"] if pos_slice is None else _slice_pos(self["hook_embed"], pos_slice, -2)
            stacked = reference.new_zeros(0, *reference.shape)
        if incl_remainder:
            resid = self["resid_post", layer - 1] if layer > 0 else self["resid_pre", 0]
            resid = resid if pos_slice is None else _slice_pos(resid, pos_slice, -2)
            stacked = torch.cat([stacked, (resid - stacked.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stacked = self.apply_ln_to_stack(stacked, layer, pos_slice=pos_slice)
        return (stacked, labels) if return_labels else stacked

    def apply_ln_to_stack(self, residual_stack: Tensor, layer: int | None = None, mlp_input: bool = False,
                          pos_slice: Any = None, batch_slice: Any = None, has_batch_dim: bool = True,
                          recompute_ln: bool = False) -> Tensor:
        """``residual_stack [components, B, pos, D]`` (pieces of the stream entering layer ``layer``; None or -1:
        the final norm) through that norm as the whole stream went through it: a LayerNorm's pieces are each
        centred, then every piece is divided by the scale the norm computed on the whole stream (its cached
        ``hook_scale``: ``blocks.{layer}.ln1`` (``ln2`` with ``mlp_input``) or ``ln_final``). The norm's weight and
        bias are left out: they are in the folded weights (``model.W_U``, ``model.W_Q``, ...). ``recompute_ln``
        (final norm only): each piece normalised with its own statistics instead (the logit lens). ``pos_slice``,
        ``batch_slice``: the slices the stack was taken with (applied to the scale), as TransformerLens's."""
        model = self._model_with_blocks("apply_ln_to_stack")
        config, n_layers = model.config, self._n_layers()
        layer = n_layers if layer in (None, -1) else layer
        if has_batch_dim and batch_slice is not None:
            residual_stack = _slice_pos(residual_stack, batch_slice, 1)
        if config.normalization_type is None:
            return residual_stack  # no norms: nothing to apply, as in TransformerLens
        if config.post_norm:
            raise ValueError(f"{self._model_name} is post-norm (BERT's layout: a norm after each residual sum), so no "
                             "norm reads a layer's input stream or a final one; there is no norm to apply to a stack")
        centre = config.normalization_type == "LN"
        if recompute_ln and layer == n_layers:  # each piece with its own statistics, the norm's weights folded away
            x = residual_stack - residual_stack.mean(-1, keepdim=True) if centre else residual_stack
            return x / (x.pow(2).mean(-1, keepdim=True) + config.eps).sqrt()
        if centre:
            residual_stack = residual_stack - residual_stack.mean(-1, keepdim=True)
        key = "ln_final.hook_scale" if layer == n_layers else f"blocks.{layer}.ln{2 if mlp_input else 1}.hook_scale"
        if key not in self.cache_dict:
            raise KeyError(f"apply_ln reads the scale {key!r} the norm computed in the run; this cache does not "
                           f"hold it: run model.run_with_cache with names_filter including {key!r} (or all points)")
        scale = self.cache_dict[key]  # [B, pos, 1]
        scale = scale if pos_slice is None else _slice_pos(scale, pos_slice, -2)
        if has_batch_dim and batch_slice is not None and self.has_batch_dim:
            scale = _slice_pos(scale, batch_slice, 0)
        return residual_stack / scale

    def logit_attrs(self, residual_stack: Tensor, tokens: Any, incorrect_tokens: Any = None, pos_slice: Any = None,
                    batch_slice: Any = None, has_batch_dim: bool = True) -> Tensor:
        """How much each piece of ``residual_stack [components, B, pos, D]`` adds to the logit of ``tokens`` (an id,
        ``[B]``, ``[pos]`` or ``[B, pos]``), minus that of ``incorrect_tokens`` if given: each piece through the
        final norm's scale (:meth:`apply_ln_to_stack`), dotted with ``model.W_U``'s columns. ``[components, B,
        pos]``, as TransformerLens's."""
        model = self._model_with_blocks("logit_attrs")
        for name, given in (("tokens", tokens), ("incorrect_tokens", incorrect_tokens)):
            if isinstance(given, str):
                raise TypeError(f"{name}: give token ids (an int or a tensor); mhalab's models take ids, not text "
                                "(SmolLM2's tokenizer: model.tokenizer.encode(text, start=False))")
        W_U = model.W_U  # [D, V], the final norm's scale folded in
        directions = W_U.T[torch.as_tensor(tokens, device=W_U.device)]  # [..., D]
        if incorrect_tokens is not None:
            wrong = torch.as_tensor(incorrect_tokens, device=W_U.device)
            if wrong.shape != torch.as_tensor(tokens).shape:
                raise ValueError(f"tokens and incorrect_tokens must have the same shape, got "
                                 f"{tuple(torch.as_tensor(tokens).shape)} and {tuple(wrong.shape)}")
            directions = directions - W_U.T[wrong]
        scaled = self.apply_ln_to_stack(residual_stack, -1, pos_slice=pos_slice, batch_slice=batch_slice,
                                        has_batch_dim=has_batch_dim)
        if (has_batch_dim and scaled.dim() == 4 and directions.dim() == 2
                and directions.size(0) == scaled.size(1)):  # one token per example: the same at every position
            directions = directions[:, None]  # [B, D] -> [B, 1, D]
        return (scaled * directions.to(scaled.dtype)).sum(-1)


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
