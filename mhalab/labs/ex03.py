"""Exercises of notebook 03 (it costs nothing): the cost table for a new width, the KV cache of a model,
and the cache of a grouped-query model."""

from __future__ import annotations

from numbers import Real

from .core import Exercise, Wrong, register


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _whole(value, what: str, case: str):
    """The learner's number as a Python number (a 0-d tensor or numpy scalar is accepted too)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if not _is_number(value):
        raise Wrong(f"{what} should be a number, got {type(value).__name__} ({value!r}) for {case}")
    return value


# ------------------------------------------------------------------------------------ exercise 1
_COST_CASES = [(768, 12), (768, 1), (1024, 16), (96, 32), (4096, 64)]  # (d_model, n_heads), none from the notebook


def _check_costs(costs) -> None:
    for d_model, n_heads in _COST_CASES:
        d_k = d_model // n_heads
        case = f"d_model={d_model}, n_heads={n_heads}"
        got = costs(d_model, n_heads)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise Wrong(f"return a tuple (d_k, parameters, kv_cache_per_token), got {got!r} for {case}")
        got_dk, got_params, got_cache = (_whole(v, name, case) for v, name in zip(got, ("d_k", "parameters", "kv_cache")))
        if got_dk != d_k:
            if got_dk == d_model:
                raise Wrong(f"d_k for {case} is {got_dk}, the whole width: each head gets an equal share of d_model")
            if got_dk == n_heads:
                raise Wrong(f"d_k for {case} is {got_dk}, the head count: d_k is the width of one head")
            raise Wrong(f"d_k for {case} is off: got {got_dk}, expected a number between 1 and d_model")
        if got_params != 4 * d_model**2:
            hints = {
                3 * d_model**2: "you counted W_Q, W_K and W_V but not the output matrix W_O",
                4 * d_model * d_k: "that is one head's share: there are n_heads heads",
                3 * d_model * d_k + d_model**2: "W_Q, W_K, W_V counted for one head only: every head has its own",
                4 * d_model**2 + 4 * d_model: "that includes the biases; count the weight matrices only (bias=False)",
                4 * d_model**2 * n_heads: "each head projects to d_k dimensions, not to d_model",
                3 * d_model**2 * n_heads + d_model**2: "each head projects to d_k dimensions, not to d_model",
                2 * d_model**2: "count all four matrices: W_Q, W_K, W_V and W_O",
            }
            raise Wrong(f"parameters for {case}: got {got_params:,}; " + hints.get(
                got_params, f"expected something of the order of d_model**2 = {d_model**2:,}"))
        if got_cache != 2 * d_model:
            hints = {
                d_model: "both the keys and the values are cached",
                2 * d_k: "that is one head: every head caches its own keys and values",
                d_k: "that is one head's keys: every head caches its own keys and values",
                2 * d_model * n_heads: "each head caches d_k numbers per key, not d_model",
                4 * d_model: "only K and V are cached (queries are used once and thrown away)",
                3 * d_model: "only K and V are cached (queries are used once and thrown away)",
            }
            raise Wrong(f"KV cache per token for {case}: got {got_cache:,}; " + hints.get(
                got_cache, f"expected a small multiple of d_model = {d_model}"))


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
    wrong=[
        lambda d_model, n_heads: (d_model, 4 * d_model**2, 2 * d_model),  # d_model instead of d_k
        lambda d_model, n_heads: (d_model // n_heads, 3 * d_model**2, 2 * d_model),  # forgot W_O
        lambda d_model, n_heads: (d_model // n_heads, 4 * d_model**2, 2 * (d_model // n_heads)),  # one head's cache
        lambda d_model, n_heads: (d_model // n_heads, 4 * d_model**2, d_model),  # keys only
    ],
))


# ------------------------------------------------------------------------------------ exercise 2
# The first case has distinct factors, so a missing or extra one can be named from the ratio.
_CACHE_CASES = [
    dict(d_model=768, n_heads=12, n_layers=6, seq_len=100, batch_size=3, bytes_per_value=4),
    dict(d_model=4096, n_heads=32, n_layers=32, seq_len=4096, batch_size=1, bytes_per_value=2),
    dict(d_model=512, n_heads=1, n_layers=1, seq_len=1, batch_size=1, bytes_per_value=1),
    dict(d_model=2048, n_heads=64, n_layers=24, seq_len=2000, batch_size=8, bytes_per_value=2),
]


def _cache_bytes(d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value):
    return 2 * d_model * n_layers * seq_len * batch_size * bytes_per_value


def _check_cache(kv_cache_bytes) -> None:
    for case in _CACHE_CASES:
        want = _cache_bytes(**case)
        text = ", ".join(f"{k}={v}" for k, v in case.items())
        got = _whole(kv_cache_bytes(**case), "the cache size", text)
        if got == want:
            continue
        ratio = got / want
        d_k = case["d_model"] // case["n_heads"]
        factors = {
            0.5: "both keys and values are cached (a factor 2)",
            1 / case["n_layers"]: "every layer keeps its own cache (multiply by n_layers)",
            1 / case["n_heads"]: "that is one head's cache: all heads together cache 2 * n_heads * d_k = 2 * d_model per token and layer",
            case["n_heads"]: "d_model already counts every head (n_heads * d_k = d_model): do not multiply by n_heads again",
            1 / case["batch_size"]: "every sequence in the batch has its own cache (multiply by batch_size)",
            1 / case["bytes_per_value"]: "that is a count of numbers, not bytes (multiply by bytes_per_value)",
            1 / case["seq_len"]: "that is per token: the cache holds every token of the sequence",
            2.0: "count keys and values once each: 2 numbers of width d_model per token and layer, not 4",
        }
        for factor, message in factors.items():
            if abs(ratio - factor) < 1e-9 * max(1.0, factor):
                raise Wrong(f"for {text}: got {got:,} bytes; {message}")
        raise Wrong(f"for {text}: got {got:,} bytes, off by a factor {ratio:.4g} "
                    f"(d_k = {d_k}; think per token, per layer, then scale up)")


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
    wrong=[
        lambda d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value:
            d_model * n_layers * seq_len * batch_size * bytes_per_value,  # forgot K and V
        lambda d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value:
            2 * d_model * seq_len * batch_size * bytes_per_value,  # forgot layers
        lambda d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value:
            2 * (d_model // n_heads) * n_layers * seq_len * batch_size * bytes_per_value,  # d_k instead of d_model
        lambda d_model, n_heads, n_layers, seq_len, batch_size, bytes_per_value:
            2 * d_model * n_heads * n_layers * seq_len * batch_size * bytes_per_value,  # times h again
    ],
))


# ------------------------------------------------------------------------------------ exercise 3
_GQA_CASES = [
    dict(d_model=4096, n_heads=32, n_kv_heads=8, n_layers=32),
    dict(d_model=768, n_heads=12, n_kv_heads=1, n_layers=5),
    dict(d_model=512, n_heads=8, n_kv_heads=8, n_layers=1),
    dict(d_model=1536, n_heads=24, n_kv_heads=6, n_layers=3),
]


def _gqa_values(d_model, n_heads, n_kv_heads, n_layers):
    return 2 * n_kv_heads * (d_model // n_heads) * n_layers


def _check_gqa(gqa_cache_per_token) -> None:
    for case in _GQA_CASES:
        want = _gqa_values(**case)
        text = ", ".join(f"{k}={v}" for k, v in case.items())
        got = _whole(gqa_cache_per_token(**case), "the number of cached values", text)
        if got == want:
            continue
        d_model, h, kv, layers = case["d_model"], case["n_heads"], case["n_kv_heads"], case["n_layers"]
        hints = {
            2 * d_model * layers: "that is 2 * d_model per token and layer, the cache of ordinary multi-head "
                                  "attention. Here only the n_kv_heads K/V heads are cached, and each is as wide "
                                  "as a query head (d_k = d_model / n_heads), not wider",
            kv * (d_model // h) * layers: "both keys and values are cached (a factor 2)",
            2 * kv * (d_model // h): "every layer keeps its own cache (multiply by n_layers)",
            2 * h * (d_model // h) * layers // kv: "the cache shrinks with fewer K/V heads: it is proportional to n_kv_heads",
        }
        raise Wrong(f"for {text}: got {got:,}; " + hints.get(
            got, "per token and layer: one key and one value of width d_k for each K/V head"))


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
    wrong=[
        lambda d_model, n_heads, n_kv_heads, n_layers: 2 * d_model * n_layers,  # ignores grouping
        lambda d_model, n_heads, n_kv_heads, n_layers: 2 * n_kv_heads * (d_model // n_heads),  # forgot layers
    ],
))
