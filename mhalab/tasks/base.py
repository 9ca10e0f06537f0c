"""What every task is: a :class:`Task` draws seeded batches (:class:`Batch`); ``IGNORE`` marks "nothing to predict"."""

from __future__ import annotations

import string
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor

from ..arguments import validate_int

IGNORE = -100  # target value meaning "nothing to predict here" (cross_entropy's ignore_index)


@dataclass
class Batch:
    """One batch of a task: ``inputs`` ``[B, T]`` token ids; ``targets`` ``[B, T]`` or ``[B, T, R]``
    (:data:`IGNORE` where there is nothing to predict); ``sources``: relation -> ``[B, T]`` position
    each query's relation points to (-1: nowhere)."""

    inputs: Tensor
    targets: Tensor
    sources: dict[str, Tensor]

    def to(self, device: torch.device | str) -> Batch:
        """A copy on ``device`` (training draws its batches on the CPU and copies them over with this)."""
        tensors = {f.name: getattr(self, f.name).to(device) for f in fields(self) if f.name != "sources"}
        return type(self)(**tensors, sources={k: v.to(device) for k, v in self.sources.items()})


class Task:
    """Base class: batches plus their loss and metrics. Subclasses implement :meth:`_generate`; target ``r``
    is relation ``relations[r]``, or, with one target, ``target_relation``."""

    name: str = "task"
    vocab_size: int
    seq_len: int
    n_targets: int = 1
    relations: tuple[str, ...] = ()
    causal: bool = False
    target_relation: str | None = None
    _repr_fields = ("name", "vocab_size", "seq_len", "n_targets", "relations", "causal")

    def sample(self, batch_size: int, *, generator: torch.Generator, device: torch.device | str | None = None) -> Batch:
        """``batch_size`` sequences drawn with ``generator``, which must live on ``device`` (no host copy)."""
        validate_int("batch_size", batch_size, 1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, e.g. torch.Generator(device=device).manual_seed(0), "
                            f"got {type(generator).__name__}")
        device = generator.device if device is None else torch.device(device)
        if device.type != generator.device.type:
            raise ValueError(f"the generator lives on {generator.device} but the batch was asked for on {device}: make "
                             f"the generator with torch.Generator(device='{device}') so sampling happens on the device")
        return self._generate(batch_size, generator, device)

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Batch:
        raise NotImplementedError

    def _validate_logits(self, logits: Tensor, batch: Batch) -> None:
        B, T = batch.inputs.shape
        want = (B, T, self.vocab_size) if self.n_targets == 1 else (B, T, self.n_targets, self.vocab_size)
        if tuple(logits.shape) != want:
            layout = "[B, T, V]" if self.n_targets == 1 else "[B, T, n_targets, V]"
            raise ValueError(
                f"{self.name}: logits must have shape {layout} = {list(want)}, got {list(logits.shape)} "
                f"(build the model with ModelConfig.for_task(task) so n_targets={self.n_targets} "
                f"and vocab_size={self.vocab_size} match)"
            )

    def loss(self, logits: Tensor, batch: Batch) -> Tensor:
        """Scalar: mean cross-entropy over all positions (and relations) that have a target."""
        self._validate_logits(logits, batch)
        flat = logits.reshape(-1, self.vocab_size).float()  # [B*T*R, V]
        return F.cross_entropy(flat, batch.targets.reshape(-1), ignore_index=IGNORE)  # targets [B*T*R]

    @torch.no_grad()
    def correct(self, logits: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        """``(correct, valid)``, each ``[B, T, R]``: where the top logit is the target, and where there is one."""
        self._validate_logits(logits, batch)
        targets = batch.targets.reshape(*batch.inputs.shape, self.n_targets)  # [B, T R] -> [B, T, R]
        valid = targets != IGNORE
        return (logits.argmax(-1).reshape(targets.shape) == targets) & valid, valid

    @torch.no_grad()
    def metrics(self, logits: Tensor, batch: Batch) -> dict[str, float]:
        """``{"loss", "accuracy", "accuracy/<relation>"...}``; accuracies are over positions with a target."""
        correct, valid = self.correct(logits, batch)  # each [B, T, R]
        out = {"loss": float(self.loss(logits, batch)), "accuracy": float(correct.sum() / valid.sum().clamp(min=1))}
        names = self.relations if self.n_targets > 1 else (self.target_relation,)
        for r, name in enumerate(names):
            if name is not None:
                out[f"accuracy/{name}"] = float(correct[..., r].sum() / valid[..., r].sum().clamp(min=1))
        return out

    def token_labels(self, tokens_1d: Tensor) -> list[str]:
        """One short string per token, for heat-map axes."""
        return [str(int(t)) for t in tokens_1d]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self._repr_fields)})"


def _letter(token: int, n_symbols: int) -> str:
    """``token`` as a letter ``a, b, ...`` when there are at most 26 symbols, else as a number."""
    return string.ascii_lowercase[token] if n_symbols <= 26 else str(token)
