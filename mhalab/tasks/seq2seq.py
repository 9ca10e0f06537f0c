"""Sequence-to-sequence tasks for the encoder-decoder (cross-attention)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..arguments import validate_int
from .base import Batch, Task, _letter


@dataclass
class Seq2SeqBatch(Batch):
    """A :class:`Batch` for an encoder-decoder, plus ``decoder_inputs`` ``[B, T]`` (BOS + targets[:, :-1],
    teacher forcing); ``sources`` point from decoder positions into the source (cross-attention's truth)."""

    decoder_inputs: Tensor


class Seq2SeqTask(Task):
    """Copy or reverse ``seq_len`` random symbols, for an encoder-decoder (:class:`Seq2SeqBatch`).

    Token ids: symbols ``0..n_symbols-1``, BOS ``n_symbols`` (``bos_id``). The relation (``"mirror"`` for
    reverse, ``"same"`` for copy) points each decoder position t at source position ``T-1-t`` or ``t``.
    """

    causal = False
    MODES = {"reverse": "mirror", "copy": "same"}
    _repr_fields = ("mode", "n_symbols", "seq_len")

    def __init__(self, mode: str = "reverse", *, n_symbols: int = 10, seq_len: int = 8) -> None:
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {tuple(self.MODES)}, got {mode!r}")
        self.mode = self.name = mode
        self.n_symbols = validate_int("n_symbols", n_symbols, 2)
        self.seq_len = validate_int("seq_len", seq_len, 2)
        self.bos_id = n_symbols
        self.vocab_size = n_symbols + 1
        self.target_relation = self.MODES[mode]
        self.relations = (self.target_relation,)

    def source_positions(self, device: torch.device | str | None = None) -> Tensor:
        """``[T]``: for each decoder position, the source position it must read (the ground truth)."""
        positions = torch.arange(self.seq_len, device=device)
        return positions.flip(0) if self.mode == "reverse" else positions

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Seq2SeqBatch:
        B, T = batch_size, self.seq_len
        source = torch.randint(0, self.n_symbols, (B, T), generator=generator, device=device)  # [B, T]
        where = self.source_positions(device)  # [T]
        targets = source[:, where]  # [B, T]: the symbol each decoder position must output
        bos = torch.full((B, 1), self.bos_id, dtype=torch.long, device=device)
        decoder_inputs = torch.cat([bos, targets[:, :-1]], dim=1)  # [B, T]: shifted right, BOS first
        sources = {self.target_relation: where.expand(B, T).contiguous()}  # [B, T]
        return Seq2SeqBatch(source, targets, sources, decoder_inputs)

    def token_labels(self, tokens_1d: Tensor) -> list[str]:
        return ["<s>" if int(t) == self.bos_id else _letter(int(t), self.n_symbols) for t in tokens_1d]
