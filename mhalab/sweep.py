"""Sweep the head count at a fixed width: one model per (head count, seed), same parameters, steps and data.

Models are trained one at a time in each process. At these sizes a CPU step costs nearly in proportion to the batch
(on a 2-core CPU, one step of a one-block lookup model at d_model 16, four tables and an MLP, took 2.9, 7.7 and
22.9 ms at batch 32, 128 and 512), so training several models as one vmapped ensemble saves nothing: 0.9-1.1x the
separate steps' speed, for 3 models on the fused kernel (which has no vmap rule) and for 3 or 15 on the explicit
path. On a CPU with more than one core, ``workers=2`` trains two models at once, each in a forked process on one
thread.
"""

from __future__ import annotations

import importlib
import io
import math
import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import torch

from .arguments import validate_distinct_ints, validate_int, validate_model_fits_task
from .counting import count_parameters
from .device import pick_device
from .models import ModelConfig, Transformer
from .plotting import plot_sweep
from .train import TrainConfig, held_out_logits, make_config, stream_seed, train

#: A given embedding: token rows ``[d_vocab, d_model]`` and position rows ``[n, d_model]`` (or None).
_GivenEmbedding = tuple[torch.Tensor, torch.Tensor | None]

__all__ = ["SweepRow", "SweepResults", "sweep_heads", "held_out_change"]


@dataclass(frozen=True)
class SweepRow:
    """One trained model: its head count, width per head, seed, size and held-out results."""

    heads: int
    d_head: int  # d_k = d_model / heads in the prose
    seed: int
    parameters: int
    loss: float
    accuracy: float
    relations: dict[str, float] = field(default_factory=dict)  # relation name -> held-out accuracy
    seconds: float = 0.0
    evals: tuple[tuple[int, dict[str, float]], ...] = ()  # (step, held-out metrics) along the run (eval_every)


@dataclass
class SweepResults:
    """What :func:`sweep_heads` returns: ``rows`` (one :class:`SweepRow` per run), the shared settings
    (``config``: every run's TrainConfig but its seed), if kept, ``models[(heads, seed)]``, and the models at the
    steps asked for, ``snapshots[(heads, seed, step)]``."""

    rows: list[SweepRow]
    d_model: int
    steps: int
    task: str = ""
    config: TrainConfig | None = None
    models: dict[tuple[int, int], Any] = field(default_factory=dict, repr=False)
    snapshots: dict[tuple[int, int, int], Any] = field(default_factory=dict, repr=False)

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

    @property
    def eval_steps(self) -> list[int]:
        """The steps every run was evaluated at (``eval_every``; the last step always)."""
        return sorted(set.intersection(*({s for s, _ in r.evals} for r in self.rows))) if self.rows else []

    def value(self, row: SweepRow, metric: str = "accuracy", step: int | None = None) -> float:
        """``metric`` of one row: ``"accuracy"``, ``"loss"``, ``"seconds"`` or a relation (``"left1"``); with
        ``step``, the held-out ``"accuracy"``, ``"loss"`` or relation at that evaluation (one of ``eval_steps``)."""
        name = metric.removeprefix("accuracy/")
        if step is not None:
            found = dict(row.evals).get(step)
            if found is None:
                raise KeyError(f"no evaluation at step {step}; the runs were evaluated at {self.eval_steps} "
                               "(sweep_heads(..., eval_every=k) evaluates every k steps)")
            key = metric if metric in found else f"accuracy/{name}"
            if key not in found:
                raise KeyError(f"unknown metric {metric!r} at step {step}: use one of {sorted(found)}")
            return float(found[key])
        if name in row.relations:
            return row.relations[name]
        if metric in ("accuracy", "loss", "seconds", "parameters", "d_head"):
            return float(getattr(row, metric))
        raise KeyError(f"unknown metric {metric!r}: use 'accuracy', 'loss', 'seconds' or one of {self.relations}")

    def by_heads(self, metric: str = "accuracy", step: int | None = None) -> dict[int, list[float]]:
        """``{head count: [metric of each seed, in seed order]}`` (at the end, or at evaluation ``step``)."""
        return {h: [self.value(r, metric, step) for r in self.rows if r.heads == h] for h in self.heads}

    def by_seed(self, metric: str = "accuracy", step: int | None = None) -> dict[int, dict[int, float]]:
        """``{seed: {head count: metric}}`` (at the end, or at evaluation ``step``)."""
        return {s: {r.heads: self.value(r, metric, step) for r in self.rows if r.seed == s} for s in self.seeds}

    def mean(self, metric: str = "accuracy") -> dict[int, float]:
        return {h: sum(v) / len(v) for h, v in self.by_heads(metric).items()}

    def best_heads(self, metric: str = "accuracy") -> int:
        """The head count with the highest mean ``metric`` across seeds."""
        means = self.mean(metric)
        return max(means, key=means.get)

    def gaps(self, heads: int, metric: str = "accuracy") -> dict[int, float]:
        """Per seed: that seed's best ``metric`` over all head counts minus its ``metric`` at ``heads``."""
        if heads not in self.heads:
            raise KeyError(f"head count {heads} was not swept; the sweep has {self.heads}")
        return {seed: max(values.values()) - values[heads] for seed, values in self.by_seed(metric).items()}

    def table(self, digits: int = 3) -> str:
        """Every run, one line each."""
        rel, nan = self.relations, math.nan
        lines = [[str(r.heads), str(r.d_head), str(r.seed), f"{r.parameters:,}",
                  *(f"{v:.{digits}f}" for v in (r.loss, r.accuracy, *(r.relations.get(n, nan) for n in rel))),
                  f"{r.seconds:.1f}"] for r in self.rows]
        return _format_table(["heads", "d_k", "seed", "params", "loss", "accuracy", *rel, "seconds"], lines)

    def summary(self, digits: int = 3) -> str:
        """One line per head count: mean accuracy, its spread across seeds, per-relation means."""
        acc, first = self.by_heads(), {r.heads: r for r in reversed(self.rows)}
        relation_means = [self.mean(n) for n in self.relations]  # once per relation, not per head count
        lines = [[str(h), str(first[h].d_head), f"{first[h].parameters:,}",
                  *(f"{v:.{digits}f}" for v in (sum(acc[h]) / len(acc[h]), min(acc[h]), max(acc[h]))),
                  *(f"{means[h]:.{digits}f}" for means in relation_means)] for h in self.heads]
        return _format_table(["heads", "d_k", "params", "accuracy (mean)", "min", "max", *self.relations], lines)

    def __str__(self) -> str:
        title = (f"sweep_heads on {self.task or 'a task'}: d_model={self.d_model}, {self.steps} steps, "
                 f"seeds {self.seeds}")
        return title + "\n" + self.table()

    def __repr__(self) -> str:
        return f"<SweepResults: {len(self.rows)} runs, heads {self.heads}, seeds {self.seeds}, d_model={self.d_model}>"

    def plot(self, metric: str = "accuracy", **options: Any):
        """Mean ``metric`` against the head count, seeds as error bars (:func:`mhalab.plotting.plot_sweep`)."""
        return plot_sweep(self, metric, **options)


def _format_table(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(map(len, column)) for column in zip(header, *lines)]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in [header, *lines])


# sweep_heads' own defaults where they differ from train's: small batches, a higher learning rate
_SWEEP_DEFAULTS = dict(batch_size=32, lr=5e-3)


def _train_one(model_config: ModelConfig, task: Any, base: TrainConfig, seed: int,
               embedding: _GivenEmbedding | None, snapshots: tuple[int, ...] = ()
               ) -> tuple[SweepRow, Transformer, dict[int, dict[str, torch.Tensor]]]:
    """One run of a sweep: initial weights from the seed's own stream (the embedding given, if one is), then
    :func:`mhalab.train.train`; the weights at each step of ``snapshots`` are copied on the way (a callback, which
    leaves the training exactly as it is without one)."""
    with torch.random.fork_rng(devices=[]):  # seed the initialisation without touching the caller's RNG
        torch.manual_seed(stream_seed(seed, "init"))
        net = Transformer(model_config)
    if embedding is not None:
        net.fix_embedding(*embedding)
    kept: dict[int, dict[str, torch.Tensor]] = {}

    def keep(step: int, model: Transformer) -> None:
        if step in snapshots:
            kept[step] = {name: value.detach().clone() for name, value in model.state_dict().items()}

    if snapshots:
        history = train(net, task, base, seed=seed, callback=keep, callback_every=math.gcd(*snapshots))
    else:
        history = train(net, task, base, seed=seed)
    final = history.final
    row = SweepRow(
        heads=model_config.n_heads, d_head=net.blocks[0].attn.d_head, seed=seed, parameters=count_parameters(net),
        loss=float(final.get("loss", math.nan)), accuracy=float(final.get("accuracy", math.nan)),
        relations={k.removeprefix("accuracy/"): float(v) for k, v in final.items() if k.startswith("accuracy/")},
        seconds=history.elapsed, evals=tuple((step, dict(metrics)) for step, metrics in history.evals),
    )
    return row, net, kept


def _train_in_worker(model_config: ModelConfig, task: Any, base: TrainConfig, seed: int,
                     embedding: _GivenEmbedding | None, threads: int, keep: bool,
                     snapshots: tuple[int, ...] = ()) -> tuple[SweepRow, bytes | None]:
    """:func:`_train_one` in a worker process on ``threads`` threads; the weights (the final ones if ``keep``, and
    the snapshots) come back as bytes."""
    torch.set_num_threads(threads)  # before any operation: the parent's thread pool does not survive the fork
    row, net, kept = _train_one(model_config, task, base, seed, embedding, snapshots)
    if not keep and not kept:
        return row, None
    buffer = io.BytesIO()
    torch.save({"final": net.state_dict() if keep else None, "snapshots": kept}, buffer)
    return row, buffer.getvalue()


def _as_model(config: ModelConfig, weights: dict[str, torch.Tensor], embedding: _GivenEmbedding | None) -> Transformer:
    """A model of ``config`` holding ``weights``, in eval mode (a given embedding fixed again, as trained)."""
    with torch.random.fork_rng(devices=[]):  # a model to load into: its draws are not the caller's
        net = Transformer(config)
    net.load_state_dict(weights)
    if embedding is not None:
        net.fix_embedding(*embedding)  # kept as trained: frozen, like a model trained here
    return net.eval()


def sweep_heads(task: Any, *, model: ModelConfig, heads: Sequence[int], seeds: Sequence[int] = (0, 1, 2),
                keep_models: bool = False, threads: int | None = 1, workers: int = 1, progress: bool = True,
                embedding: _GivenEmbedding | None = None, config: TrainConfig | None = None,
                snapshots: Sequence[int] = (), **settings: Any) -> SweepResults:
    """Train one :class:`~mhalab.models.Transformer` per (head count, seed): ``model`` with ``n_heads`` set to each
    of ``heads`` (``dataclasses.replace``), so the width, depth and everything else stay fixed.

    Every head count of a seed starts from ``torch.manual_seed(stream_seed(seed, "init"))`` (a stream of its
    own, not the training batches' or dropout's) and trains on the same batches.
    ``model``: a :class:`~mhalab.models.ModelConfig` for ``task`` (``ModelConfig.for_task(task, d_model=64,
    n_layers=1)``; its own ``n_heads`` is not used); ``keep_models``: keep them in ``results.models`` (eval mode);
    ``threads``: torch's CPU threads meanwhile (on a busy 2-core machine 100 steps at ``d_model=64`` took
    5 s on one, 20-30 s on two); ``workers``: on a CPU, train this many models at once, each in a process of
    its own forked from this one (on ``threads`` threads, one if None), with the same results as one at a time;
    off Linux (where forking a process is not safe) or on any machine with a GPU (where autograd does not survive a
    fork), the runs stay one at a time;
    ``embedding``: ``(tokens, positions)`` (e.g. ``task.factored_code(d_model)``) given to every model and kept out
    of training (:meth:`~mhalab.models.Transformer.fix_embedding`);
    ``snapshots``: steps (1 to ``steps``) at which every run's weights are also kept, as models in
    ``results.snapshots[(heads, seed, step)]`` (eval mode): the same run seen part way, trained exactly as without;
    ``config``/``settings``: as for :func:`mhalab.train.train` (without config, ``batch_size=32``, ``lr=5e-3``);
    each run is silent and evaluated at the end, and every ``eval_every`` steps if given (``SweepRow.evals``:
    a held-out learning curve per run, read with ``results.by_heads(step=...)``).
    """
    if not isinstance(model, ModelConfig):
        raise TypeError(f"model must be a ModelConfig (the head count is swept, every other field kept), got "
                        f"{type(model).__name__}: sweep_heads(task, model=ModelConfig.for_task(task, d_model=64, "
                        f"n_layers=1), heads=[1, 2, 4])")
    validate_model_fits_task(SimpleNamespace(config=model), task)
    heads = validate_distinct_ints("heads", heads)
    seeds = validate_distinct_ints("seeds", seeds)
    for key in [k for k in ("seed", "progress", "checkpoint") if k in settings]:
        raise ValueError(f"sweep_heads sets {key} itself (the seed comes from `seeds`); do not pass {key}=")
    # a bad head count gets the standard message naming the valid ones; d_head = d_model / h, derived anew
    configs = {h: replace(model, n_heads=h, d_head=None) for h in heads}
    if embedding is not None:
        if not (isinstance(embedding, (tuple, list)) and len(embedding) == 2):
            raise TypeError(f"embedding must be two things, (tokens, positions), e.g. task.factored_code(d_model) "
                            f"(positions may be None), got {type(embedding).__name__}"
                            + (f" of length {len(embedding)}" if isinstance(embedding, (tuple, list)) else ""))
        embedding = (embedding[0], embedding[1])
        with torch.random.fork_rng(devices=[]):  # building a model draws numbers: not from the caller's stream
            Transformer(model).fix_embedding(*embedding)  # a bad embedding fails now, not in a worker
    if threads is not None:
        validate_int("threads", threads, 1, why=" (or None)")
    validate_int("workers", workers, 1)
    snapshots = tuple(validate_distinct_ints("snapshots", snapshots)) if snapshots not in ((), []) else ()
    # Fail on a bad setting now, not after the first few models have trained.
    defaults = _SWEEP_DEFAULTS if config is None else {}
    base = make_config(config, **{**defaults, **settings}, progress=False, checkpoint=None)
    for step in snapshots:
        validate_int("each step of snapshots", step, 1, maximum=base.steps, why=f" (the runs train {base.steps} steps)")
    threads_before = torch.get_num_threads()

    from tqdm.auto import tqdm

    runs = [(h, seed) for h in heads for seed in seeds]
    on_cpu = pick_device(base.device).type == "cpu"
    # Forking is safe on Linux; on macOS (where Python no longer forks by default) and Windows the runs stay serial,
    # and so they do where torch sees a GPU: there the first backward pass, even on the CPU, starts autograd's
    # per-device threads, after which a forked child cannot run autograd at all.
    forkable = sys.platform.startswith("linux") and torch.cuda.device_count() == 0
    parallel = min(workers, len(runs)) if on_cpu and forkable else 1
    rows: list[SweepRow] = []
    models: dict[tuple[int, int], Any] = {}
    kept_snapshots: dict[tuple[int, int, int], Any] = {}
    bar = tqdm(total=len(runs), desc="sweep", unit="model", disable=not progress, dynamic_ncols=True)
    try:
        if threads is not None and on_cpu:
            torch.set_num_threads(threads)
        if parallel > 1:
            # The optimizer's first use imports torch._dynamo (over a second of CPU): import it here once, so that
            # every worker forked below inherits it instead of importing it again.
            importlib.import_module("torch._dynamo")

            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=parallel, mp_context=context) as pool:
                futures = [pool.submit(_train_in_worker, configs[h], task, base, seed, embedding, threads or 1,
                                       keep_models, snapshots)
                           for h, seed in runs]
                for (h, seed), future in zip(runs, futures):  # in the order of the runs, whichever ends first
                    row, weights = future.result()
                    rows.append(row)
                    if weights is not None:
                        weights = torch.load(io.BytesIO(weights), weights_only=True)
                        if keep_models:
                            models[(h, seed)] = _as_model(configs[h], weights["final"], embedding)
                        for step, state in weights["snapshots"].items():
                            kept_snapshots[(h, seed, step)] = _as_model(configs[h], state, embedding)
                    bar.update(1)
        else:
            for h, seed in runs:
                bar.set_postfix(heads=h, seed=seed, refresh=True)
                row, net, kept = _train_one(configs[h], task, base, seed, embedding, snapshots)
                rows.append(row)
                if keep_models:
                    models[(h, seed)] = net.eval()
                for step, state in kept.items():
                    kept_snapshots[(h, seed, step)] = _as_model(configs[h], state, embedding)
                bar.update(1)
    finally:
        bar.close()
        torch.set_num_threads(threads_before)
    return SweepResults(rows, d_model=model.d_model, steps=base.steps, task=repr(task), config=base, models=models,
                        snapshots=kept_snapshots)


@torch.no_grad()
def held_out_change(before: Any, after: Any, task: Any, config: TrainConfig) -> tuple[float, float]:
    """``(change, standard error)``: how much the held-out accuracy changed from model ``before`` to model
    ``after`` (the same run at two steps, say), on the held-out sequences a sweep with ``config`` evaluates every
    run on (:func:`mhalab.train.evaluate`'s), so the change is the difference of the two recorded accuracies.

    Both models answer the same sequences, so what the change shares with them cancels: its standard error is the
    spread of the change from one held-out sequence to the next (each sequence's share of its answers that
    became right, minus the share that became wrong), over the square root of the number of sequences. The
    sequences are independent draws; the answers within one are not, which is why the sequence is the unit."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be the sweep's TrainConfig (results.config), got {type(config).__name__}")
    answered = [held_out_logits(model, task, batches=config.eval_batches, batch_size=config.eval_batch_size,
                                precision=config.precision) for model in (before, after)]
    changes = []
    for pair in zip(*answered):  # one held-out batch, as each model answered it
        per_sequence = []
        for logits, batch in pair:
            correct, valid = task.correct(logits, batch)  # each [B, T, R]
            per_sequence.append((correct.flatten(1).sum(1) / valid.flatten(1).sum(1).clamp(min=1)).cpu())  # [B]
        changes.append(per_sequence[1] - per_sequence[0])
    change = torch.cat(changes).double()  # [eval_batches * eval_batch_size]: one change per sequence
    return float(change.mean()), float(change.std() / math.sqrt(len(change)))
