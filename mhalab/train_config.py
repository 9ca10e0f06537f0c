"""A training run's settings: :class:`TrainConfig` (every setting of :func:`mhalab.train.train`, checked when
made), :func:`make_config`, and :func:`stream_seed`, which gives each of a run's random streams a seed of its own.
:mod:`mhalab.train` imports all three from here; import them from either.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from .arguments import validate_float, validate_int
from .device import pick_device, resolve_precision

__all__ = ["TrainConfig", "make_config", "stream_seed"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Every setting of :func:`train`, checked when made (and by ``dataclasses.replace``). Fields hold what
    was asked for: ``warmup_steps=None`` stays None (derived: :attr:`warmup`), so a resume may add ``steps``."""

    steps: int  # total optimizer steps; a resumed run continues up to it
    batch_size: int = 64
    lr: float = 3e-3  # peak AdamW learning rate
    weight_decay: float = 0.01  # on weight matrices and embeddings only
    warmup_steps: int | None = None  # linear warm-up to lr, then cosine to final_lr_fraction * lr
    final_lr_fraction: float = 0.1
    grad_clip: float | None = 1.0  # global gradient-norm clip; None: off
    # training batches and dropout, each its own stream (the caller's RNG is left alone; seed the init yourself)
    seed: int = 0
    device: str = "auto"  # "auto" (cuda, mps, cpu), "cpu", "cuda", "cuda:1", "mps"
    precision: str = "fp32"  # or, on CUDA, "bf16"/"fp16" autocast, or "auto" (the fastest there)
    eval_every: int | None = None  # held-out evaluation every this many steps (and always at the end)
    eval_batches: int = 4
    eval_batch_size: int = 256
    checkpoint: str | os.PathLike | None = None  # file: resumed from if it exists (same settings but steps)
    checkpoint_every: int | None = None  # default steps // 10 when checkpoint is given
    progress: bool = True  # a tqdm bar and one line naming the device and precision

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("batch_size", 1), ("seed", 0), ("eval_batches", 1), ("eval_batch_size", 1)):
            validate_int(name, getattr(self, name), low)
        for name, low in (("warmup_steps", 0), ("eval_every", 1), ("checkpoint_every", 1)):  # these may be None
            if getattr(self, name) is not None:
                validate_int(name, getattr(self, name), low)
        if self.warmup_steps is not None and self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} is longer than the whole run (steps={self.steps})")
        validate_float("lr", self.lr, positive=True)
        validate_float("weight_decay", self.weight_decay)
        validate_float("final_lr_fraction", self.final_lr_fraction, high=1.0)
        if self.grad_clip is not None:
            validate_float("grad_clip", self.grad_clip, positive=True)
        if isinstance(self.device, torch.device):
            object.__setattr__(self, "device", str(self.device))
        resolve_precision(self.precision, pick_device(self.device))  # a bad device or precision fails now
        if self.checkpoint is not None and not isinstance(self.checkpoint, (str, os.PathLike)):
            raise TypeError("checkpoint must be a file path (str or pathlib.Path), "
                            f"got {type(self.checkpoint).__name__}")
        if not isinstance(self.progress, bool):
            raise TypeError(f"progress must be True or False, got {self.progress!r}")

    @property
    def warmup(self) -> int:
        """``warmup_steps``, or 5% of ``steps`` (1 to 200) when that is None."""
        return min(200, max(1, self.steps // 20)) if self.warmup_steps is None else self.warmup_steps

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` for optimizer step ``step + 1``: linear warm-up, then cosine decay."""
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        done = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        return self.final_lr_fraction + (1 - self.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * done))

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (what a checkpoint stores)."""
        return {**asdict(self), "checkpoint": None if self.checkpoint is None else str(self.checkpoint)}


def stream_seed(seed: int, purpose: str) -> int:
    """The seed of one random stream of a run: ``purpose`` is ``"data"`` (training batches), ``"dropout"``,
    ``"init"`` (:func:`mhalab.sweep.sweep_heads`' initial weights) or ``"eval"`` (held-out batches).

    ``torch.manual_seed(s)`` and ``torch.Generator().manual_seed(s)`` produce the same numbers, so seeding
    every stream with ``seed`` itself would give the batches, the dropout masks and the initial weights the
    same bits. Each stream gets a hash of ``(seed, purpose)`` instead: distinct, and the same on every run."""
    validate_int("seed", seed, 0)
    digest = hashlib.sha256(f"mhalab {purpose} stream, seed {seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: a valid seed for every torch generator


def make_config(config: TrainConfig | None = None, /, **overrides: Any) -> TrainConfig:
    """``config`` with some fields replaced (``overrides``: TrainConfig field names), or a new TrainConfig."""
    names = [f.name for f in fields(TrainConfig)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise TypeError(f"unknown training setting(s) {unknown}; the settings (TrainConfig fields) are {names}")
    if config is None:
        if "steps" not in overrides:
            raise TypeError("say how long to train: steps=... (optimizer steps), e.g. train(model, task, steps=500)")
        return TrainConfig(**overrides)
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig (or None), got {type(config).__name__}")
    return replace(config, **overrides)
