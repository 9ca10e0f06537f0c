"""What hook points cost: a toy Transformer with no hooks against the same model on plain SDPA and on
torch.nn.MultiheadAttention, what caching hook points costs, and decoding with the preallocated KV cache.

Forward passes (inference: eval mode, no gradients) of one decoder-only ``mhalab.Transformer``, every
variant with the same weights, timed in interleaved rounds (the order rotates) and compared by medians:

    plain_sdpa     each attention layer replaced by a bare reimplementation: one matmul, a view, the fused
                   F.scaled_dot_product_attention, W_O (no hook points, no checks)
    torch_mha      each attention layer replaced by torch.nn.MultiheadAttention (``to_torch``), need_weights=False
    mhalab         mhalab as shipped, no hook attached (what every training and generation run pays)
    cache_qkvz     model.run_with_cache of every hook_q, hook_k, hook_v, hook_z (still the fused kernel)
    cache_pattern  model.run_with_cache of every hook_pattern (the explicit path: the weights are formed)

Printed ratios: ``mhalab/plain`` and ``mhalab/torch`` (target <= 1.05: hook points cost nothing when
unused), ``qkvz/mhalab`` and ``pattern/mhalab`` (the price of looking). Then greedy decoding with KV caches:
``KVCache`` (preallocated, grows by doubling) against a cache that concatenates at every token (the old
behaviour, O(T²) copying), as tokens per second (per sequence).

    python benchmarks/hooks.py                         # CPU defaults: about a minute
    python benchmarks/hooks.py --threads 2 --repeats 21
    python benchmarks/hooks.py --device cuda --batch 32 --length 512 --decode 1024
    python benchmarks/hooks.py --threads 1 --clock cpu    # on a shared CPU: this process's CPU time, not wall time
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mhalab.attention import MultiHeadAttention
from mhalab.device import pick_device
from mhalab.head_batching import time_interleaved
from mhalab.kv_cache import KVCache
from mhalab.masks import causal_forbidden_mask
from mhalab.models import ModelConfig, Transformer
from mhalab.torch_interop import to_torch

TARGET = 1.05  # mhalab / plain_sdpa and mhalab / torch_mha must not exceed this


class PlainSDPA(nn.Module):
    """The least an attention layer can do: the same weights, the fused kernel, nothing else (causal only)."""

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        self.qkv_proj, self.out_proj, self.n_heads, self.d_head = mha.qkv_proj, mha.out_proj, mha.n_heads, mha.d_head

    def forward(self, query: Tensor, key=None, value=None, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False, kv_cache=None):
        if key_padding_mask is not None or attn_mask is not None or kv_cache is not None:
            raise NotImplementedError("PlainSDPA is for the unmasked or causal forward the benchmark times")
        B, T, _ = query.shape
        q, k, v = self.qkv_proj(query).view(B, T, 3, self.n_heads, self.d_head).unbind(2)  # 3 x [B, T, H, dk]
        heads = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=is_causal)  # [B, H, T, dk]
        return self.out_proj(heads.transpose(1, 2).reshape(B, T, -1)), None  # [B, T, H, dk] -> [B, T, D]


class TorchMHA(nn.Module):
    """torch.nn.MultiheadAttention with the same weights, called as mhalab's layer is called."""

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        self.inner = to_torch(mha).eval()
        self.masks: dict = {}

    def forward(self, query: Tensor, key=None, value=None, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False, kv_cache=None):
        if kv_cache is not None:
            raise NotImplementedError("torch.nn.MultiheadAttention has no KV cache")
        if is_causal:  # torch needs the mask beside the is_causal hint
            T = query.size(1)
            attn_mask = self.masks.get(T)
            if attn_mask is None:
                attn_mask = self.masks[T] = causal_forbidden_mask(T, device=query.device)
        return self.inner(query, query, query, key_padding_mask=key_padding_mask, need_weights=False,
                          attn_mask=attn_mask, is_causal=is_causal)


def with_attention(model: nn.Module, make) -> nn.Module:
    """A copy of ``model`` with every MultiHeadAttention replaced by ``make(layer)``."""
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, MultiHeadAttention):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, make(module))
    return model


class ConcatKVCache(KVCache):
    """The KV cache as it was: every token concatenated onto everything so far (O(T²) copying)."""

    def __init__(self) -> None:
        super().__init__()
        self._kc: Tensor | None = None
        self._vc: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self._kc is None else self._kc.size(-2)

    @property
    def k(self):
        return self._kc

    @property
    def v(self):
        return self._vc

    def append(self, k: Tensor, v: Tensor):
        self._kc = k if self._kc is None else torch.cat([self._kc, k], dim=-2)
        self._vc = v if self._vc is None else torch.cat([self._vc, v], dim=-2)
        return self._kc, self._vc


@torch.no_grad()
def decode(model: Transformer, prompt: Tensor, new_tokens: int, make_cache) -> Tensor:
    """Greedy decoding fed one token at a time, with caches from ``make_cache``."""
    caches = [make_cache() for _ in model.blocks]
    tokens, step = prompt, prompt
    for _ in range(new_tokens):
        step = model(step, kv_caches=caches)[:, -1:].argmax(-1)  # [B, 1]
        tokens = torch.cat([tokens, step], dim=1)
    return tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default: cpu)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--decode", type=int, default=512, help="tokens to generate in the decoding benchmark")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (medians are reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time (default) or this process's CPU time (steadier on a shared CPU, 1 thread)")
    parser.add_argument("--check", action="store_true", help=f"exit 1 if mhalab/plain or mhalab/torch > {TARGET}")
    args = parser.parse_args()

    device = pick_device(args.device)
    if args.clock == "cpu" and device.type != "cpu":
        parser.error(f"--clock cpu times this process on the CPU; on {device.type} use the wall clock (--clock wall)")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ModelConfig(d_vocab=512, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
                         n_ctx=max(args.length, args.decode + 8), causal=True)
    model = Transformer(config).to(device).eval()
    plain, torch_mha = with_attention(model, PlainSDPA), with_attention(model, TorchMHA)
    tokens = torch.randint(0, config.d_vocab, (args.batch, args.length), device=device)
    qkvz = lambda name: name.rsplit(".", 1)[-1] in ("hook_q", "hook_k", "hook_v", "hook_z")  # noqa: E731
    forwards = {
        "plain_sdpa": lambda: plain(tokens),
        "torch_mha": lambda: torch_mha(tokens),
        "mhalab": lambda: model(tokens),
        "cache_qkvz": lambda: model.run_with_cache(tokens, names_filter=qkvz)[0],
        "cache_pattern": lambda: model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))[0],
    }
    with torch.no_grad():  # every variant must compute the same logits, or the timing means nothing
        reference = forwards["mhalab"]()
        for name, forward in forwards.items():
            diff = (forward() - reference).abs().max().item()
            if diff > 1e-4:
                raise AssertionError(f"{name} differs from mhalab by {diff:.3g}")

    print(f"device={device} threads={torch.get_num_threads()} torch={torch.__version__} batch={args.batch} "
          f"length={args.length} d_model={args.d_model} heads={args.heads} layers={args.layers} "
          f"repeats={args.repeats} clock={args.clock} (median ms per forward, no gradients)")
    with torch.no_grad():
        times = time_interleaved(forwards, repeats=args.repeats, warmup=2, device=device, clock=clock)
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    print("  ".join(f"{name} {value:.2f}" for name, value in ms.items()))
    ratios = {"mhalab/plain": ms["mhalab"] / ms["plain_sdpa"], "mhalab/torch": ms["mhalab"] / ms["torch_mha"],
              "qkvz/mhalab": ms["cache_qkvz"] / ms["mhalab"], "pattern/mhalab": ms["cache_pattern"] / ms["mhalab"]}
    print("  ".join(f"{name} {value:.3f}" for name, value in ratios.items()))
    pairs = {"mhalab/plain": ("mhalab", "plain_sdpa"), "mhalab/torch": ("mhalab", "torch_mha"),
             "qkvz/mhalab": ("cache_qkvz", "mhalab"), "pattern/mhalab": ("cache_pattern", "mhalab")}
    rounds = {name: [a / b for a, b in zip(times[top], times[bottom])] for name, (top, bottom) in pairs.items()}
    print("per round (same round, lowest to highest): " + "  ".join(
        f"{name} {min(r):.3f} to {max(r):.3f}" for name, r in rounds.items()))
    met = ratios["mhalab/plain"] <= TARGET and ratios["mhalab/torch"] <= TARGET
    print(f"target mhalab/plain and mhalab/torch <= {TARGET}: {'met' if met else 'NOT met'}")

    prompt = tokens[:, :4]  # [B, 4]
    same = torch.equal(decode(model, prompt, 16, KVCache), decode(model, prompt, 16, ConcatKVCache))
    if not same:
        raise AssertionError("the preallocated and the concatenating cache decode different tokens")
    runs = {"preallocated": lambda: decode(model, prompt, args.decode, KVCache),
            "concatenating": lambda: decode(model, prompt, args.decode, ConcatKVCache)}
    start = time.perf_counter()
    decode_times = time_interleaved(runs, repeats=max(3, args.repeats // 5), warmup=1, device=device, clock=clock)
    tok_s = {name: args.decode / statistics.median(t) for name, t in decode_times.items()}
    print(f"decode {args.decode} tokens (batch {args.batch}): preallocated {tok_s['preallocated']:.0f} tok/s, "
          f"concatenating {tok_s['concatenating']:.0f} tok/s, time ratio concatenating/preallocated "
          f"{tok_s['preallocated'] / tok_s['concatenating']:.3f}  ({time.perf_counter() - start:.0f} s)")
    return 0 if met or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
