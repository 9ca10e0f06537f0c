"""Synthetic sequence tasks whose answers come from known positions, so we can tell which head learned what.

Batches are drawn from a seeded generator on its device, and ``Batch.sources`` records, for each
relation and query position, the position it points to: the ground truth heads are scored against.
Shapes: ``B`` batch, ``T`` sequence length, ``R`` targets per position, ``V`` vocabulary.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor

from .arguments import check_distinct_ints, check_int

__all__ = ["Batch", "Task", "MultiRelationTask", "KeyValueRecall", "TableLookup", "RepeatedSegments", "Seq2SeqBatch",
           "Seq2SeqTask", "IGNORE"]

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
        check_int("batch_size", batch_size, 1)
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

    def _check_logits(self, logits: Tensor, batch: Batch) -> None:
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
        self._check_logits(logits, batch)
        flat = logits.reshape(-1, self.vocab_size).float()  # [B*T*R, V]
        return F.cross_entropy(flat, batch.targets.reshape(-1), ignore_index=IGNORE)  # targets [B*T*R]

    @torch.no_grad()
    def metrics(self, logits: Tensor, batch: Batch) -> dict[str, float]:
        """``{"loss", "accuracy", "accuracy/<relation>"...}``; accuracies are over positions with a target."""
        self._check_logits(logits, batch)
        targets = batch.targets.reshape(*batch.inputs.shape, self.n_targets)  # [B, T, R]
        valid = targets != IGNORE
        correct = (logits.argmax(-1).reshape(targets.shape) == targets) & valid  # [B, T, R]
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
        self.vocab_size = check_int("vocab_size", vocab_size, 2)
        self.seq_len = check_int("seq_len", seq_len, 2)
        offsets = tuple(check_distinct_ints("offsets", offsets))  # one relation each
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


class KeyValueRecall(Task):
    """``n_pairs`` pairs ``k1 v1 k2 v2 ...`` (distinct keys), then ``n_queries`` stored keys; the target at a
    query is the value stored under it. Relations at query positions: ``key`` (where the key was stored,
    found only by matching contents) and ``value`` (right after it: the answer). Token ids: keys
    ``0..n_keys-1``, values ``n_keys..n_keys+n_values-1``.

    ``slots=True``: only the keys are stored, ``k1 k2 ... k_P``, and the value of a key is its slot: the
    target at a query asking pair j is token ``n_keys + j`` (so ``n_values`` is ``n_pairs``). One attention
    layer can then answer by matching contents alone (``key`` and ``value`` both point at slot j); with the
    two-token pairs a model first needs a layer that moves each key onto its value.
    """

    name = "key-value recall"
    target_relation = "value"
    _repr_fields = ("n_pairs", "n_keys", "n_values", "n_queries", "causal", "slots")

    def __init__(self, n_pairs: int = 8, *, n_keys: int = 16, n_values: int | None = None, n_queries: int = 4,
                 causal: bool = True, slots: bool = False) -> None:
        self.n_pairs = check_int("n_pairs", n_pairs, 1)
        self.n_keys = check_int("n_keys", n_keys, n_pairs,
                                why=f" (the {n_pairs} keys in one sequence are distinct, so n_keys >= n_pairs)")
        if not isinstance(slots, bool):
            raise TypeError(f"slots must be True or False, got {slots!r}")
        if slots and n_values not in (None, n_pairs):
            raise ValueError(f"with slots=True the values are the {n_pairs} slots, so n_values is n_pairs; "
                             f"got n_values={n_values} (leave it out)")
        self.slots = slots
        values = n_pairs if slots else 16 if n_values is None else n_values
        self.n_values = check_int("n_values", values, 1 if slots else 2)
        self.n_queries = check_int("n_queries", n_queries, 1)
        self.causal = bool(causal)
        self.vocab_size = self.n_keys + self.n_values
        self.seq_len = (1 if slots else 2) * n_pairs + n_queries
        self.relations = ("key", "value")

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Batch:
        B, P, Q, T = batch_size, self.n_pairs, self.n_queries, self.seq_len
        # Distinct keys per sequence: the first P of a random permutation of the key alphabet.
        keys = torch.rand(B, self.n_keys, generator=generator, device=device).argsort(dim=-1)[:, :P]  # [B, P]
        values = torch.randint(0, self.n_values, (B, P), generator=generator, device=device) + self.n_keys  # [B, P]
        asked = torch.randint(0, P, (B, Q), generator=generator, device=device)  # [B, Q]: which pair each query asks
        if self.slots:  # only the keys are stored; the value of pair j is j itself
            values = torch.arange(P, device=device).expand(B, P) + self.n_keys
            stored = keys  # [B, P]
        else:
            stored = torch.stack([keys, values], dim=-1).reshape(B, 2 * P)  # [B, P, 2] -> [B, 2P]: k1 v1 k2 v2 ...
        first = stored.shape[1]  # where the queries start
        inputs = torch.cat([stored, keys.gather(1, asked)], dim=1)  # [B, T]
        targets = torch.full((B, T), IGNORE, dtype=torch.long, device=device)
        targets[:, first:] = values.gather(1, asked)  # [B, Q]: the value stored under each asked key
        key_pos = torch.full((B, T), -1, dtype=torch.long, device=device)
        key_pos[:, first:] = asked if self.slots else 2 * asked  # pair j's key sits at j (slots) or 2j
        value_pos = key_pos if self.slots else torch.where(key_pos >= 0, key_pos + 1, key_pos)  # its value: right after
        return Batch(inputs, targets, {"key": key_pos, "value": value_pos})

    def token_labels(self, tokens_1d: Tensor) -> list[str]:
        value = "slot" if self.slots else "v"
        return [f"K{t}" if t < self.n_keys else f"{value}{t - self.n_keys}" for t in map(int, tokens_1d)]


class TableLookup(Task):
    """``n_tables`` tables of ``n_entries`` entries, then ``n_queries`` keys; at a query, target r is the value
    the asked key has in table r (relation ``table<r>``), so one query needs ``n_tables`` lookups at once.

    Every table holds the same distinct keys (from ``n_keys``) in its own order, each with its own value (from
    ``n_values``). An entry is one token, ``key * n_values + value``, so one attention layer can find it by
    content; queries are tokens ``n_keys * n_values + key``. Tables sit in order at positions ``0..D*P-1``.

    With ``shift`` s > 0, table r holds every key moved by r*s (mod ``n_keys``) instead, and target r at a query
    for key k is the value of key ``(k + r*s) mod n_keys`` in table r: the tables' lookups need different keys,
    so no one attention pattern (a content term plus a position term) serves them all. ``shift=0`` draws exactly
    the unshifted task's sequences.
    """

    name = "table lookup"
    _repr_fields = ("n_tables", "n_entries", "n_keys", "n_values", "n_queries", "shift")

    def __init__(self, n_tables: int = 4, n_entries: int = 4, *, n_keys: int = 64, n_values: int = 8,
                 n_queries: int = 4, shift: int = 0) -> None:
        self.n_tables = check_int("n_tables", n_tables, 1)
        self.n_entries = check_int("n_entries", n_entries, 1)
        self.n_keys = check_int("n_keys", n_keys, n_entries,
                                why=f" (the {n_entries} keys of a table are distinct, so n_keys >= n_entries)")
        self.n_values = check_int("n_values", n_values, 2)
        self.n_queries = check_int("n_queries", n_queries, 1)
        self.shift = check_int("shift", shift, 0, why=" (table r holds the keys moved by r * shift; 0 = unmoved)")
        self.n_targets = n_tables
        self.relations = tuple(f"table{r}" for r in range(n_tables))
        self.vocab_size = n_keys * n_values + n_keys
        self.seq_len = n_tables * n_entries + n_queries

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Batch:
        B, D, P, Q, T = batch_size, self.n_tables, self.n_entries, self.n_queries, self.seq_len
        keys = torch.rand(B, self.n_keys, generator=generator, device=device).argsort(-1)[:, :P]  # [B, P] distinct
        values = torch.randint(0, self.n_values, (B, D, P), generator=generator, device=device)  # [B, D, P]
        order = torch.rand(B, D, P, generator=generator, device=device).argsort(-1)  # [B, D, P]: each table's order
        moved = torch.arange(D, device=device)[None, :, None] * self.shift  # [1, D, 1]: table r moves keys by r*s
        table_keys = (keys[:, None, :] + moved) % self.n_keys  # [B, D, P]: table r's j-th key
        stored_keys = table_keys.gather(2, order)  # [B, D, P]
        entries = (stored_keys * self.n_values + values.gather(2, order)).reshape(B, D * P)  # [B, D*P]
        asked = torch.randint(0, P, (B, Q), generator=generator, device=device)  # [B, Q]: which key each query asks
        inputs = torch.cat([entries, keys.gather(1, asked) + self.n_keys * self.n_values], dim=1)  # [B, T]
        targets = torch.full((B, T, D), IGNORE, dtype=torch.long, device=device)
        targets[:, D * P:] = values.gather(2, asked[:, None, :].expand(B, D, Q)).transpose(1, 2)  # [B, Q, D]
        slot = order.argsort(-1)  # [B, D, P]: where key j sits in table r
        sources = {}
        for r, name in enumerate(self.relations):
            where = torch.full((B, T), -1, dtype=torch.long, device=device)
            where[:, D * P:] = r * P + slot[:, r].gather(1, asked)
            sources[name] = where
        return Batch(inputs, targets, sources)

    def factored_code(self, d_model: int) -> tuple[Tensor, Tensor]:
        """A fixed embedding in which key, value and table each have dimensions of their own (one-hot): an
        entry's row is its key's unit vector plus its value's, a query's its key's alone, and an entry's position
        row its table's (queries' positions: zero). Give it to a model with :meth:`Transformer.fix_embedding`
        (or ``sweep_heads(embedding=...)``): then only the heads, MLP and readout train.

        Returns ``(tokens [vocab_size, d_model], positions [seq_len, d_model])``; dimensions after
        ``n_keys + n_values + n_tables`` stay zero."""
        K, V, D, P = self.n_keys, self.n_values, self.n_tables, self.n_entries
        check_int("d_model", d_model, K + V + D,
                  why=f" (the code gives {K} keys, {V} values and {D} tables a dimension each: {K + V + D})")
        tokens = torch.zeros(self.vocab_size, d_model)
        key_of_entry = torch.arange(K * V) // V  # entry token = key * V + value
        tokens[torch.arange(K * V), key_of_entry] = 1.0
        tokens[torch.arange(K * V), K + torch.arange(K * V) % V] = 1.0
        tokens[K * V + torch.arange(K), torch.arange(K)] = 1.0  # query token for key k
        positions = torch.zeros(self.seq_len, d_model)
        positions[torch.arange(D * P), K + V + torch.arange(D * P) // P] = 1.0  # table r fills positions r*P..
        return tokens, positions


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
        self.vocab_size = check_int("vocab_size", vocab_size, 2)
        self.seq_len = check_int("seq_len", seq_len, 4)
        self.n_segments = check_int("n_segments", n_segments, 1)
        if not (isinstance(segment_lengths, (tuple, list)) and len(segment_lengths) == 2):
            raise TypeError(f"segment_lengths must be (shortest, longest), e.g. (6, 12), got {segment_lengths!r}")
        low = check_int("the shortest segment length", segment_lengths[0], 2,
                        why=" (a segment of one token repeated predicts nothing)")
        high = check_int("the longest segment length", segment_lengths[1], low, why=f" (the shortest is {low})")
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
        self.n_symbols = check_int("n_symbols", n_symbols, 2)
        self.seq_len = check_int("seq_len", seq_len, 2)
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
