"""All heads as one batched operation against a Python loop over heads, at a fixed total width.

The same measurement as notebook 03 (``mhalab.head_batching.time_heads``), on any device:

    python benchmarks/heads_parallel.py                              # CPU, notebook 03's sizes (< 1 minute)
    python benchmarks/heads_parallel.py --device cuda --dtype bfloat16 \\
        --json benchmarks/results/heads_parallel_gpu.json            # what notebook 03 reads, if committed

For every part (``attention``: the attention operations alone; ``layer``: a whole layer, where in the
loop every head also runs its own projections), every size (batch x sequence length) and every head
count it prints the median time per call of both versions and the ratio looped / batched (how many
times faster the batched version is).  ``--json PATH`` also writes the figures, with the device name,
date, torch version and settings, so a result can be committed and quoted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

from mhalab.device import pick_device
from mhalab.head_batching import PARTS, time_heads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,8,32,64, got {text!r}") from None


def _sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        try:
            batch, seq_len = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"sizes are BATCHxSEQ_LEN, comma-separated, such as 1x64,8x1024; got {item!r}"
            ) from None
        sizes.append((batch, seq_len))
    return sizes


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads available)"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--heads", type=_int_list, default=[1, 8, 32, 64], help="head counts (default 1,8,32,64)")
    parser.add_argument("--d-model", type=int, default=512, help="total width shared by the heads (default 512)")
    parser.add_argument("--sizes", type=_sizes, default=None,
                        help="BATCHxSEQ_LEN list; default 1x64 on CPU (notebook 03), 1x64,8x1024 on a GPU")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {','.join(PARTS)} to time (default both)")
    parser.add_argument("--repeats", type=int, default=51, help="interleaved rounds; the median is reported")
    parser.add_argument("--inner", type=int, default=None,
                        help="calls per timed sample (default 1 on CPU, 20 on a GPU)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads during the measurement (default 1)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    device = pick_device(args.device)
    dtype = DTYPES[args.dtype]
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {unknown}: choose from {', '.join(PARTS)}")
    if dtype != torch.float32 and device.type == "cpu":
        parser.error(f"--dtype {args.dtype} is for GPUs; on the CPU use float32")
    sizes = args.sizes or ([(1, 64)] if device.type == "cpu" else [(1, 64), (8, 1024)])
    inner = args.inner or (1 if device.type == "cpu" else 20)

    name = device_name(device)
    print(f"device: {name}   dtype: {args.dtype}   d_model: {args.d_model}   torch {torch.__version__}")
    print(f"median of {args.repeats} interleaved rounds, {inner} call(s) per sample"
          + (f", {args.threads} CPU thread(s)" if device.type == "cpu" else ""))
    runs = []
    start = time.perf_counter()
    for part in parts:
        for batch, seq_len in sizes:
            rows = time_heads(
                args.heads, part=part, d_model=args.d_model, batch=batch, seq_len=seq_len, repeats=args.repeats,
                inner=inner, device=device, dtype=dtype, threads=args.threads,
            )
            print(f"\n{part}, batch {batch}, seq_len {seq_len}")
            print(f"{'heads':>5} {'d_k':>4} {'batched ms':>11} {'looped ms':>10} {'looped/batched':>15}")
            for r in rows:
                print(f"{r.heads:>5} {r.d_head:>4} {r.batched_s * 1e3:>11.4f} {r.looped_s * 1e3:>10.4f} "
                      f"{r.ratio:>14.2f}x")
            runs.append({"part": part, "batch": batch, "seq_len": seq_len, "rows": [r.as_dict() for r in rows]})
    print(f"\nmeasured in {time.perf_counter() - start:.1f} s")

    result = {
        "device": name,
        "device_type": device.type,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "d_model": args.d_model,
        "repeats": args.repeats,
        "inner": inner,
        "threads": args.threads if device.type == "cpu" else None,
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "runs": runs,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
