"""Exercises of notebook 04 (it costs nothing): the sequence length from which one layer's attention patterns take
more numbers than its keys and values, the largest batch a GPU holds for a real grouped-query model, and
grouped-query attention in one pass, equal to the token-by-token decode through a KV cache."""

from __future__ import annotations

import math

import torch

from .calls import Check
from .core import Exercise, register
from .judging import consistent_mistake, expect_whole, judge, name_miss, unseparated
from .verdicts import AnswerRaised, Wrong

# ------------------------------------------------------------------------------------ exercise 1
# One layer's forward pass over T tokens: the patterns are n_heads maps of T x T (one per query head), K and V are
# 2 * n_kv_heads * d_head * T numbers. The patterns take more once n_heads * T > 2 * n_kv_heads * d_head.
_CROSS_CASES = [  # (d_model, n_heads, n_kv_heads, d_head, what): every reading below differs on some case
    (512, 8, None, None, "section 3's layer: 8 heads, each with its own K and V"),
    (576, 9, 3, 64, "SmolLM2-135M's layer"),
    (1000, 12, 4, 80, "d_model not a multiple of n_heads"),
    (512, 8, 2, None, "grouped-query, 2 K/V heads"),
    (3072, 16, None, 256, "Gemma-7B's layer: heads wider than d_model / n_heads"),
    (4096, 32, 1, 128, "multi-query"),
    (21, 6, 2, 7, "odd shapes"),
    (8, 8, 1, None, "heads of width one, one K/V head"),
    (7, 7, None, None, "seven heads of width one"),
]


def _sizes(d_model: int, n_heads: int, n_kv_heads, d_head) -> tuple[int, int]:
    """(n_kv_heads, d_head) with the defaults filled in: one K/V head per query head, d_head = d_model / n_heads."""
    return (n_heads if n_kv_heads is None else n_kv_heads), (d_model // n_heads if d_head is None else d_head)


def _first(more) -> int:
    """The smallest length T >= 1 where ``more(T)`` (the patterns take more than K and V) holds."""
    T = 1
    while not more(T):
        T += 1
    return T


def _crossover(d_model: int, n_heads: int, n_kv_heads=None, d_head=None) -> int:
    """The checker's own reading (for drawing cases; the answer is the solution's)."""
    kv, d = _sizes(d_model, n_heads, n_kv_heads, d_head)
    return 2 * kv * d // n_heads + 1


def _past(x: float) -> int:
    """The first whole length T >= 1 with T > x."""
    return max(1, math.floor(x) + 1)


def _cross_mistakes(d_model: int, n_heads: int, n_kv_heads, d_head) -> dict[str, int]:
    """{what a plausible reading missed: the length it predicts} for one case."""
    kv, d = _sizes(d_model, n_heads, n_kv_heads, d_head)
    x = 2 * kv * d / n_heads                         # where the two are equal
    return {
        "at that length the patterns take exactly as many numbers as K and V, not more: the first length where "
        "they take more is one token longer (compare strictly)": max(1, math.ceil(x)),
        "at that length the patterns do not yet take more than K and V: round up past the length where the two "
        "are equal (the first whole T with n_heads * T > ...)": max(0, math.floor(x)),
        "rounding to the nearest length can land on or before the crossing: take the first whole length past it":
            round(x),
        "that is half the crossover: the cache holds both K and V for every K/V head, and the patterns are one "
        "[T, T] map per query head (the weights, not the scores as well)": _past(x / 2),
        "every query head has its own [T, T] pattern: n_heads of them, against the K and V of all K/V heads":
            _past(2 * kv * d),
        "only the n_kv_heads K/V heads are stored (each shared by n_heads / n_kv_heads query heads), while every "
        "query head has its own pattern": _past(2 * d),
        "the head width is d_head when it is given; it need not be d_model / n_heads": _past(2 * kv * d_model / n_heads
                                                                                            / n_heads),
        "each K/V head is d_head wide, not d_model": _past(2 * kv * d_model / n_heads),
        "2 * d_model per token is the cache only with one K/V head per query head and d_head = d_model / n_heads; "
        "count 2 * n_kv_heads * d_head": _past(2 * d_model / n_heads),
        "the patterns belong to the query heads (n_heads of them) and K and V to the K/V heads: the ratio is "
        "n_kv_heads / n_heads, not its inverse": _past(2 * n_heads * d / kv),
        "n_kv_heads=None means one K/V head per query head (ordinary multi-head attention), not one in all":
            _past(2 * (1 if n_kv_heads is None else kv) * d / n_heads),
        "the causal mask zeroes the upper triangle, but the pattern still holds all T x T numbers per head":
            _first(lambda T: n_heads * T * (T + 1) // 2 > 2 * kv * d * T),
        "the keys and values grow with the sequence too: compare the patterns with the whole sequence's K and V "
        "(2 * n_kv_heads * d_head numbers per token, times T), not with one token's":
            _first(lambda T: n_heads * T * T > 2 * kv * d),
    }


def _cross_cases(check: Check) -> list[tuple]:
    """The fixed cases; when grading three drawn fresh as well (redrawn a few times at most until every reading
    gives lengths of its own)."""
    cases = list(_CROSS_CASES)
    if not check.grading:
        return cases
    for attempt in range(20):
        r = check.rng(32 + 1000 * attempt)
        drawn = []
        for i in range(3):
            n_heads = r.choice([2, 3, 4, 6, 8, 9, 12, 16, 24, 32, 40, 64])
            n_kv = r.choice([None] + [g for g in range(1, n_heads + 1) if n_heads % g == 0])
            d_head = r.choice([None, r.choice([1, 3, 16, 32, 64, 80, 96, 128, 256])])
            d_model = n_heads * r.randint(1, 128) if d_head is None else r.randint(n_heads, 8192)
            drawn.append((d_model, n_heads, n_kv, d_head, f"drawn case {i}"))
        every = cases + drawn
        if not unseparated([_crossover(*c[:4]) for c in every], [_cross_mistakes(*c[:4]) for c in every], _equal):
            break
    return cases + drawn


def _equal(a, b) -> bool:
    return a == b


def _cross_label(d_model, n_heads, n_kv_heads, d_head, what) -> str:
    return f"d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}, d_head={d_head} ({what})"


def _check_crossover(crossover_length, check: Check) -> None:
    cases, got, raised = _cross_cases(check), [], None
    for case in cases:
        label = _cross_label(*case)
        try:
            value = check.call(crossover_length, *case[:4], label=label)
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        try:
            got.append(expect_whole(value, f"the length for {label}"))
        except Wrong:
            kv, d = _sizes(*case[:4])
            if isinstance(value, (int, float)) and math.isclose(float(value), 2 * kv * d / case[1], rel_tol=1e-9):
                raise Wrong(f"for {label} you returned {float(value):.4g}, the length where the patterns and K and V "
                            "take the same number of numbers; a sequence is a whole number of tokens: return the "
                            "first whole length at which the patterns take more") from None
            raise
    cases = cases[:len(got)]
    wants = [int(check.reference(*c[:4])) for c in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    missed = consistent_mistake(got, wants, [_cross_mistakes(*c[:4]) for c in cases], _equal)
    said = f"for {_cross_label(*cases[bad])} you said {got[bad]:,}, the patterns first take more at {wants[bad]:,}"
    raise Wrong(f"{said}: " + (missed or "count both sides for a sequence of T tokens, the patterns (one [T, T] map "
                                         "per query head) and K and V (one key and one value of d_head numbers per "
                                         "K/V head and token), and find the first T where the patterns win"))


register(Exercise(
    "04", 1, "when the attention pattern outgrows the cache",
    _check_crossover,
    hint=["Count one layer's numbers for one sequence of T tokens: the patterns (what shape has each head's?) and the "
          "keys and values (section 3's count, with a head width d_head and the K/V heads of grouped-query "
          "attention). Which side grows faster with T?",
          "Set patterns > keys and values and divide by T: a straight line in T against a constant. The answer is the "
          "first whole T past the point where the two are equal."],
    solution=(
        "def crossover_length(d_model, n_heads, n_kv_heads=None, d_head=None):\n"
        "    if n_kv_heads is None:\n"
        "        n_kv_heads = n_heads                     # one K/V head per query head\n"
        "    if d_head is None:\n"
        "        d_head = d_model // n_heads              # the usual sizing\n"
        "    cache = 2 * n_kv_heads * d_head              # K and V, per token: the cache grows like T\n"
        "    # patterns: n_heads * T * T numbers; more than cache * T when n_heads * T > cache\n"
        "    return cache // n_heads + 1                  # the first whole T past cache / n_heads"
    ),
    minutes=15, difficulty=2, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 2
# Configs shaped like real checkpoints' (the published sizes); the Gemma-like one has d_head != d_model / n_heads.
_CONFIGS = {
    "SmolLM2-135M-like": dict(n_layers=30, d_model=576, n_heads=9, n_key_value_heads=3, d_head=64),
    "Llama-2-70B-like": dict(n_layers=80, d_model=8192, n_heads=64, n_key_value_heads=8, d_head=128),
    "Gemma-7B-like": dict(n_layers=28, d_model=3072, n_heads=16, n_key_value_heads=16, d_head=256),
    "made-up": dict(n_layers=12, d_model=1000, n_heads=10, n_key_value_heads=2, d_head=80),
    "Mistral-7B-like": dict(n_layers=32, d_model=4096, n_heads=32, n_key_value_heads=8, d_head=128),
}
_BATCH_CASES = [  # (config name, seq_len, memory_bytes, bytes_per_value)
    ("made-up", 3000, 5_000_000_000, 4),             # first: every mistake below gives a different batch here
    ("SmolLM2-135M-like", 8192, 17_000_000_000, 2),
    ("Llama-2-70B-like", 4096, 40_000_000_000, 2),
    ("Gemma-7B-like", 8192, 24_000_000_000, 2),
    ("Mistral-7B-like", 32768, 3_000_000_000, 2),   # not even one sequence fits
]


def _per_sequence(c: dict, seq_len: int, bytes_per_value: int) -> int:
    return 2 * c["n_layers"] * c["n_key_value_heads"] * c["d_head"] * seq_len * bytes_per_value


def _batch_mistakes(c: dict, seq_len: int, memory: int, nbytes: int) -> list[tuple[int, str]]:
    def fit(per_sequence):
        return int(memory // per_sequence)

    right = _per_sequence(c, seq_len, nbytes)
    return [
        (fit(right * c["n_heads"] // c["n_key_value_heads"]),
         "that is the batch for full multi-head attention, with a key "
         "and a value for every query head; here only the K/V heads are cached"),
        (fit(right // 2), "both the keys and the values are cached (a factor 2)"),
        (fit(right // c["n_layers"]), "every layer keeps its own cache"),
        (fit(right // nbytes), "the memory is in bytes and the cache holds numbers: each takes bytes_per_value bytes"),
        (fit(right // c["d_head"] * (c["d_model"] // c["n_heads"])), "the head width is the config's d_head; it need "
                                                                     "not be d_model / n_heads"),
        (fit(right // c["d_head"] * c["d_model"] // c["n_key_value_heads"]),
         "each K/V head is d_head wide, not d_model"),
        (fit(right // seq_len), "every token of every sequence is cached: multiply by seq_len"),
        (-(-memory // right), "that batch does not fit: a sequence that fits only partly cannot run (round down)"),
    ]


def _batch_cases(check: Check) -> list[tuple[str, dict, int, int, int]]:
    """(name, config, seq_len, memory_bytes, bytes_per_value): the fixed cases, and when grading two drawn fresh."""
    cases = [(name, dict(_CONFIGS[name]), *rest) for name, *rest in _BATCH_CASES]
    if check.grading:
        r = check.rng(31)
        for _ in range(2):
            kv = r.choice([1, 2, 4, 8])
            heads, d_head = kv * r.choice([1, 2, 4]), r.choice([32, 64, 80, 128])
            config = dict(
                n_layers=r.randint(2, 60), d_model=heads * d_head, n_heads=heads, n_key_value_heads=kv, d_head=d_head
            )
            cases.append(("drawn", config, r.randint(64, 16384), r.randint(10**8, 8 * 10**10), r.choice([1, 2, 4])))
    return cases


def _check_batch(largest_batch, check: Check) -> None:
    for name, config, seq_len, memory, nbytes in _batch_cases(check):
        label = f"the {name} config {config}, seq_len={seq_len}, memory_bytes={memory:,}, bytes_per_value={nbytes}"
        got = check.call(largest_batch, config, seq_len, memory, nbytes, label=f"{name} config, seq_len={seq_len}, "
                                                                               f"memory_bytes={memory:,}, "
                                                                               f"bytes_per_value={nbytes}")
        got = expect_whole(got, f"the batch size for {label}")
        want = check.reference(config, seq_len, memory, nbytes)
        if got == want:
            continue
        miss = name_miss(got, [(v, m) for v, m in _batch_mistakes(config, seq_len, memory, nbytes) if v != want])
        raise Wrong(f"for {label}: got a batch of {got:,}; " + (miss or (
            "that many sequences' caches do not fit" if got > want else "a larger batch still fits")
            + ": work out the bytes one sequence's cache takes, over all layers"))


register(Exercise(
    "04", 2, "the largest batch a GPU holds",
    _check_batch,
    hint=["First the bytes of one sequence's cache: per token and layer, a key and a value for every K/V head, "
          "each d_head wide; then all layers, all tokens, bytes per number.",
          "The batch is how many such caches fit in memory_bytes, as a whole number (a cache cannot be split)."],
    solution=(
        "def largest_batch(config, seq_len, memory_bytes, bytes_per_value):\n"
        "    per_token_per_layer = 2 * config['n_key_value_heads'] * config['d_head']   # K and V, shared heads only\n"
        "    per_sequence = per_token_per_layer * config['n_layers'] * seq_len * bytes_per_value\n"
        "    return memory_bytes // per_sequence                                # whole sequences only"
    ),
    minutes=15, difficulty=2, importance=3,
))


# ------------------------------------------------------------------------------------ exercise 3
_GQA_SHAPES = [(2, 5, 24, 6, 2), (1, 7, 32, 4, 1), (3, 4, 16, 4, 4), (2, 6, 48, 8, 2)]  # (B, T, D, H, H_kv)


def _gqa_forward(x, W_Q, W_K, W_V, W_O, n_heads, n_key_value_heads, *, causal=True, interleave=True, scale=True,
                 merge=True, out=True, swapped=False, over=-1, itself=True, values_cycle=False):
    """The one-pass GQA forward (and, with a flag off, the result of a typical mistake: also Q and K
    ``swapped``, the softmax ``over`` another axis, a mask that hides a query's key ``itself``, the values
    shared with ``.repeat`` while the keys are right)."""
    B, T, _ = x.shape
    d_k = W_Q.size(1) // n_heads
    q = (x @ W_Q).view(B, T, n_heads, d_k).transpose(1, 2)        # [B, H, T, dk]
    k = (x @ W_K).view(B, T, n_key_value_heads, d_k).transpose(1, 2)     # [B, H_kv, T, dk]
    v = (x @ W_V).view(B, T, n_key_value_heads, d_k).transpose(1, 2)
    group = n_heads // n_key_value_heads
    share = (lambda z: z.repeat_interleave(group, dim=1)) if interleave else (lambda z: z.repeat(1, group, 1, 1))
    k, v = share(k), (v.repeat(1, group, 1, 1) if values_cycle else share(v))   # [B, H, T, dk]
    if swapped:
        q, k = k, q
    scores = q @ k.transpose(-2, -1) / (d_k ** 0.5 if scale else 1.0)   # [B, H, T, T]
    if causal:  # (a mask that hides a query's own key is -1e9, not -inf, else the first query's row is NaN)
        allowed = torch.ones(T, T, dtype=torch.bool).tril(0 if itself else -1)
        scores = scores.masked_fill(~allowed, float("-inf") if itself else -1e9)
    z = scores.softmax(over) @ v                                  # [B, H, T, dk]
    z = z.transpose(1, 2).reshape(B, T, -1) if merge else z.reshape(B, T, -1)   # [B, T, H dk]
    return z @ W_O if out else z


def _gqa_cases(check: Check) -> list:
    g = check.generator(3)
    cases = []
    for B, T, D, H, G in _GQA_SHAPES:
        d_k = D // H
        W = [torch.randn(D, n * d_k, generator=g) / D**0.5 for n in (H, G, G)]
        cases.append((torch.randn(B, T, D, generator=g), *W, torch.randn(H * d_k, D, generator=g) / D**0.5, H, G))
    return cases


def _check_gqa(gqa_attention, check: Check) -> None:
    for case in _gqa_cases(check):
        x, W_Q, W_K, W_V, W_O, H, G = case
        label = f"x {list(x.shape)}, n_heads={H}, n_key_value_heads={G}"
        got = check.call(gqa_attention, *case, label=label)
        judge(got, check.reference(*case), f"gqa_attention({label})", lambda: {
            "a query sees keys after it: token-by-token decoding only ever has the past in its cache (mask the "
            "future)": _gqa_forward(*case, causal=False),
            "query heads are paired with the wrong K/V heads: the cache stores consecutive query heads' shared head "
            "once (head i uses K/V head i // (n_heads // n_key_value_heads)), and .repeat cycles through them instead":
                _gqa_forward(*case, interleave=False),
            "the scores are not scaled by 1/sqrt(d_k)": _gqa_forward(*case, scale=False),
            "the heads are merged in the wrong order: bring the head axis back next to d_k before reshaping to "
            "[B, T, H * d_k]": _gqa_forward(*case, merge=False),
            "W_O is missing: the concatenated heads still go through the output projection":
                _gqa_forward(*case, out=False),
            "Q and K are swapped: the scores are q kᵀ, each query against the keys of the past (x @ W_Q for the "
            "queries, x @ W_K for the keys)": _gqa_forward(*case, swapped=True),
            "the softmax runs over the queries (dim -2); each query's weights must sum to 1 over the keys, the last "
            "axis": _gqa_forward(*case, over=-2),
            "a query does not see its own key: the causal mask allows keys j <= i, the diagonal included":
                _gqa_forward(*case, itself=False),
            "the keys are shared right but the values with .repeat, which cycles through the K/V heads: share both "
            "with repeat_interleave (head i uses K/V head i // (n_heads // n_key_value_heads))":
                _gqa_forward(*case, values_cycle=True),
        }, note=" (compared with decoding token by token through a KV cache)")


register(Exercise(
    "04", 3, "grouped-query attention in one pass",
    _check_gqa,
    hint=["Project once for the whole sequence: q [B, H, T, d_k], k and v [B, H_kv, T, d_k]. Decoding only ever "
          "saw the past: what does that ask of the one-pass scores?",
          "gqa_decode shares a K/V head with repeat_interleave along the head axis; do the same, then the usual "
          "scaled, causally masked softmax, merge the heads and apply W_O."],
    solution=(
        "def gqa_attention(x, W_Q, W_K, W_V, W_O, n_heads, n_key_value_heads):\n"
        "    B, T, _ = x.shape\n"
        "    d_k = W_Q.size(1) // n_heads\n"
        "    q = (x @ W_Q).view(B, T, n_heads, d_k).transpose(1, 2)        # [B, H, T, dk]\n"
        "    k = (x @ W_K).view(B, T, n_key_value_heads, d_k).transpose(1, 2)     # [B, H_kv, T, dk]\n"
        "    v = (x @ W_V).view(B, T, n_key_value_heads, d_k).transpose(1, 2)\n"
        "    group = n_heads // n_key_value_heads                                 # query heads per K/V head\n"
        "    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # [B, H, T, dk]\n"
        "    scores = q @ k.transpose(-2, -1) / d_k**0.5                  # [B, H, T, T]\n"
        "    future = torch.ones(T, T, dtype=torch.bool).triu(1)\n"
        "    z = scores.masked_fill(future, float('-inf')).softmax(-1) @ v  # [B, H, T, dk]\n"
        "    return z.transpose(1, 2).reshape(B, T, -1) @ W_O              # [B, T, D]"
    ),
    minutes=25, difficulty=3, importance=3,
))
