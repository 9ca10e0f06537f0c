"""Exercises of notebook 03 (where it sits): a causal mask for decoding, what each of the three uses of
attention lets flow from an edited token to which positions, and counting the attention operations of an
architecture."""

from __future__ import annotations

import torch

from .calls import Check
from .core import Exercise, register
from .judging import _as_tensor, consistent_mistake, describe, expect_equal, expect_shape, expect_whole, name_miss
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
def _critical_path(encoder_layers: int, decoder_layers: int) -> int:
    """Sequential steps when the decoder's first self-attention runs beside the encoder (it does not need it)."""
    if not encoder_layers or not decoder_layers:
        return encoder_layers + decoder_layers
    return max(encoder_layers, 1) + 1 + 2 * (decoder_layers - 1)


_COUNT_CASES = [(32, 0, 32), (16, 24, 0), (8, 6, 6), (12, 4, 10)]
_COUNT_LABELS = ["n_heads=32, encoder_layers=0, decoder_layers=32 (decoder-only)",
                 "n_heads=16, encoder_layers=24, decoder_layers=0 (encoder-only)",
                 "n_heads=8, encoder_layers=6, decoder_layers=6 (encoder-decoder)",
                 "n_heads=12, encoder_layers=4, decoder_layers=10 (encoder-decoder)"]


def _check_count(attention_operations, check: Check) -> None:
    r = check.rng(62)
    fresh = [(h, e, d) for h, e, d in ((r.randint(1, 32), r.randint(1, 24), r.randint(1, 24)) for _ in range(2))]
    labels = [f"n_heads={h}, encoder_layers={e}, decoder_layers={d} (encoder-decoder)" for h, e, d in fresh]
    for (n_heads, enc, dec), label in zip(_COUNT_CASES + (fresh if check.grading else []), _COUNT_LABELS + labels):
        got = check.call(attention_operations, n_heads, enc, dec, label=label)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Wrong(f"return a pair (operations, sequential_steps), got {got!r} for {label}"[:300])
        got_ops = expect_whole(got[0], f"operations for {label}")
        got_steps = expect_whole(got[1], f"sequential steps for {label}")
        ops, steps = check.reference(n_heads, enc, dec)
        if got_ops != ops:
            raise Wrong(f"operations for {label}: got {got_ops:,}; " + (name_miss(got_ops, [
                ((enc + dec) * n_heads, "a decoder layer of an encoder-decoder has two attention blocks: "
                                        "self-attention and cross-attention"),
                ((enc + 2 * dec) * n_heads, "cross-attention needs an encoder to attend to: a decoder-only model has "
                                            "none"),
                (steps, "that counts blocks; every head of a block is its own operation"),
            ]) or "count the heads of every attention block in one forward pass"))
        if got_steps not in (steps, _critical_path(enc, dec)):  # a standard implementation, or the true critical path
            raise Wrong(f"sequential steps for {label}: got {got_steps:,}; " + (name_miss(got_steps, [
                (ops, "the heads of one block run side by side; only the blocks must wait for each other"),
                (1, "a block needs the previous block's output, so the blocks cannot all run at once"),
                (enc + dec, "in a decoder layer, cross-attention takes its queries from the self-attention's output, "
                            "so it must wait for it"),
            ]) or "count the attention blocks that must run one after another"))


register(Exercise(
    "03", 3, "count the attention operations of an architecture",
    _check_count,
    hint="Count attention blocks first: one per encoder layer, one per decoder layer, and one more per decoder "
         "layer if there is an encoder to cross-attend to. Every head of a block is one operation; the blocks "
         "run one after another, the heads of a block side by side.",
    solution=(
        "def attention_operations(n_heads, encoder_layers, decoder_layers):\n"
        "    cross = decoder_layers if encoder_layers > 0 else 0   # cross-attention only with an encoder\n"
        "    blocks = encoder_layers + decoder_layers + cross      # in a standard implementation each block waits\n"
        "    return blocks * n_heads, blocks                       # (the decoder's first self-attention need not)"
    ),
    minutes=10, difficulty=1, importance=2,
))
