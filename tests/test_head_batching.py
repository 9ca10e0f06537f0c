"""Tests for mhalab.head_batching: counting attention operations, batched vs looped heads.

(Seeing the calls on a real model is done with hooks: tests/test_hooks.py.)
"""

import pytest
import torch

from mhalab import MultiHeadAttention
from mhalab.head_batching import (
    batched_attention,
    batched_heads,
    count_attention,
    looped_attention,
    looped_heads,
    random_attention_layer,
    time_heads,
    time_interleaved,
)
from mhalab.models import ModelConfig


def test_decoder_only_32_by_32_is_1024_operations():
    stack = count_attention(ModelConfig(d_vocab=32000, d_model=4096, n_heads=32, n_layers=32, causal=True))
    assert stack.attention_blocks == 32
    assert stack.attention_operations == 1024
    assert stack.sequential_steps == 32
    assert stack.breakdown() == {"decoder self-attention (causal)": 1024}


def test_encoder_decoder_counts_cross_attention_twice_per_decoder_layer():
    stack = count_attention(ModelConfig(d_vocab=37000, d_model=512, n_heads=8, n_layers=6), encoder_decoder=True)
    assert stack.attention_operations == 6 * 8 + 6 * 8 * 2 == 144
    assert stack.sequential_steps == 18
    assert sum(stack.breakdown().values()) == stack.attention_operations


def test_an_encoder_is_counted_and_the_count_matches_the_calls_of_a_built_model():
    from mhalab.encoder_decoder import EncoderDecoder
    from mhalab.hooks import run_with_cache
    from mhalab.models import Transformer

    config = ModelConfig(d_vocab=7, d_model=8, n_heads=2, n_layers=3)
    assert count_attention(config).breakdown() == {"encoder self-attention": 6}
    x = torch.zeros(1, 4, dtype=torch.long)
    for model, count, inputs in ((Transformer(config), count_attention(config), (x,)),
                                 (EncoderDecoder(config), count_attention(config, encoder_decoder=True), (x, x))):
        _, cache = run_with_cache(model.eval(), *inputs, names_filter=lambda name: name.endswith("hook_pattern"))
        assert len(cache) == count.attention_blocks
        assert sum(p.size(1) for p in cache.values()) == count.attention_operations


def test_count_attention_needs_a_model_config():
    with pytest.raises(TypeError, match="count_attention needs a ModelConfig, got dict"):
        count_attention(dict(n_heads=4, n_layers=2))


@pytest.mark.parametrize("h", [1, 4, 16])
def test_batched_and_looped_compute_the_same(h):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 5, 32 // h, generator=g) for _ in range(3))
    torch.testing.assert_close(batched_attention(q, k, v), looped_attention(q, k, v))
    w = random_attention_layer(32, h, generator=g)
    x = torch.randn(2, 5, 32, generator=g)
    torch.testing.assert_close(batched_heads(x, w), looped_heads(x, w), atol=1e-5, rtol=1e-5)


def test_batched_heads_matches_multi_head_attention_module():
    g = torch.Generator().manual_seed(1)
    layer = random_attention_layer(32, 4, generator=g)
    assert isinstance(layer, MultiHeadAttention) and not layer.bias
    x = torch.randn(2, 6, 32, generator=g)
    torch.testing.assert_close(batched_heads(x, layer), layer(x)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("part", ["attention", "layer"])
def test_time_heads_returns_one_row_per_head_count(part):
    threads = torch.get_num_threads()
    rows = time_heads((1, 4), part=part, d_model=32, seq_len=8, repeats=2, warmup=0)
    assert [r.heads for r in rows] == [1, 4] and [r.d_head for r in rows] == [32, 8]
    assert all(r.batched_s > 0 and r.looped_s > 0 and r.ratio == r.looped_s / r.batched_s for r in rows)
    assert all(len(r.round_ratios) == 2 and all(x > 0 for x in r.round_ratios) for r in rows)  # one per round
    assert torch.get_num_threads() == threads  # restored


def test_time_interleaved_rotates_the_order_and_reads_the_clock_it_is_given():
    calls, ticks = [], iter(range(1000))
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    # a clock that advances by one per reading: every sample is exactly one tick, whatever the wall clock does
    times = time_interleaved(fns, repeats=3, warmup=1, clock=lambda: next(ticks))
    assert times == {"a": [1, 1, 1], "b": [1, 1, 1]}
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]  # one warm-up round, then three, each starting further on


def test_time_heads_rejects_bad_arguments():
    with pytest.raises(ValueError, match="part must be one of"):
        time_heads(part="everything")
    with pytest.raises(ValueError, match="not divisible"):
        time_heads((3,), d_model=32)
    with pytest.raises(ValueError, match="repeats"):
        time_heads(repeats=0)


def test_benchmark_script_prints_and_writes_json(tmp_path, capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "heads_parallel.py"
    spec = importlib.util.spec_from_file_location("heads_parallel", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.json"
    result = bench.main(["--d-model", "32", "--heads", "1,4", "--sizes", "1x8", "--repeats", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    assert [r["heads"] for r in result["runs"][0]["rows"]] == [1, 4]
    assert {run["part"] for run in result["runs"]} == {"attention", "layer"}
    assert "looped/batched" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "64"])
