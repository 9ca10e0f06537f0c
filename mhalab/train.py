"""Training loop: AdamW with warm-up and cosine decay, evaluation, checkpoints that resume exactly.

:func:`train` trains any model whose ``forward_batch(batch)`` (or ``forward(batch.inputs)``)
returns the logits a task's ``loss`` expects, on batches the task draws on the device from a
seeded ``torch.Generator``.  Because that generator, the optimizer, the scheduler and every
random-number state go into the checkpoint, stopping and resuming gives the same weights,
bit for bit on a CPU, as one uninterrupted run.

Things that cost nothing to learn but are easy to get wrong, handled here:

* device choice (``device="auto"``: cuda, then mps, then cpu) and mixed precision (bf16 autocast
  on GPUs that have it, fp16 with a gradient scaler on older ones, float32 on CPU and MPS);
* no host-device synchronisation per step: losses stay on the device and are read in groups,
  which is also where a NaN or infinite loss is caught (:class:`TrainingDiverged` names the step);
* checkpoints are written to a temporary file and renamed over the old one, so a crash or a
  Ctrl-C while saving never leaves a half-written file, and a diverged run never overwrites the
  last good checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ._checks import check_int
from .device import autocast_dtype, pick_device

__all__ = [
    "train",
    "evaluate",
    "History",
    "TrainingDiverged",
    "load_checkpoint",
    "resolve_precision",
    "EVAL_SEED",
    "PRECISIONS",
]

EVAL_SEED = 987_654_321  # held-out batches come from this stream; training uses `seed`, a different one
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_FLUSH_EVERY = 16  # read losses back from the device (and check them) at most this many steps apart
_CHECKPOINT_FORMAT = "mhalab-checkpoint-v1"
# Arguments that must match for a resumed run to be the same run (steps may grow: the schedule stretches).
_RESUME_MUST_MATCH = ("batch_size", "lr", "weight_decay", "warmup_steps", "final_lr_fraction", "seed", "precision", "grad_clip")


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or infinite.  ``step`` is the first bad step (1-based)."""

    def __init__(self, message: str, *, step: int, loss: float) -> None:
        super().__init__(message)
        self.step, self.loss = step, loss


# ----------------------------------------------------------------------------- history
@dataclass
class History:
    """What happened during training.

    Attributes:
        steps: step numbers 1..n, one per optimizer step.
        train_loss: the training loss at each of those steps (one batch each, so noisy).
        lr: the learning rate used at each step.
        evals: ``(step, metrics)`` for every evaluation on the held-out batches.
        elapsed: seconds spent training (summed over resumed runs).
        device, precision: where and how it ran.
    """

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    elapsed: float = 0.0
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

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only (what a checkpoint stores)."""
        return {
            "steps": list(self.steps), "train_loss": list(self.train_loss), "lr": list(self.lr),
            "evals": [(int(s), {k: float(v) for k, v in m.items()}) for s, m in self.evals],
            "elapsed": float(self.elapsed), "device": self.device, "precision": self.precision,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "History":
        values = dict(values)
        values["evals"] = [(int(s), dict(m)) for s, m in values.get("evals", [])]
        return cls(**values)

    def __repr__(self) -> str:
        final = ", ".join(f"{k}={v:.4g}" for k, v in self.final.items() if "/" not in k)
        return (f"History({len(self.steps)} steps on {self.device or '?'} ({self.precision or '?'}), "
                f"{self.elapsed:.1f} s; final: {final or 'no evaluation'})")

    def plot(self, *, smooth: int = 20, title: str | None = None):
        """Training loss (per step and smoothed) and the held-out metrics; returns the figure.

        In a notebook end the line with ``;`` so the figure is not shown twice.
        """
        import matplotlib.pyplot as plt

        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(9, 3), dpi=72)
        if self.steps:
            ax_loss.plot(self.steps, self.train_loss, color="tab:blue", alpha=0.25, lw=0.8, label="train (per step)")
            k = max(1, min(smooth, len(self.train_loss)))
            kernel = torch.ones(k) / k
            smoothed = torch.nn.functional.conv1d(torch.tensor(self.train_loss)[None, None], kernel[None, None])[0, 0]
            ax_loss.plot(self.steps[k - 1 :], smoothed.tolist(), color="tab:blue", label=f"train ({k}-step mean)")
        if self.evals:
            eval_steps, eval_loss = self.metric("loss") if "loss" in self.evals[-1][1] else ([], [])
            if eval_steps:
                ax_loss.plot(eval_steps, eval_loss, "o-", color="tab:orange", ms=3, label="held-out")
            for name in sorted(self.evals[-1][1]):
                if name.startswith("accuracy"):
                    s, v = self.metric(name)
                    main = name == "accuracy"
                    ax_acc.plot(s, v, "o-" if main else "-", ms=3, lw=2 if main else 1, label=name.replace("accuracy/", ""))
            ax_acc.legend(fontsize=7, loc="lower right")
        positive = [x for x in self.train_loss if x > 0]
        if positive and max(positive) / min(positive) > 20:
            ax_loss.set_yscale("log")
        ax_loss.set(xlabel="step", ylabel="loss", title="loss")
        ax_loss.legend(fontsize=7)
        ax_acc.set(xlabel="step", ylabel="held-out accuracy", title="accuracy", ylim=(-0.02, 1.02))
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        return fig


# --------------------------------------------------------------------------- precision
def resolve_precision(precision: str, device: torch.device) -> tuple[str, torch.dtype | None]:
    """``(name, autocast dtype or None)`` for ``precision`` on ``device``; raises on impossible choices.

    ``"auto"`` is bf16 autocast on CUDA GPUs that support it, fp16 (with a gradient scaler) on
    older CUDA GPUs, and float32 on CPU and MPS, where autocast would be slower, not faster.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        dtype = autocast_dtype(device)
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype], dtype
    if precision == "fp32":
        return "fp32", None
    if device.type != "cuda":
        raise ValueError(
            f"precision={precision!r} (autocast) is only used on CUDA GPUs, but training runs on {device}; "
            "use precision='auto' or 'fp32'"
        )
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU has no bfloat16 support; use precision='fp16' (with a gradient scaler) or 'auto'")
    return precision, torch.bfloat16 if precision == "bf16" else torch.float16


# ------------------------------------------------------------------------- validation
def _float_arg(name: str, value: Any, *, low: float, low_inclusive: bool, high: float | None = None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    too_low = value < low if low_inclusive else value <= low
    if too_low or (high is not None and value > high):
        bound = f"{'>=' if low_inclusive else '>'} {low}" + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"{name} must be {bound}, got {name}={value}")


def _check_task(task: Any) -> None:
    missing = [a for a in ("sample", "loss", "metrics", "vocab_size", "seq_len") if not hasattr(task, a)]
    if missing:
        raise TypeError(f"task must follow mhalab.tasks.Task (sample, loss, metrics, vocab_size, seq_len); "
                        f"{type(task).__name__} lacks {missing}")


def _check_model_fits_task(model: nn.Module, task: Any) -> None:
    """Catch a model built for another task before any training happens."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "vocab_size"):
        return
    problems = []
    if cfg.vocab_size != task.vocab_size:
        problems.append(f"vocab_size {cfg.vocab_size} != task's {task.vocab_size}")
    if getattr(cfg, "max_len", task.seq_len) < task.seq_len:
        problems.append(f"max_len {cfg.max_len} < task's seq_len {task.seq_len}")
    if getattr(cfg, "n_targets", 1) != getattr(task, "n_targets", 1):
        problems.append(f"n_targets {cfg.n_targets} != task's {task.n_targets}")
    if problems:
        raise ValueError(f"the model does not fit task {getattr(task, 'name', type(task).__name__)!r}: "
                         + "; ".join(problems) + ". Build it with ModelConfig.for_task(task, d_model=..., n_heads=...)")


def _logits(model: nn.Module, batch: Any) -> Tensor:
    forward_batch = getattr(model, "forward_batch", None)
    return forward_batch(batch) if forward_batch is not None else model(batch.inputs)


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


# --------------------------------------------------------------------------- evaluate
@torch.no_grad()
def evaluate(
    model: nn.Module,
    task: Any,
    *,
    batches: int = 8,
    batch_size: int = 256,
    seed: int = EVAL_SEED,
    device: str | torch.device | None = None,
    precision: str = "auto",
) -> dict[str, float]:
    """The task's metrics on ``batches`` held-out batches, averaged over batches.

    The batches come from a fresh generator seeded with ``seed`` (by default :data:`EVAL_SEED`,
    a stream training never draws from), so every call sees the same batches and evaluating
    never disturbs training.  ``device=None`` uses the model's device.  The model runs in eval
    mode (no dropout); its mode is restored afterwards.
    """
    _check_task(task)
    check_int("batches", batches, 1)
    check_int("batch_size", batch_size, 1)
    check_int("seed", seed, 0)
    device = _model_device(model) if device is None else pick_device(device)
    _, dtype = resolve_precision(precision, device)
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    totals: dict[str, float] = {}
    try:
        for _ in range(batches):
            batch = task.sample(batch_size, generator=generator, device=device)
            with _autocast(device, dtype):
                logits = _logits(model, batch)
            for name, value in task.metrics(logits.float(), batch).items():
                totals[name] = totals.get(name, 0.0) + float(value)
    finally:
        model.train(was_training)
    return {name: total / batches for name, total in totals.items()}


# ------------------------------------------------------------------------- checkpoints
def _save_atomic(state: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary file in the same folder, then rename it over ``path``.

    ``os.replace`` is atomic, so ``path`` always holds either the old checkpoint or the new
    one, never a half-written file, even if the process dies mid-save.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_checkpoint(path: str | os.PathLike, model: nn.Module | None = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`train` (``weights_only=True``: tensors and plain values only).

    With ``model`` its weights are loaded into it.  The dict holds ``model``, ``optimizer``,
    ``scheduler``, ``scaler``, ``step``, ``rng``, ``config`` (the ModelConfig as a dict, or None),
    ``train_args`` and ``history`` (a dict; ``History.from_dict`` rebuilds it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not a checkpoint written by mhalab.train (format {_CHECKPOINT_FORMAT})")
    if model is not None:
        _load_model_state(model, state, path)
    return state


def _load_model_state(model: nn.Module, state: dict[str, Any], path: Path) -> None:
    cfg = getattr(model, "config", None)
    saved = state.get("config")
    if saved is not None and hasattr(cfg, "to_dict") and cfg.to_dict() != saved:
        diff = {k: (saved.get(k), v) for k, v in cfg.to_dict().items() if saved.get(k) != v}
        raise ValueError(
            f"checkpoint {str(path)!r} was written for another model configuration "
            f"(field: (checkpoint, this model)) {diff}; build the model with that config, "
            "or train into a new checkpoint path"
        )
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise ValueError(f"checkpoint {str(path)!r} does not fit this model: {e}") from None


# ------------------------------------------------------------------------------- train
def train(
    model: nn.Module,
    task: Any,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    warmup_steps: int | None = None,
    final_lr_fraction: float = 0.1,
    device: str | torch.device = "auto",
    seed: int = 0,
    precision: str = "auto",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    eval_every: int | None = None,
    eval_batches: int = 4,
    eval_batch_size: int = 256,
    grad_clip: float | None = 1.0,
    progress: bool = True,
) -> History:
    """Train ``model`` on batches drawn from ``task`` for ``steps`` optimizer steps; return a :class:`History`.

    Args:
        model: e.g. :class:`mhalab.models.Transformer`; moved to ``device`` in place.
        task: a :class:`mhalab.tasks.Task` (``sample``, ``loss``, ``metrics``).
        steps: total optimizer steps (when resuming, training continues up to this number).
        batch_size: sequences per step.
        lr: peak learning rate of AdamW.
        weight_decay: AdamW weight decay, applied to weight matrices and embeddings only
            (not to biases or LayerNorm gains).
        warmup_steps: steps of linear warm-up from 0 to ``lr``; None means 5% of ``steps``
            (at most 200).  Then the rate follows a cosine down to ``final_lr_fraction * lr``.
        device: ``"auto"`` (cuda, then mps, then cpu), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``.
        seed: seeds the training data stream and dropout.  The global RNG is left as it was.
            Model initialisation happens before ``train``: seed that yourself (``torch.manual_seed``).
        precision: ``"auto"``, ``"fp32"``, ``"bf16"`` or ``"fp16"`` (the last two: CUDA only).
        checkpoint: a file path.  If it exists, training resumes from it (same arguments
            required, except ``steps``); it is rewritten every ``checkpoint_every`` steps and at the end.
        checkpoint_every: default ``steps // 10`` (at least 1) when ``checkpoint`` is given.
        eval_every: evaluate on held-out batches every this many steps (and always at the end).
        eval_batches, eval_batch_size: size of each held-out evaluation (see :func:`evaluate`).
        grad_clip: clip the global gradient norm to this; None turns clipping off.
        progress: show a progress bar (``tqdm.auto``: a widget in Jupyter, text in a terminal)
            and print one line saying which device and precision are used.

    Raises:
        TrainingDiverged: (a FloatingPointError) the loss became NaN or infinite; the message names
            the step.  A checkpoint written before that step is kept untouched.
    """
    # ---- check everything before any work, so a bad setting fails in a second, not after training
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_task(task)
    check_int("steps", steps, 1)
    check_int("batch_size", batch_size, 1)
    _float_arg("lr", lr, low=0.0, low_inclusive=False)
    _float_arg("weight_decay", weight_decay, low=0.0, low_inclusive=True)
    if warmup_steps is not None:
        check_int("warmup_steps", warmup_steps, 0)
        if warmup_steps > steps:
            raise ValueError(f"warmup_steps={warmup_steps} is longer than the whole run (steps={steps})")
    _float_arg("final_lr_fraction", final_lr_fraction, low=0.0, low_inclusive=True, high=1.0)
    check_int("seed", seed, 0)
    if seed == EVAL_SEED:
        raise ValueError(f"seed={EVAL_SEED} is the held-out evaluation stream's seed; train with another seed")
    for name, value in (("checkpoint_every", checkpoint_every), ("eval_every", eval_every)):
        if value is not None:
            check_int(name, value, 1)
    check_int("eval_batches", eval_batches, 1)
    check_int("eval_batch_size", eval_batch_size, 1)
    _float_arg("grad_clip", grad_clip, low=0.0, low_inclusive=False, allow_none=True)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False, got {progress!r}")
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(f"checkpoint must be a file path (str or pathlib.Path), got {type(checkpoint).__name__}")
    _check_model_fits_task(model, task)
    device = pick_device(device)
    precision_name, amp_dtype = resolve_precision(precision, device)

    warmup = min(200, max(1, steps // 20)) if warmup_steps is None else warmup_steps
    ckpt_path = Path(checkpoint) if checkpoint is not None else None
    ckpt_every = (checkpoint_every or max(1, steps // 10)) if ckpt_path is not None else None
    args = dict(
        steps=steps, batch_size=batch_size, lr=float(lr), weight_decay=float(weight_decay), warmup_steps=warmup,
        final_lr_fraction=float(final_lr_fraction), seed=seed, precision=precision_name,
        grad_clip=None if grad_clip is None else float(grad_clip), eval_every=eval_every,
        eval_batches=eval_batches, eval_batch_size=eval_batch_size, checkpoint_every=ckpt_every,
        task=str(getattr(task, "name", type(task).__name__)),
    )

    # ---- model, optimizer, schedule, scaler
    model.to(device)
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]  # biases, LayerNorm gains
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters")
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.98), foreach=True,
    )

    def schedule(step: int) -> float:  # multiplier of lr for optimizer step `step + 1`
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress_ = min(1.0, (step - warmup) / max(1, steps - warmup))
        return final_lr_fraction + (1 - final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress_))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16) if device.type == "cuda" else None
    generator = torch.Generator(device=device)
    history = History(device=str(device), precision=precision_name)
    start = 0
    rng_devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []

    with torch.random.fork_rng(devices=rng_devices, device_type=device.type if device.type == "cuda" else "cuda"):
        torch.manual_seed(seed)  # dropout's stream, inside fork_rng so the caller's RNG is untouched
        generator.manual_seed(seed)
        if ckpt_path is not None and ckpt_path.exists():
            state = load_checkpoint(ckpt_path)
            if int(state["step"]) > steps:
                raise ValueError(f"checkpoint {str(ckpt_path)!r} is already at step {state['step']}, beyond "
                                 f"steps={steps}; pass steps >= that, or another checkpoint path")
            _check_resume_args(state["train_args"], args, ckpt_path)
            _load_model_state(model, state, ckpt_path)
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            if scaler is not None and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            rng = state["rng"]
            torch.set_rng_state(rng["torch"])
            if device.type == "cuda" and rng.get("cuda") is not None:
                torch.cuda.set_rng_state(rng["cuda"], device)
            generator.set_state(rng["data"])
            history = History.from_dict(state["history"])
            start = int(state["step"])

        def save(step: int) -> None:
            _save_atomic({
                "format": _CHECKPOINT_FORMAT,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
                "step": step,
                "rng": {
                    "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                    "data": generator.get_state(),
                },
                "config": model.config.to_dict() if hasattr(getattr(model, "config", None), "to_dict") else None,
                "train_args": args,
                "history": history.to_dict(),
            }, ckpt_path)

        return _run(model, task, optimizer, scheduler, scaler, generator, history, save if ckpt_path else None,
                    start=start, steps=steps, batch_size=batch_size, device=device, amp_dtype=amp_dtype,
                    grad_clip=grad_clip, eval_every=eval_every, eval_batches=eval_batches,
                    eval_batch_size=eval_batch_size, precision_name=precision_name, ckpt_every=ckpt_every,
                    ckpt_path=ckpt_path, lr=lr, progress=progress)


def _check_resume_args(saved: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    diff = {k: (saved.get(k), now[k]) for k in _RESUME_MUST_MATCH if saved.get(k) != now[k]}
    if saved.get("task") != now["task"]:
        diff["task"] = (saved.get("task"), now["task"])
    if diff:
        raise ValueError(
            f"checkpoint {str(path)!r} was written by a run with other settings (name: (checkpoint, now)) {diff}; "
            "resume with the same settings (only steps may change), or train into a new checkpoint path"
        )
    if saved.get("steps") != now["steps"]:
        warnings.warn(
            f"resuming a run planned for {saved.get('steps')} steps with steps={now['steps']}: the cosine schedule "
            "is stretched from here on, so the result differs from a run planned with that many steps",
            stacklevel=3,
        )


def _run(model, task, optimizer, scheduler, scaler, generator, history, save, *, start, steps, batch_size, device,
         amp_dtype, grad_clip, eval_every, eval_batches, eval_batch_size, precision_name, ckpt_every, ckpt_path,
         lr, progress) -> History:
    """The loop itself (inside train's fork_rng).  Losses are read back only every few steps."""
    from tqdm.auto import tqdm

    params = [p for group in optimizer.param_groups for p in group["params"]]
    use_scaler = scaler is not None and scaler.is_enabled()
    pending: list[Tensor] = []  # this group's losses, still on the device
    pending_lr: list[float] = []
    last_saved = start if ckpt_path is not None and ckpt_path.exists() else None

    def flush(step: int) -> None:
        """Copy the pending losses to the host (one sync) and stop at the first non-finite one."""
        if not pending:
            return
        values = torch.stack(pending).float().tolist()
        first = step - len(values) + 1
        for i, value in enumerate(values):
            if not math.isfinite(value):
                bad = first + i
                kept = (f"The last good checkpoint (step {last_saved}) at {str(ckpt_path)!r} is untouched; "
                        "resuming from it with the same settings would diverge again, so change the settings and "
                        "train into a new checkpoint path." if last_saved is not None else
                        "No checkpoint was written before it.")
                fp32 = ", or precision='fp32'" if precision_name != "fp32" else ""
                raise TrainingDiverged(
                    f"training diverged: the loss became {value} at step {bad} (of {steps}); the weights are no "
                    f"longer usable. Try a lower learning rate (lr={lr:g} -> {lr / 3:.2g}), a longer warm-up, or "
                    f"gradient clipping (grad_clip=1.0){fp32}. " + kept,
                    step=bad, loss=value,
                )
        history.steps.extend(range(first, step + 1))
        history.train_loss.extend(values)
        history.lr.extend(pending_lr)
        pending.clear()
        pending_lr.clear()

    model.train()
    bar = tqdm(total=steps, initial=start, disable=not progress, desc=f"training on {device.type}", unit="step",
               dynamic_ncols=True)
    if progress:
        gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
        bar.write(f"mhalab.train: {device}{gpu}, precision {precision_name}, {steps - start} steps to go")
    began = time.perf_counter()
    elapsed_before = history.elapsed
    step = start
    try:
        for step in range(start + 1, steps + 1):
            batch = task.sample(batch_size, generator=generator, device=device)
            with _autocast(device, amp_dtype):
                logits = _logits(model, batch)
                loss = task.loss(logits, batch)
            optimizer.zero_grad(set_to_none=True)
            pending_lr.append(optimizer.param_groups[0]["lr"])
            if use_scaler:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                if grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                if grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
                optimizer.step()
            scheduler.step()
            pending.append(loss.detach())

            evaluate_now = eval_every is not None and step % eval_every == 0
            save_now = save is not None and (step % ckpt_every == 0 or step == steps)
            if len(pending) >= _FLUSH_EVERY or evaluate_now or save_now or step == steps:
                flush(step)  # raises TrainingDiverged before anything below could save bad weights
                bar.set_postfix(loss=f"{history.train_loss[-1]:.4f}", refresh=False)
            if evaluate_now or step == steps:
                metrics = evaluate(model, task, batches=eval_batches, batch_size=eval_batch_size, device=device,
                                   precision=precision_name)
                history.evals.append((step, metrics))
                if "accuracy" in metrics:
                    bar.set_postfix(loss=f"{history.train_loss[-1]:.4f}", acc=f"{metrics['accuracy']:.3f}", refresh=False)
            history.elapsed = elapsed_before + time.perf_counter() - began
            if save_now:
                save(step)
                last_saved = step
            bar.update(1)
    except KeyboardInterrupt:
        where = (f"; the last checkpoint (step {last_saved}) is at {str(ckpt_path)!r}: call train again with the "
                 "same arguments to resume" if last_saved is not None else "; pass checkpoint=path to be able to resume")
        bar.write(f"interrupted during step {step}{where}")
        raise
    finally:
        bar.close()
    history.elapsed = elapsed_before + time.perf_counter() - began
    return history


# The head-count sweep trains through this module; it lives in sweep.py (one idea per module).
from .sweep import sweep_heads  # noqa: E402  (sweep imports train lazily, so either import order works)

__all__.append("sweep_heads")
