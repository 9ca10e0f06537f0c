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
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import torch

from .attention import check_head_count
from .counting import count_parameters
from .device import pick_device
from .models import ModelConfig, Transformer

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
    """The table :func:`sweep_heads` returns: ``rows`` (one :class:`SweepRow` per run) plus the settings.

    ``print(results)`` shows every run; :meth:`summary` one line per head count; :meth:`plot` the curve.
    """

    rows: list[SweepRow]
    d_model: int
    steps: int
    task: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
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

    def to_records(self) -> list[dict[str, Any]]:
        """One flat dict per run (relations as ``accuracy/<name>``), e.g. for ``pandas.DataFrame``."""
        records = []
        for r in self.rows:
            record = {k: v for k, v in asdict(r).items() if k != "relations"}
            record.update({f"accuracy/{k}": v for k, v in r.relations.items()})
            records.append(record)
        return records

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

    # ----------------------------------------------------------------- plotting
    def plot(self, metric: str = "accuracy", *, relations: bool = True, ax=None, title: str | None = None):
        """Mean ``metric`` against the head count (log scale), error bars spanning the seeds (min to max),
        each seed as a dot, and (``relations=True``) the mean per relation as thin lines. Returns the Axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6.4, 3.6), dpi=72)
        heads = self.heads
        values = self.by_heads(metric)
        mean = [sum(values[h]) / len(values[h]) for h in heads]
        low = [m - min(values[h]) for m, h in zip(mean, heads)]
        high = [max(values[h]) - m for m, h in zip(mean, heads)]
        if relations and metric == "accuracy":
            for name in self.relations:
                means = self.mean(name)
                ax.plot(heads, [means[h] for h in heads], lw=1, alpha=0.55, label=name)
        for h in heads:
            ax.plot([h] * len(values[h]), values[h], "o", color="0.3", ms=3, alpha=0.6, zorder=3)
        ax.errorbar(heads, mean, yerr=[low, high], fmt="o-", color="black", lw=2, capsize=4, zorder=4,
                    label=f"{metric} (mean; bars: min-max over {len(self.seeds)} seeds)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(heads)
        d_k = {r.heads: r.d_k for r in self.rows}
        ax.set_xticklabels([f"{h}\n{d_k[h]}" for h in heads])
        ax.set_xlabel(f"heads h  /  d_k = {self.d_model}/h")
        ax.set_ylabel(f"held-out {metric}")
        if metric == "accuracy":
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower center")
        ax.set_title(title or f"d_model = {self.d_model}: same parameters in every column")
        ax.figure.tight_layout()
        return ax


def _format_table(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) if lines else len(header[i]) for i in range(len(header))]
    out = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def _int_list(name: str, values: Iterable[int]) -> list[int]:
    if isinstance(values, int):
        values = [values]
    values = list(values)
    if not values:
        raise ValueError(f"{name} must list at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must hold ints, got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} has repeats: {values}")
    return values


def sweep_heads(
    task: Any,
    *,
    d_model: int,
    heads: Sequence[int],
    seeds: Sequence[int] = (0, 1, 2),
    steps: int,
    n_layers: int = 1,
    batch_size: int = 32,
    lr: float = 5e-3,
    device: str | torch.device = "auto",
    eval_batches: int = 4,
    eval_batch_size: int = 256,
    model: dict[str, Any] | None = None,
    keep_models: bool = False,
    threads: int | None = 1,
    progress: bool = True,
    **train_kwargs: Any,
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
        steps, batch_size, lr: passed to :func:`mhalab.train.train` (as is any other keyword,
            e.g. ``weight_decay`` or ``precision``).
        n_layers: transformer blocks per model.
        device: where to train (``"auto"``: cuda, then mps, then cpu).
        eval_batches, eval_batch_size: size of the held-out evaluation at the end of each run.
        model: extra :class:`~mhalab.models.ModelConfig` fields (e.g. ``{"d_ff": 128}``).
        keep_models: keep every trained model in ``results.models[(heads, seed)]`` (in eval mode), to
            look at their attention afterwards.
        threads: on a CPU, the number of threads torch may use while the sweep trains (its setting is
            restored afterwards); None leaves it alone. Models this small gain nothing from a second
            thread, and on a busy machine (other notebooks, tests in parallel) the threads wait on each
            other: we measured 100 steps at ``d_model=64`` taking 5 s on one thread and 20-30 s on two
            while the two cores were shared with other work. Ignored on GPUs.
        progress: one progress bar over all runs.

    Returns:
        :class:`SweepResults`, in the order heads x seeds.
    """
    heads = _int_list("heads", heads)
    seeds = _int_list("seeds", seeds)
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    bad = [h for h in heads if h < 1 or d_model % h]
    if bad:
        check_head_count(d_model, bad[0])  # raises the standard message naming the valid head counts
    model = dict(model or {})
    for key in ("d_model", "n_heads", "n_layers"):
        if key in model:
            raise ValueError(f"pass {key} as sweep_heads' own argument, not inside model={{...}}")
    for key in ("seed", "progress", "eval_every"):
        if key in train_kwargs:
            raise ValueError(f"sweep_heads sets {key} itself (the seed comes from `seeds`); do not pass {key}=")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    # Fail on a bad setting now, not after the first few models have trained.
    configs = {h: ModelConfig.for_task(task, d_model=d_model, n_heads=h, n_layers=n_layers, **model) for h in heads}
    on_cpu = pick_device(device).type == "cpu"
    threads_before = torch.get_num_threads()

    from tqdm.auto import tqdm

    # Imported here, not at the top, so that mhalab.train can re-export sweep_heads without a circular import.
    from . import train as _train

    rows: list[SweepRow] = []
    models: dict[tuple[int, int], Any] = {}
    bar = tqdm(total=len(heads) * len(seeds), desc="sweep", unit="model", disable=not progress, dynamic_ncols=True)
    try:
        if on_cpu and threads is not None:
            torch.set_num_threads(threads)
        for h in heads:
            for seed in seeds:
                bar.set_postfix(heads=h, seed=seed, refresh=True)
                began = time.perf_counter()
                with torch.random.fork_rng(devices=[]):  # seed the initialisation without touching the caller's RNG
                    torch.manual_seed(seed)
                    net = Transformer(configs[h])
                history = _train.train(
                    net, task, steps=steps, batch_size=batch_size, lr=lr, device=device, seed=seed,
                    eval_batches=eval_batches, eval_batch_size=eval_batch_size, progress=False, **train_kwargs,
                )
                final = history.final
                rows.append(SweepRow(
                    heads=h, d_k=configs[h].d_k, seed=seed, parameters=count_parameters(net),
                    loss=float(final.get("loss", math.nan)), accuracy=float(final.get("accuracy", math.nan)),
                    relations={k.removeprefix("accuracy/"): float(v) for k, v in final.items() if k.startswith("accuracy/")},
                    seconds=time.perf_counter() - began,
                ))
                if keep_models:
                    models[(h, seed)] = net.eval()
                bar.update(1)
    finally:
        bar.close()
        torch.set_num_threads(threads_before)
    settings = dict(n_layers=n_layers, batch_size=batch_size, lr=lr, model=model, **train_kwargs)
    return SweepResults(rows, d_model=d_model, steps=steps, task=repr(task), settings=settings, models=models)
