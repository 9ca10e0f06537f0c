"""How many attention operations a transformer runs, in what order, and why the heads are batched.

:func:`count_attention` counts them from a :class:`~mhalab.config.ModelConfig` (one per head per attention
block); :func:`time_heads` times all heads
as one batched operation against a Python loop over the heads (``benchmarks/heads_parallel.py`` on any
device). The calls themselves are seen on a real model with :mod:`mhalab.hooks`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from .arguments import validate_head_count, validate_int
from .attention import MultiHeadAttention
from .config import ModelConfig
from .device import synchronize

__all__ = [
    "AttentionCount", "count_attention", "batched_attention", "looped_attention", "random_attention_layer",
    "separate_heads", "batched_heads", "looped_heads", "PARTS", "HeadTiming", "time_interleaved", "time_heads",
]


# --------------------------------------------------------------------------- counting
@dataclass(frozen=True)
class AttentionCount:
    """The attention blocks one forward pass runs (what :func:`count_attention` returns): ``encoder_blocks`` see
    the whole input, ``decoder_blocks`` are causal, ``cross_blocks`` read an encoder's output; each has ``n_heads``."""

    n_heads: int
    encoder_blocks: int = 0
    decoder_blocks: int = 0
    cross_blocks: int = 0

    @property
    def attention_blocks(self) -> int:
        """Multi-head attention blocks per forward pass (each a separate call, run in sequence)."""
        return self.encoder_blocks + self.decoder_blocks + self.cross_blocks

    @property
    def attention_operations(self) -> int:
        """Single-head attention operations per forward pass: one per head per block."""
        return self.attention_blocks * self.n_heads

    # Blocks run one after another (each reads the previous one's output); only the heads *within* a block
    # are independent, so the operations run as this many steps of n_heads.
    sequential_steps = attention_blocks

    def breakdown(self) -> dict[str, int]:
        """Operations per kind of attention (only the kinds this model has)."""
        parts = {
            "encoder self-attention": self.encoder_blocks * self.n_heads,
            "decoder self-attention (causal)": self.decoder_blocks * self.n_heads,
            "cross-attention": self.cross_blocks * self.n_heads,
        }
        return {kind: n for kind, n in parts.items() if n}


def count_attention(config: ModelConfig, *, encoder_decoder: bool = False) -> AttentionCount:
    """The attention blocks of ``Transformer(config)`` (``n_layers`` encoder blocks, or causal decoder blocks with
    ``config.causal``), or with ``encoder_decoder`` of ``EncoderDecoder(config)`` (``n_layers`` each in the encoder
    and the decoder, and a cross-attention in every decoder layer). Counted from the config: no model is built."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"count_attention needs a ModelConfig, got {type(config).__name__}; e.g. count_attention("
                        "ModelConfig(d_vocab=32000, d_model=4096, n_heads=32, n_layers=32, causal=True))")
    N = config.n_layers
    if encoder_decoder:
        return AttentionCount(config.n_heads, encoder_blocks=N, decoder_blocks=N, cross_blocks=N)
    if config.causal:
        return AttentionCount(config.n_heads, decoder_blocks=N)
    return AttentionCount(config.n_heads, encoder_blocks=N)


# --------------------------------------------------------------------------- two ways to run h heads
def batched_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Every head's attention as one operation: ``q, k, v`` ``[B, H, T, d_head]`` -> ``[B, H, T, d_head]``."""
    return F.scaled_dot_product_attention(q, k, v)  # the head axis is just another batch axis


def looped_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The same result, one head at a time: ``H`` separate calls, then stacked back together."""
    heads = [F.scaled_dot_product_attention(*qkv) for qkv in zip(q.split(1, 1), k.split(1, 1), v.split(1, 1))]
    return torch.cat(heads, dim=1)  # H x [B, 1, T, d_head] -> [B, H, T, d_head]


def random_attention_layer(d_model: int, n_heads: int, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, generator: torch.Generator | None = None) -> MultiHeadAttention:
    """A bias-free ``n_heads``-head :class:`MultiHeadAttention` of width ``d_model``, its weights drawn from
    ``generator``."""
    validate_head_count(d_model, n_heads)
    layer = MultiHeadAttention(d_model, n_heads, bias=False, device=device, dtype=dtype).requires_grad_(False)
    for weight in (layer.qkv_proj.weight, layer.out_proj.weight):  # W_QKV [3 D, D] (rows: Q, K, V), then W_O [D, D]
        weight.copy_(torch.randn(weight.shape, generator=generator) * d_model**-0.5)  # keeps activations at unit scale
    return layer


def separate_heads(layer: MultiHeadAttention) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Each head's ``(W_Q, W_K, W_V)`` ``[D, dk]`` (:meth:`~MultiHeadAttention.head_projections`) copied into
    tensors of its own, as if every head were its own small module."""
    return [tuple(W.contiguous() for W in layer.head_projections(i)[:3]) for i in range(layer.n_heads)]


def batched_heads(x: Tensor, layer: MultiHeadAttention) -> Tensor:
    """A whole layer ``[B, T, D]`` -> ``[B, T, D]``, all heads at once: one projection, one attention call."""
    q, k, v = layer.qkv_proj(x).split(layer.d_model, dim=-1)  # 3 x [B, T, D]: every head's projection in one matmul
    q, k, v = (layer.split_heads(t) for t in (q, k, v))  # [B, T, D] -> [B, H, T, dk]
    return layer.out_proj(layer.merge_heads(batched_attention(q, k, v)))  # [B, H, T, dk] -> [B, T, D] -> W_O


def looped_heads(x: Tensor, layer: MultiHeadAttention, heads: list | None = None) -> Tensor:
    """:func:`batched_heads` one head at a time, each with its own projections (``heads``: :func:`separate_heads`,
    made once for timing): the same FLOPs, as about ``4 h`` small operations instead of a few large ones.
    ``[B, T, D]`` -> ``[B, T, D]``."""
    outputs = []
    for W_Q, W_K, W_V in separate_heads(layer) if heads is None else heads:
        q, k, v = ((x @ W).unsqueeze(1) for W in (W_Q, W_K, W_V))  # 3 x [B, T, dk] -> [B, 1, T, dk]
        outputs.append(F.scaled_dot_product_attention(q, k, v).squeeze(1))  # [B, 1, T, dk] -> [B, T, dk]: one head
    return layer.out_proj(torch.cat(outputs, dim=-1))  # H x [B, T, dk] -> [B, T, D] -> W_O


# --------------------------------------------------------------------------- timing
PARTS = ("attention", "layer")


def time_interleaved(fns: dict, *, repeats: int, warmup: int = 1, inner: int = 1,
                     device: torch.device | str = "cpu", clock=time.perf_counter) -> dict:
    """``{name: [repeats]}`` seconds per call of each of ``fns`` (``{name: function}``), each sample the
    mean of ``inner`` back-to-back calls. Rounds interleave the functions (starting one further along
    each round) so that load from elsewhere hits them alike: compare medians. ``clock`` is wall time by
    default; ``time.process_time`` (this process's CPU time) is steadier on a shared machine, with one thread."""
    device = torch.device(device)
    names = list(fns)
    times: dict = {name: [] for name in names}
    for r in range(warmup + repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate: no one always goes first
            synchronize(device)
            start = clock()
            for _ in range(inner):
                fns[name]()
            synchronize(device)
            if r >= warmup:
                times[name].append((clock() - start) / inner)
    return times


@dataclass(frozen=True)
class HeadTiming:
    """Median seconds per call of the batched and the looped version for one head count, and ``round_ratios``:
    looped / batched in each interleaved round (``[repeats]``, in round order), to compare round by round."""

    heads: int
    d_head: int
    batched_s: float
    looped_s: float
    repeats: int
    round_ratios: tuple[float, ...] = field(default=(), repr=False)

    @property
    def ratio(self) -> float:
        """How many times faster the batched version is (looped time / batched time)."""
        return self.looped_s / self.batched_s

    def as_dict(self) -> dict:
        return {**asdict(self), "round_ratios": list(self.round_ratios), "ratio": self.ratio}


def time_heads(heads=(1, 8, 32, 64), *, part: str = "attention", d_model: int = 512, batch: int = 1,
               seq_len: int = 64, repeats: int = 51, inner: int = 1, warmup: int = 3,
               device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               threads: int | None = 1) -> list[HeadTiming]:
    """Median times of all heads as one batched operation and as a Python loop over them, per head count
    at one ``d_model``: the attention alone (``part="attention"``, from ``[B, H, T, d_head]`` q, k, v) or whole
    layers (``"layer"``). Both are checked to agree first; ``threads``: torch's CPU threads while timing."""
    heads = tuple(heads)
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    for name, value in (("repeats", repeats), ("inner", inner), ("batch", batch), ("seq_len", seq_len)):
        validate_int(name, value, 1)
    if not heads:
        raise ValueError("heads must name at least one head count, e.g. (1, 8, 32, 64)")
    device = torch.device(device)
    tolerance = (1e-4 if device.type == "cpu" else 1e-3) if dtype == torch.float32 else 5e-2  # GPUs may use TF32
    g = torch.Generator().manual_seed(0)
    versions = {}  # {h: (batched, looped)}: two functions computing the same tensor
    for h in heads:
        d_head = validate_head_count(d_model, h)
        if part == "attention":  # 3 x [B, H, T, d_head], as the projections would hand them over
            qkv = [torch.randn(batch, h, seq_len, d_head, generator=g).to(device, dtype) for _ in range(3)]
            versions[h] = (partial(batched_attention, *qkv), partial(looped_attention, *qkv))
        else:
            x = torch.randn(batch, seq_len, d_model, generator=g).to(device, dtype)  # [B, T, D]
            layer = random_attention_layer(d_model, h, device=device, dtype=dtype, generator=g)
            versions[h] = (partial(batched_heads, x, layer), partial(looped_heads, x, layer, separate_heads(layer)))

    previous_threads = torch.get_num_threads()
    if threads is not None and device.type == "cpu":
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for h, (batched, looped) in versions.items():  # the same result both ways, so the race is fair
                if not torch.allclose(batched().float(), looped().float(), atol=tolerance, rtol=tolerance):
                    raise AssertionError(f"batched and looped heads disagree at h={h}")
            fns = {("batched", h): pair[0] for h, pair in versions.items()}
            fns.update({("looped", h): pair[1] for h, pair in versions.items()})
            times = time_interleaved(fns, repeats=repeats, warmup=warmup, inner=inner, device=device)
    finally:
        torch.set_num_threads(previous_threads)
    median = {key: statistics.median(samples) for key, samples in times.items()}
    return [HeadTiming(h, d_model // h, median["batched", h], median["looped", h], repeats,
                       tuple(lo / ba for lo, ba in zip(times["looped", h], times["batched", h]))) for h in heads]
