"""Exercises of notebook 04 (it costs nothing): the cost table for a new width (a warm-up), the largest
batch a GPU holds for a real grouped-query model, and grouped-query attention in one pass, equal to the
token-by-token decode through a KV cache."""

from __future__ import annotations

import torch

from .calls import Check
from .core import Exercise, register
from .judging import expect_whole, judge, name_miss
from .verdicts import Wrong

# ------------------------------------------------------------------------------------ exercise 1
_COST_CASES = [(768, 12), (768, 1), (1024, 16), (96, 32), (4096, 64)]  # (d_model, n_heads), none from the notebook


def _cost_mistakes(d_model: int, n_heads: int) -> dict[str, list[tuple[int, str]]]:
    d_k = d_model // n_heads
    return {
        "d_k": [(d_model, "the whole width: each head gets an equal share of d_model"),
                (n_heads, "the head count: d_k is the width of one head")],
        "parameters": [(3 * d_model**2, "you counted W_Q, W_K and W_V but not the output matrix W_O"),
                       (4 * d_model * d_k, "that is one head's share: there are n_heads heads"),
                       (3 * d_model * d_k + d_model**2, "W_Q, W_K, W_V counted for one head only: every head has its "
                                                        "own"),
                       (4 * d_model**2 + 4 * d_model, "that includes the biases; count the weight matrices only "
                                                      "(bias=False)"),
                       (4 * d_model**2 * n_heads, "each head projects to d_k dimensions, not to d_model"),
                       (3 * d_model**2 * n_heads + d_model**2, "each head projects to d_k dimensions, not to d_model"),
                       (2 * d_model**2, "count all four matrices: W_Q, W_K, W_V and W_O")],
        "kv_cache": [(d_model, "both the keys and the values are cached"),
                     (2 * d_k, "that is one head: every head caches its own keys and values"),
                     (d_k, "that is one head's keys: every head caches its own keys and values"),
                     (2 * d_model * n_heads, "each head caches d_k numbers per key, not d_model"),
                     (4 * d_model, "only K and V are cached (queries are used once and thrown away)"),
                     (3 * d_model, "only K and V are cached (queries are used once and thrown away)")],
    }


def _cost_cases(check: Check) -> list[tuple[int, int]]:
    """The fixed cases, and when grading two drawn fresh."""
    r = check.rng(30)
    fresh = [(h * r.randint(2, 96), h) for h in (r.randint(2, 40), r.randint(2, 40))]
    return list(_COST_CASES) + (fresh if check.grading else [])


def _check_costs(attention_costs, check: Check) -> None:
    for d_model, n_heads in _cost_cases(check):
        label = f"d_model={d_model}, n_heads={n_heads}"
        got = check.call(attention_costs, d_model, n_heads, label=label)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise Wrong(f"return a tuple (d_k, parameters, kv_cache) of three numbers; for {label} you returned "
                        f"{got!r}"[:300])
        want = dict(zip(("d_k", "parameters", "kv_cache"), check.reference(d_model, n_heads)))
        for value, (name, right) in zip(got, want.items()):
            value = expect_whole(value, f"{name} for {label}")
            if value != right:
                miss = name_miss(value, _cost_mistakes(d_model, n_heads)[name])
                raise Wrong(f"{name} for {label}: got {value:,}; " + (miss or "think of what it counts, per head, then "
                                                                              "for all heads"))


register(Exercise(
    "04", 1, "the cost table for a new width",
    _check_costs,
    hint="Each of the h heads has three [d_model, d_k] matrices; W_O is [d_model, d_model]. The cache keeps "
         "one key and one value of width d_k per head and token. Then use h * d_k = d_model.",
    solution=(
        "def attention_costs(d_model, n_heads):\n"
        "    d_k = d_model // n_heads\n"
        "    parameters = n_heads * 3 * d_model * d_k + d_model * d_model   # = 4 * d_model**2\n"
        "    kv_cache = 2 * n_heads * d_k                                   # = 2 * d_model\n"
        "    return d_k, parameters, kv_cache"
    ),
    minutes=10, difficulty=1, importance=4,
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
