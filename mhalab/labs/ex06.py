"""Exercises of notebook 06 (where it sits): a causal mask for decoding, the mask and weight shape of each
of the three uses of attention, and counting the attention operations of an architecture."""

from __future__ import annotations

import torch

from ..attention import causal_mask
from .checks import call_on_hidden_cases, case, expect_callable, expect_equal
from .core import Exercise, Wrong, register


# ------------------------------------------------------------------------------------ exercise 1
def _causal_reference(n_queries: int, n_keys: int) -> torch.Tensor:
    return causal_mask(n_queries, n_keys)


def _check_causal(causal_allowed) -> None:
    # Square first (a whole sequence), then the queries as the last few positions (decoding with a cache).
    call_on_hidden_cases(
        causal_allowed,
        [case(5, 5), case(1, 1), case(9, 9), case(3, 7, label="n_queries=3, n_keys=7 (4 tokens already cached)"),
         case(1, 6, label="n_queries=1, n_keys=6 (one new token, 5 cached)")],
        reference=_causal_reference,
        name="causal_allowed",
        compare=expect_equal,
    )


register(Exercise(
    "06", 1, "a causal mask, also for decoding with a cache",
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
    reference=_causal_reference,
    wrong=[
        lambda n_queries, n_keys: torch.ones(n_queries, n_keys).tril().bool(),  # top-left aligned
        lambda n_queries, n_keys: torch.ones(n_queries, n_keys).triu(n_keys - n_queries).bool(),  # the future
        lambda n_queries, n_keys: torch.ones(n_queries, n_keys).tril(n_keys - n_queries - 1).bool(),  # not itself
        lambda n_queries, n_keys: torch.ones(n_queries, n_keys, dtype=torch.bool),  # no mask
    ],
))


# ------------------------------------------------------------------------------------ exercise 2
_USES = ("encoder", "decoder", "cross")
_MASKS = ("none", "causal")


def _layout_reference(batch: int, n_heads: int, src_len: int, tgt_len: int) -> dict:
    return {
        "encoder": ("none", (batch, n_heads, src_len, src_len)),
        "decoder": ("causal", (batch, n_heads, tgt_len, tgt_len)),
        "cross": ("none", (batch, n_heads, tgt_len, src_len)),
    }


def _check_layout(attention_layout) -> None:
    expect_callable(attention_layout, "attention_layout")
    for batch, n_heads, src_len, tgt_len in [(2, 8, 11, 5), (3, 4, 6, 9), (1, 1, 7, 7)]:
        text = f"batch={batch}, n_heads={n_heads}, src_len={src_len}, tgt_len={tgt_len}"
        got = attention_layout(batch, n_heads, src_len, tgt_len)
        want = _layout_reference(batch, n_heads, src_len, tgt_len)
        if not isinstance(got, dict) or set(got) != set(_USES):
            keys = sorted(got) if isinstance(got, dict) else type(got).__name__
            raise Wrong(f"return a dict with the keys {list(_USES)} (one per use of attention), got {keys}")
        for use in _USES:
            entry = got[use]
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise Wrong(f"{use!r}: give a pair (mask, weights_shape), got {entry!r}")
            mask, shape = entry
            if mask not in _MASKS:
                raise Wrong(f"{use!r}: the mask is one of {list(_MASKS)}, got {mask!r}")
            if mask != want[use][0]:
                why = {
                    "encoder": "the encoder reads a source that is given in full: may a position look ahead?",
                    "decoder": "the decoder writes its output one token at a time: what must a position not see?",
                    "cross": "the whole source is known before the decoder starts: which source positions may it read?",
                }
                raise Wrong(f"{use!r}: the mask {mask!r} is not right; {why[use]}")
            try:
                shape = tuple(int(s) for s in shape)
            except (TypeError, ValueError):
                raise Wrong(f"{use!r}: the weights shape should be a tuple of 4 ints, got {shape!r}") from None
            if shape != want[use][1]:
                hint = "[batch, head, query, key]: who asks (queries) comes first, who is read (keys) second"
                if use == "cross" and shape == (batch, n_heads, src_len, tgt_len):
                    hint = "queries come from the decoder and keys from the encoder: [batch, head, tgt_len, src_len]"
                raise Wrong(f"{use!r} for {text}: weights shape {shape} is not right; the layout is {hint}")


register(Exercise(
    "06", 2, "mask and weights shape of each use of attention",
    _check_layout,
    hint="Weights are [batch, head, query, key]. Ask for each use: where do the queries come from, where do "
         "the keys come from, and is there anything a query must not see?",
    solution=(
        "def attention_layout(batch, n_heads, src_len, tgt_len):\n"
        "    return {\n"
        "        \"encoder\": (\"none\", (batch, n_heads, src_len, src_len)),    # the source sees itself, all of it\n"
        "        \"decoder\": (\"causal\", (batch, n_heads, tgt_len, tgt_len)),  # the target so far, no peeking ahead\n"
        "        \"cross\": (\"none\", (batch, n_heads, tgt_len, src_len)),      # target queries read the whole source\n"
        "    }"
    ),
    reference=_layout_reference,
    wrong=[
        lambda b, h, s, t: {"encoder": ("none", (b, h, s, s)), "decoder": ("causal", (b, h, t, t)),
                            "cross": ("none", (b, h, s, t))},  # cross transposed
        lambda b, h, s, t: {"encoder": ("causal", (b, h, s, s)), "decoder": ("causal", (b, h, t, t)),
                            "cross": ("causal", (b, h, t, s))},  # causal everywhere
        lambda b, h, s, t: {"encoder": ("none", (b, h, s, s)), "decoder": ("none", (b, h, t, t)),
                            "cross": ("none", (b, h, t, s))},  # decoder can see the future
    ],
))


# ------------------------------------------------------------------------------------ exercise 3
def _count_reference(n_heads: int, encoder_layers: int, decoder_layers: int) -> tuple[int, int]:
    cross = decoder_layers if encoder_layers > 0 else 0  # cross-attention exists only with an encoder
    blocks = encoder_layers + decoder_layers + cross
    return blocks * n_heads, blocks


_COUNT_CASES = [
    case(32, 0, 32, label="n_heads=32, encoder_layers=0, decoder_layers=32 (decoder-only)"),
    case(16, 24, 0, label="n_heads=16, encoder_layers=24, decoder_layers=0 (encoder-only)"),
    case(8, 6, 6, label="n_heads=8, encoder_layers=6, decoder_layers=6 (encoder-decoder)"),
    case(12, 4, 10, label="n_heads=12, encoder_layers=4, decoder_layers=10 (encoder-decoder)"),
]


def _check_count(attention_operations) -> None:
    expect_callable(attention_operations, "attention_operations")
    for c in _COUNT_CASES:
        got = attention_operations(*c.args)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Wrong(f"return a pair (operations, sequential_steps), got {got!r} for {c.label}")
        n_heads, enc, dec = c.args
        ops, steps = _count_reference(*c.args)
        got_ops, got_steps = got
        if got_ops != ops:
            hints = {
                (enc + dec) * n_heads: "a decoder layer of an encoder-decoder has two attention blocks: "
                                       "self-attention and cross-attention",
                (enc + 2 * dec) * n_heads: "cross-attention needs an encoder to attend to: a decoder-only model has none",
                enc + dec + (dec if enc else 0): "that counts blocks; every head of a block is its own operation",
            }
            raise Wrong(f"operations for {c.label}: got {got_ops!r}; " + hints.get(
                got_ops, "count the heads of every attention block in one forward pass"))
        if got_steps != steps:
            hints = {
                ops: "the heads of one block run side by side; only the blocks must wait for each other",
                1: "a block needs the previous block's output, so the blocks cannot all run at once",
                enc + dec: "in a decoder layer, cross-attention takes its queries from the self-attention's "
                           "output, so it must wait for it",
            }
            raise Wrong(f"sequential steps for {c.label}: got {got_steps!r}; " + hints.get(
                got_steps, "count the attention blocks that must run one after another"))


register(Exercise(
    "06", 3, "count the attention operations of an architecture",
    _check_count,
    hint="Count attention blocks first: one per encoder layer, one per decoder layer, and one more per decoder "
         "layer if there is an encoder to cross-attend to. Every head of a block is one operation; the blocks "
         "run one after another, the heads of a block side by side.",
    solution=(
        "def attention_operations(n_heads, encoder_layers, decoder_layers):\n"
        "    cross = decoder_layers if encoder_layers > 0 else 0   # cross-attention only with an encoder\n"
        "    blocks = encoder_layers + decoder_layers + cross      # each block waits for the previous one\n"
        "    return blocks * n_heads, blocks"
    ),
    reference=_count_reference,
    wrong=[
        lambda h, e, d: ((e + d) * h, e + d),  # forgot cross-attention
        lambda h, e, d: ((e + 2 * d) * h, e + 2 * d),  # cross-attention without an encoder
        lambda h, e, d: (_count_reference(h, e, d)[0], _count_reference(h, e, d)[0]),  # heads also sequential
        lambda h, e, d: (_count_reference(h, e, d)[0], 1),  # everything in parallel
    ],
))
