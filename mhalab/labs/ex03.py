"""Exercises of notebook 03 (it costs nothing): the cost table for a new width, the KV cache of a model,
and the cache of a grouped-query model."""

from __future__ import annotations

from .checks import call_answer, expect_whole, name_miss
from .core import Exercise, Wrong, register


# ------------------------------------------------------------------------------------ exercise 1
_COST_CASES = [(768, 12), (768, 1), (1024, 16), (96, 32), (4096, 64)]  # (d_model, n_heads), none from the notebook


def _cost_mistakes(d_model: int, n_heads: int) -> dict[str, list[tuple[int, str]]]:
    d_k = d_model // n_heads
    return {
        "d_k": [(d_model, "the whole width: each head gets an equal share of d_model"),
                (n_heads, "the head count: d_k is the width of one head")],
        "parameters": [(3 * d_model**2, "you counted W_Q, W_K and W_V but not the output matrix W_O"),
                       (4 * d_model * d_k, "that is one head's share: there are n_heads heads"),
                       (3 * d_model * d_k + d_model**2, "W_Q, W_K, W_V counted for one head only: every head has its own"),
                       (4 * d_model**2 + 4 * d_model, "that includes the biases; count the weight matrices only (bias=False)"),
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


def _check_costs(attention_costs) -> None:
    for d_model, n_heads in _COST_CASES:
        label = f"d_model={d_model}, n_heads={n_heads}"
        got = call_answer(attention_costs, d_model, n_heads, label=label)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise Wrong(f"return a tuple (d_k, parameters, kv_cache) of three numbers; for {label} you returned {got!r}"[:300])
        want = dict(d_k=d_model // n_heads, parameters=4 * d_model**2, kv_cache=2 * d_model)
        for value, (name, right) in zip(got, want.items()):
            value = expect_whole(value, f"{name} for {label}")
            if value != right:
                miss = name_miss(value, _cost_mistakes(d_model, n_heads)[name])
                raise Wrong(f"{name} for {label}: got {value:,}; " + (miss or "think of what it counts, per head, then for all heads"))


register(Exercise(
    "03", 1, "the cost table for a new width",
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
    reference=lambda d_model, n_heads: (d_model // n_heads, 4 * d_model**2, 2 * d_model),
))


# ------------------------------------------------------------------------------------ exercise 2
# Every case has distinct factors, so a missing or extra one is named from the ratio (tests check it).
_CACHE_CASES = [  # (d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value)
    (768, 12, 6, 100, 3, 4),
    (4096, 32, 24, 4096, 7, 1),
    (512, 8, 5, 9, 3, 1),
    (2048, 64, 24, 2000, 8, 4),
]
_CACHE_PARAMS = ("d_model", "n_heads", "n_layers", "seq_len", "batch_size", "bytes_per_value")


def _cache_bytes(d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value):
    return 2 * d_model * n_layers * seq_len * batch_size * bytes_per_value


def _cache_mistakes(d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value) -> list[tuple[float, str]]:
    """(ratio to the right answer, message) of each plausible mistake."""
    return [
        (0.5, "both keys and values are cached (a factor 2)"),
        (1 / n_layers, "every layer keeps its own cache (multiply by n_layers)"),
        (1 / n_heads, "that is one head's cache: all heads together cache 2 * n_heads * d_k = 2 * d_model per token and layer"),
        (n_heads, "d_model already counts every head (n_heads * d_k = d_model): do not multiply by n_heads again"),
        (1 / batch_size, "every sequence in the batch has its own cache (multiply by batch_size)"),
        (1 / bytes_per_value, "that is a count of numbers, not bytes (multiply by bytes_per_value)"),
        (1 / seq_len, "that is per token: the cache holds every token of the sequence"),
        (2.0, "count keys and values once each: 2 numbers of width d_model per token and layer, not 4"),
    ]


def _check_cache(kv_cache_bytes) -> None:
    for case in _CACHE_CASES:
        label = ", ".join(f"{k}={v}" for k, v in zip(_CACHE_PARAMS, case))
        want = _cache_bytes(*case)
        got = expect_whole(call_answer(kv_cache_bytes, *case, label=label), f"the cache size for {label}")
        if got == want:
            continue
        ratio = got / want
        miss = next((m for r, m in _cache_mistakes(*case) if abs(ratio - r) < 1e-9 * max(1.0, r)), None)
        raise Wrong(f"for {label}: got {got:,} bytes; " + (miss or f"off by a factor {ratio:.4g} (think per token, per layer, then scale up)"))


register(Exercise(
    "03", 2, "predict the KV cache of a model",
    _check_cache,
    hint="Per token and layer the cache holds one key and one value for every head: 2 * n_heads * d_k numbers. "
         "Then multiply by what else has its own cache: layers, tokens, sequences in the batch; then bytes.",
    solution=(
        "def kv_cache_bytes(d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value):\n"
        "    d_k = d_model // n_heads\n"
        "    per_token_per_layer = 2 * n_heads * d_k        # = 2 * d_model: n_heads drops out\n"
        "    return per_token_per_layer * n_layers * seq_len * batch_size * bytes_per_value"
    ),
    reference=_cache_bytes,
))


# ------------------------------------------------------------------------------------ exercise 3
# (d_model, n_heads, n_kv_heads, n_layers). In every case the mistakes below give different numbers.
_GQA_CASES = [(768, 12, 4, 5), (4096, 32, 4, 30), (512, 8, 8, 3), (1536, 24, 6, 7)]


def _gqa_values(d_model, n_heads, n_kv_heads, n_layers):
    return 2 * n_kv_heads * (d_model // n_heads) * n_layers


def _gqa_mistakes(d_model, n_heads, n_kv_heads, n_layers) -> list[tuple[int, str]]:
    d_k = d_model // n_heads
    return [
        (2 * d_model * n_layers, "that is 2 * d_model per token and layer, the cache of ordinary multi-head attention. "
                                 "Here only the n_kv_heads K/V heads are cached, each as wide as a query head (d_k)"),
        (n_kv_heads * d_k * n_layers, "both keys and values are cached (a factor 2)"),
        (2 * n_kv_heads * d_k, "every layer keeps its own cache (multiply by n_layers)"),
        (2 * n_heads * d_k * n_layers // n_kv_heads, "the cache shrinks with fewer K/V heads: it is proportional to n_kv_heads"),
        (2 * n_kv_heads * d_model * n_layers, "each K/V head is d_k = d_model / n_heads wide, not d_model"),
    ]


def _check_gqa(gqa_cache_per_token) -> None:
    for case in _GQA_CASES:
        label = "d_model={}, n_heads={}, n_kv_heads={}, n_layers={}".format(*case)
        got = expect_whole(call_answer(gqa_cache_per_token, *case, label=label), f"the number of cached values for {label}")
        if got != _gqa_values(*case):
            raise Wrong(f"for {label}: got {got:,}; " + (name_miss(got, _gqa_mistakes(*case))
                        or "per token and layer: one key and one value of width d_k for each K/V head"))


register(Exercise(
    "03", 3, "the cache of a grouped-query model",
    _check_gqa,
    hint="Only the K/V heads are cached; each is still d_k = d_model / n_heads wide (the query heads set d_k).",
    solution=(
        "def gqa_cache_per_token(d_model, n_heads, n_kv_heads, n_layers):\n"
        "    d_k = d_model // n_heads                 # the head width is set by the query heads\n"
        "    return 2 * n_kv_heads * d_k * n_layers   # keys and values of the K/V heads only, in every layer"
    ),
    reference=_gqa_values,
))
