"""Relations by position: predict the tokens at fixed offsets (one head per offset would do)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..arguments import validate_distinct_ints, validate_int
from .base import IGNORE, Batch, Task, _letter


class MultiRelationTask(Task):
    """At every position i, predict the tokens at several fixed relative offsets at once: targets
    ``[B, T, R]``, target r is the token at ``i + offsets[r]`` (relations ``left2, left1, right1, right2``).

    Each answer needs attention peaked at its own position, so one head must blend the roles; and a
    ``d_k = 1`` head's score ``q_i * k_j`` is monotone in ``k_j``, so it cannot peak at a relative offset
    (``d_k = 2`` can, by rotation). Bidirectional by default: a causal mask lets ``d_k = 1`` reach offset -1.
    """

    name = "multi-relation"
    _repr_fields = ("offsets", "vocab_size", "seq_len", "causal")

    def __init__(self, offsets: tuple[int, ...] = (-2, -1, 1, 2), *, vocab_size: int = 16, seq_len: int = 16,
                 causal: bool = False) -> None:
        self.vocab_size = validate_int("vocab_size", vocab_size, 2)
        self.seq_len = validate_int("seq_len", seq_len, 2)
        offsets = tuple(validate_distinct_ints("offsets", offsets))  # one relation each
        for o in offsets:
            if o == 0:
                raise ValueError("offset 0 is the query's own token, which needs no attention; use non-zero offsets")
            if abs(o) >= seq_len:
                raise ValueError(f"offset {o} never fits in a sequence of seq_len={seq_len}: "
                                 "use |offset| < seq_len (or a longer seq_len)")
        if causal and any(o > 0 for o in offsets):
            raise ValueError(f"a causal model cannot see later tokens, so offsets {tuple(o for o in offsets if o > 0)} "
                             "are impossible with causal=True; use negative offsets or causal=False")
        self.offsets = offsets
        self.causal = bool(causal)
        self.n_targets = len(offsets)
        self.relations = tuple(f"left{-o}" if o < 0 else f"right{o}" for o in offsets)
        # (source, gather index, outside), each [T, R], built once per device: building them copies
        # `offsets` from the host, which on a GPU would wait for all queued work at every step.
        self._index_cache: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Batch:
        B, T = batch_size, self.seq_len
        inputs = torch.randint(0, self.vocab_size, (B, T), generator=generator, device=device)  # [B, T]
        if device not in self._index_cache:
            source = torch.arange(T)[:, None] + torch.tensor(self.offsets)[None, :]  # [T, R]: where relation r points
            outside = (source < 0) | (source >= T)  # [T, R]: off the edge of the sequence
            parts = (source.masked_fill(outside, -1), source.clamp(0, T - 1), outside)
            self._index_cache[device] = tuple(t.to(device) for t in parts)
        source, gather_index, outside = self._index_cache[device]  # each [T, R]
        targets = inputs[:, gather_index].masked_fill(outside, IGNORE)  # [B, T, R]: token at i + offset_r
        sources = {name: source[:, r].expand(B, T).contiguous() for r, name in enumerate(self.relations)}  # each [B, T]
        return Batch(inputs, targets, sources)

    def token_labels(self, tokens_1d: Tensor) -> list[str]:
        return [_letter(int(t), self.vocab_size) for t in tokens_1d]
