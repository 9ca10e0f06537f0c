"""What a training run recorded: losses, learning rates and held-out metrics, step by step."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .plotting import plot_history

__all__ = ["History"]


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
        """Plain Python values only (what a checkpoint stores); ``History(**d)`` rebuilds it."""
        return asdict(self)

    def __repr__(self) -> str:
        final = ", ".join(f"{k}={v:.4g}" for k, v in self.final.items() if "/" not in k)
        return (f"History({len(self.steps)} steps on {self.device or '?'} ({self.precision or '?'}), "
                f"{self.elapsed:.1f} s; final: {final or 'no evaluation'})")

    def plot(self, *, smooth: int = 20, title: str | None = None):
        """Training loss (per step and smoothed) and the held-out metrics; returns the figure
        (:func:`mhalab.plotting.plot_history`).  In a notebook end the line with ``;``."""
        return plot_history(self, smooth=smooth, title=title)
