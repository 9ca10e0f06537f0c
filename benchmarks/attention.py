"""Forward + backward time of mhalab's MultiHeadAttention against torch.nn.MultiheadAttention and a loop of heads.

Four implementations of the same self-attention, all with the same weights:

    torch          torch.nn.MultiheadAttention(batch_first=True), need_weights=False
    ours_sdpa      mhalab MultiHeadAttention, need_weights=False (F.scaled_dot_product_attention)
    ours_explicit  mhalab MultiHeadAttention, need_weights=True  (softmax(QKᵀ/√d_k)V written out, weights kept)
    loop           one head at a time: each head its own small Q/K/V projection and attention,
                   then concatenate the heads and apply W_O (what "h separate attentions" means literally)

One timed step is a forward pass and a backward pass (gradients for the input and every weight).
The implementations are timed in interleaved repetitions (the order rotates every round), so that the
load of a shared machine hits all of them alike, and medians are compared. Printed ratios:

    sdpa/torch      ours_sdpa / torch        target <= 1.05 (our readable module costs nothing extra)
    expl/torch      ours_explicit / torch    the price of materialising the weights
    loop/batched    loop / ours_sdpa         why heads are computed as one batched tensor op

    python benchmarks/attention.py                                # CPU defaults: about a minute
    python benchmarks/attention.py --heads 8 --repeats 21         # one shape, more repeats
    python benchmarks/attention.py --device cuda --dtype bfloat16 --batch 32 --length 1024 --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from mhalab.attention import MultiHeadAttention
from mhalab.device import pick_device
from mhalab.head_batching import time_interleaved
from mhalab.masks import causal_forbidden_mask
from mhalab.torch_interop import from_torch

TARGET = 1.05  # ours_sdpa / torch must not exceed this
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LoopOfHeads(nn.Module):
    """Multi-head attention computed literally: h separate attentions, one after the other.

    Each head owns its ``d_model -> d_head`` query, key and value projections (copied from ``mha``'s
    slices, so the result is the same function); their outputs are concatenated and mixed by W_O.
    """

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        D, dk = mha.d_model, mha.d_head
        self.d_head = dk
        self.q, self.k, self.v = (nn.ModuleList(), nn.ModuleList(), nn.ModuleList())
        for i in range(mha.n_heads):
            p = mha.head_projections(i)
            for projections, w, b in ((self.q, p.W_Q, p.b_Q), (self.k, p.W_K, p.b_K), (self.v, p.W_V, p.b_V)):
                lin = nn.Linear(D, dk, bias=b is not None, device=w.device, dtype=w.dtype)
                with torch.no_grad():
                    lin.weight.copy_(w.t())  # head_projections gives [D, dk]; Linear stores [dk, D]
                    if b is not None:
                        lin.bias.copy_(b)
                projections.append(lin)
        weight = mha.out_proj.weight
        self.out_proj = nn.Linear(D, D, bias=mha.bias, device=weight.device, dtype=weight.dtype)
        self.out_proj.load_state_dict(mha.out_proj.state_dict())

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        heads = []
        for q_proj, k_proj, v_proj in zip(self.q, self.k, self.v):
            q, k, v = q_proj(x), k_proj(x), v_proj(x)  # each [B, L, dk]
            heads.append(F.scaled_dot_product_attention(q, k, v, is_causal=is_causal))  # [B, L, dk]
        return self.out_proj(torch.cat(heads, dim=-1))  # concat -> [B, L, D], then W_O


def make_steps(n_heads: int, args, device: torch.device, dtype: torch.dtype) -> dict:
    """The four implementations, each as a function that runs one forward + backward."""
    theirs = nn.MultiheadAttention(args.d_model, n_heads, batch_first=True, device=device, dtype=dtype)
    with torch.no_grad():  # non-zero biases, so that they are really part of the comparison
        theirs.in_proj_bias.normal_(0, 0.1)
        theirs.out_proj.bias.normal_(0, 0.1)
    ours = from_torch(theirs)
    loop = LoopOfHeads(ours)
    x = torch.randn(args.batch, args.length, args.d_model, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    causal = args.causal
    # torch wants the mask with is_causal
    forbidden = causal_forbidden_mask(args.length, device=device) if causal else None

    forwards = {
        "torch": (theirs, lambda: theirs(x, x, x, need_weights=False, attn_mask=forbidden, is_causal=causal)[0]),
        "ours_sdpa": (ours, lambda: ours(x, is_causal=causal, need_weights=False)[0]),
        "ours_explicit": (ours, lambda: ours(x, is_causal=causal, need_weights=True, average_attn_weights=False)[0]),
        "loop": (loop, lambda: loop(x, is_causal=causal)),
    }

    with torch.no_grad():  # all four must compute the same function, or the timing means nothing
        reference = forwards["torch"][1]()
        for name, (_, forward) in forwards.items():
            diff = (forward().float() - reference.float()).abs().max().item()
            limit = 1e-4 if dtype == torch.float32 else 5e-2
            if diff > limit:
                raise AssertionError(f"{name} differs from torch by {diff:.3g} at n_heads={n_heads}")

    def step(module, forward):
        def run():
            module.zero_grad(set_to_none=True)
            x.grad = None
            forward().backward(grad)
        return run

    return {name: step(module, forward) for name, (module, forward) in forwards.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default: cpu)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per shape (medians are reported)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--causal", action="store_true", help="causal self-attention instead of full")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--check", action="store_true", help=f"exit 1 if sdpa/torch > {TARGET} for some shape")
    args = parser.parse_args()

    device, dtype = pick_device(args.device), DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"device={device} dtype={args.dtype} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"batch={args.batch} length={args.length} d_model={args.d_model} causal={args.causal} "
        f"repeats={args.repeats} (median ms of forward+backward)"
    )
    header = (f"{'heads':>5} {'d_k':>4} {'torch':>8} {'ours_sdpa':>10} {'ours_expl':>10} {'loop':>8} "
              f"{'sdpa/torch':>11} {'expl/torch':>11} {'loop/batched':>13}")
    print(header)
    start, met = time.perf_counter(), True
    for n_heads in args.heads:
        steps = make_steps(n_heads, args, device, dtype)
        times = time_interleaved(steps, repeats=args.repeats, warmup=args.warmup, device=device)
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        sdpa_ratio = ms["ours_sdpa"] / ms["torch"]
        met &= sdpa_ratio <= TARGET
        print(
            f"{n_heads:>5} {args.d_model // n_heads:>4} {ms['torch']:>8.1f} {ms['ours_sdpa']:>10.1f} "
            f"{ms['ours_explicit']:>10.1f} {ms['loop']:>8.1f} {sdpa_ratio:>11.3f} "
            f"{ms['ours_explicit'] / ms['torch']:>11.3f} {ms['loop'] / ms['ours_sdpa']:>13.3f}",
            flush=True,
        )
        del steps
    print(f"target sdpa/torch <= {TARGET}: {'met' if met else 'NOT met'} for every shape  "
          f"({time.perf_counter() - start:.0f} s)")
    return 0 if met or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
