"""Relations by content: find a key among the sequence's entries and read its value."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..arguments import validate_int
from .base import IGNORE, Batch, Task


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
        self.n_pairs = validate_int("n_pairs", n_pairs, 1)
        self.n_keys = validate_int("n_keys", n_keys, n_pairs,
                                why=f" (the {n_pairs} keys in one sequence are distinct, so n_keys >= n_pairs)")
        if not isinstance(slots, bool):
            raise TypeError(f"slots must be True or False, got {slots!r}")
        if slots and n_values not in (None, n_pairs):
            raise ValueError(f"with slots=True the values are the {n_pairs} slots, so n_values is n_pairs; "
                             f"got n_values={n_values} (leave it out)")
        self.slots = slots
        values = n_pairs if slots else 16 if n_values is None else n_values
        self.n_values = validate_int("n_values", values, 1 if slots else 2)
        self.n_queries = validate_int("n_queries", n_queries, 1)
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
        self.n_tables = validate_int("n_tables", n_tables, 1)
        self.n_entries = validate_int("n_entries", n_entries, 1)
        self.n_keys = validate_int("n_keys", n_keys, n_entries,
                                why=f" (the {n_entries} keys of a table are distinct, so n_keys >= n_entries)")
        self.n_values = validate_int("n_values", n_values, 2)
        self.n_queries = validate_int("n_queries", n_queries, 1)
        self.shift = validate_int("shift", shift, 0, why=" (table r holds the keys moved by r * shift; 0 = unmoved)")
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
        K, V, D = self.n_keys, self.n_values, self.n_tables
        return self._code(d_model, torch.eye(K), query_flag=False,
                          why=f" (the code gives {K} keys, {V} values and {D} tables a dimension each: {K + V + D})")

    def circle_code(self, d_model: int) -> tuple[Tensor, Tensor]:
        """:meth:`factored_code` with the keys on a circle: key j is the point ``(cos a_j, sin a_j)``,
        ``a_j = 2 pi j / n_keys``, in dimensions 0-1 (entries and queries alike), so table r's shift is a rotation by
        ``r * shift`` steps of the circle. A head of width two can then match the asked key in one table by rotating
        its query (a QK circuit of rank 2), while a width-one head still ranks entries by one number, their
        projection on one direction. Values and tables one-hot after the key's two dimensions; query positions get
        one dimension of their own after those (a flag), so a query can be told from an entry by position alone.

        Returns ``(tokens [vocab_size, d_model], positions [seq_len, d_model])``; dimensions after
        ``2 + n_values + n_tables + 1`` stay zero."""
        V, D = self.n_values, self.n_tables
        angle = 2 * math.pi * torch.arange(self.n_keys) / self.n_keys
        return self._code(d_model, torch.stack([angle.cos(), angle.sin()], dim=-1), query_flag=True,
                          why=f" (the code gives the keys 2 dimensions, {V} values and {D} tables a dimension "
                              f"each, and query positions one: {2 + V + D + 1})")

    def _code(self, d_model: int, keys: Tensor, *, query_flag: bool, why: str) -> tuple[Tensor, Tensor]:
        """The embedding of :meth:`factored_code` and :meth:`circle_code`, given each key's row ``keys [n_keys, k]``
        (dimensions ``0..k-1``), then the values' and tables' one-hot dimensions and, with ``query_flag``, one for
        query positions."""
        K, V, D, P = self.n_keys, self.n_values, self.n_tables, self.n_entries
        k = keys.shape[1]
        validate_int("d_model", d_model, k + V + D + int(query_flag), why=why)
        tokens = torch.zeros(self.vocab_size, d_model)
        entry = torch.arange(K * V)  # entry token = key * V + value
        tokens[entry, :k] = keys[entry // V]
        tokens[entry, k + entry % V] = 1.0
        tokens[K * V + torch.arange(K), :k] = keys  # query token for key j
        positions = torch.zeros(self.seq_len, d_model)
        positions[torch.arange(D * P), k + V + torch.arange(D * P) // P] = 1.0  # table r fills positions r*P..
        if query_flag:
            positions[D * P:, k + V + D] = 1.0
        return tokens, positions
