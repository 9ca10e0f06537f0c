"""Repeated segments: the task on which induction heads form."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..arguments import validate_int
from .base import IGNORE, Batch, Task


class RepeatedSegments(Task):
    """Random tokens in which ``n_segments`` segments (each of a random length in ``segment_lengths``) are
    repeated right after themselves, at random places: ``... a b c d a b c d ... e f g e f g ...``. Causal
    next-token prediction: target at i is the token at i + 1 (none at the last position).

    Only the repeats are predictable, and only by looking back: at a token of a second copy, find where it
    occurred before and read the token that followed (an induction head, Olsson et al. 2022). Relation
    ``induction`` points each query whose next token is a repeat at that earlier follower (-1 elsewhere);
    :meth:`metrics` adds the loss on those targets (``loss/repeated``) and on all others (``loss/fresh``).
    """

    name = "repeated segments"
    causal = True
    relations = ("induction",)
    _repr_fields = ("vocab_size", "seq_len", "n_segments", "segment_lengths")

    def __init__(self, vocab_size: int = 64, seq_len: int = 48, *, n_segments: int = 2,
                 segment_lengths: tuple[int, int] = (6, 12)) -> None:
        self.vocab_size = validate_int("vocab_size", vocab_size, 2)
        self.seq_len = validate_int("seq_len", seq_len, 4)
        self.n_segments = validate_int("n_segments", n_segments, 1)
        if not (isinstance(segment_lengths, (tuple, list)) and len(segment_lengths) == 2):
            raise TypeError(f"segment_lengths must be (shortest, longest), e.g. (6, 12), got {segment_lengths!r}")
        low = validate_int("the shortest segment length", segment_lengths[0], 2,
                        why=" (a segment of one token repeated predicts nothing)")
        high = validate_int("the longest segment length", segment_lengths[1], low, why=f" (the shortest is {low})")
        if 2 * n_segments * high > seq_len:
            raise ValueError(f"{n_segments} segments of up to {high} tokens, each written twice, need "
                             f"{2 * n_segments * high} positions but seq_len={seq_len}: use seq_len >= "
                             f"{2 * n_segments * high}, fewer segments, or shorter ones")
        self.segment_lengths = (low, high)

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Batch:
        B, T, n = batch_size, self.seq_len, self.n_segments
        low, high = self.segment_lengths
        lengths = torch.randint(low, high + 1, (B, n), generator=generator, device=device)  # [B, n]
        filler = T - 2 * lengths.sum(dim=1, keepdim=True)  # [B, 1]: fresh tokens around the segments
        # n + 1 gaps that add up to the filler: cut [0, filler] at n sorted random points.
        cuts = (torch.rand(B, n, generator=generator, device=device) * (filler + 1)).floor().long().sort(dim=1).values
        edges = torch.cat([torch.zeros_like(filler), cuts, filler], dim=1)  # [B, n + 2]
        gaps = edges.diff(dim=1)  # [B, n + 1]
        # segment k's first copy starts after every earlier gap and segment (twice) and its own gap
        starts = gaps[:, :n].cumsum(dim=1) + 2 * (lengths.cumsum(dim=1) - lengths)  # [B, n]
        position = torch.arange(T, device=device)  # [T]
        offset = torch.zeros(B, T, dtype=torch.long, device=device)  # [B, T]: how far back a copied token's original is
        for k in range(n):
            second = starts[:, k : k + 1] + lengths[:, k : k + 1]  # [B, 1]: where the second copy starts
            inside = (position >= second) & (position < second + lengths[:, k : k + 1])  # [B, T]
            offset += inside * lengths[:, k : k + 1]
        tokens = torch.randint(0, self.vocab_size, (B, T), generator=generator, device=device)  # [B, T]
        # originals are never copies themselves, so one gather writes every second copy
        inputs = torch.where(offset > 0, tokens.gather(1, position - offset), tokens)  # [B, T]
        targets = torch.cat([inputs[:, 1:], torch.full((B, 1), IGNORE, dtype=torch.long, device=device)], dim=1)
        # the next token is a repeat when it and this one lie in the same second copy
        repeat_next = torch.zeros(B, T, dtype=torch.bool, device=device)
        repeat_next[:, :-1] = (offset[:, :-1] > 0) & (offset[:, 1:] > 0)
        induction = torch.where(repeat_next, position - offset + 1, -1)  # [B, T]: the follower of the earlier copy
        return Batch(inputs, targets, {"induction": induction})

    @torch.no_grad()
    def metrics(self, logits: Tensor, batch: Batch) -> dict[str, float]:
        """The :class:`Task` metrics plus ``loss/repeated`` (targets only induction can predict) and
        ``loss/fresh`` (every other target: random, so at best ``ln vocab_size``)."""
        out = super().metrics(logits, batch)
        losses = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE,
                                 reduction="none").view(batch.targets.shape)  # [B, T]
        repeated = batch.sources["induction"] >= 0  # [B, T]
        fresh = (batch.targets != IGNORE) & ~repeated
        for name, where in (("repeated", repeated), ("fresh", fresh)):
            out[f"loss/{name}"] = float(losses[where].mean()) if bool(where.any()) else float("nan")
        return out
