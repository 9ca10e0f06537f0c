"""What a training run recorded: losses, learning rates and held-out metrics, step by step."""

from __future__ import annotations

from dataclasses import dataclass, field

from .plotting import plot_history

__all__ = ["History"]


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
