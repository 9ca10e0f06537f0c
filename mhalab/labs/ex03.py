"""Exercises of notebook 03 (where it sits): a causal mask for decoding, the mask and weight shape of each
of the three uses of attention, and counting the attention operations of an architecture."""

from __future__ import annotations

import torch

from .calls import Check
from .core import Exercise, register
from .judging import expect_equal, expect_whole, name_miss
from .verdicts import Wrong


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
_USES = ("encoder", "decoder", "cross")
_WHY_MASK = {
    "encoder": "the encoder reads a source that is given in full: may a position look ahead?",
    "decoder": "the decoder writes its output one token at a time: what must a position not see?",
    "cross": "the whole source is known before the decoder starts: which source positions may it read?",
}
_SIDES = {"encoder": ("source", "source"), "decoder": ("target", "target"), "cross": ("target", "source")}
_NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}


def _shape_miss(use: str, shape: tuple, want: tuple, src_len: int, tgt_len: int) -> str:
    """What is wrong with one block's weights shape, axis by axis."""
    if shape[2:] == want[2:][::-1] and want[2] != want[3]:
        return "queries and keys are swapped: the layout is [batch, head, query, key], who asks first"
    for axis, (got, right) in enumerate(zip(shape, want)):
        if got == right:
            continue
        if axis < 2:
            return f"axis {axis} is {('batch', 'heads')[axis]}: it has {right} entries here, not {got}"
        role, side = ("query", "queries") if axis == 2 else ("key", "keys")
        source = _SIDES[use][axis - 2]
        length = "src_len" if source == "source" else "tgt_len"
        return (
            f"the {role} axis has {got} entries; the {side} of {_NAMES[use]} come from the {source}, of length {length}"
        )
    return "the layout is [batch, head, query, key]"


def _check_layout(attention_layout, check: Check) -> None:
    r = check.rng(61)
    drawn = [(r.randint(1, 8), r.randint(1, 16), r.randint(2, 30), r.randint(2, 30)) for _ in range(2)]
    fresh = drawn if check.grading else []
    for batch, n_heads, src_len, tgt_len in [(2, 8, 11, 5), (3, 4, 6, 9), (1, 1, 7, 7)] + fresh:
        text = f"batch={batch}, n_heads={n_heads}, src_len={src_len}, tgt_len={tgt_len}"
        got = check.call(attention_layout, batch, n_heads, src_len, tgt_len, label=text)
        want = check.reference(batch, n_heads, src_len, tgt_len)
        if not isinstance(got, dict) or set(got) != set(_USES):
            keys = sorted(map(str, got)) if isinstance(got, dict) else type(got).__name__
            raise Wrong(f"return a dict with the keys {list(_USES)} (one per use of attention), got {keys}")
        for use in _USES:
            entry = got[use]
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise Wrong(f"{use!r}: give a pair (mask, weights_shape), got {entry!r}"[:200])
            mask, shape = entry
            if mask not in ("none", "causal"):
                raise Wrong(f"{use!r}: the mask is 'none' or 'causal', got {mask!r}"[:200])
            if mask != want[use][0]:
                raise Wrong(f"{use!r}: the mask {mask!r} is not right; {_WHY_MASK[use]}")
            if not isinstance(shape, (tuple, list, torch.Size)) or len(shape) != 4:
                raise Wrong(f"{use!r}: the weights shape should be 4 whole numbers, got {shape!r}"[:200])
            shape = tuple(expect_whole(s, f"{use!r}: an entry of the weights shape") for s in shape)
            if shape != want[use][1]:
                raise Wrong(f"{use!r} for {text}: weights shape {shape} is not right; "
                            + _shape_miss(use, shape, want[use][1], src_len, tgt_len))


register(Exercise(
    "03", 2, "mask and weights shape of each use of attention",
    _check_layout,
    hint="Weights are [batch, head, query, key]. Ask for each use: where do the queries come from, where do "
         "the keys come from, and is there anything a query must not see?",
    solution=(
        "def attention_layout(batch, n_heads, src_len, tgt_len):\n"
        "    return {\n"
        "        \"encoder\": (\"none\", (batch, n_heads, src_len, src_len)),    # the source sees itself, all of it\n"
        "        \"decoder\": (\"causal\", (batch, n_heads, tgt_len, tgt_len)),  # the target so far, no peeking "
        "ahead\n"
        "        \"cross\": (\"none\", (batch, n_heads, tgt_len, src_len)),      # target queries read the whole "
        "source\n"
        "    }"
    ),
    minutes=10, difficulty=1, importance=2,
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
