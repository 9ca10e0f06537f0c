"""Sweep the head count at a fixed width: the experiment behind "more heads cost width, not parameters".

:func:`sweep_heads` trains one model per (head count, seed), all with the same ``d_model`` (so the same
number of parameters), the same number of steps and, for a given seed, the same initialisation seed
and the same training batches. It returns a :class:`SweepResults`: a tidy table with one row per run
that prints readably, summarises per head count, and plots accuracy against the head count with the
spread across seeds.

Why one model at a time rather than the seeds of a head count as a batched ensemble
(``torch.func.stack_module_state`` + ``vmap``): on a small CPU we measured the vmapped three-member step
at about twice the time of three ordinary steps (the fused attention kernel has no vmap batching rule,
so vmap falls back to a loop, and the bookkeeping costs more than the batching saves at this size).
The models here are small enough that the plain loop is the fast one; a GPU makes every step cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch

from ._checks import check_distinct_ints, check_head_count, check_int
from .counting import count_parameters
from .device import pick_device
from .models import ModelConfig, Transformer
from .plotting import plot_sweep
from .train import TrainConfig, make_config, train

__all__ = ["SweepRow", "SweepResults", "sweep_heads"]


@dataclass(frozen=True)
class SweepRow:
    """One trained model: its head count, width per head, seed, size and held-out results."""

    heads: int
    d_k: int
    seed: int
    parameters: int
    loss: float
    accuracy: float
    relations: dict[str, float] = field(default_factory=dict)  # relation name -> held-out accuracy
    seconds: float = 0.0


@dataclass
class SweepResults:
    """The table :func:`sweep_heads` returns: ``rows`` (one :class:`SweepRow` per run) plus the settings
    (``config``: the :class:`~mhalab.train.TrainConfig` of every run, ``seed`` aside).

    ``print(results)`` shows every run; :meth:`summary` one line per head count; :meth:`plot` the curve.
    """

    rows: list[SweepRow]
    d_model: int
    steps: int
    task: str = ""
    config: TrainConfig | None = None
    models: dict[tuple[int, int], Any] = field(default_factory=dict, repr=False)  # (heads, seed) -> model, if kept

    # ----------------------------------------------------------------- access
    @property
    def heads(self) -> list[int]:
        """Head counts in the order they were swept."""
        return list(dict.fromkeys(r.heads for r in self.rows))

    @property
    def seeds(self) -> list[int]:
        return list(dict.fromkeys(r.seed for r in self.rows))

    @property
    def relations(self) -> list[str]:
        return list(dict.fromkeys(name for r in self.rows for name in r.relations))

    def value(self, row: SweepRow, metric: str = "accuracy") -> float:
        """``metric`` of one row: ``"accuracy"``, ``"loss"``, ``"seconds"`` or a relation name
        (``"left1"`` or ``"accuracy/left1"``)."""
        name = metric.removeprefix("accuracy/")
        if name in row.relations:
            return row.relations[name]
        if metric in ("accuracy", "loss", "seconds", "parameters", "d_k"):
            return float(getattr(row, metric))
        raise KeyError(f"unknown metric {metric!r}: use 'accuracy', 'loss', 'seconds' or one of {self.relations}")

    def by_heads(self, metric: str = "accuracy") -> dict[int, list[float]]:
        """``{head count: [metric of each seed, in seed order]}``."""
        out: dict[int, list[float]] = {h: [] for h in self.heads}
        for r in self.rows:
            out[r.heads].append(self.value(r, metric))
        return out

    def by_seed(self, metric: str = "accuracy") -> dict[int, dict[int, float]]:
        """``{seed: {head count: metric}}``."""
        out: dict[int, dict[int, float]] = {s: {} for s in self.seeds}
        for r in self.rows:
            out[r.seed][r.heads] = self.value(r, metric)
        return out

    def mean(self, metric: str = "accuracy") -> dict[int, float]:
        return {h: sum(v) / len(v) for h, v in self.by_heads(metric).items()}

    def best_heads(self, metric: str = "accuracy") -> int:
        """The head count with the highest mean ``metric`` across seeds."""
        means = self.mean(metric)
        return max(means, key=means.get)

    def gaps(self, heads: int, metric: str = "accuracy") -> dict[int, float]:
        """For every seed: (best ``metric`` over all head counts for that seed) - (``metric`` at ``heads``).

        A gap of at least 0.10 for every seed means ``heads`` is worse than the best head count by ten
        accuracy points in every run, not just on average.
        """
        if heads not in self.heads:
            raise KeyError(f"head count {heads} was not swept; the sweep has {self.heads}")
        return {seed: max(values.values()) - values[heads] for seed, values in self.by_seed(metric).items()}

    # ----------------------------------------------------------------- printing
    def table(self, digits: int = 3) -> str:
        """Every run, one line each."""
        rel = self.relations
        header = ["heads", "d_k", "seed", "params", "loss", "accuracy", *rel, "seconds"]
        lines = []
        for r in self.rows:
            lines.append([
                str(r.heads), str(r.d_k), str(r.seed), f"{r.parameters:,}", f"{r.loss:.{digits}f}",
                f"{r.accuracy:.{digits}f}", *(f"{r.relations.get(n, float('nan')):.{digits}f}" for n in rel),
                f"{r.seconds:.1f}",
            ])
        return _format_table(header, lines)

    def summary(self, digits: int = 3) -> str:
        """One line per head count: mean accuracy, its spread across seeds, per-relation means."""
        rel = self.relations
        header = ["heads", "d_k", "params", "accuracy (mean)", "min", "max", *rel]
        acc = self.by_heads("accuracy")
        relation_means = {n: self.mean(n) for n in rel}  # once per relation, not once per (relation, head count)
        first = {}
        for r in self.rows:
            first.setdefault(r.heads, r)
        lines = []
        for h in self.heads:
            v = acc[h]
            lines.append([
                str(h), str(first[h].d_k), f"{first[h].parameters:,}", f"{sum(v) / len(v):.{digits}f}",
                f"{min(v):.{digits}f}", f"{max(v):.{digits}f}",
                *(f"{relation_means[n][h]:.{digits}f}" for n in rel),
            ])
        return _format_table(header, lines)

    def __str__(self) -> str:
        title = (f"sweep_heads on {self.task or 'a task'}: d_model={self.d_model}, {self.steps} steps, "
                 f"seeds {self.seeds}")
        return title + "\n" + self.table()

    def __repr__(self) -> str:
        return f"<SweepResults: {len(self.rows)} runs, heads {self.heads}, seeds {self.seeds}, d_model={self.d_model}>"

    def plot(self, metric: str = "accuracy", *, relations: bool = True, ax=None, title: str | None = None):
        """Mean ``metric`` against the head count, seeds as error bars (:func:`mhalab.plotting.plot_sweep`)."""
        return plot_sweep(self, metric, relations=relations, ax=ax, title=title)


def _format_table(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) if lines else len(header[i]) for i in range(len(header))]
    out = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


# sweep_heads' own defaults where they differ from train's: small batches, a higher learning rate
_SWEEP_DEFAULTS = dict(batch_size=32, lr=5e-3)


def sweep_heads(
    task: Any,
    *,
    d_model: int,
    heads: Sequence[int],
    seeds: Sequence[int] = (0, 1, 2),
    n_layers: int = 1,
    model: dict[str, Any] | None = None,
    keep_models: bool = False,
    threads: int | None = 1,
    progress: bool = True,
    config: TrainConfig | None = None,
    **settings: Any,
) -> SweepResults:
    """Train one :class:`~mhalab.models.Transformer` per (head count, seed) at fixed ``d_model``.

    Every model has the same width, depth, MLP and vocabulary, so the same parameter count (each
    row reports it, so that can be checked); only how the width is cut into heads differs. For a given
    seed every head count starts from ``torch.manual_seed(seed)`` and trains on the same batches
    (``train(seed=seed)``), so differences between head counts are not differences in data.

    Args:
        task: a :class:`mhalab.tasks.Task`.
        d_model: model width, shared by every run; every head count must divide it.
        heads: head counts to try, e.g. ``(1, 2, 4, 8, 16, 32, 64)``.
        seeds: one run per seed and head count.
        n_layers: transformer blocks per model.
        model: extra :class:`~mhalab.models.ModelConfig` fields (e.g. ``{"d_ff": 128}``).
        keep_models: keep every trained model in ``results.models[(heads, seed)]`` (in eval mode), to
            look at their attention afterwards.
        threads: torch's CPU threads while the sweep trains (restored afterwards; None leaves them alone).
            Models this small gain nothing from a second thread, and on a busy 2-core machine we measured
            100 steps at ``d_model=64`` taking 5 s on one thread and 20-30 s on two. Ignored on GPUs.
        progress: one progress bar over all runs.
        config, settings: the training settings of every run, as for :func:`mhalab.train.train`
            (``steps`` at least; without ``config``, ``batch_size=32`` and ``lr=5e-3`` unless given).
            The seed comes from ``seeds``; each run is silent and evaluated once, at the end, with no checkpoint.

    Returns:
        :class:`SweepResults`, in the order heads x seeds.
    """
    heads = check_distinct_ints("heads", heads)
    seeds = check_distinct_ints("seeds", seeds)
    check_int("d_model", d_model, 1)
    bad = [h for h in heads if h < 1 or d_model % h]
    if bad:
        check_head_count(d_model, bad[0])  # raises the standard message naming the valid head counts
    model = dict(model or {})
    for key in ("d_model", "n_heads", "n_layers"):
        if key in model:
            raise ValueError(f"pass {key} as sweep_heads' own argument, not inside model={{...}}")
    for key in ("seed", "progress", "eval_every", "checkpoint"):
        if key in settings:
            raise ValueError(f"sweep_heads sets {key} itself (the seed comes from `seeds`); do not pass {key}=")
    if threads is not None:
        check_int("threads", threads, 1, why=" (or None)")
    # Fail on a bad setting now, not after the first few models have trained.
    base = make_config(config, **settings) if config is not None else make_config(**{**_SWEEP_DEFAULTS, **settings})
    base = replace(base, progress=False, eval_every=None, checkpoint=None)
    configs = {h: ModelConfig.for_task(task, d_model=d_model, n_heads=h, n_layers=n_layers, **model) for h in heads}
    on_cpu = pick_device(base.device).type == "cpu"
    threads_before = torch.get_num_threads()

    from tqdm.auto import tqdm

    rows: list[SweepRow] = []
    models: dict[tuple[int, int], Any] = {}
    bar = tqdm(total=len(heads) * len(seeds), desc="sweep", unit="model", disable=not progress, dynamic_ncols=True)
    try:
        if on_cpu and threads is not None:
            torch.set_num_threads(threads)
        for h in heads:
            for seed in seeds:
                bar.set_postfix(heads=h, seed=seed, refresh=True)
                with torch.random.fork_rng(devices=[]):  # seed the initialisation without touching the caller's RNG
                    torch.manual_seed(seed)
                    net = Transformer(configs[h])
                history = train(net, task, base, seed=seed)
                final = history.final
                rows.append(SweepRow(
                    heads=h, d_k=configs[h].d_k, seed=seed, parameters=count_parameters(net),
                    loss=float(final.get("loss", math.nan)), accuracy=float(final.get("accuracy", math.nan)),
                    relations={k.removeprefix("accuracy/"): float(v) for k, v in final.items() if k.startswith("accuracy/")},
                    seconds=history.elapsed,
                ))
                if keep_models:
                    models[(h, seed)] = net.eval()
                bar.update(1)
    finally:
        bar.close()
        torch.set_num_threads(threads_before)
    return SweepResults(rows, d_model=d_model, steps=base.steps, task=repr(task), config=base, models=models)
