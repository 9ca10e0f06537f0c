"""The course's real models against the libraries people would use instead, with every hook point in place.

SmolLM2-135M (mhalab.pretrained.smollm2, float32) against ``transformers`` reading the same GGUF file, and
all-MiniLM-L6-v2 (mhalab.pretrained.minilm) against ``sentence-transformers`` reading the same wheel. Each pair
is timed in interleaved rounds (the order rotates; medians), in one run, on the same threads:

    decode_cached     32 greedy tokens after a 16-token prompt, with the KV cache (tokens per second)
    decode_uncached   the same 32 tokens, every step recomputing the whole prefix
    prefill_256       one forward pass over 256 tokens, logits at every position
    minilm_64         unit-length embeddings of 64 sentences, the references' 10 cycled (tokenisation included
                      on both sides)
    minilm_short      the same for 64 short sentences of 5 to 15 words (seeded draws of those sentences' words)

Printed: each median, and ``mhalab / library`` as a ratio of times (below 1: mhalab is faster), with the
spread of that ratio over the rounds (each round's own mhalab / library, lowest to highest). The
libraries are optional: without them only mhalab's figures are printed. They belong in a throwaway venv,
never in the course's (see benchmarks/RESULTS.md for the command).

    python benchmarks/real_models.py                     # 2 threads, 5 rounds: a few minutes
    python benchmarks/real_models.py --threads 2 --repeats 7
    python benchmarks/real_models.py --only minilm       # the two MiniLM workloads alone: under a minute
    python benchmarks/real_models.py --clock cpu --threads 1 --new-tokens 16 --repeats 7   # on a shared machine

``--clock cpu`` times each call in this process's CPU time (``time.process_time``) instead of wall time: on a
machine shared with other work the wall clock also counts the time the process waits for a core, the CPU clock
hardly does. It is meant for ``--threads 1`` (with more threads it adds up the threads' time, spinning
included) and turns the tokenizers' own thread pool off (``TOKENIZERS_PARALLELISM=false``) on both sides.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from mhalab.head_batching import time_interleaved
from mhalab.pretrained import load_minilm, load_smollm2

ROOT = Path(__file__).resolve().parent.parent
PARAGRAPH = ROOT / "tests" / "references" / "paragraph.txt"
sys.path.insert(0, str(ROOT / "tools"))
# The libraries loaded as the references were made (the same files, float32, SDPA), and their sentences.
from make_pretrained_references import SENTENCES, sentence_transformers_minilm, transformers_smollm2  # noqa: E402


def _library(name: str, load, path: Path):
    """``load(path)``, or None where the library ``name`` is not installed (then only mhalab's figures are printed)."""
    return load(path) if importlib.util.find_spec(name) is not None else None


def short_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of 5 to 15 words, drawn (seeded) from the words of the reference sentences."""
    words = " ".join(SENTENCES).replace(".", "").replace(",", "").replace("!", "").replace("?", "").split()
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))).capitalize() + "." for _ in range(n)]


def _report(title: str, times: dict, unit: str, per: float) -> None:
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n{title}")
    for name, m in med.items():
        print(f"  {name:<22} {m * 1e3:9.1f} ms   {per / m:8.1f} {unit}   (rounds {min(times[name]) * 1e3:.1f} to "
              f"{max(times[name]) * 1e3:.1f} ms)")
    if "library" in med:
        rounds = [m / lib for m, lib in zip(times["mhalab"], times["library"])]  # same round, one after the other
        print(f"  mhalab / library: {med['mhalab'] / med['library']:.3f} of the time (ratio of medians); "
              f"per round {min(rounds):.3f} to {max(rounds):.3f}, median {statistics.median(rounds):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--only", choices=["smollm2", "minilm"], help="run one model's workloads only")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time (default) or this process's CPU time (steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.timer = time.perf_counter
    if args.clock == "cpu":
        args.timer = time.process_time
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # its worker threads' time would count on the CPU clock
    print(f"clock: {args.clock} ({args.timer.__name__}), {args.threads} threads, {args.repeats} rounds, "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.only != "minilm":
        _smollm2(args)
    if args.only != "smollm2":
        _minilm(args)


def _smollm2(args: argparse.Namespace) -> None:
    from mhalab.pretrained.files import SMOLLM2, model_file
    from mhalab.pretrained.smollm2 import GGUF_NAME

    ours = load_smollm2(allow_download=False)
    theirs = _library("transformers", transformers_smollm2, model_file(SMOLLM2, GGUF_NAME, allow_download=False))
    versions = f"torch {torch.__version__}, {args.threads} threads, {args.clock} clock"
    if theirs is not None:
        import transformers
        versions += f", transformers {transformers.__version__}"
    ids = ours.tokenizer(PARAGRAPH.read_text().strip())  # [1, T]
    if ids.size(1) < args.prefill:
        ids = ids.repeat(1, args.prefill // ids.size(1) + 1)
    prompt, long = ids[:, :16], ids[:, : args.prefill]
    n = args.new_tokens

    def hf_generate(use_cache: bool):
        return theirs.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=use_cache,
                               attention_mask=torch.ones_like(prompt), pad_token_id=0)

    with torch.inference_mode():
        mine = ours.generate(prompt, n)
        if theirs is not None:
            same = torch.equal(mine, hf_generate(True))
            print(f"greedy tokens equal to transformers': {same}")
        for cached in (True, False):
            fns = {"mhalab": lambda c=cached: ours.generate(prompt, n, use_cache=c)}
            if theirs is not None:
                fns["library"] = lambda c=cached: hf_generate(c)
            times = time_interleaved(fns, repeats=args.repeats, clock=args.timer)
            _report(f"SmolLM2 decode, {n} greedy tokens after 16, {'with' if cached else 'without'} the KV cache "
                    f"({versions})", times, "tok/s", n)
        fns = {"mhalab": lambda: ours(long)}
        if theirs is not None:
            fns["library"] = lambda: theirs(long).logits
        times = time_interleaved(fns, repeats=args.repeats, clock=args.timer)
        _report(f"SmolLM2 prefill, {args.prefill} tokens ({versions})", times, "tok/s", args.prefill)


def _minilm(args: argparse.Namespace) -> None:
    from mhalab.pretrained.files import MINILM, model_file

    minilm = load_minilm(allow_download=False)
    folder = model_file(MINILM, "model.safetensors", allow_download=False).parent
    st = _library("sentence_transformers", sentence_transformers_minilm, folder)
    cycled = [SENTENCES[i % len(SENTENCES)] + f" ({i})" for i in range(args.sentences)]
    workloads = {"the references' sentences": cycled,
                 "short sentences of 5 to 15 words": short_sentences(args.sentences)}
    for what, sentences in workloads.items():
        with torch.inference_mode():
            fns = {"mhalab": lambda s=sentences: minilm.encode(s)}
            label = ""
            if st is not None:
                import sentence_transformers
                fns["library"] = lambda s=sentences: st.encode(s, batch_size=len(s), convert_to_tensor=True)
                gap = (fns["mhalab"]() - fns["library"]()).abs().max().item()
                print(f"\nlargest difference between the embeddings ({what}): {gap:.2e}")
                label = f", sentence-transformers {sentence_transformers.__version__}"
            shape = list(minilm.tokenizer(sentences).tokens.shape)
            _report(f"MiniLM, {len(sentences)} {what} in one batch, tokens {shape} (torch {torch.__version__}, "
                    f"{args.threads} threads, {args.clock} clock{label})",
                    time_interleaved(fns, repeats=args.repeats, clock=args.timer), "sentences/s",
                    len(sentences))


if __name__ == "__main__":
    main()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
