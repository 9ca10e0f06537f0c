"""Synthetic sequence tasks whose answers come from known positions, so we can tell which head learned what.

Every task here draws random sequences from a seed, directly on the training device (no host-to-device
copy per step), and records, for every query position, *which position* each relation points to
(``Batch.sources``). That ground truth is what later notebooks score heads against.

Three tasks:

* :class:`MultiRelationTask`: at every position, predict several tokens at once, each sitting at its own
  fixed relative offset (the token two to the left, one to the left, one to the right, ...). Each
  prediction needs attention *peaked at a different position*, and bound to its own role. That is the
  trade the course is about: one head has one weighting per query and must blend the roles together;
  a head with ``d_k = 1`` cannot put its peak at a relative offset at all (see the class docstring).
* :class:`KeyValueRecall`: a list of key/value pairs, then queries; the answer to a query is the value
  stored under the same key. Here the head must *match contents*: the query's key against every stored
  key. Telling many keys apart takes several dimensions per head.
* :class:`Seq2SeqTask` (added for notebook 06): copy or reverse a sequence, for an encoder-decoder. Its
  batches (:class:`Seq2SeqBatch`) also carry the decoder's input, and ``sources`` point from each decoder
  position into the source: the ground truth for cross-attention.

Shapes: ``B`` batch, ``T`` sequence length, ``R`` number of targets per position, ``V`` vocabulary.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_int

__all__ = ["Batch", "Task", "MultiRelationTask", "KeyValueRecall", "Seq2SeqBatch", "Seq2SeqTask", "IGNORE"]

IGNORE = -100  # target value meaning "nothing to predict here" (cross_entropy's ignore_index)


@dataclass
class Batch:
    """One batch of a task.

    Attributes:
        inputs: ``[B, T]`` long token ids.
        targets: ``[B, T]`` (one target per position) or ``[B, T, R]`` (one per relation), long;
            ``-100`` (:data:`IGNORE`) where there is nothing to predict.
        sources: relation name -> ``[B, T]`` long: for each query position, the position that relation
            points to (``-1`` where it points nowhere). Ground truth for scoring attention heads.
    """

    inputs: Tensor
    targets: Tensor
    sources: dict[str, Tensor]

    def to(self, device: torch.device | str) -> "Batch":
        """A copy on ``device`` (only for analysis; training samples on the device directly)."""
        return Batch(self.inputs.to(device), self.targets.to(device), {k: v.to(device) for k, v in self.sources.items()})


class Task:
    """Base class: a generator of batches plus the loss and metrics that go with them.

    Subclasses set ``name``, ``vocab_size``, ``seq_len``, ``n_targets``, ``relations``, ``causal`` and
    implement :meth:`_generate`. ``relations[r]`` names target ``r`` when ``n_targets > 1``; a
    single-target task names the relation its target is read from in ``target_relation``.
    """

    name: str = "task"
    vocab_size: int
    seq_len: int
    n_targets: int = 1
    relations: tuple[str, ...] = ()
    causal: bool = False
    target_relation: str | None = None  # single-target tasks: the relation whose token is the answer

    # ------------------------------------------------------------ sampling
    def sample(self, batch_size: int, *, generator: torch.Generator, device: torch.device | str | None = None) -> Batch:
        """Draw ``batch_size`` sequences with ``generator`` directly on ``device``.

        ``generator`` must live on ``device`` (``torch.Generator(device=device).manual_seed(s)``), so
        that no random numbers are made on the host and copied over at every step.
        """
        check_int("batch_size", batch_size, 1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, e.g. torch.Generator(device=device).manual_seed(0), "
                f"got {type(generator).__name__}"
            )
        device = generator.device if device is None else torch.device(device)
        if device.type != generator.device.type:
            raise ValueError(
                f"the generator lives on {generator.device} but the batch was asked for on {device}: "
                f"make the generator with torch.Generator(device='{device}') so sampling happens on the device"
            )
        return self._generate(batch_size, generator, device)

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Batch:
        raise NotImplementedError

    # ---------------------------------------------------- loss and metrics
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
        return F.cross_entropy(
            logits.reshape(-1, self.vocab_size).float(),  # [B*T*R, V]
            batch.targets.reshape(-1),  # [B*T*R]
            ignore_index=IGNORE,
        )

    @torch.no_grad()
    def metrics(self, logits: Tensor, batch: Batch) -> dict[str, float]:
        """``{"loss", "accuracy", "accuracy/<relation>"...}``; accuracies are over positions with a target."""
        self._check_logits(logits, batch)
        targets = batch.targets if self.n_targets > 1 else batch.targets.unsqueeze(-1)  # [B, T, R]
        predicted = logits.argmax(-1) if self.n_targets > 1 else logits.argmax(-1).unsqueeze(-1)  # [B, T, R]
        valid = targets != IGNORE
        correct = (predicted == targets) & valid
        out = {
            "loss": float(self.loss(logits, batch)),
            "accuracy": float(correct.sum() / valid.sum().clamp(min=1)),
        }
        names = self.relations if self.n_targets > 1 else (self.target_relation,)
        for r, name in enumerate(names):
            if name is not None:
                out[f"accuracy/{name}"] = float(correct[..., r].sum() / valid[..., r].sum().clamp(min=1))
        return out

    def token_labels(self, tokens_1d: Tensor) -> list[str]:
        """One short string per token, for heat-map axes."""
        return [str(int(t)) for t in tokens_1d]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, seq_len={self.seq_len}, "
            f"n_targets={self.n_targets}, relations={self.relations}, causal={self.causal})"
        )


def offset_name(offset: int) -> str:
    """``-2 -> "left2"``, ``1 -> "right1"``: the relation name used for a relative offset."""
    return f"left{-offset}" if offset < 0 else f"right{offset}"


class MultiRelationTask(Task):
    """Predict, at every position i, the tokens at several fixed relative offsets at once.

    Input: ``seq_len`` tokens drawn uniformly from ``vocab_size`` symbols. Targets ``[B, T, R]``: target
    ``r`` at position i is the token at ``i + offsets[r]`` (``-100`` where that falls off the sequence).
    With the default ``offsets=(-2, -1, 1, 2)`` the relations are ``left2, left1, right1, right2``:
    position i must report its two neighbours on each side, each in its own slot.

    Relations (``sources[name][b, i] = i + offset``, or -1 off the edge): each one is a fixed relative
    offset, the same for every query and every sequence, independent of content.

    Why it exercises heads:

    * **Several roles at once.** The four answers sit at four different positions. One head gives each
      query *one* weighting over the keys; if it spreads it over the four neighbours, what reaches the
      query is a weighted sum of four value vectors, a bag in which "which token came from where" is
      lost. So a single head can get one relation right and must guess the rest (or blend and get all
      of them roughly wrong). Several heads can each take one offset.
    * **Relative offsets need width.** A head with ``d_k = 1`` scores key j for query i as
      ``q_i * k_j`` with scalars ``q_i, k_j``: for a fixed query that is *monotone in k_j*, so its
      weights peak at the key with the largest ``k_j`` (when ``q_i > 0``) or the smallest (``q_i < 0``).
      Those two positions are the same for every query, so a ``d_k = 1`` head cannot look "one to the
      left of wherever I am". ``d_k = 2`` already can: give position p the key ``(cos wp, sin wp)`` and
      the query the same vector rotated by ``w * offset``; the score ``cos(w (p - i - offset))`` peaks
      exactly at ``p = i + offset``. (A causal mask makes the "largest key" a per-prefix maximum, which
      lets a ``d_k = 1`` head reach offset -1 by zig-zagging keys; the default task is bidirectional
      (``causal=False``) to keep the limit clean.)

    Together the two effects make accuracy a hump in the head count at fixed ``d_model``: one head is
    too few, ``d_model`` heads of width one are too thin.

    Args:
        offsets: distinct non-zero relative offsets, one target (and relation) each.
        vocab_size: number of symbols (at least 2).
        seq_len: sequence length; every offset must be shorter than it.
        causal: whether a model should use causal self-attention; needs all offsets negative.
    """

    def __init__(
        self,
        offsets: tuple[int, ...] = (-2, -1, 1, 2),
        *,
        vocab_size: int = 16,
        seq_len: int = 16,
        causal: bool = False,
        name: str = "multi-relation",
    ) -> None:
        self.vocab_size = check_int("vocab_size", vocab_size, 2)
        self.seq_len = check_int("seq_len", seq_len, 2)
        offsets = tuple(offsets)
        if not offsets:
            raise ValueError("offsets must name at least one relative offset, e.g. offsets=(-1, 1)")
        for o in offsets:
            if isinstance(o, bool) or not isinstance(o, int):
                raise TypeError(f"every offset must be an int (a relative position such as -1), got {o!r}")
            if o == 0:
                raise ValueError("offset 0 is the query's own token, which needs no attention; use non-zero offsets")
            if abs(o) >= seq_len:
                raise ValueError(
                    f"offset {o} never fits in a sequence of seq_len={seq_len}: use |offset| < seq_len "
                    f"(or a longer seq_len)"
                )
        if len(set(offsets)) != len(offsets):
            raise ValueError(f"offsets must be distinct (one relation each), got {offsets}")
        if causal and any(o > 0 for o in offsets):
            raise ValueError(
                f"a causal model cannot see later tokens, so offsets {tuple(o for o in offsets if o > 0)} "
                f"are impossible with causal=True; use negative offsets or causal=False"
            )
        self.offsets = offsets
        self.causal = bool(causal)
        self.name = name
        self.n_targets = len(offsets)
        self.relations = tuple(offset_name(o) for o in offsets)
        self._index_cache: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}  # see _relation_index

    def _relation_index(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """``(source, gather_index, outside)``, each ``[T, R]`` on ``device``, built once per device.

        They are the same for every batch, and building them copies ``offsets`` from the host, which
        on a GPU would wait for all queued work at every training step.
        """
        cached = self._index_cache.get(device)
        if cached is None:
            T = self.seq_len
            source = torch.arange(T)[:, None] + torch.tensor(self.offsets)[None, :]  # [T, R]: where each relation points
            outside = (source < 0) | (source >= T)  # [T, R]: off the edge of the sequence
            cached = tuple(t.to(device) for t in (source.masked_fill(outside, -1), source.clamp(0, T - 1), outside))
            self._index_cache[device] = cached
        return cached

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Batch:
        B, T = batch_size, self.seq_len
        inputs = torch.randint(0, self.vocab_size, (B, T), generator=generator, device=device)  # [B, T]
        source, gather_index, outside = self._relation_index(device)  # each [T, R]
        gathered = inputs[:, gather_index]  # [B, T, R]: token at i + offset_r
        targets = gathered.masked_fill(outside, IGNORE)  # [B, T, R]
        sources = {name: source[:, r].expand(B, T).contiguous() for r, name in enumerate(self.relations)}  # each [B, T]
        return Batch(inputs, targets, sources)

    def token_labels(self, tokens_1d: Tensor) -> list[str]:
        alphabet = string.ascii_lowercase if self.vocab_size <= 26 else None
        return [alphabet[int(t)] if alphabet else str(int(t)) for t in tokens_1d]

    def __repr__(self) -> str:
        return (
            f"MultiRelationTask(offsets={self.offsets}, vocab_size={self.vocab_size}, seq_len={self.seq_len}, "
            f"causal={self.causal})"
        )


class KeyValueRecall(Task):
    """Store key/value pairs, then answer queries: "what value was stored under this key?".

    A sequence is ``n_pairs`` pairs ``k1 v1 k2 v2 ...`` (distinct keys drawn from ``n_keys`` key symbols,
    values drawn from ``n_values`` value symbols, so the two never share a token id) followed by
    ``n_queries`` query keys, each one of the stored keys. The target at a query position is the value
    stored under that key; every other position has no target (``-100``). Token ids: keys
    ``0 .. n_keys-1``, values ``n_keys .. n_keys+n_values-1``.

    Relations (defined at query positions, -1 elsewhere):

    * ``key``: the position where the queried key was stored (a *content* relation: where it is changes
      from sequence to sequence; only matching the query's token against the stored keys finds it).
    * ``value``: the position right after it, which holds the answer (``target_relation``).

    Why it exercises heads: the query has to single out one stored key among ``n_pairs`` by comparing
    contents, ``q_query . k_key``. A ``d_k = 1`` head's score is monotone in a scalar key, so it can only
    prefer "the largest" or "the smallest" key, never "the one equal to mine"; telling ``n_keys``
    symbols apart reliably takes several dimensions per head. The usual solution uses two layers: one
    head copies each key into the position of its value (a fixed offset -1), then a matching head in
    the next layer reads the value whose copied key equals the query.

    Args:
        n_pairs: key/value pairs per sequence.
        n_keys: size of the key alphabet (at least ``n_pairs``: keys in one sequence are distinct).
        n_values: size of the value alphabet.
        n_queries: queries after the pairs (each asks one stored key; repeats allowed).
        causal: whether a model should use causal self-attention (works either way: queries come last).
    """

    target_relation = "value"

    def __init__(
        self,
        n_pairs: int = 8,
        *,
        n_keys: int = 16,
        n_values: int = 16,
        n_queries: int = 4,
        causal: bool = True,
        name: str = "key-value recall",
    ) -> None:
        self.n_pairs = check_int("n_pairs", n_pairs, 1)
        self.n_keys = check_int(
            "n_keys", n_keys, n_pairs, why=f" (the {n_pairs} keys in one sequence are distinct, so n_keys >= n_pairs)"
        )
        self.n_values = check_int("n_values", n_values, 2)
        self.n_queries = check_int("n_queries", n_queries, 1)
        self.causal = bool(causal)
        self.name = name
        self.vocab_size = n_keys + n_values
        self.seq_len = 2 * n_pairs + n_queries
        self.n_targets = 1
        self.relations = ("key", "value")

    def _generate(self, batch_size: int, generator: torch.Generator, device: torch.device) -> Batch:
        B, P, Q, T = batch_size, self.n_pairs, self.n_queries, self.seq_len
        # Distinct keys per sequence: the first P of a random permutation of the key alphabet.
        keys = torch.rand(B, self.n_keys, generator=generator, device=device).argsort(dim=-1)[:, :P]  # [B, P]
        values = torch.randint(0, self.n_values, (B, P), generator=generator, device=device) + self.n_keys  # [B, P]
        asked = torch.randint(0, P, (B, Q), generator=generator, device=device)  # [B, Q]: which pair each query asks
        pairs = torch.stack([keys, values], dim=-1).reshape(B, 2 * P)  # [B, P, 2] -> [B, 2P]: k1 v1 k2 v2 ...
        queries = keys.gather(1, asked)  # [B, Q]
        inputs = torch.cat([pairs, queries], dim=1)  # [B, T]
        targets = torch.full((B, T), IGNORE, dtype=torch.long, device=device)
        targets[:, 2 * P :] = values.gather(1, asked)  # [B, Q]: the value stored under each asked key
        key_pos = torch.full((B, T), -1, dtype=torch.long, device=device)
        key_pos[:, 2 * P :] = 2 * asked  # pair j's key sits at 2j
        value_pos = torch.where(key_pos >= 0, key_pos + 1, key_pos)  # and its value right after
        return Batch(inputs, targets, {"key": key_pos, "value": value_pos})

    def token_labels(self, tokens_1d: Tensor) -> list[str]:
        labels = []
        for t in map(int, tokens_1d):
            labels.append(f"K{t}" if t < self.n_keys else f"v{t - self.n_keys}")
        return labels

    def __repr__(self) -> str:
        return (
            f"KeyValueRecall(n_pairs={self.n_pairs}, n_keys={self.n_keys}, n_values={self.n_values}, "
            f"n_queries={self.n_queries}, causal={self.causal})"
        )


# ----------------------------------------------------------------------------- sequence to sequence
@dataclass
class Seq2SeqBatch(Batch):
    """A :class:`Batch` for an encoder-decoder: ``inputs`` is the source, plus the decoder's own input.

    Attributes:
        decoder_inputs: ``[B, T]`` long: the target shifted right by one, starting with the task's BOS
            token (teacher forcing: decoder position t sees the true answers before t and predicts
            ``targets[:, t]``). :meth:`mhalab.models.EncoderDecoder.forward_batch` reads it.

    ``sources`` point from each *decoder* position into the *source* sequence: they are the ground truth
    for cross-attention.
    """

    decoder_inputs: Tensor

    def to(self, device: torch.device | str) -> "Seq2SeqBatch":
        return Seq2SeqBatch(
            self.inputs.to(device), self.targets.to(device), {k: v.to(device) for k, v in self.sources.items()},
            self.decoder_inputs.to(device),
        )


class Seq2SeqTask(Task):
    """Copy or reverse a random sequence: the smallest job that needs an encoder *and* a decoder.

    The source is ``seq_len`` symbols drawn uniformly from ``n_symbols``; the target is the same
    symbols (``mode="copy"``) or the same symbols in reverse order (``mode="reverse"``). Batches are
    :class:`Seq2SeqBatch`: ``inputs`` (source) ``[B, T]``, ``decoder_inputs`` (BOS + target[:-1]) ``[B, T]``,
    ``targets`` ``[B, T]``. Token ids: symbols ``0 .. n_symbols-1``, BOS ``n_symbols`` (``bos_id``), so
    ``vocab_size = n_symbols + 1``; source and target share the vocabulary (and an EncoderDecoder's embedding).

    Relation (``target_relation``): ``"mirror"`` for reverse, ``"same"`` for copy. ``sources[name][b, t]``
    is the *source* position whose symbol decoder position t must output: ``T - 1 - t`` (reverse, the
    anti-diagonal) or ``t`` (copy, the diagonal). A cross-attention head that solves the task puts its
    weight there.

    ``causal`` is False: the task itself lets a model see the whole source. An
    :class:`~mhalab.models.EncoderDecoder` ignores it (its encoder sees everything, its decoder is
    causal); an encoder-only :class:`~mhalab.models.Transformer` can also solve it from ``inputs`` alone.

    Args:
        mode: ``"reverse"`` or ``"copy"``.
        n_symbols: size of the symbol alphabet (at least 2).
        seq_len: length of source and target.
    """

    n_targets = 1
    causal = False
    MODES = {"reverse": "mirror", "copy": "same"}

    def __init__(self, mode: str = "reverse", *, n_symbols: int = 10, seq_len: int = 8, name: str | None = None) -> None:
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {tuple(self.MODES)}, got {mode!r}")
        self.mode = mode
        self.n_symbols = check_int("n_symbols", n_symbols, 2)
        self.seq_len = check_int("seq_len", seq_len, 2)
        self.bos_id = n_symbols
        self.vocab_size = n_symbols + 1
        self.target_relation = self.MODES[mode]
        self.relations = (self.target_relation,)
        self.name = name or mode

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
        alphabet = string.ascii_lowercase if self.n_symbols <= 26 else None
        return ["<s>" if int(t) == self.bos_id else (alphabet[int(t)] if alphabet else str(int(t))) for t in tokens_1d]

    def __repr__(self) -> str:
        return f"Seq2SeqTask(mode={self.mode!r}, n_symbols={self.n_symbols}, seq_len={self.seq_len})"
