"""Watch heads form: a light recorder that :func:`mhalab.train.train` calls during training.

At each recorded step it runs the model once on a fixed held-out batch of a
:class:`~mhalab.tasks.RepeatedSegments` task and keeps a few numbers, not the weights: the loss on the repeated
and on the fresh tokens, the in-context-learning score, each head's induction and previous-token scores, and
every head's attention pattern on one fixed example. Shapes: K recorded steps, N layers, H heads, T positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .arguments import validate_int
from .head_roles import induction_score, previous_token_score, stack_attention
from .models import eval_mode
from .tasks import IGNORE
from .train import EVAL_SEED, stream_seed

__all__ = ["FormationRecorder", "SCORES", "LOSSES"]

#: The per-head scores a recorder keeps, each ``[K, N, H]``.
SCORES = ("induction", "previous-token")
#: The losses a recorder keeps, each ``[K]`` (nats); ``icl`` is late minus early (negative: context helps).
LOSSES = ("loss", "repeated", "fresh", "icl")


class FormationRecorder:
    """A ``callback(step, model)`` for :func:`~mhalab.train.train` that records how a model's heads form.

    ``task``: a task whose ``sources["induction"]`` marks the repeated targets
    (:class:`~mhalab.tasks.RepeatedSegments`).
    ``every``: record every this many steps (train reads it; step 0 and the last step are always recorded).
    ``batch_size`` sequences are drawn once from a held-out stream (``seed``); example 0 of them is the fixed
    example whose patterns are kept. ``icl_window``: how many positions at each end of the context the
    in-context-learning score compares (Olsson et al. 2022: loss late in the context minus loss early).

    After training: ``steps`` ``[K]``, :meth:`loss` (``"loss"``, ``"repeated"``, ``"fresh"``, ``"icl"``: ``[K]``),
    :meth:`score` (``"induction"``, ``"previous-token"``: ``[K, N, H]``), ``patterns`` ``[K, N, H, T, T]``.
    """

    def __init__(self, task: Any, *, every: int = 50, batch_size: int = 128, seed: int = EVAL_SEED,
                 icl_window: int | None = None) -> None:
        if not isinstance(getattr(task, "relations", None), tuple) or "induction" not in task.relations:
            raise TypeError(f"FormationRecorder needs a task whose batches mark the repeated targets "
                            f"(sources['induction']), such as mhalab.tasks.RepeatedSegments; got {task!r}")
        self.task = task
        self.every = validate_int("every", every, 1)
        validate_int("batch_size", batch_size, 1)
        window = max(1, task.seq_len // 6) if icl_window is None else icl_window
        self.icl_window = validate_int("icl_window", window, 1, maximum=(task.seq_len - 1) // 2,
                                    why=f" (two windows must fit in the {task.seq_len - 1} targets)")
        generator = torch.Generator().manual_seed(stream_seed(seed, "formation"))
        self.batch = task.sample(batch_size, generator=generator)  # on the CPU; moved to the model's device
        self.example = self.batch.inputs[0]  # [T]: the sequence whose patterns are kept
        self.steps: list[int] = []
        self._losses: dict[str, list[float]] = {name: [] for name in LOSSES}
        self._scores: dict[str, list[Tensor]] = {name: [] for name in SCORES}
        self._patterns: list[Tensor] = []

    @torch.no_grad()
    def __call__(self, step: int, model: nn.Module) -> None:
        """Record ``model`` at ``step``: one forward pass over the fixed batch, in eval mode."""
        device = next(model.parameters()).device
        tokens = self.batch.inputs.to(device)
        with eval_mode(model):
            logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_pattern"))
        attention = stack_attention(cache).float().cpu()  # [N, B, H, T, T]
        targets = self.batch.targets
        nll = F.cross_entropy(logits.float().cpu().flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                              reduction="none").view(targets.shape)  # [B, T]
        valid = targets != IGNORE
        repeated = self.batch.sources["induction"] >= 0  # [B, T]
        w = self.icl_window
        last = int(valid.sum(dim=1).min())  # targets at queries 0 .. last - 1 (the last position has none)
        values = {"loss": nll[valid].mean(), "repeated": nll[repeated].mean(), "fresh": nll[valid & ~repeated].mean(),
                  "icl": nll[:, last - w : last].mean() - nll[:, :w].mean()}
        self.steps.append(int(step))
        for name in LOSSES:
            self._losses[name].append(float(values[name]))
        self._scores["induction"].append(induction_score(attention, self.batch.inputs))  # [N, H]
        self._scores["previous-token"].append(previous_token_score(attention))  # [N, H]
        self._patterns.append(attention[:, 0].clone())  # [N, H, T, T]: the fixed example

    # ------------------------------------------------------------------ reading
    def _validate_recorded(self) -> None:
        if not self.steps:
            raise ValueError("nothing recorded yet: pass the recorder to train(model, task, callback=recorder, ...)")

    def loss(self, name: str) -> Tensor:
        """``[K]``: one of :data:`LOSSES` at every recorded step."""
        if name not in LOSSES:
            raise KeyError(f"no loss {name!r}; the recorder keeps {LOSSES}")
        self._validate_recorded()
        return torch.tensor(self._losses[name])

    def score(self, name: str) -> Tensor:
        """``[K, N, H]``: one of :data:`SCORES` for every head at every recorded step."""
        if name not in SCORES:
            raise KeyError(f"no score {name!r}; the recorder keeps {SCORES}")
        self._validate_recorded()
        return torch.stack(self._scores[name])

    @property
    def patterns(self) -> Tensor:
        """``[K, N, H, T, T]``: every head's attention on the fixed example at every recorded step."""
        self._validate_recorded()
        return torch.stack(self._patterns)

    def best_head(self, name: str = "induction", *, layers: Sequence[int] | None = None) -> tuple[int, int]:
        """``(layer, head)`` with the highest final ``name`` score (only in ``layers``, if given)."""
        final = self.score(name)[-1].clone()  # [N, H]
        if layers is not None:
            keep = torch.zeros(final.size(0), dtype=torch.bool)
            keep[list(layers)] = True
            final[~keep] = -1.0
        layer, head = divmod(int(final.argmax()), final.size(1))
        return layer, head

    def first_step(self, values: Tensor, threshold: float, *, below: bool = False) -> int | None:
        """The first recorded step at which ``values`` ``[K]`` reach ``threshold`` (fall to it with
        ``below``) and stay there to the end; None if they never do."""
        if values.shape != (len(self.steps),):
            raise ValueError(f"values must hold one number per recorded step, [{len(self.steps)}], "
                             f"got {tuple(values.shape)}")
        reached = values <= threshold if below else values >= threshold  # [K]
        for k in range(len(self.steps)):
            if bool(reached[k:].all()):
                return self.steps[k]
        return None

    def __repr__(self) -> str:
        done = f"{len(self.steps)} steps recorded" + (f" (0..{self.steps[-1]})" if self.steps else "")
        return f"<FormationRecorder every {self.every} on {self.task!r}: {done}>"
