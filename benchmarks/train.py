"""Training throughput of mhalab's Transformer against the same model built from torch.nn.

Both models have the same architecture and sizes: token + learned position embeddings,
``n_layers`` pre-norm blocks (multi-head self-attention, then a GELU MLP of width ``d_mlp``),
a final LayerNorm and a linear output head.  The reference uses
``torch.nn.TransformerEncoderLayer(norm_first=True, batch_first=True, activation="gelu")``.

One "step" is what training does: forward, cross-entropy loss, backward and an AdamW step.
The two models are timed in interleaved repetitions (A, B, A, B, ...) so that machine load
hits both alike, and the medians are compared.  The target is ratio >= 0.9
(mhalab tokens/s divided by torch tokens/s).

    python benchmarks/train.py                 # CPU defaults (d_model 64, 8 heads, 2 layers), < 1 minute
    python benchmarks/train.py --threads 1     # steadier numbers on a busy machine
    python benchmarks/train.py --device cuda --d-model 512 --heads 8 --layers 4 --batch 64 --seq 256
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch import nn

from mhalab.device import pick_device
from mhalab.head_batching import time_interleaved
from mhalab.models import ModelConfig, Transformer


class TorchTransformer(nn.Module):
    """The same architecture as mhalab.models.Transformer, from torch.nn building blocks."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        D = config.d_model
        self.causal = config.causal
        self.tokens = nn.Embedding(config.d_vocab, D)
        self.positions = nn.Embedding(config.n_ctx, D)
        layer = nn.TransformerEncoderLayer(
            D, config.n_heads, dim_feedforward=config.d_mlp, dropout=config.dropout,
            activation="gelu", batch_first=True, norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.ln_final = nn.LayerNorm(D)
        self.head = nn.Linear(D, config.d_vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.size(1)
        x = self.tokens(tokens) + self.positions.weight[:T]  # [B, T, D]
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=tokens.device) if self.causal else None
        x = self.encoder(x, mask=mask, is_causal=self.causal)
        return self.head(self.ln_final(x))  # [B, T, V]


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_step(model, tokens, targets):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        logits = model(tokens)  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # [B*T, V] vs [B*T]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default cpu)")
    p.add_argument("--steps", type=int, default=10, help="training steps per timed repetition")
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions per model (median taken)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=None, help="MLP width (default 4 * d_model)")
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--causal", action="store_true", help="decoder-only (causal) self-attention")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.reps < 1:
        p.error("--steps and --reps must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    device = pick_device(args.device)
    config = ModelConfig(
        d_vocab=args.vocab, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
        d_mlp=args.d_ff, n_ctx=args.seq, causal=args.causal,
    )
    torch.manual_seed(0)
    ours = Transformer(config).to(device)
    theirs = TorchTransformer(config).to(device)
    assert count(ours) == count(theirs), (count(ours), count(theirs))  # same architecture, same size

    g = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=device, generator=g)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), device=device, generator=g)
    steps = {"mhalab": make_step(ours, tokens, targets), "torch.nn": make_step(theirs, tokens, targets)}
    # One warm-up round (allocator, kernels, optimizer state), then seconds per step, interleaved.
    times = time_interleaved(steps, repeats=args.reps, warmup=1, inner=args.steps, device=device)
    rate = {name: args.batch * args.seq / statistics.median(t) for name, t in times.items()}
    ratio = rate["mhalab"] / rate["torch.nn"]
    print(f"device={device} threads={torch.get_num_threads()} d_model={args.d_model} heads={args.heads} "
          f"layers={args.layers} d_mlp={config.d_mlp} vocab={args.vocab} seq={args.seq} batch={args.batch} "
          f"causal={args.causal} params={count(ours)}")
    print(f"{args.reps} interleaved repetitions of {args.steps} steps (forward + backward + AdamW), medians:")
    for name, r in rate.items():
        print(f"  {name:9s} {r:12,.0f} tokens/s   (median {statistics.median(times[name]) * 1e3:.2f} ms/step)")
    verdict = "meets" if ratio >= 0.9 else "MISSES"
    print(f"ratio mhalab / torch.nn = {ratio:.3f}  ({verdict} the target >= 0.9)")
    return ratio


if __name__ == "__main__":
    main()
