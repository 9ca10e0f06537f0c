"""How many attention operations a transformer runs, in what order, and why the heads are batched.

Three ideas, one module:

* :class:`StackConfig` counts the attention operations of an architecture: one per head per
  attention block (encoder self-attention, decoder self-attention, and, in an encoder-decoder,
  cross-attention).  A 32-layer decoder with 32 heads runs 32 x 32 = 1,024 of them per forward pass.
* The calls themselves are seen on a real model with :mod:`mhalab.hooks`: a hook on every
  ``*.pattern`` point fires once per attention call, in order, with all of that block's heads in one
  ``[B, H, L, S]`` tensor, and the blocks fire one after another (a block needs the previous block's output).
* :func:`batched_heads` and :func:`looped_heads` compute the same multi-head attention layer two ways
  (all heads as one batched operation, or one head at a time in a Python loop) and
  :func:`time_heads` times them against each other.  ``benchmarks/heads_parallel.py`` runs the same
  measurement on any device.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_head_count
from .device import synchronize

__all__ = [
    "StackConfig",
    "batched_attention",
    "looped_attention",
    "HeadWeights",
    "head_weights",
    "batched_heads",
    "looped_heads",
    "HeadTiming",
    "time_heads",
]


# --------------------------------------------------------------------------- counting
@dataclass(frozen=True)
class StackConfig:
    """The attention layout of a transformer: how many blocks, each with how many heads.

    ``encoder_layers`` blocks of self-attention over the whole input; ``decoder_layers`` blocks of
    causal self-attention, each followed by a cross-attention block when ``cross_attention`` is True
    (an encoder-decoder).  A decoder-only model (GPT, Llama) has ``encoder_layers=0``; an
    encoder-only model (BERT) has ``decoder_layers=0``.
    """

    name: str
    n_heads: int
    encoder_layers: int = 0
    decoder_layers: int = 0
    cross_attention: bool = False
    d_model: int | None = None

    def __post_init__(self) -> None:
        for label in ("n_heads", "encoder_layers", "decoder_layers"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{label} must be a non-negative int, got {value!r}")
        if self.n_heads < 1:
            raise ValueError(f"n_heads must be at least 1, got {self.n_heads}")
        if self.encoder_layers + self.decoder_layers == 0:
            raise ValueError("a stack needs at least one layer: set encoder_layers or decoder_layers")
        if self.cross_attention and (self.encoder_layers == 0 or self.decoder_layers == 0):
            raise ValueError(
                "cross_attention=True describes an encoder-decoder: it needs encoder_layers >= 1 "
                f"and decoder_layers >= 1, got {self.encoder_layers} and {self.decoder_layers}"
            )
        if self.d_model is not None:
            check_head_count(self.d_model, self.n_heads)

    @property
    def attention_blocks(self) -> int:
        """Multi-head attention blocks per forward pass (each a separate call, run in sequence)."""
        per_decoder_layer = 2 if self.cross_attention else 1  # self-attention (+ cross-attention)
        return self.encoder_layers + self.decoder_layers * per_decoder_layer

    @property
    def attention_operations(self) -> int:
        """Single-head attention operations per forward pass: one per head per block."""
        return self.attention_blocks * self.n_heads

    @property
    def sequential_steps(self) -> int:
        """Blocks that must run one after another: each consumes the previous block's output.

        Only the heads *within* a block are independent of each other, so the operations run as
        ``sequential_steps`` steps of ``n_heads`` parallel heads.
        """
        return self.attention_blocks

    def breakdown(self) -> dict[str, int]:
        """Operations per kind of attention (only the kinds this stack has)."""
        parts = {
            "encoder self-attention": self.encoder_layers * self.n_heads,
            "decoder self-attention (causal)": self.decoder_layers * self.n_heads,
            "cross-attention": self.decoder_layers * self.n_heads if self.cross_attention else 0,
        }
        return {kind: n for kind, n in parts.items() if n}


# --------------------------------------------------------------------------- two ways to run h heads
def batched_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Every head's attention as one operation: ``q, k, v`` ``[B, H, T, d_k]`` -> ``[B, H, T, d_k]``."""
    return F.scaled_dot_product_attention(q, k, v)  # the head axis is just another batch axis


def looped_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The same result, one head at a time: ``H`` separate calls, then stacked back together."""
    heads = [
        F.scaled_dot_product_attention(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1])  # [B, 1, T, d_k]
        for i in range(q.size(1))
    ]
    return torch.cat(heads, dim=1)  # [B, H, T, d_k]


@dataclass
class HeadWeights:
    """The weights of one multi-head attention layer, with each head's slices also stored separately.

    ``W_qkv`` ``[3 D, D]`` and ``W_o`` ``[D, D]`` are what :func:`batched_heads` uses; ``per_head`` holds
    head i's contiguous ``(W_q, W_k, W_v)``, each ``[d_k, D]``, cut from the same matrix, which is what
    :func:`looped_heads` uses (as if every head were its own small module).
    """

    n_heads: int
    d_k: int
    W_qkv: Tensor
    W_o: Tensor
    per_head: list[tuple[Tensor, Tensor, Tensor]] = field(repr=False)


def head_weights(
    d_model: int,
    n_heads: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
) -> HeadWeights:
    """Random weights for an ``n_heads``-head layer of width ``d_model`` (no biases)."""
    d_k = check_head_count(d_model, n_heads)
    scale = d_model**-0.5  # keeps activations at unit scale
    W_qkv = torch.randn(3 * d_model, d_model, generator=generator) * scale  # rows: Q, K, V outputs
    W_o = torch.randn(d_model, d_model, generator=generator) * scale
    W_qkv, W_o = W_qkv.to(device=device, dtype=dtype), W_o.to(device=device, dtype=dtype)
    per_head = []
    for i in range(n_heads):
        rows = [slice(p * d_model + i * d_k, p * d_model + (i + 1) * d_k) for p in range(3)]  # Q, K, V rows
        per_head.append(tuple(W_qkv[r].contiguous() for r in rows))  # 3 x [d_k, D]
    return HeadWeights(n_heads, d_k, W_qkv, W_o, per_head)


def batched_heads(x: Tensor, w: HeadWeights) -> Tensor:
    """A whole layer, all heads at once: one projection matmul, one attention call over ``[B, H, T, d_k]``.

    ``x`` is ``[B, T, D]``; returns ``[B, T, D]``.
    """
    B, T, D = x.shape
    q, k, v = F.linear(x, w.W_qkv).split(D, dim=-1)  # 3 x [B, T, D]: every head's projection in one matmul
    q, k, v = (t.view(B, T, w.n_heads, w.d_k).transpose(1, 2) for t in (q, k, v))  # [B, H, T, d_k]
    heads = F.scaled_dot_product_attention(q, k, v)  # [B, H, T, d_k]: all heads in one call
    return F.linear(heads.transpose(1, 2).reshape(B, T, D), w.W_o)  # [B, T, H, d_k] -> [B, T, D] -> W_O


def looped_heads(x: Tensor, w: HeadWeights) -> Tensor:
    """A whole layer, one head at a time in a Python loop, each head with its own three small projections.

    The same arithmetic as :func:`batched_heads` (same FLOPs, same result), issued as about ``4 h``
    small operations instead of a few large ones.  ``x`` is ``[B, T, D]``; returns ``[B, T, D]``.
    """
    outputs = []
    for W_q, W_k, W_v in w.per_head:
        q, k, v = (F.linear(x, W).unsqueeze(1) for W in (W_q, W_k, W_v))  # 3 x [B, 1, T, d_k]
        outputs.append(F.scaled_dot_product_attention(q, k, v).squeeze(1))  # [B, T, d_k]: this head alone
    return F.linear(torch.cat(outputs, dim=-1), w.W_o)  # concat -> [B, T, D] -> W_O


# --------------------------------------------------------------------------- timing
PARTS = ("attention", "layer")


@dataclass(frozen=True)
class HeadTiming:
    """Median seconds per call of the batched and the looped version for one head count."""

    heads: int
    d_k: int
    batched_s: float
    looped_s: float
    repeats: int

    @property
    def ratio(self) -> float:
        """How many times faster the batched version is (looped time / batched time)."""
        return self.looped_s / self.batched_s

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def _versions(part, heads, d_model, batch, seq_len, device, dtype, generator):
    """For each head count: (batched thunk, looped thunk), both computing the same tensor."""
    versions = {}
    for h in heads:
        d_k = check_head_count(d_model, h)
        if part == "attention":
            q, k, v = (
                torch.randn(batch, h, seq_len, d_k, generator=generator).to(device=device, dtype=dtype)
                for _ in range(3)
            )  # 3 x [B, H, T, d_k], as the projections would hand them over
            versions[h] = (lambda q=q, k=k, v=v: batched_attention(q, k, v), lambda q=q, k=k, v=v: looped_attention(q, k, v))
        else:
            x = torch.randn(batch, seq_len, d_model, generator=generator).to(device=device, dtype=dtype)  # [B, T, D]
            w = head_weights(d_model, h, device=device, dtype=dtype, generator=generator)
            versions[h] = (lambda x=x, w=w: batched_heads(x, w), lambda x=x, w=w: looped_heads(x, w))
    return versions


def time_heads(
    heads=(1, 8, 32, 64),
    *,
    part: str = "attention",
    d_model: int = 512,
    batch: int = 1,
    seq_len: int = 64,
    repeats: int = 51,
    inner: int = 1,
    warmup: int = 3,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    threads: int | None = 1,
    seed: int = 0,
) -> list[HeadTiming]:
    """Time all heads as one batched operation against a Python loop over the heads (same ``d_model``).

    ``part="attention"`` times the attention operations themselves (``softmax(q kᵀ / sqrt(d_k)) v`` for
    every head, from ready-made ``[B, H, T, d_k]`` queries, keys and values); ``part="layer"`` times a
    whole layer, where in the loop every head also runs its own three projections.

    The repetitions are interleaved (round ``r`` times every head count and both versions before round
    ``r + 1`` starts), so a burst of load from elsewhere hits them alike; each figure is the median over
    ``repeats`` rounds of the mean over ``inner`` back-to-back calls.  ``threads`` sets
    ``torch.set_num_threads`` during the measurement on a CPU (restored afterwards); one thread gives
    the steadiest figures on a shared machine.  Before timing, checks that both versions agree.
    """
    heads = tuple(heads)
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    for name, value in (("repeats", repeats), ("inner", inner), ("batch", batch), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not heads:
        raise ValueError("heads must name at least one head count, e.g. (1, 8, 32, 64)")
    device = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    tolerance = (1e-4 if device.type == "cpu" else 1e-3) if dtype == torch.float32 else 5e-2  # GPUs may use TF32

    previous_threads = torch.get_num_threads()
    if threads is not None and device.type == "cpu":
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            versions = _versions(part, heads, d_model, batch, seq_len, device, dtype, generator)
            for h, (batched, looped) in versions.items():  # the same result both ways, so the race is fair
                a, b = batched().float(), looped().float()
                if not torch.allclose(a, b, atol=tolerance, rtol=tolerance):
                    raise AssertionError(f"batched and looped heads disagree at h={h}")
            samples: dict[tuple[str, int], list[float]] = {}
            for round_ in range(warmup + repeats):
                for h, pair in versions.items():
                    for version, fn in zip(("batched", "looped"), pair):
                        synchronize(device)
                        start = time.perf_counter()
                        for _ in range(inner):
                            fn()
                        synchronize(device)
                        if round_ >= warmup:
                            samples.setdefault((version, h), []).append((time.perf_counter() - start) / inner)
    finally:
        torch.set_num_threads(previous_threads)
    return [
        HeadTiming(
            heads=h,
            d_k=d_model // h,
            batched_s=statistics.median(samples[("batched", h)]),
            looped_s=statistics.median(samples[("looped", h)]),
            repeats=repeats,
        )
        for h in heads
    ]
