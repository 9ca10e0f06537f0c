"""What the heads do: capture their attention, score it, switch heads off, rank them, prune them.

Everything here works on any model built from :class:`mhalab.MultiHeadAttention` (the layers are
found as ``model.blocks[i].attn``, or else every ``MultiHeadAttention`` in registration order) and
changes none of its parameters: attention is captured and heads are switched off with hooks that are
removed afterwards.

Shapes use these names:

    N  layers      B  batch      H  heads per layer      T  query positions      S  key positions
    dk width of one head (d_model / H)

Per-head tensors follow ``[layer][batch, head, query, key]`` (a list of ``[B, H, T, S]``, one per
layer); :func:`stack_attention` turns that into one ``[N, B, H, T, S]`` tensor.  Every score is a
``[N, H]`` tensor: one number per head.

The pieces, in the order a notebook uses them:

* :func:`capture_attention`: every layer's weights for a batch, in one call.
* :func:`head_scores`: per head, how much attention lands where each ground-truth relation points
  (``batch.sources``), plus scores that need no ground truth: previous-token, next-token, self,
  first-token (an "attention sink"), entropy and mean attention distance.
* :func:`ablate`: a context manager that switches off any set of ``(layer, head)`` pairs (zero or
  mean ablation) and restores the model on exit; :func:`ablate_each_head` runs it head by head.
* :func:`head_importance`: Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?":
  ``I_h = E_x |dL(x)/d xi_h|`` for a gate ``xi_h = 1`` multiplying head h's output.
* :func:`pruning_curve`: accuracy as heads are removed by importance, against random orders.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .models import _eval_mode

__all__ = [
    "GENERIC_SCORES",
    "attention_layers",
    "model_shape",
    "check_heads",
    "capture_attention",
    "stack_attention",
    "relation_score",
    "previous_token_score",
    "next_token_score",
    "self_score",
    "first_token_score",
    "attention_entropy",
    "attention_distance",
    "head_scores",
    "format_scores",
    "best_heads",
    "heads_matching",
    "evaluate_batch",
    "head_output_means",
    "ablate",
    "AblationTable",
    "ablate_each_head",
    "per_example_loss",
    "head_importance",
    "PruningCurve",
    "pruning_curve",
]

Head = tuple[int, int]  # (layer, head)

#: Scores that need no ground truth, in the order :func:`head_scores` returns them.
GENERIC_SCORES = ("previous-token", "next-token", "self", "first-token", "entropy", "distance")
#: Scores that are fractions of attention in [0, 1] (entropy is in nats, distance in positions).
FRACTION_SCORES = ("previous-token", "next-token", "self", "first-token")


# ----------------------------------------------------------------------------------- layers
def attention_layers(model: nn.Module) -> list[MultiHeadAttention]:
    """The model's attention modules, one per layer.

    ``model.blocks[i].attn`` when the model has them (:class:`mhalab.models.Transformer`); otherwise
    every :class:`MultiHeadAttention` in ``model.modules()`` order (for an encoder-decoder: encoder
    layers, then each decoder layer's self- and cross-attention).
    """
    if isinstance(model, MultiHeadAttention):
        return [model]
    blocks = getattr(model, "blocks", None)
    if blocks is not None:
        layers = [getattr(block, "attn", None) for block in blocks]
        if layers and all(isinstance(a, MultiHeadAttention) for a in layers):
            return layers
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise TypeError(
            f"{type(model).__name__} contains no mhalab.MultiHeadAttention module; the analysis tools need a model "
            "built from it (e.g. mhalab.models.Transformer)"
        )
    return layers


def model_shape(model: nn.Module) -> tuple[int, int]:
    """``(n_layers, n_heads)``; every layer must have the same number of heads."""
    layers = attention_layers(model)
    counts = {a.n_heads for a in layers}
    if len(counts) != 1:
        raise ValueError(f"the attention layers have different head counts {sorted(counts)}; pass heads per layer")
    return len(layers), counts.pop()


def check_heads(model: nn.Module, heads: Iterable[Head] | Head) -> list[Head]:
    """Validate ``(layer, head)`` pairs against the model and return them as a sorted, de-duplicated list.

    A single pair ``(1, 3)`` is accepted as well as a list of pairs.  Out-of-range indices raise an
    IndexError that names the valid range.
    """
    layers = attention_layers(model)
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(i, (int, np.integer)) for i in heads):
        heads = [heads]
    checked: set[Head] = set()
    for pair in heads:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"each head must be a (layer, head) pair of ints, got {pair!r}")
        layer, head = pair
        for name, value in (("layer", layer), ("head", head)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} index must be an int, got {type(value).__name__} ({value!r}) in {pair!r}")
        layer, head = int(layer), int(head)
        if not 0 <= layer < len(layers):
            raise IndexError(f"layer {layer} is out of range: the model has layers 0..{len(layers) - 1}")
        n_heads = layers[layer].n_heads
        if not 0 <= head < n_heads:
            raise IndexError(f"head {head} is out of range: layer {layer} has heads 0..{n_heads - 1}")
        checked.add((layer, head))
    return sorted(checked)


def _tokens(batch_or_tokens: Any) -> Tensor:
    tokens = getattr(batch_or_tokens, "inputs", batch_or_tokens)
    if not isinstance(tokens, Tensor):
        raise TypeError(f"expected a task Batch or a [batch, seq] tensor of token ids, got {type(batch_or_tokens).__name__}")
    return tokens


def _forward(model: nn.Module, batch_or_tokens: Any) -> Tensor:
    """Logits for a Batch (through ``model.forward_batch`` when the model has it) or for token ids."""
    if hasattr(batch_or_tokens, "inputs") and hasattr(model, "forward_batch"):
        return model.forward_batch(batch_or_tokens)
    return model(_tokens(batch_or_tokens))


# -------------------------------------------------------------------------------- capturing
def capture_attention(model: nn.Module, batch: Any) -> list[Tensor]:
    """Every layer's attention weights for one batch, in one forward pass (eval mode, no gradients).

    Args:
        model: a model built from :class:`MultiHeadAttention`.
        batch: a task ``Batch`` or a ``[B, T]`` tensor of token ids.

    Returns:
        A list with one ``[B, H, T, S]`` tensor per attention layer (``[layer][batch, head, query,
        key]``, the layout bertviz reads); every row sums to 1 over the keys.

    Hooks on each layer ask it for its per-head weights and give the layer's caller exactly what it
    asked for, so this works whatever the model's own ``forward`` returns.
    """
    layers = attention_layers(model)
    captured: dict[int, Tensor] = {}
    asked: dict[int, tuple[bool, bool]] = {}  # id(layer) -> what its caller asked for
    handles = []

    def pre_hook(module, args, kwargs):
        asked[id(module)] = (kwargs.get("need_weights", False), kwargs.get("average_attn_weights", True))
        return args, {**kwargs, "need_weights": True, "average_attn_weights": False}

    def make_post_hook(index: int):
        def post_hook(module, args, kwargs, output):
            out, weights = output  # weights: [B, H, T, S]
            captured[index] = weights.detach()
            need, average = asked.pop(id(module), (False, True))
            if not need:
                return out, None
            return out, (weights.mean(dim=1) if average else weights)

        return post_hook

    try:
        for i, layer in enumerate(layers):
            handles.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))
            handles.append(layer.register_forward_hook(make_post_hook(i), with_kwargs=True))
        with torch.no_grad(), _eval_mode(model):
            _forward(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    missing = [i for i in range(len(layers)) if i not in captured]
    if missing:
        raise RuntimeError(f"attention layers {missing} did not run in the forward pass, so nothing was captured")
    return [captured[i] for i in range(len(layers))]


def stack_attention(attention: Sequence[Tensor] | Tensor) -> Tensor:
    """``[layer][B, H, T, S]`` -> one ``[N, B, H, T, S]`` tensor (a stacked tensor is returned as is)."""
    if isinstance(attention, Tensor):
        if attention.dim() != 5:
            raise ValueError(f"stacked attention must be [layer, batch, head, query, key], got shape {tuple(attention.shape)}")
        return attention
    shapes = {tuple(a.shape) for a in attention}
    if len(shapes) != 1:
        raise ValueError(f"cannot stack layers whose attention has different shapes {sorted(shapes)}")
    if len(next(iter(shapes))) != 4:
        raise ValueError(f"each layer's attention must be [batch, head, query, key], got shape {next(iter(shapes))}")
    return torch.stack(list(attention), dim=0)  # [N, B, H, T, S]


# ---------------------------------------------------------------------------------- scores
# Every score takes attention [N, B, H, T, S] (or a list of layers) and averages over the batch and
# the query positions where it is defined, giving one number per head: [N, H].

def _diagonal_score(attention: Sequence[Tensor] | Tensor, offset: int) -> Tensor:
    A = stack_attention(attention)
    diag = torch.diagonal(A, offset=offset, dim1=-2, dim2=-1)  # [N, B, H, T - |offset|]: A[q, q + offset]
    if diag.size(-1) == 0:
        raise ValueError(f"sequences of length {A.size(-1)} have no pairs at offset {offset}")
    return diag.float().mean(dim=(1, 3))  # [N, H]


def previous_token_score(attention: Sequence[Tensor] | Tensor) -> Tensor:
    """``[N, H]``: mean attention from each query to the token just before it (queries 1..T-1)."""
    return _diagonal_score(attention, -1)


def next_token_score(attention: Sequence[Tensor] | Tensor) -> Tensor:
    """``[N, H]``: mean attention from each query to the token just after it (queries 0..T-2)."""
    return _diagonal_score(attention, 1)


def self_score(attention: Sequence[Tensor] | Tensor) -> Tensor:
    """``[N, H]``: mean attention from each query to itself."""
    return _diagonal_score(attention, 0)


def first_token_score(attention: Sequence[Tensor] | Tensor) -> Tensor:
    """``[N, H]``: mean attention on position 0 (an "attention sink"), over queries 1..T-1.

    Query 0 is left out: it attends to position 0 as itself (and must, under a causal mask).
    """
    A = stack_attention(attention)
    if A.size(-2) < 2:
        raise ValueError("the first-token score needs at least two query positions")
    return A[..., 1:, 0].float().mean(dim=(1, 3))  # [N, B, H, T-1] -> [N, H]


def attention_entropy(attention: Sequence[Tensor] | Tensor) -> Tensor:
    """``[N, H]``: mean entropy of each query's weighting, in nats.

    0 means every query looks at exactly one key; ``log S`` means it spreads evenly over all S keys.
    """
    A = stack_attention(attention).float()
    plogp = torch.where(A > 0, A * A.clamp_min(1e-30).log(), torch.zeros_like(A))  # 0 log 0 = 0
    return -plogp.sum(dim=-1).mean(dim=(1, 3))  # [N, B, H, T] -> [N, H]


def attention_distance(attention: Sequence[Tensor] | Tensor) -> Tensor:
    """``[N, H]``: mean |query - key| distance, weighted by attention (in positions)."""
    A = stack_attention(attention).float()
    T, S = A.shape[-2:]
    offset = S - T  # queries are the last T of S positions (as with a KV cache); 0 for self-attention
    q = torch.arange(T, device=A.device)[:, None] + offset
    k = torch.arange(S, device=A.device)[None, :]
    distance = (q - k).abs().float()  # [T, S]
    return (A * distance).sum(dim=-1).mean(dim=(1, 3))  # [N, B, H, T] -> [N, H]


def relation_score(attention: Sequence[Tensor] | Tensor, sources: Tensor, *, name: str = "relation") -> Tensor:
    """``[N, H]``: mean attention each head puts on the position a relation points to.

    Args:
        attention: ``[layer][B, H, T, S]`` or ``[N, B, H, T, S]``.
        sources: ``[B, T]`` long: for each query, the key position the relation points to, ``-1``
            where it points nowhere (those queries are left out of the mean).

    A head scoring 0.9 puts, on average, 90% of its attention exactly where the relation points.
    """
    A = stack_attention(attention)
    N, B, H, T, S = A.shape
    if tuple(sources.shape) != (B, T):
        raise ValueError(
            f"sources for {name!r} must be [batch, query] = [{B}, {T}] to match the attention, got {tuple(sources.shape)}"
        )
    sources = sources.to(A.device)
    valid = sources >= 0  # [B, T]
    if not bool(valid.any()):
        raise ValueError(f"relation {name!r} points nowhere in this batch (all sources are -1), so it cannot be scored")
    if int(sources.max()) >= S:
        raise ValueError(f"relation {name!r} points to position {int(sources.max())}, but there are only {S} keys")
    index = sources.clamp(min=0)[None, :, None, :, None].expand(N, B, H, T, 1)  # [N, B, H, T, 1]
    on_source = A.gather(-1, index).squeeze(-1).float()  # [N, B, H, T]: attention on the pointed-to key
    weight = valid[None, :, None, :].float()  # [1, B, 1, T]
    return (on_source * weight).sum(dim=(1, 3)) / weight.sum()  # [N, H]


def head_scores(
    attention: Sequence[Tensor] | Tensor,
    batch: Any = None,
    *,
    relations: Sequence[str] | None = None,
    generic: bool = True,
) -> dict[str, Tensor]:
    """Every score for every head: ``{name: [N, H]}``.

    Args:
        attention: from :func:`capture_attention` (``[layer][B, H, T, S]``) or stacked.
        batch: the task ``Batch`` the attention was computed on; its ``sources`` give one score per
            relation (omit it for the generic scores only).
        relations: which relations to score, in this order (default: all of ``batch.sources``).
        generic: include the scores that need no ground truth (:data:`GENERIC_SCORES`).

    Returns:
        Relation scores first (fraction of attention on the right position, in [0, 1]), then
        ``previous-token``, ``next-token``, ``self``, ``first-token`` (fractions), ``entropy`` (nats)
        and ``distance`` (positions).
    """
    A = stack_attention(attention)
    scores: dict[str, Tensor] = {}
    if batch is not None:
        sources = getattr(batch, "sources", None)
        if sources is None:
            raise TypeError(f"batch must be a task Batch with .sources, got {type(batch).__name__}")
        names = list(sources) if relations is None else list(relations)
        for name in names:
            if name not in sources:
                raise KeyError(f"relation {name!r} is not in this batch; it has {sorted(sources)}")
            scores[name] = relation_score(A, sources[name], name=name)
    elif relations:
        raise ValueError("relation scores need the batch (with .sources) the attention was computed on")
    if generic:
        scores["previous-token"] = previous_token_score(A)
        scores["next-token"] = next_token_score(A)
        scores["self"] = self_score(A)
        scores["first-token"] = first_token_score(A)
        scores["entropy"] = attention_entropy(A)
        scores["distance"] = attention_distance(A)
    return scores


def format_scores(scores: dict[str, Tensor], *, names: Sequence[str] | None = None, digits: int = 2) -> str:
    """A text table: one row per head (``L0H3``), one column per score."""
    names = list(scores) if names is None else list(names)
    N, H = next(iter(scores.values())).shape
    width = max(6, *(len(n) for n in names))
    lines = ["head  " + " ".join(f"{n:>{width}}" for n in names)]
    for layer in range(N):
        for head in range(H):
            row = " ".join(f"{float(scores[n][layer, head]):>{width}.{digits}f}" for n in names)
            lines.append(f"L{layer}H{head}  {row}")
    return "\n".join(lines)


def best_heads(scores: dict[str, Tensor], names: Sequence[str]) -> dict[str, tuple[Head, float]]:
    """For each score name: the head with the highest score and that score, ``{name: ((layer, head), score)}``."""
    out = {}
    for name in names:
        s = scores[name]
        flat = int(s.argmax())
        layer, head = divmod(flat, s.size(1))
        out[name] = ((layer, head), float(s[layer, head]))
    return out


def heads_matching(scores: dict[str, Tensor], names: Sequence[str], threshold: float = 0.8) -> dict[Head, str | None]:
    """Each head's best-matching name among ``names`` if its score reaches ``threshold``, else None."""
    stacked = torch.stack([scores[n] for n in names], dim=0)  # [R, N, H]
    value, which = stacked.max(dim=0)  # [N, H]
    N, H = value.shape
    return {(l, h): (names[int(which[l, h])] if float(value[l, h]) >= threshold else None) for l in range(N) for h in range(H)}


# -------------------------------------------------------------------------------- ablation
def evaluate_batch(model: nn.Module, task: Any, batch: Any) -> dict[str, float]:
    """``task.metrics`` of the model on one fixed batch (eval mode, no gradients)."""
    with torch.no_grad(), _eval_mode(model):
        logits = _forward(model, batch)
    return task.metrics(logits, batch)


def head_output_means(model: nn.Module, reference: Any) -> list[Tensor]:
    """Each layer's head outputs averaged over a reference batch: a list of ``[T, H, dk]``.

    The mean is taken over the batch only, so it keeps what a head does at each position on
    average (e.g. the constant part that every example shares) and removes what depends on the input.
    """
    layers = attention_layers(model)
    means: dict[int, Tensor] = {}
    handles = []

    def make_hook(index: int, layer: MultiHeadAttention):
        def hook(module, args):
            x = args[0]  # [B, T, D]: the concatenated head outputs, just before W_O
            B, T, D = x.shape
            means[index] = x.detach().float().mean(dim=0).view(T, layer.n_heads, layer.d_k)  # [T, H, dk]

        return hook

    try:
        for i, layer in enumerate(layers):
            handles.append(layer.out_proj.register_forward_pre_hook(make_hook(i, layer)))
        with torch.no_grad(), _eval_mode(model):
            _forward(model, reference)
    finally:
        for handle in handles:
            handle.remove()
    return [means[i] for i in range(len(layers))]


@contextlib.contextmanager
def _gate_heads(model: nn.Module, gates: Tensor, means: list[Tensor] | None = None) -> Iterator[None]:
    """Multiply each head's output by ``gates`` (``[N, H]`` or ``[B, N, H]``) while inside.

    Where ``means`` is given, a head's output becomes ``g * output + (1 - g) * mean`` instead, so a
    gate of 0 means "replace by its mean".  Implemented as a pre-hook on each layer's ``W_O``, whose
    input is exactly the concatenation of the head outputs.
    """
    layers = attention_layers(model)
    handles = []

    def make_hook(index: int, layer: MultiHeadAttention):
        H, dk = layer.n_heads, layer.d_k

        def hook(module, args):
            x = args[0]  # [B, T, D]
            B, T, D = x.shape
            g = gates[..., index, :]  # [H] or [B, H]
            g = g.view(1, 1, H, 1) if g.dim() == 1 else g.view(B, 1, H, 1)
            heads = x.view(B, T, H, dk)  # [B, T, D] -> [B, T, H, dk]
            if means is None:
                heads = heads * g.to(x.dtype)
            else:
                mean = means[index]
                if mean.size(0) != T:
                    raise ValueError(
                        f"mean ablation: the reference batch had sequences of length {mean.size(0)} but this input "
                        f"has length {T}; use a reference batch of the same length"
                    )
                heads = heads * g.to(x.dtype) + (1 - g.to(x.dtype)) * mean.to(x.dtype)[None]  # [B, T, H, dk]
            return (heads.reshape(B, T, D),) + tuple(args[1:])  # [B, T, H, dk] -> [B, T, D]

        return hook

    try:
        for i, layer in enumerate(layers):
            handles.append(layer.out_proj.register_forward_pre_hook(make_hook(i, layer)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def ablate(
    model: nn.Module,
    heads: Iterable[Head] | Head,
    *,
    method: str = "zero",
    reference: Any = None,
) -> Iterator[nn.Module]:
    """Switch off some heads while inside the ``with`` block; the model is exactly as before on exit.

    Args:
        model: a model built from :class:`MultiHeadAttention`.
        heads: ``(layer, head)`` pairs (or one pair) to switch off.
        method: ``"zero"`` replaces each head's output by zeros (what a 0 in ``head_mask`` does);
            ``"mean"`` replaces it by its mean over ``reference`` at each position, which removes
            what the head computes from the input but keeps its average contribution.
        reference: a batch (or token ids) for ``method="mean"``.

    Nothing about the model is modified: hooks on each layer's ``W_O`` do the work and are removed on
    exit, even after an exception. Yields the model::

        with ablate(model, [(0, 3), (1, 5)]):
            metrics = evaluate_batch(model, task, batch)
    """
    if method not in ("zero", "mean"):
        raise ValueError(f"method must be 'zero' or 'mean', got {method!r}")
    heads = check_heads(model, heads)
    N, H = model_shape(model)
    param = next(model.parameters())
    gates = torch.ones(N, H, device=param.device, dtype=param.dtype)
    for layer, head in heads:
        gates[layer, head] = 0.0
    means = None
    if method == "mean":
        if reference is None:
            raise ValueError("mean ablation needs a reference batch: ablate(model, heads, method='mean', reference=batch)")
        means = head_output_means(model, reference)
    with _gate_heads(model, gates, means):
        yield model


@dataclass
class AblationTable:
    """What switching off each head (one at a time) does to every metric.

    Attributes:
        baseline: metrics of the intact model.
        ablated: metric name -> ``[N, H]``: that metric with head ``(layer, head)`` switched off.
        method: ``"zero"`` or ``"mean"``.
    """

    baseline: dict[str, float]
    ablated: dict[str, Tensor]
    method: str = "zero"

    def drop(self, metric: str = "accuracy") -> Tensor:
        """``[N, H]``: how much ``metric`` falls when each head is switched off (positive = worse)."""
        if metric not in self.ablated:
            raise KeyError(f"no metric {metric!r}; the table has {sorted(self.ablated)}")
        return self.baseline[metric] - self.ablated[metric]


def ablate_each_head(
    model: nn.Module, task: Any, batch: Any, *, method: str = "zero", reference: Any = None
) -> AblationTable:
    """Switch off every head in turn and record ``task.metrics`` on ``batch``.

    Mean ablation uses ``reference`` (default: ``batch`` itself) for the means.
    """
    N, H = model_shape(model)
    baseline = evaluate_batch(model, task, batch)
    table = {name: torch.zeros(N, H) for name in baseline}
    if method == "mean" and reference is None:
        reference = batch
    for layer in range(N):
        for head in range(H):
            with ablate(model, [(layer, head)], method=method, reference=reference):
                metrics = evaluate_batch(model, task, batch)
            for name, value in metrics.items():
                table[name][layer, head] = value
    return AblationTable(baseline, table, method)


# ------------------------------------------------------------------------------- importance
def per_example_loss(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """``[B]``: each example's mean cross-entropy over its positions (and targets) that have one.

    ``logits`` ``[B, T, V]`` with ``targets`` ``[B, T]``, or ``[B, T, R, V]`` with ``[B, T, R]``.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)} (expected [..., V] vs [...])")
    V = logits.size(-1)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # half precision -> float32
    ce = F.cross_entropy(
        logits.reshape(-1, V), targets.reshape(-1), ignore_index=ignore_index, reduction="none"
    ).view(targets.shape)  # [B, T(, R)]
    valid = (targets != ignore_index).float()
    return (ce * valid).flatten(1).sum(1) / valid.flatten(1).sum(1).clamp(min=1)  # [B]


def _as_batches(batches: Any) -> list[Any]:
    if isinstance(batches, (list, tuple)):
        return list(batches)
    return [batches]


def head_importance(
    model: nn.Module,
    batches: Any,
    *,
    normalize: bool = True,
    mask: Tensor | None = None,
    loss_fn: Callable[[Tensor, Any], Tensor] | None = None,
) -> Tensor:
    """Head importance of Michel, Levy & Neubig (2019): ``I_h = E_x |dL(x) / d xi_h|``, ``[N, H]``.

    Every head's output is multiplied by a gate ``xi_h`` (all ones, so the model computes exactly what
    it always does); the importance of head h is how strongly the loss of one example reacts to that
    gate, in absolute value, averaged over examples.  By the chain rule this equals the paper's
    ``E_x |A_h(x)ᵀ dL(x)/dA_h(x)|``, with ``A_h`` the head's output.

    Args:
        model: a model built from :class:`MultiHeadAttention`.
        batches: a task ``Batch`` or a list of them (each needs ``inputs`` and ``targets``).
        normalize: divide each layer's scores by their l2 norm, as the paper does, so that layers are
            comparable when pruning globally.
        mask: optional ``[N, H]`` of 0/1: heads already removed (0) stay off and score 0.
        loss_fn: ``loss_fn(logits, batch) -> [B]`` per-example losses (default: mean cross-entropy
            over each example's targets, :func:`per_example_loss`).

    One backward pass per batch: each example gets its own gates ``[B, N, H]`` so the gradient of
    the *summed* loss with respect to them is every example's own gradient.
    """
    N, H = model_shape(model)
    param = next(model.parameters())
    total = torch.zeros(N, H, device=param.device, dtype=torch.float64 if param.dtype == torch.float64 else torch.float32)
    count = 0
    keep = torch.ones(N, H, device=param.device) if mask is None else mask.to(param.device, torch.float32)
    if tuple(keep.shape) != (N, H):
        raise ValueError(f"mask must be [n_layers, n_heads] = [{N}, {H}], got {tuple(keep.shape)}")
    with _eval_mode(model):
        for batch in _as_batches(batches):
            B = _tokens(batch).size(0)
            xi = torch.ones(B, N, H, device=param.device, dtype=param.dtype, requires_grad=True)  # [B, N, H]
            with _gate_heads(model, xi * keep.to(param.dtype)):
                logits = _forward(model, batch)
            losses = per_example_loss(logits, batch.targets) if loss_fn is None else loss_fn(logits, batch)  # [B]
            (grad,) = torch.autograd.grad(losses.sum(), xi)  # [B, N, H]: dL(x_b)/d xi for each example b
            total += grad.abs().sum(dim=0).to(total.dtype)
            count += B
    importance = total / count
    if normalize:
        importance = importance / importance.norm(dim=-1, keepdim=True).clamp_min(1e-12)  # l2 per layer
    return importance.cpu()


# --------------------------------------------------------------------------------- pruning
@dataclass
class PruningCurve:
    """Accuracy as heads are removed, one more at each step.

    Attributes:
        baseline: the metric with every head on.
        metric: which metric of ``task.metrics``.
        removed: ``[K + 1]``: 0, 1, ..., K heads removed.
        by_importance: ``[K + 1]``: the metric when the least important heads go first.
        importance_order: the heads in the order they were removed.
        random: ``[R, K + 1]``: the metric for each of R random orders.
        random_orders: those orders.
        n_heads: heads in the model.
    """

    baseline: float
    metric: str
    removed: np.ndarray
    by_importance: np.ndarray
    importance_order: list[Head]
    random: np.ndarray
    random_orders: list[list[Head]] = field(repr=False)
    n_heads: int = 0
    recompute: bool = False

    @property
    def random_mean(self) -> np.ndarray:
        return self.random.mean(axis=0)

    @property
    def random_std(self) -> np.ndarray:
        return self.random.std(axis=0)

    def removable(self, tolerance: float = 0.01, *, curve: str = "importance") -> int:
        """How many heads can go (in that order) before the metric first falls more than ``tolerance`` below the baseline.

        ``curve`` is ``"importance"`` or ``"random"`` (the mean over random orders).
        """
        values = self.by_importance if curve == "importance" else self.random_mean if curve == "random" else None
        if values is None:
            raise ValueError(f"curve must be 'importance' or 'random', got {curve!r}")
        below = np.nonzero(values < self.baseline - tolerance)[0]
        return int(below[0] - 1) if len(below) else int(self.removed[-1])

    def plot(self, ax=None, *, title: str | None = None):
        """Both curves against the fraction of heads removed, random orders as mean ± one std."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5.5, 3.4), dpi=80)
        x = self.removed / max(self.n_heads, 1)
        label = "by importance" + (" (recomputed)" if self.recompute else "")
        ax.plot(x, self.by_importance, "o-", ms=3, label=label)
        mean, std = self.random_mean, self.random_std
        ax.plot(x, mean, "s--", ms=3, color="gray", label=f"random order (mean of {len(self.random)})")
        ax.fill_between(x, mean - std, mean + std, color="gray", alpha=0.25, lw=0)
        ax.axhline(self.baseline - 0.01, color="k", lw=0.6, ls=":", label="1 point below the full model")
        ax.set_xlabel("fraction of heads removed")
        ax.set_ylabel(self.metric)
        ax.set_title(title or "Pruning heads")
        ax.legend(fontsize=8, loc="lower left")
        return ax


def _metric(model: nn.Module, task: Any, batch: Any, heads: list[Head], metric: str, method: str, reference: Any) -> float:
    with ablate(model, heads, method=method, reference=reference):
        metrics = evaluate_batch(model, task, batch)
    if metric not in metrics:
        raise KeyError(f"task.metrics has no {metric!r}; it has {sorted(metrics)}")
    return float(metrics[metric])


def pruning_curve(
    model: nn.Module,
    task: Any,
    batch: Any,
    *,
    importance_batches: Any = None,
    recompute: bool = False,
    random_orders: int = 5,
    seed: int = 0,
    metric: str = "accuracy",
    max_removed: int | None = None,
    method: str = "zero",
) -> PruningCurve:
    """Remove heads one at a time, least important first, and compare with random orders.

    Args:
        model: a trained model built from :class:`MultiHeadAttention`.
        task: its task (for ``task.metrics``).
        batch: the fixed evaluation batch every point of the curve is measured on.
        importance_batches: batch(es) for :func:`head_importance` (default: ``batch``).
        recompute: recompute the importance of the remaining heads after every removal (as Michel
            et al. do iteratively) instead of ranking once.
        random_orders: how many random removal orders to average.
        seed: seed of the random orders.
        metric: which entry of ``task.metrics`` to track.
        max_removed: stop after this many heads (default: all of them).
        method: ``"zero"`` (as in the paper) or ``"mean"`` ablation (reference: ``batch``).
    """
    N, H = model_shape(model)
    heads = [(l, h) for l in range(N) for h in range(H)]
    K = len(heads) if max_removed is None else int(max_removed)
    if not 0 <= K <= len(heads):
        raise ValueError(f"max_removed must be between 0 and {len(heads)}, got {max_removed}")
    importance_batches = batch if importance_batches is None else importance_batches
    reference = batch if method == "mean" else None

    def measure(removed: list[Head]) -> float:
        return _metric(model, task, batch, removed, metric, method, reference)

    baseline = measure([])
    # Importance order: rank once, or re-rank the survivors after each removal.
    order: list[Head] = []
    if not recompute:
        importance = head_importance(model, importance_batches)
        order = sorted(heads, key=lambda lh: (float(importance[lh]), lh))[:K]
    else:
        mask = torch.ones(N, H)
        for _ in range(K):
            importance = head_importance(model, importance_batches, mask=mask)
            alive = [lh for lh in heads if mask[lh] > 0]
            nxt = min(alive, key=lambda lh: (float(importance[lh]), lh))
            order.append(nxt)
            mask[nxt] = 0.0
    by_importance = np.array([baseline] + [measure(order[: k + 1]) for k in range(K)])

    rng = np.random.default_rng(seed)
    orders = [[heads[i] for i in rng.permutation(len(heads))[:K]] for _ in range(random_orders)]
    random = np.array([[baseline] + [measure(o[: k + 1]) for k in range(K)] for o in orders]).reshape(random_orders, K + 1)
    return PruningCurve(
        baseline=baseline,
        metric=metric,
        removed=np.arange(K + 1),
        by_importance=by_importance,
        importance_order=order,
        random=random,
        random_orders=orders,
        n_heads=len(heads),
        recompute=recompute,
    )
