"""Switch heads off and see what breaks: ablation, head importance and pruning.

Nothing here changes a model's parameters: heads are switched off or gated by hooks on their ``hook_z``
points (:mod:`mhalab.hooks`, which documents the axes), attached only while needed. Layer ``i`` is the model's
``i``-th attention module.
Importance and pruning follow Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?".

    N  layers      B  batch      H  heads per layer      T  positions      dk  width of one head
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .arguments import validate_index
from .head_interventions import ablate_heads, gate_heads
from .hooks import attention_modules, hooks_attached
from .models import batch_logits, eval_mode
from .plotting import plot_pruning_curve
from .tasks import IGNORE

__all__ = [
    "model_shape", "validate_heads", "evaluate_batch", "ablate", "AblationTable", "ablate_each_head",
    "AdditiveControl", "additive_control", "per_sequence_metrics", "standard_error", "per_example_loss",
    "head_importance", "PruningCurve", "pruning_curve",
]

Head = tuple[int, int]  # (layer, head)


# ----------------------------------------------------------------------------------- heads
def _z_points(model: nn.Module) -> list[str]:
    """The ``hook_z`` point of each attention layer, in order (``blocks.0.attn.hook_z``, ...; ``hook_z`` for a
    lone layer)."""
    return [f"{name}.hook_z" if name else "hook_z" for name in attention_modules(model)]


def model_shape(model: nn.Module) -> tuple[int, int]:
    """``(n_layers, n_heads)``; every layer must have the same number of heads."""
    layers = attention_modules(model).values()
    counts = {a.n_heads for a in layers}
    if len(counts) != 1:
        raise ValueError(f"the attention layers have different head counts {sorted(counts)}; pass heads per layer")
    return len(layers), counts.pop()


def validate_heads(model: nn.Module, heads: Iterable[Head] | Head) -> list[Head]:
    """``(layer, head)`` pairs (or one pair) checked against the model, sorted and de-duplicated."""
    layers = list(attention_modules(model).values())
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(i, (int, np.integer)) for i in heads):
        heads = [heads]
    checked: set[Head] = set()
    for pair in heads:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"each head must be a (layer, head) pair of ints, got {pair!r}")
        layer = validate_index("layer", pair[0], len(layers), valid="the model has layers")
        head = validate_index("head", pair[1], layers[layer].n_heads, valid=f"layer {layer} has heads")
        checked.add((layer, head))
    return sorted(checked)


# -------------------------------------------------------------------------------- ablation
def evaluate_batch(model: nn.Module, task: Any, batch: Any) -> dict[str, float]:
    """``task.metrics`` of the model on one fixed batch (eval mode, no gradients)."""
    with torch.no_grad(), eval_mode(model):
        logits = batch_logits(model, batch)
    return task.metrics(logits, batch)


@contextlib.contextmanager
def ablate(model: nn.Module, heads: Iterable[Head] | Head, *, method: str = "zero",
           reference: Any = None) -> Iterator[nn.Module]:
    """Switch off ``(layer, head)`` pairs inside the ``with`` block (yields the model; restored on exit).

    ``method="zero"`` sets each head's output ``z`` to zeros; ``"mean"`` to its mean ``[T, H, dk]`` over
    the ``reference`` batch, which keeps the head's average contribution but not what depends on the input.
    """
    if method not in ("zero", "mean"):
        raise ValueError(f"method must be 'zero' or 'mean', got {method!r}")
    heads = validate_heads(model, heads)
    points = _z_points(model)
    means: dict[str, Tensor] = {}
    if method == "mean":
        if reference is None:
            raise ValueError("mean ablation needs a reference batch: "
                             "ablate(model, heads, method='mean', reference=batch)")

        def mean_over_batch(z: Tensor, hook) -> None:  # z: [B, T, H, dk]
            means[hook.name] = z.detach().float().mean(dim=0)  # [T, H, dk]

        with torch.no_grad(), eval_mode(model), hooks_attached(model, [(points, mean_over_batch)]):
            batch_logits(model, reference)
    hooks = [(point, ablate_heads([h for l, h in heads if l == layer], means.get(point)))
             for layer, point in enumerate(points) if any(l == layer for l, _ in heads)]
    with hooks_attached(model, hooks):
        yield model


@dataclass
class AblationTable:
    """Every metric with each head switched off: ``baseline`` (intact) and ``ablated`` ``{metric: [N, H]}``."""

    baseline: dict[str, float]
    ablated: dict[str, Tensor]

    def drop(self, metric: str = "accuracy") -> Tensor:
        """``[N, H]``: how much ``metric`` falls when each head is switched off (positive = worse)."""
        if metric not in self.ablated:
            raise KeyError(f"no metric {metric!r}; the table has {sorted(self.ablated)}")
        return self.baseline[metric] - self.ablated[metric]


def ablate_each_head(model: nn.Module, task: Any, batch: Any) -> AblationTable:
    """Zero each head in turn and record ``task.metrics`` on ``batch``."""
    N, H = model_shape(model)
    points = _z_points(model)  # looked up once, not once per head
    baseline = evaluate_batch(model, task, batch)
    table = {name: torch.zeros(N, H) for name in baseline}
    for layer, head in np.ndindex(N, H):
        with hooks_attached(model, [(points[layer], ablate_heads([head]))]):
            for name, value in evaluate_batch(model, task, batch).items():
                table[name][layer, head] = value
    return AblationTable(baseline, table)


# ------------------------------------------------------------------------ additive control
@dataclass
class AdditiveControl:
    """A control whose heads cannot interact, built from a model: switching heads off changes its logits by
    the sum of their single effects. ``intact``: the model's logits ``[B, T(, R), V]``; ``change``: per head,
    its logits with that head alone switched off, less ``intact``."""

    intact: Tensor
    change: dict[Head, Tensor] = field(repr=False)

    def logits(self, heads: Iterable[Head]) -> Tensor:
        """The control's logits with ``heads`` switched off: ``intact`` plus their changes, summed."""
        return self.intact + sum((self.change[tuple(lh)] for lh in heads), torch.zeros_like(self.intact))


def additive_control(model: nn.Module, batch: Any, heads: Iterable[Head] | None = None) -> AdditiveControl:
    """The :class:`AdditiveControl` of ``model`` on ``batch``: one run intact and one per head of ``heads``
    (default: every head) with that head alone zeroed."""
    N, H = model_shape(model)
    heads = validate_heads(model, list(np.ndindex(N, H)) if heads is None else heads)
    with torch.no_grad(), eval_mode(model):
        intact = batch_logits(model, batch)
        change = {}
        for lh in heads:
            with ablate(model, [lh]):
                change[lh] = batch_logits(model, batch) - intact
    return AdditiveControl(intact, change)


def per_sequence_metrics(task: Any, logits: Tensor, batch: Any, relation: int | None = None) -> tuple[Tensor, Tensor]:
    """``([B] accuracy, [B] loss)`` of each sequence in float64, over its targets (or relation ``relation``'s
    only): a difference of two models' values, averaged over the sequences, has :func:`standard_error`."""
    correct, valid = task.correct(logits, batch)  # each [B, T, R]
    targets = batch.targets
    if relation is not None:  # one relation: logits [B, T, R, V] -> [B, T, V], targets [B, T, R] -> [B, T]
        correct, valid = correct[..., relation], valid[..., relation]
        logits, targets = logits[..., relation, :], targets[..., relation]
    accuracy = correct.flatten(1).sum(1).double() / valid.flatten(1).sum(1).clamp(min=1)  # [B]
    return accuracy, per_example_loss(logits, targets).double()


def standard_error(values: Tensor) -> float:
    """The standard error of the mean of ``values`` ``[B]`` (independent draws): ``std / sqrt(B)``."""
    return float(values.std() / values.numel() ** 0.5)


# ------------------------------------------------------------------------------- importance
def per_example_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """``[B]``: each example's mean cross-entropy over the targets it has (not ``IGNORE``), from ``logits``
    ``[B, T, V]`` and ``targets`` ``[B, T]``, or ``[B, T, R, V]`` and ``[B, T, R]``."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)} "
                         "(expected [..., V] vs [...])")
    V = logits.size(-1)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # half precision -> float32
    ce = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=IGNORE, reduction="none")
    valid = (targets != IGNORE).flatten(1).sum(1)  # [B]; IGNORE's cross-entropy is 0 already
    return ce.view(targets.size(0), -1).sum(1) / valid.clamp(min=1)  # [B, T(, R)] -> [B, T R] -> [B]


def head_importance(model: nn.Module, batches: Any, *, normalize: bool = True,
                    mask: Tensor | None = None) -> Tensor:
    """``[N, H]``: Michel et al.'s ``I_h = E_x |dL(x) / d xi_h|`` for a gate ``xi_h = 1`` on head h's output.

    ``batches``: a task ``Batch`` or a list of them. ``normalize``: l2 per layer, as the paper does.
    ``mask``: ``[N, H]`` of 0/1, heads already removed (0) stay off and score 0. One backward pass per batch.
    """
    N, H = model_shape(model)
    points = _z_points(model)
    param = next(model.parameters())
    dtype = torch.float64 if param.dtype == torch.float64 else torch.float32  # half precision: sum in float32
    grads = []
    keep = torch.ones(N, H, device=param.device) if mask is None else mask.to(param.device, torch.float32)
    if tuple(keep.shape) != (N, H):
        raise ValueError(f"mask must be [n_layers, n_heads] = [{N}, {H}], got {tuple(keep.shape)}")
    with eval_mode(model):
        for batch in batches if isinstance(batches, (list, tuple)) else [batches]:
            B = batch.inputs.size(0)
            # Gates per example, so the gradient of the summed loss is every example's own gradient.
            xi = torch.ones(B, N, H, device=param.device, dtype=param.dtype, requires_grad=True)  # [B, N, H]
            gates = xi * keep.to(param.dtype)  # [B, N, H]: removed heads stay at 0
            with hooks_attached(model, [(point, gate_heads(gates[:, i])) for i, point in enumerate(points)]):
                logits = batch_logits(model, batch)
            losses = per_example_loss(logits, batch.targets)  # [B]
            (grad,) = torch.autograd.grad(losses.sum(), xi)  # [B, N, H]: dL(x_b)/d xi for each example b
            grads.append(grad.abs().to(dtype))
    importance = torch.cat(grads).mean(dim=0)  # [N, H]: the mean over every example
    if normalize:
        importance = importance / importance.norm(dim=-1, keepdim=True).clamp_min(1e-12)  # l2 per layer
    return importance.cpu()


# --------------------------------------------------------------------------------- pruning
@dataclass
class PruningCurve:
    """Accuracy with 0..K heads removed (``removed`` ``[K + 1]``): least important first (``by_importance``,
    removing ``importance_order``) and in R random orders (``random`` ``[R, K + 1]``, ``random_orders``)."""

    baseline: float
    removed: np.ndarray
    by_importance: np.ndarray
    importance_order: list[Head]
    random: np.ndarray
    random_orders: list[list[Head]] = field(repr=False)
    n_heads: int = 0
    recompute: bool = False

    def removable(self, tolerance: float = 0.01, *, curve: str = "importance") -> int:
        """Heads removed (in that order) before accuracy first falls more than ``tolerance`` below baseline.

        ``curve`` is ``"importance"`` or ``"random"`` (the mean over random orders).
        """
        values = {"importance": self.by_importance, "random": self.random.mean(axis=0)}.get(curve)
        if values is None:
            raise ValueError(f"curve must be 'importance' or 'random', got {curve!r}")
        below = np.nonzero(values < self.baseline - tolerance)[0]
        return int(below[0] - 1) if len(below) else int(self.removed[-1])

    def plot(self, ax=None, *, title: str | None = None):
        """Both curves against the fraction of heads removed: :func:`mhalab.plotting.plot_pruning_curve`."""
        return plot_pruning_curve(self, ax=ax, title=title)


def pruning_curve(model: nn.Module, task: Any, batch: Any, *, recompute: bool = False, random_orders: int = 5,
                  seed: int = 0, max_removed: int | None = None) -> PruningCurve:
    """Zero heads one at a time, least important first (:func:`head_importance` on ``batch``), against
    ``random_orders`` random orders; accuracy on ``batch`` after each. ``recompute`` re-ranks the
    survivors after every removal (as Michel et al. do); ``max_removed`` stops early (default: all)."""
    N, H = model_shape(model)
    heads = [(l, h) for l in range(N) for h in range(H)]
    K = len(heads) if max_removed is None else int(max_removed)
    if not 0 <= K <= len(heads):
        raise ValueError(f"max_removed must be between 0 and {len(heads)}, got {max_removed}")

    def accuracy(removed: list[Head]) -> float:
        with ablate(model, removed):
            return float(evaluate_batch(model, task, batch)["accuracy"])

    baseline = accuracy([])
    order: list[Head] = []
    mask = torch.ones(N, H)
    while len(order) < K:  # rank once, or (recompute) re-rank the survivors after each removal
        importance = head_importance(model, batch, mask=mask)
        alive = sorted((lh for lh in heads if lh not in order), key=lambda lh: (float(importance[lh]), lh))
        order += alive[: 1 if recompute else K]
        for lh in order:
            mask[lh] = 0.0

    def curve(removal_order: list[Head]) -> list[float]:
        return [baseline] + [accuracy(removal_order[:k]) for k in range(1, K + 1)]

    rng = np.random.default_rng(seed)
    orders = [[heads[i] for i in rng.permutation(len(heads))[:K]] for _ in range(random_orders)]
    by_importance = np.array(curve(order))
    random = np.array([curve(o) for o in orders]).reshape(random_orders, K + 1)
    return PruningCurve(baseline, np.arange(K + 1), by_importance, importance_order=order, random=random,
                        random_orders=orders, n_heads=len(heads), recompute=recompute)
