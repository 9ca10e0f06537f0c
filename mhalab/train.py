"""Training loop: AdamW with warm-up and cosine decay, evaluation, checkpoints that resume exactly.

The same batches on every device (drawn on the CPU) and float32 unless asked, so a run on a GPU trains on the data
and in the precision of the same run on a laptop; losses are read back in groups (no sync per step), where a NaN
stops the run without overwriting the last good checkpoint.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .arguments import validate_int, validate_model_fits_task, validate_task
from .checkpoint import load_checkpoint, restore, save_checkpoint, snapshot
from .device import autocast, foreach_supported, moved_to, pick_device, resolve_precision
from .models import batch_logits, eval_mode
from .plotting import plot_history
from .train_config import TrainConfig, make_config, stream_seed

__all__ = ["train", "evaluate", "held_out_logits",
           "TrainConfig", "make_config", "History", "TrainingDiverged", "CallbackFailed",
           "EVAL_SEED", "stream_seed"]

EVAL_SEED = 987_654_321  # evaluate's default seed: the held-out batches are the same in every call
_FLUSH_EVERY = 16  # read losses back from the device (and check them) at most this many steps apart
# Settings a resumed run must share with the run that wrote the checkpoint (steps may grow: the schedule stretches).
_RESUME_MUST_MATCH = ("batch_size", "lr", "weight_decay", "warmup_steps", "final_lr_fraction", "seed", "grad_clip")


@dataclass
class History:
    """What happened during training, one entry per optimizer step, plus every held-out evaluation."""

    steps: list[int] = field(default_factory=list)  # 1..n
    train_loss: list[float] = field(default_factory=list)  # one batch each, so noisy
    lr: list[float] = field(default_factory=list)
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (step, metrics)
    elapsed: float = 0.0  # seconds, summed over resumed runs
    device: str = ""
    precision: str = ""

    @property
    def final(self) -> dict[str, float]:
        """Metrics of the last evaluation (``{}`` if there was none)."""
        return dict(self.evals[-1][1]) if self.evals else {}

    def metric(self, name: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one evaluation metric, e.g. ``history.metric("accuracy")``."""
        pairs = [(s, m[name]) for s, m in self.evals if name in m]
        if not pairs and self.evals:
            raise KeyError(f"no metric {name!r}; evaluations recorded {sorted(self.evals[-1][1])}")
        return [s for s, _ in pairs], [v for _, v in pairs]

    def __repr__(self) -> str:
        final = ", ".join(f"{k}={v:.4g}" for k, v in self.final.items() if "/" not in k)
        return (f"History({len(self.steps)} steps on {self.device or '?'} ({self.precision or '?'}), "
                f"{self.elapsed:.1f} s; final: {final or 'no evaluation'})")

    def plot(self, *, smooth: int = 20, title: str | None = None):
        """Training loss (per step and smoothed) and held-out metrics: :func:`mhalab.plotting.plot_history`."""
        return plot_history(self, smooth=smooth, title=title)


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or infinite.  ``step`` is the first bad step (1-based)."""

    def __init__(self, message: str, *, step: int, loss: float) -> None:
        super().__init__(message)
        self.step, self.loss = step, loss


class CallbackFailed(RuntimeError):
    """The ``callback`` of :func:`train` raised at ``step``. Nothing finished is lost: the model holds the
    weights of that step, ``history`` the run up to it, and a checkpoint (if one was asked for) was written."""

    def __init__(self, message: str, *, step: int, history: History) -> None:
        super().__init__(message)
        self.step, self.history = step, history


def _to_device(batch: Any, device: torch.device) -> Any:
    """A batch drawn on the CPU, on ``device``: itself on the CPU, else ``batch.to(device)`` (:class:`Batch` has it)."""
    if device.type == "cpu":
        return batch
    if not callable(getattr(batch, "to", None)):
        raise TypeError(f"training on {device} draws each batch on the CPU and copies it with batch.to(device), but a "
                        f"{type(batch).__name__} has no to(): return an mhalab.tasks.Batch from sample(), or give "
                        "yours a to(device)")
    return batch.to(device)


def held_out_logits(model: nn.Module, task: Any, *, batches: int = 8, batch_size: int = 256, seed: int = EVAL_SEED,
                    device: str | torch.device | None = None, precision: str = "fp32") -> Iterator[tuple[Tensor, Any]]:
    """``(logits, batch)`` for each of ``batches`` held-out batches, the same on every call and every device (drawn on
    the CPU from ``stream_seed(seed, "eval")``, a stream training never uses): the model in eval mode on ``device``
    (None: the model's), under ``precision``'s autocast, logits in float32. What :func:`evaluate` scores."""
    device = next(model.parameters(), torch.empty(0)).device if device is None else pick_device(device)
    _, dtype = resolve_precision(precision, device)
    generator = torch.Generator().manual_seed(stream_seed(seed, "eval"))
    for _ in range(batches):
        batch = _to_device(task.sample(batch_size, generator=generator), device)
        with torch.no_grad(), eval_mode(model), autocast(device, dtype):
            logits = batch_logits(model, batch)
        yield logits.float(), batch


def evaluate(model: nn.Module, task: Any, *, batches: int = 8, batch_size: int = 256, seed: int = EVAL_SEED,
             device: str | torch.device | None = None, precision: str = "fp32") -> dict[str, float]:
    """The task's metrics averaged over ``batches`` held-out batches (:func:`held_out_logits`), the same ones every
    call, in eval mode; ``device=None`` uses the model's device."""
    validate_task(task)
    validate_int("batches", batches, 1)
    validate_int("batch_size", batch_size, 1)
    validate_int("seed", seed, 0)
    results = [task.metrics(logits, batch) for logits, batch in held_out_logits(
        model, task, batches=batches, batch_size=batch_size, seed=seed, device=device, precision=precision)]
    return {name: sum(float(r[name]) for r in results) / batches for name in results[0]}


def train(model: nn.Module, task: Any, config: TrainConfig | None = None, *,
          callback: Callable[[int, nn.Module], Any] | None = None, callback_every: int | None = None,
          **settings: Any) -> History:
    """Train ``model`` on ``task``'s batches; return a :class:`History`.

    The model trains on ``device`` (``"auto"``: a GPU if there is one) and is handed back on the device it was on
    when called, also when training stops early: a model built on the CPU comes back to the CPU, where a notebook's
    tensors are, and one the caller put on a GPU stays there.

    ``settings`` are :class:`TrainConfig` fields, e.g. ``train(model, task, steps=400, lr=1e-2)``; with
    ``config`` they replace its fields. Raises :class:`TrainingDiverged` on a NaN/inf loss.

    ``callback(step, model)`` looks at the model during training (e.g. a
    :class:`mhalab.formation.FormationRecorder`): at step 0 before the first update (unless resuming), then
    after every ``callback_every``-th step (default: the callback's own ``every``, else ``steps // 10``) and
    the last. It runs with its own random state, so a run with a callback trains exactly as one without.
    If it raises, training stops with :class:`CallbackFailed`, which keeps everything finished."""
    from tqdm.auto import tqdm

    # ---- check everything before any work, so a bad setting fails in a second, not after training
    cfg = make_config(config, **settings)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    validate_task(task)
    validate_model_fits_task(model, task)
    device = pick_device(cfg.device)
    precision, amp_dtype = resolve_precision(cfg.precision, device)
    path = None if cfg.checkpoint is None else Path(cfg.checkpoint)
    run = {"task": str(getattr(task, "name", type(task).__name__)), "precision": precision}
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be a function callback(step, model), got {type(callback).__name__}")
    if callback_every is None:
        callback_every = getattr(callback, "every", None) or max(1, cfg.steps // 10)
    validate_int("callback_every", callback_every, 1)

    with moved_to(model, device):  # trained on `device`, handed back where it was (a notebook's tensors live there)
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]  # matrices and embeddings
        no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]  # biases, LayerNorm gains
        if not decay and not no_decay:
            raise ValueError("the model has no trainable parameters")
        foreach = foreach_supported(device)  # one multi-tensor kernel per update where torch has them (not MPS)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.98), foreach=foreach,
        )
        scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)  # passes through unless fp16
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cfg.lr_factor(step))
        parts = dict(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)  # what a checkpoint holds
        # The batches are drawn on the CPU and copied over: a GPU draws other numbers from the same seed, and a run
        # there would train on other data than the same run on a laptop. (The copy is small beside a step.)
        generator = torch.Generator()
        history = History(device=str(device), precision=precision)
        start, save_every = 0, cfg.checkpoint_every or max(1, cfg.steps // 10)
        # torch.manual_seed below reseeds the CPU and `device`: put the caller's random states back afterwards
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device], device_type=device.type):
            torch.manual_seed(stream_seed(cfg.seed, "dropout"))  # the global stream: dropout's
            generator.manual_seed(stream_seed(cfg.seed, "data"))  # the training batches
            if path is not None and path.exists():
                state = load_checkpoint(path)
                _validate_resume(state, cfg, run, path)
                history, start = History(**state["history"]), int(state["step"])
                data, rest = restore(state, parts, generator, device, path=path)
                if not (data and rest):
                    saved_on = state["rng"].get("device", "another kind of device")
                    new = " and ".join(name for name, kept in (("the batches", data), ("dropout", rest)) if not kept)
                    also = ", and so do the batches (drawn on the CPU)" if data else ""
                    unless = " if the model has dropout" if data else ""
                    warnings.warn(
                        f"checkpoint {str(path)!r} was written on {saved_on} and is resumed on {device.type}: the "
                        f"weights, optimizer and schedule continue{also}, but {new} after step {start} cannot "
                        "continue here (one kind of device's random streams cannot continue on another, and a "
                        "checkpoint from before mhalab drew batches on the CPU holds a GPU generator's), so they come "
                        f"from new streams (seeded by seed and step). The run stays deterministic, but differs from "
                        f"one that never moved{unless}.", stacklevel=2)
                    if not rest:
                        torch.manual_seed(stream_seed(cfg.seed, f"dropout after step {start}"))
                    if not data:
                        generator.manual_seed(stream_seed(cfg.seed, f"data after step {start}"))
            last_saved = start if path is not None and path.exists() else None
            pending: list[Tensor] = []  # losses not yet read back from the device
            model.train()
            bar = tqdm(total=cfg.steps, initial=start, disable=not cfg.progress, desc=f"training on {device.type}",
                       unit="step", dynamic_ncols=True)
            if cfg.progress:
                gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
                bar.write(f"mhalab.train: {device}{gpu}, precision {precision}, {cfg.steps - start} steps to go")
            began = time.perf_counter() - history.elapsed  # resumed runs add up
            step = start

            def call_back(step: int) -> None:
                """Run the callback outside training's random streams and mode; if it fails, keep the work done."""
                try:
                    with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device],
                                               device_type=device.type):
                        callback(step, model)
                except Exception as error:
                    kept = ""
                    if path is not None and step > start and last_saved != step:
                        save_checkpoint(snapshot(parts, generator, device, step=step, train_config=cfg.to_dict(),
                                                 history=asdict(history), **run), path)
                    if path is not None and step > start:
                        kept = (f", the checkpoint {str(path)!r} holds step {step} "
                                "(train again with the same settings to resume)")
                    raise CallbackFailed(
                        f"the callback {getattr(callback, '__name__', type(callback).__name__)} raised at step {step}: "
                        f"{type(error).__name__}: {error}. Training stopped there; nothing finished is lost: the model "
                        f"holds step {step}'s weights, this error's .history the run so far{kept}",
                        step=step, history=history) from error
                finally:
                    model.train()

            try:
                if callback is not None and start == 0:
                    call_back(0)
                for step in range(start + 1, cfg.steps + 1):
                    batch = _to_device(task.sample(cfg.batch_size, generator=generator), device)
                    with autocast(device, amp_dtype):
                        loss = task.loss(batch_logits(model, batch), batch)
                    optimizer.zero_grad(set_to_none=True)
                    history.lr.append(optimizer.param_groups[0]["lr"])
                    scaler.scale(loss).backward()
                    if cfg.grad_clip is not None:
                        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                        torch.nn.utils.clip_grad_norm_(decay + no_decay, cfg.grad_clip, foreach=foreach)
                    scaler.step(optimizer)
                    scaler.update()
                    scheduler.step()
                    pending.append(loss.detach())

                    evaluate_now = step == cfg.steps or (cfg.eval_every is not None and step % cfg.eval_every == 0)
                    save_now = path is not None and (step == cfg.steps or step % save_every == 0)
                    if len(pending) >= _FLUSH_EVERY or evaluate_now or save_now:
                        # one host sync per group; raises TrainingDiverged before anything below could save bad weights
                        _record_losses(history, pending, step, cfg, last_saved)
                        if evaluate_now:
                            history.evals.append((step, evaluate(model, task, batches=cfg.eval_batches, device=device,
                                                                 batch_size=cfg.eval_batch_size, precision=precision)))
                        shown = {"acc": f"{history.final['accuracy']:.3f}"} if "accuracy" in history.final else {}
                        bar.set_postfix(loss=f"{history.train_loss[-1]:.4f}", **shown, refresh=False)
                    history.elapsed = time.perf_counter() - began
                    if save_now:
                        save_checkpoint(snapshot(parts, generator, device, step=step, train_config=cfg.to_dict(),
                                                 history=asdict(history), **run), path)
                        last_saved = step
                    if callback is not None and (step % callback_every == 0 or step == cfg.steps):
                        if pending:  # a NaN stops the run here, before the callback looks at broken weights
                            _record_losses(history, pending, step, cfg, last_saved)
                        call_back(step)
                    bar.update(1)
            except KeyboardInterrupt:
                where = (f"; the last checkpoint (step {last_saved}) is at {str(cfg.checkpoint)!r}: call train again "
                         "with the same settings to resume" if last_saved is not None
                         else "; pass checkpoint=path to be able to resume")
                bar.write(f"interrupted during step {step}{where}")
                raise
            finally:
                bar.close()
        return history


def _record_losses(history: History, pending: list[Tensor], step: int, cfg: TrainConfig,
                   last_saved: int | None) -> None:
    """Move the pending losses (steps ``step - len(pending) + 1 .. step``) into ``history``, or raise
    :class:`TrainingDiverged` at the first non-finite one."""
    values = torch.stack(pending).float().tolist()
    first = step - len(values) + 1
    pending.clear()
    bad = next((i for i, value in enumerate(values) if not math.isfinite(value)), None)
    if bad is not None:
        kept = (f"The last good checkpoint (step {last_saved}) at {str(cfg.checkpoint)!r} is untouched; resuming "
                "from it with the same settings would diverge again, so change the settings and train into a new "
                "checkpoint path." if last_saved is not None else "No checkpoint was written before it.")
        fp32 = ", or precision='fp32'" if history.precision != "fp32" else ""
        raise TrainingDiverged(
            f"training diverged: the loss became {values[bad]} at step {first + bad} (of {cfg.steps}); the weights "
            f"are no longer usable. Try a lower learning rate (lr={cfg.lr:g} -> {cfg.lr / 3:.2g}), a longer warm-up, "
            f"or gradient clipping (grad_clip=1.0){fp32}. " + kept,
            step=first + bad, loss=values[bad],
        )
    history.steps.extend(range(first, step + 1))
    history.train_loss.extend(values)


def _validate_resume(state: dict[str, Any], cfg: TrainConfig, run: dict[str, str], path: Path) -> None:
    """Refuse a checkpoint of another run; only ``steps`` may change (and then the schedule stretches)."""
    if state["step"] > cfg.steps:
        raise ValueError(f"checkpoint {str(path)!r} is already at step {state['step']}, beyond steps={cfg.steps}; "
                         "pass steps >= that, or another checkpoint path")
    saved, now = {**state["train_config"], **{k: state[k] for k in run}}, {**cfg.to_dict(), **run}
    diff = {k: (saved[k], now[k]) for k in (*_RESUME_MUST_MATCH, *run) if saved[k] != now[k]}
    if diff:
        raise ValueError(
            f"checkpoint {str(path)!r} was written by a run with other settings (name: (checkpoint, now)) {diff}; "
            "resume with the same settings (only steps may change), or train into a new checkpoint path"
        )
    if saved["steps"] != cfg.steps:
        warnings.warn(f"resuming a run planned for {saved['steps']} steps with steps={cfg.steps}: the cosine "
                      "schedule is stretched from here on, so the result differs from a run planned with that many "
                      "steps", stacklevel=3)
