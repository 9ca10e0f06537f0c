"""Switch heads off and see what breaks: ablation, head importance and pruning.

Every function here works on any model built from :class:`mhalab.MultiHeadAttention` and changes none of
its parameters: heads are switched off or gated by hooks on their ``z`` points (:mod:`mhalab.hooks`),
attached only while they are needed.  Layer ``i`` is the model's ``i``-th attention module
(:func:`mhalab.hooks.attention_modules`: ``blocks.{i}.attn`` in a :class:`~mhalab.models.Transformer`).

    N  layers      B  batch      H  heads per layer      T  positions      dk  width of one head

* :func:`ablate`: a context manager that switches off any set of ``(layer, head)`` pairs (zero or mean
  ablation); :func:`ablate_each_head` runs it head by head.
* :func:`head_importance`: Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?":
  ``I_h = E_x |dL(x)/d xi_h|`` for a gate ``xi_h = 1`` multiplying head h's output.
* :func:`pruning_curve`: accuracy as heads are removed by importance, against random orders.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_index
from .hooks import ablate_heads, attention_modules, gate_heads, hooks_attached
from .models import batch_logits, eval_mode
from .plotting import figure

__all__ = [
    "model_shape",
    "check_heads",
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


# ----------------------------------------------------------------------------------- heads
def _z_points(model: nn.Module) -> list[str]:
    """The ``z`` hook point of each attention layer, in order (``blocks.0.attn.z``, ...; ``z`` for a lone layer)."""
    return [f"{name}.z" if name else "z" for name in attention_modules(model)]


def model_shape(model: nn.Module) -> tuple[int, int]:
    """``(n_layers, n_heads)``; every layer must have the same number of heads."""
    layers = attention_modules(model).values()
    counts = {a.n_heads for a in layers}
    if len(counts) != 1:
        raise ValueError(f"the attention layers have different head counts {sorted(counts)}; pass heads per layer")
    return len(layers), counts.pop()


def check_heads(model: nn.Module, heads: Iterable[Head] | Head) -> list[Head]:
    """Validate ``(layer, head)`` pairs against the model and return them as a sorted, de-duplicated list.

    A single pair ``(1, 3)`` is accepted as well as a list of pairs.  Out-of-range indices raise an
    IndexError that names the valid range.
    """
    layers = list(attention_modules(model).values())
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(i, (int, np.integer)) for i in heads):
        heads = [heads]
    checked: set[Head] = set()
    for pair in heads:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"each head must be a (layer, head) pair of ints, got {pair!r}")
        layer = check_index("layer", pair[0], len(layers), valid="the model has layers")
        head = check_index("head", pair[1], layers[layer].n_heads, valid=f"layer {layer} has heads")
        checked.add((layer, head))
    return sorted(checked)


# -------------------------------------------------------------------------------- ablation
def evaluate_batch(model: nn.Module, task: Any, batch: Any) -> dict[str, float]:
    """``task.metrics`` of the model on one fixed batch (eval mode, no gradients)."""
    with torch.no_grad(), eval_mode(model):
        logits = batch_logits(model, batch)
    return task.metrics(logits, batch)


def head_output_means(model: nn.Module, reference: Any) -> list[Tensor]:
    """Each layer's head outputs ``z`` averaged over a reference batch: a list of ``[T, H, dk]``.

    The mean is taken over the batch only, so it keeps what a head does at each position on
    average (e.g. the constant part that every example shares) and removes what depends on the input.
    """
    means: dict[str, Tensor] = {}

    def mean_over_batch(z: Tensor, name: str) -> None:  # z: [B, T, H, dk]
        means[name] = z.detach().float().mean(dim=0)  # [T, H, dk]

    points = _z_points(model)
    with torch.no_grad(), eval_mode(model), hooks_attached(model, [(points, mean_over_batch)]):
        batch_logits(model, reference)
    return [means[name] for name in points]


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
        method: ``"zero"`` replaces each head's output ``z`` by zeros (its slice of W_O then adds
            nothing); ``"mean"`` replaces it by its mean over ``reference`` at each position, which
            removes what the head computes from the input but keeps its average contribution.
        reference: a batch (or token ids) for ``method="mean"``.

    Nothing about the model is modified: :func:`mhalab.hooks.ablate_heads` hooks on the layers' ``z``
    points do the work and are removed on exit, even after an exception. Yields the model::

        with ablate(model, [(0, 3), (1, 5)]):
            metrics = evaluate_batch(model, task, batch)
    """
    if method not in ("zero", "mean"):
        raise ValueError(f"method must be 'zero' or 'mean', got {method!r}")
    heads = check_heads(model, heads)
    means = None
    if method == "mean":
        if reference is None:
            raise ValueError("mean ablation needs a reference batch: ablate(model, heads, method='mean', reference=batch)")
        means = head_output_means(model, reference)
    hooks = []
    for layer, point in enumerate(_z_points(model)):
        off = [h for l, h in heads if l == layer]
        if off:
            hooks.append((point, ablate_heads(off, None if means is None else means[layer])))
    with hooks_attached(model, hooks):
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

    One backward pass per batch: each example gets its own gates ``[B, N, H]`` (a
    :func:`mhalab.hooks.gate_heads` hook on every ``z`` point), so the gradient of the *summed* loss
    with respect to them is every example's own gradient.
    """
    N, H = model_shape(model)
    points = _z_points(model)
    param = next(model.parameters())
    total = torch.zeros(N, H, device=param.device, dtype=torch.float64 if param.dtype == torch.float64 else torch.float32)
    count = 0
    keep = torch.ones(N, H, device=param.device) if mask is None else mask.to(param.device, torch.float32)
    if tuple(keep.shape) != (N, H):
        raise ValueError(f"mask must be [n_layers, n_heads] = [{N}, {H}], got {tuple(keep.shape)}")
    with eval_mode(model):
        for batch in batches if isinstance(batches, (list, tuple)) else [batches]:
            B = batch.inputs.size(0)
            xi = torch.ones(B, N, H, device=param.device, dtype=param.dtype, requires_grad=True)  # [B, N, H]
            gates = xi * keep.to(param.dtype)  # [B, N, H]: removed heads stay at 0
            with hooks_attached(model, [(point, gate_heads(gates[:, i])) for i, point in enumerate(points)]):
                logits = batch_logits(model, batch)
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
        if ax is None:
            ax = figure(width=5.5, height=3.4)[1][0, 0]
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
