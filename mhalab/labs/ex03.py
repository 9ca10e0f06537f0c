"""Exercises of notebook 03 (where it sits): a causal mask for decoding, what each of the three uses of
attention lets flow from an edited token to which positions, and the critical path of an encoder-decoder (the
fewest attention blocks that must run one after another)."""

from __future__ import annotations

import torch

from .calls import Check
from .core import Exercise, register
from .judging import _as_tensor, consistent_mistake, describe, expect_equal, expect_shape, expect_whole, unseparated
from .verdicts import AnswerRaised, Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _diagonal_miss(got, want: torch.Tensor) -> str | None:
    """What is off when ``got`` is the lower triangle of ``want``'s shape starting at another diagonal."""
    if (
        not isinstance(got, torch.Tensor)
        or got.shape != want.shape
        or got.dtype != torch.bool
        or torch.equal(got, want)
    ):
        return None
    L, S = want.shape
    for k, why in ((S - L + 1, "each query also sees the key just after it; query i may see keys j <= i + "
                               "(n_keys - n_queries), itself included and nothing later"),
                   (S - L - 1, "each query misses its own key; query i may see keys j <= i + (n_keys - n_queries), "
                               "itself included"),
                   (L - S, "the offset has the wrong sign: query i sits at position i + (n_keys - n_queries), so it "
                           "sees more keys, not fewer (tril(n_keys - n_queries))")):
        if torch.equal(got, torch.ones(L, S, dtype=torch.bool).tril(k)):
            return why
    return None


def _expect_causal(value, expected, name) -> None:
    why = _diagonal_miss(value, expected)
    if why:
        raise Wrong(why)
    expect_equal(value, expected, name)


def _check_causal(causal_allowed, check: Check) -> None:
    # Square first (a whole sequence), then the queries as the last few positions (decoding with a cache).
    check.calls(causal_allowed, [(5, 5), (1, 1), (9, 9)], compare=_expect_causal)
    r = check.rng(60)
    for L, S in [(3, 7), (1, 6)] + ([(r.randint(1, 5), r.randint(6, 12)) for _ in range(2)] if check.grading else []):
        label = f"n_queries={L}, n_keys={S} ({S - L} tokens already cached)"
        got = check.call(causal_allowed, L, S, label=label)
        if (
            isinstance(got, torch.Tensor)
            and got.shape == (L, S)
            and torch.equal(got.bool(), torch.ones(L, S, dtype=torch.bool).tril())
        ):
            raise Wrong(f"causal_allowed({label}): your mask lines the queries up with the first keys; they are the "
                        f"*last* {L} positions, so query i sits at position {S - L} + i and may see the cached tokens "
                        "too")
        try:
            _expect_causal(got, check.reference(L, S), "the result")
        except Wrong as wrong:
            raise Wrong(f"causal_allowed({label}): {wrong}") from None


register(Exercise(
    "03", 1, "a causal mask, also for decoding with a cache",
    _check_causal,
    hint="Entry [i, j] says whether query i may look at key j. Give every query its absolute position: "
         "with n_keys - n_queries tokens cached, query i sits at position n_keys - n_queries + i. "
         "It may see every key at that position or before.",
    solution=(
        "def causal_allowed(n_queries, n_keys):\n"
        "    offset = n_keys - n_queries                          # tokens already in the cache\n"
        "    query_pos = torch.arange(n_queries)[:, None] + offset  # [L, 1]: absolute positions\n"
        "    key_pos = torch.arange(n_keys)[None, :]               # [1, S]\n"
        "    return key_pos <= query_pos                           # [L, S], True = allowed"
    ),
    minutes=15, difficulty=2, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 2
# Two streams, one vector per position: the source (the encoder's) and the target (the decoder's). Each block adds
# its attention's output to the stream its queries come from, so a position that differs keeps differing. A rule
# maps (source, target) [S], [T] bool, True = differs from the unedited run, to the same after one block.
_KINDS = ("encoder", "decoder", "cross")


def _later(x: torch.Tensor) -> torch.Tensor:
    """The positions at or after the first True of ``x`` (causal: key j reaches the queries i >= j)."""
    return x.cumsum(0) > 0


def _earlier(x: torch.Tensor) -> torch.Tensor:
    return _later(x.flip(0)).flip(0)


def _shifted(x: torch.Tensor, by: int) -> torch.Tensor:
    """``x`` moved ``by`` positions (left for negative ``by``), the same length, False where nothing moved in."""
    out = torch.zeros_like(x)
    if by >= 0:
        out[by:] = x[:len(x) - by]
    else:
        out[:by] = x[-by:]
    return out


_RIGHT = {
    "encoder": lambda s, t: (s | s.any(), t),                 # no mask: any source change reaches every source query
    "decoder": lambda s, t: (s, t | _later(t)),               # causal: a change at t reaches t and later
    "cross": lambda s, t: (s, t | s.any()),                   # every target query reads every source key
}


def _flow(blocks, side: str, position: int, S: int, T: int, **wrong) -> tuple[torch.Tensor, torch.Tensor]:
    """Which positions of each stream differ after ``blocks``, with the rules of ``wrong`` (kind -> rule) in place
    of the right ones."""
    source, target = torch.zeros(S, dtype=torch.bool), torch.zeros(T, dtype=torch.bool)
    (source if side == "source" else target)[position] = True
    for kind in blocks:
        source, target = {**_RIGHT, **wrong}[kind](source, target)
    return source, target


def _fit(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` cut or padded with False to ``n`` entries (a source pattern read on the target's positions)."""
    return torch.cat([x[:n], torch.zeros(max(0, n - len(x)), dtype=torch.bool)])


def _reach_mistakes(blocks, side, position, S, T) -> dict[str, tuple]:
    """{what a plausible mistake misses: the pair it returns} for one case."""
    case = (blocks, side, position, S, T)
    right = _flow(*case)
    itself = [_flow(*case)[0].clone(), _flow(*case)[1].clone()]
    stream_runs = "encoder" in blocks if side == "source" else ("decoder" in blocks or "cross" in blocks)
    if not stream_runs:
        itself[side == "target"][position] = False
    out = {
        "the encoder has no mask: a change at source position j reaches every source position, the ones before j "
        "too": _flow(*case, encoder=lambda s, t: (s | _later(s), t)),
        "the causal mask is inverted: in decoder self-attention query i sees the keys j <= i, so a change at target "
        "position t reaches t and the positions *after* it, not the ones before it":
            _flow(*case, decoder=lambda s, t: (s, t | _earlier(t))),
        "decoder self-attention is causal: a change at target position t cannot reach the positions before t":
            _flow(*case, decoder=lambda s, t: (s, t | t.any())),
        "off by one on the diagonal: query t - 1 sees the keys j <= t - 1, never key t, so a change at target "
        "position t reaches t and later, not t - 1":
            _flow(*case, decoder=lambda s, t: (s, t | _later(t | _shifted(t, -1)))),
        "cross-attention has no mask: every target query reads every source key, so a change at any source "
        "position reaches every target position, not only the one with the same index":
            _flow(*case, cross=lambda s, t: (s, t | _fit(s, T))),
        "cross-attention is not causal: every target query reads every source key, so a source change reaches "
        "every target position, the earlier ones too":
            _flow(*case, cross=lambda s, t: (s, t | _later(_fit(s, T)))),
        "in cross-attention a target position reads only the source: a change at target position t changes t's own "
        "query, so t's output, and no other target position reads it (decoder self-attention is what spreads it)":
            _flow(*case, cross=lambda s, t: (s, t | s.any() | t.any())),
        "cross-attention does not spread a target change to the later positions: it changes only t's own output "
        "(its query); decoder self-attention is what carries it on":
            _flow(*case, cross=lambda s, t: (s, t | s.any() | _later(t))),
        "decoder self-attention reads only the target stream: a source change reaches the target through "
        "cross-attention, not through it": _flow(*case, decoder=lambda s, t: (s, t | _later(t) | s.any())),
        "cross-attention's queries come from the target and its keys and values from the source: it writes into "
        "the target stream, never into the source": _flow(*case, cross=lambda s, t: (s | t.any(), t)),
        "encoder self-attention reads only the source: a target change never reaches the source stream":
            _flow(*case, encoder=lambda s, t: (s | s.any() | t.any(), t)),
        "the edited token itself differs from the start, even where no block of its own stream runs after the "
        "edit: mark its own position": tuple(itself),
        "each block adds its output to its stream, so what an earlier block changed stays changed: follow the edit "
        "through every block, in order": _flow(blocks[-1:], side, position, S, T),
        "return (source_changed, target_changed), in that order": (right[1], right[0]),
    }
    return out


def _reach_same(a, b) -> bool:
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


_REACH_CASES = [  # (blocks, side, position, src_len, tgt_len)
    (["decoder"], "target", 2, 4, 6),
    (["cross"], "target", 1, 5, 4),
    (["cross"], "source", 1, 5, 4),
    (["encoder"], "source", 2, 5, 3),
    (["decoder"], "source", 2, 4, 3),
    (["encoder"], "target", 0, 3, 3),
    (["cross", "decoder"], "source", 4, 5, 5),
    (["decoder", "cross", "decoder", "cross"], "target", 5, 8, 6),
    (["decoder", "decoder"], "target", 0, 2, 1),
    ([], "source", 0, 1, 2),
    (["encoder", "encoder", "decoder", "cross", "decoder", "cross"], "source", 6, 7, 4),
]


def _reach_cases(check: Check) -> list[tuple]:
    """The fixed cases (every mistake named gives a result of its own on one of them), and when grading three more
    drawn fresh: lists of blocks in any order, either side, lengths from 1 to 9."""
    cases = [(list(b), side, p, S, T) for b, side, p, S, T in _REACH_CASES]
    if check.grading:
        r = check.rng(61)
        for _ in range(3):
            S, T, side = r.randint(1, 9), r.randint(1, 9), r.choice(("source", "target"))
            blocks = [r.choice(_KINDS) for _ in range(r.randint(0, 5))]
            cases.append((blocks, side, r.randrange(S if side == "source" else T), S, T))
    return cases


def _reach_label(blocks, side, position, S, T) -> str:
    return f"blocks={blocks}, an edit at {side} position {position}, src_len={S}, tgt_len={T}"


def _as_changed(value, n: int, stream: str, label: str) -> torch.Tensor:
    got = _as_tensor(value, f"{stream}_changed for {label}")
    expect_shape(got, [n], f"{stream}_changed for {label} (one entry per {stream} position)")
    if got.dtype != torch.bool:
        if got.is_complex() or not bool(((got == 0) | (got == 1)).all()):
            raise Wrong(f"{stream}_changed for {label} should be True/False per position, got {got.tolist()}")
        got = got.bool()
    return got


def _check_reach(reach, check: Check) -> None:
    cases, got, raised = _reach_cases(check), [], None
    for blocks, side, position, S, T in cases:
        label = _reach_label(blocks, side, position, S, T)
        try:
            value = check.call(reach, list(blocks), side, position, S, T, label=label)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise Wrong(f"return a pair (source_changed, target_changed), got {describe(value)} for {label}")
        lengths = [len(v) if hasattr(v, "__len__") else None for v in value]
        if S != T and lengths == [T, S]:
            raise Wrong(f"for {label} you returned {T} entries, then {S}: return (source_changed, target_changed), "
                        f"in that order (src_len={S} entries, then tgt_len={T})")
        got.append((_as_changed(value[0], S, "source", label), _as_changed(value[1], T, "target", label)))
    cases = cases[:len(got)]
    wants = [tuple(torch.as_tensor(w).bool() for w in check.reference(list(c[0]), *c[1:])) for c in cases]
    if all(_reach_same(g, w) for g, w in zip(got, wants)):
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if not _reach_same(g, w))
    label = _reach_label(*cases[bad])
    missed = consistent_mistake(got, wants, [_reach_mistakes(*c) for c in cases], _reach_same)
    if missed:
        raise Wrong(f"for {label}: {missed}")
    stream = 0 if not torch.equal(got[bad][0], wants[bad][0]) else 1
    j = int((got[bad][stream] != wants[bad][stream]).nonzero()[0])
    said = "may change" if got[bad][stream][j] else "cannot change"
    raise Wrong(f"for {label}: you said {('source', 'target')[stream]} position {j} {said}; it "
                f"{'cannot' if got[bad][stream][j] else 'may'}. Follow the edit block by block: which queries read a "
                "key (or a query) that differs?")


register(Exercise(
    "03", 2, "what each kind of attention lets flow where",
    _check_reach,
    hint=["Keep one vector of booleans per stream, True only at the edited token. A block adds its output to the "
          "stream its queries come from, so a True never turns False again; go through the blocks in order.",
          "Per kind, ask which queries read a key that differs, or are themselves a query that differs. Encoder: "
          "every source query reads every source key. Decoder self-attention: query i reads target keys j <= i. "
          "Cross-attention: every target query reads every source key, and no other target position."],
    solution=(
        "def reach(blocks, side, position, src_len, tgt_len):\n"
        "    source = torch.zeros(src_len, dtype=torch.bool)       # True: differs from the unedited run\n"
        "    target = torch.zeros(tgt_len, dtype=torch.bool)\n"
        "    (source if side == 'source' else target)[position] = True   # the edited token itself\n"
        "    for kind in blocks:\n"
        "        if kind == 'encoder' and source.any():\n"
        "            source[:] = True                               # no mask: every source query reads key j\n"
        "        elif kind == 'decoder' and target.any():\n"
        "            first = int(target.nonzero()[0])\n"
        "            target[first:] = True                          # causal: key j reaches the queries i >= j\n"
        "        elif kind == 'cross' and source.any():\n"
        "            target[:] = True                               # every target query reads every source key\n"
        "        # (cross-attention moves a target change nowhere: only that position's own query differs)\n"
        "    return source, target"
    ),
    minutes=15, difficulty=2, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 3
# The blocks of one forward pass and what each waits for: encoder layer i for encoder layer i - 1; the decoder's
# self-attention of layer l for layer l - 1's cross-attention (the decoder stream; the first for nothing); its
# cross-attention for that self-attention (its queries) and for the encoder's last layer (its keys and values).
def _path(encoder_layers: int, decoder_layers: int, *, cross_waits=True, self_waits_cross=True) -> int:
    """The longest chain of blocks that wait for one another (the checker's own reading, for drawing cases; the
    answer is the solution's), and with a flag off, a reading that drops that dependency."""
    encoder_done = encoder_layers                  # the encoder is one chain
    decoder_done = self_done = 0                   # steps until the decoder stream (self-attention chain) is ready
    for _ in range(decoder_layers):
        self_done = (decoder_done if self_waits_cross else self_done) + 1
        decoder_done = self_done
        if encoder_layers:                         # cross-attention, only with an encoder to read
            decoder_done = max(self_done, encoder_done if cross_waits else 0) + 1
    return max(encoder_done, decoder_done)


def _path_mistakes(n_heads: int, encoder_layers: int, decoder_layers: int) -> dict[str, int]:
    """{what a plausible reading missed: the path it gives} for one case."""
    E, D = encoder_layers, decoder_layers
    right = _path(E, D)
    blocks = E + D + (D if E else 0)
    return {
        "that is every block one after another, as a standard implementation runs them; the decoder's first "
        "self-attention reads only the decoder's own input, so it need not wait for the encoder": blocks,
        "the heads of a block run side by side: count blocks, not heads": right * n_heads,
        "that counts every head of every block, one after another: the heads of a block run side by side, and one "
        "block need not wait for the encoder": blocks * n_heads,
        "cross-attention reads the encoder's output (its keys and values), so it waits for the encoder's last "
        "layer: the decoder cannot run beside the whole encoder": _path(E, D, cross_waits=False),
        "a decoder layer is two steps: its cross-attention takes its queries from the self-attention's output, so "
        "it waits for it": E + D,
        "decoder self-attention reads the decoder stream, which the cross-attention of the layer below has just "
        "written to: each decoder self-attention after the first waits for the cross-attention below it":
            _path(E, D, self_waits_cross=False),
        "a block needs what the block before it computed, so the blocks cannot all run at once": 1,
        "encoder_layers + 2 * decoder_layers - 1 holds only when there are both an encoder and a decoder: a "
        "decoder-only model has no cross-attention, and an encoder-only one no decoder block to run beside the "
        "encoder": E + 2 * D - 1,
        "a decoder-only model has no cross-attention (there is no encoder to attend to): each decoder layer is one "
        "block": 2 * D - 1 if D and not E else right,
        "a decoder-only model has no cross-attention, and with no encoder nothing runs beside its first block: "
        "every one of its blocks waits for the one before": 2 * D if not E else right,
        "only an encoder-decoder has a block that need not wait; in a decoder-only or encoder-only model every "
        "block waits for the one before": E + D - 1 if not (E and D) else right,
        "an encoder-only model has nothing to run beside its first layer: its critical path is every encoder "
        "layer": E - 1 if E and not D else right,
    }


_PATH_CASES = [  # (n_heads, encoder_layers, decoder_layers, what)
    (8, 6, 6, "Transformer base's shape"),
    (32, 0, 32, "decoder-only"),
    (16, 24, 0, "encoder-only"),
    (12, 10, 3, "an encoder longer than the decoder"),
    (4, 2, 12, "a decoder much longer than the encoder"),
    (6, 1, 1, "one layer each"),
    (1, 3, 2, "one head per block"),
    (2, 0, 0, "no layers at all"),
]


def _path_cases(check: Check) -> list[tuple]:
    """The fixed cases; when grading three drawn fresh as well (redrawn a few times at most until every reading
    gives a path of its own on some case)."""
    cases = list(_PATH_CASES)
    if not check.grading:
        return cases
    for attempt in range(20):
        r = check.rng(62 + 1000 * attempt)
        drawn = [(r.choice([1, 2, 4, 8, 12, 16, 32]), r.choice([0, r.randint(1, 24)]), r.randint(0, 24),
                  f"drawn case {i}") for i in range(3)]
        every = cases + drawn
        if not unseparated([_path(*c[1:3]) for c in every], [_path_mistakes(*c[:3]) for c in every], _same_path):
            break
    return cases + drawn


def _same_path(a, b) -> bool:
    return a == b


def _path_label(n_heads, encoder_layers, decoder_layers, what) -> str:
    return f"n_heads={n_heads}, encoder_layers={encoder_layers}, decoder_layers={decoder_layers} ({what})"


def _path_hint(encoder_layers: int, decoder_layers: int) -> str:
    """What to think about for the first case the answer gets wrong, when no one mistake explains every case."""
    if not encoder_layers and not decoder_layers:
        return "a model with no layers runs no attention block"
    if not encoder_layers:
        return "a decoder-only model has one block per layer, each waiting for the one before"
    if not decoder_layers:
        return "an encoder-only model is one chain of blocks"
    return ("follow the decoder layer by layer: when can its self-attention start, and when its cross-attention "
            "(which also needs the encoder's output)?")


def _check_path(critical_path, check: Check) -> None:
    cases, got, raised = _path_cases(check), [], None
    for case in cases:
        label = _path_label(*case)
        try:
            value = check.call(critical_path, *case[:3], label=label)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if isinstance(value, (tuple, list)):
            raise Wrong(f"for {label} return one whole number, the blocks on the critical path; got "
                        f"{describe(value)}")
        got.append(expect_whole(value, f"the critical path for {label}"))
    cases = cases[:len(got)]
    wants = [int(check.reference(*c[:3])) for c in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    missed = consistent_mistake(got, wants, [_path_mistakes(*c[:3]) for c in cases], _same_path)
    raise Wrong(f"for {_path_label(*cases[bad])} you said {got[bad]:,} blocks, the critical path is {wants[bad]:,}: "
                + (missed or _path_hint(*cases[bad][1:3])))


register(Exercise(
    "03", 3, "the critical path of an encoder-decoder",
    _check_path,
    hint=["List each block with what it waits for: an encoder layer for the one below it; a decoder self-attention "
          "for the decoder stream (the first one for nothing: it reads the decoder's input); a cross-attention for "
          "the self-attention below it (its queries) and for the encoder's last layer (its keys and values).",
          "Give every block the step at which it can run: one more than the latest step among what it waits for. The "
          "critical path is the latest step of all. Then check the models without an encoder, or without a "
          "decoder."],
    solution=(
        "def critical_path(n_heads, encoder_layers, decoder_layers):\n"
        "    # the heads of a block run side by side: n_heads does not lengthen the path\n"
        "    if encoder_layers == 0 or decoder_layers == 0:\n"
        "        return encoder_layers + decoder_layers        # one chain: every block waits for the one before\n"
        "    # the decoder's first self-attention runs beside the encoder; its first cross-attention waits for\n"
        "    # both, then every later decoder layer adds self-attention and cross-attention, one after the other\n"
        "    return encoder_layers + 1 + 2 * (decoder_layers - 1)"
    ),
    minutes=15, difficulty=3, importance=2,
))
