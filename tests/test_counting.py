"""mhalab.counting: the seed's table, the formulas against real modules and caches, and bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mhalab.attention import MultiHeadAttention
from mhalab.counting import (
    attention_parameters,
    cost_table,
    count_parameters,
    kv_cache_per_token,
)
from mhalab.kv_cache import KVCache
from mhalab.torch_interop import to_torch

# The seed's table for d_model = 512: heads, d_k, Q+K+V+O parameters, KV cache per token per layer.
SEED_TABLE = """
heads	d_k	Q, K, V, O parameters	KV cache per token per layer
1	512	1,048,576	1,024
8	64	1,048,576	1,024
32	16	1,048,576	1,024
64	8	1,048,576	1,024
"""


def seed_rows() -> list[list[str]]:
    return [line.split("\t") for line in SEED_TABLE.strip().splitlines()[1:]]


@pytest.fixture(scope="module")
def table():
    return cost_table()


def test_every_row_is_the_same_at_d_model_512(table):
    assert [row.heads for row in table] == [1, 8, 32, 64]
    assert [row.d_head for row in table] == [512, 64, 16, 8]
    for row in table:
        assert row.parameters == row.parameters_formula == 1_048_576 == 4 * 512**2
        assert row.kv_cache == row.kv_cache_formula == 1_024 == 2 * 512


def test_printing_gives_the_seeds_table(table):
    text = str(table)
    lines = text.splitlines()
    assert lines[0] == "d_model = 512"
    for word in ("heads", "d_k", "Q, K, V, O parameters", "KV cache per token per layer"):
        assert word in lines[1]
    printed = [line.split() for line in lines[2:]]
    assert printed == seed_rows(), f"printed table differs from the seed's:\n{text}"
    assert repr(table) == text  # a notebook cell ending in `cost_table()` shows the table


def test_bias_adds_4_d_model():
    table = cost_table(64, heads=(1, 4, 64), bias=True)
    assert "with biases" in str(table)
    for row in table:
        assert row.parameters == 4 * 64**2 + 4 * 64
        assert row.kv_cache == 2 * 64  # biases do not change what is cached


@pytest.mark.parametrize("d_model, n_heads", [(512, 8), (48, 3), (7, 7), (10, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_formula_matches_a_real_module(d_model, n_heads, bias):
    formula = attention_parameters(d_model, n_heads, bias=bias)
    module = MultiHeadAttention(d_model, n_heads, bias=bias)
    assert formula.total == count_parameters(module) == count_parameters(to_torch(module))
    assert formula.d_head * n_heads == d_model
    # per projection: Q, K, V are the three thirds of qkv_proj, O is out_proj
    assert formula.qkv == count_parameters(module.qkv_proj)
    assert formula.o == count_parameters(module.out_proj)
    assert formula.q == formula.k == formula.v == d_model**2 + (d_model if bias else 0)
    assert formula.per_head_qkv * n_heads == formula.qkv
    head = module.head_projections(0)
    per_head = sum(t.numel() for t in (head.W_Q, head.W_K, head.W_V, head.b_Q, head.b_K, head.b_V) if t is not None)
    assert formula.per_head_qkv == per_head


def test_count_parameters_skips_frozen_ones():
    module = MultiHeadAttention(16, 4)
    module.out_proj.requires_grad_(False)
    assert count_parameters(module) == 3 * 16**2 + 3 * 16
    assert count_parameters(nn.Linear(3, 2)) == 8


def test_kv_cache_formula_matches_a_real_cache():
    module = MultiHeadAttention(32, 4).eval()
    cache = KVCache()
    module(torch.randn(2, 3, 32), kv_cache=cache, is_causal=True)
    module(torch.randn(2, 1, 32), kv_cache=cache)
    size = kv_cache_per_token(32, 4, dtype=torch.float32)
    assert size.elements == cache.values_per_token == 64
    assert size.bytes == cache.bytes_per_token == 256


@pytest.mark.parametrize(
    "dtype, n_layers, elements, nbytes",
    [
        (None, 1, 1_024, None),
        (torch.float32, 1, 1_024, 4_096),
        (torch.bfloat16, 1, 1_024, 2_048),
        (torch.float16, 6, 6_144, 12_288),
        (torch.float32, 12, 12_288, 49_152),
    ],
)
def test_kv_cache_per_token(dtype, n_layers, elements, nbytes):
    for n_heads in (1, 8, 64):  # the head count does not matter
        size = kv_cache_per_token(512, n_heads, n_layers=n_layers, dtype=dtype)
        assert (size.elements, size.bytes) == (elements, nbytes)


class TestBadInput:
    def test_indivisible_head_count(self):
        for call in (lambda: attention_parameters(512, 3), lambda: kv_cache_per_token(512, 3),
                     lambda: cost_table(512, heads=(8, 3))):
            with pytest.raises(ValueError, match=r"d_model=512 is not divisible by n_heads=3.*1, 2, 4, 8"):
                call()

    @pytest.mark.parametrize("n_layers, error, message", [
        (0, ValueError, "n_layers must be at least 1, got n_layers=0"),
        (-2, ValueError, "n_layers must be at least 1"),
        (1.5, TypeError, "n_layers must be an int, got float"),
        (True, TypeError, "n_layers must be an int, got bool"),
    ])
    def test_n_layers(self, n_layers, error, message):
        with pytest.raises(error, match=message):
            kv_cache_per_token(512, 8, n_layers=n_layers)

    def test_dtype(self):
        with pytest.raises(TypeError, match="dtype must be a torch.dtype such as torch.float32"):
            kv_cache_per_token(512, 8, dtype="float32")

    def test_heads(self):
        with pytest.raises(TypeError, match=r"heads must be a sequence of head counts such as \(1, 8, 32, 64\)"):
            cost_table(512, heads=8)
        with pytest.raises(ValueError, match="heads is empty"):
            cost_table(512, heads=())
        with pytest.raises(ValueError, match="n_heads must be at least 1"):
            cost_table(512, heads=(0,))
        with pytest.raises(ValueError, match="decode_tokens must be at least 1"):
            cost_table(64, heads=(1,), decode_tokens=0)


@pytest.mark.parametrize(
    "d_model, n_heads, n_key_value_heads, d_head",
    [(64, 8, 2, None), (64, 8, 1, None), (64, 8, None, 16), (30, 6, 3, 8), (576, 9, 3, 64)],
)
@pytest.mark.parametrize("bias", [False, True])
def test_formulas_match_real_modules_for_grouped_query_and_any_head_size(d_model, n_heads, n_key_value_heads, d_head,
                                                                         bias):
    import torch

    from mhalab.attention import MultiHeadAttention
    from mhalab.counting import attention_parameters, count_parameters, kv_cache_per_token
    from mhalab.kv_cache import KVCache

    module = MultiHeadAttention(d_model, n_heads, n_key_value_heads=n_key_value_heads, d_head=d_head, bias=bias)
    formula = attention_parameters(d_model, n_heads, n_key_value_heads=n_key_value_heads, d_head=d_head, bias=bias)
    assert count_parameters(module) == formula.total
    cache = KVCache()
    module(torch.randn(1, 2, d_model), kv_cache=cache, is_causal=True)
    formula = kv_cache_per_token(d_model, n_heads, n_key_value_heads=n_key_value_heads, d_head=d_head)
    assert cache.values_per_token == formula.elements
    g = n_key_value_heads or n_heads
    d_k = d_head or d_model // n_heads
    per_token = kv_cache_per_token(d_model, n_heads, n_key_value_heads=n_key_value_heads, d_head=d_head, n_layers=30)
    assert per_token.elements == 2 * g * d_k * 30


def test_grouped_query_counting_refuses_bad_groups():
    from mhalab.counting import attention_parameters

    with pytest.raises(ValueError, match="not a multiple of n_key_value_heads=4"):
        attention_parameters(576, 9, n_key_value_heads=4)
