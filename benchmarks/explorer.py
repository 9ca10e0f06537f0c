"""How fast the head explorer answers a slider move, against redrawing naively.

Notebook 07's explorer must answer a slider move in well under half a second on a CPU. It keeps one
figure, caches everything that does not change (axes, ticks, colour bar) as a background, and on a move
only restores it and draws the artists that changed (blitting), then encodes a PNG. Timed here from the
outside (a clock around ``HeadExplorer.update``), for three kinds of move and two naive baselines:

    head move        the layer or head slider (blitted: the common case)
    example move     the example slider (new tick labels, so the background is redrawn)
    highlight move   the dropdown (blitted)
    full redraw      the same figure rendered whole with savefig on every move (no blitting)
    new figure       a fresh pyplot figure per move (what a plain ``interact`` callback does)

The browser test (tests/test_browser.py) measures the same thing end to end in JupyterLab
(slider key press -> new image on the page).

    python benchmarks/explorer.py                 # about 20 s
    python benchmarks/explorer.py --moves 50

``--text`` times what pressing Enter in the text box costs with a pretrained model (issue 21: at most 1 s
for up to 32 tokens with SmolLM2 on 2 cores): ``set_text`` re-runs the model with the attention cached,
recomputes the scores, rebuilds the figure and renders it, alone and with a model view attached (which
redraws all 270 thumbnails too). Needs the model wheels (``INSTALL_HINT``)::

    python benchmarks/explorer.py --text --threads 2 --model smollm2       # about a minute
    python benchmarks/explorer.py --text --threads 2 --model minilm
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

import torch

from mhalab.models import ModelConfig, Transformer
from mhalab.tasks import MultiRelationTask
from mhalab.widgets import head_explorer

TARGET_S = 0.5  # a slider move must answer faster than this
TEXT_TARGET_S = 1.0  # new text (up to MAX_TOKENS tokens) must be drawn within this

#: Sentences of about 8, 20 and 32 tokens (trimmed to the cap by words if a tokenizer makes more).
TEXTS = [
    "The cat sat on the mat.",
    "When Mary and John went to the store, John gave a drink to Mary because she was thirsty.",
    "The quick brown fox jumps over the lazy dog because it was bored, and then it ran all the way home to "
    "its den near the old river bank.",
]


def naive_new_figure(explorer, layer: int, head: int) -> float:
    """A new pyplot figure per move: heat map + bars + text, rendered to PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = time.perf_counter()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=72)
    ax0.imshow(explorer.data.attention[layer, 0, head], vmin=0, vmax=1)
    ax0.set_xticks(range(explorer.data.S), explorer.data.labels[0])
    ax0.set_yticks(range(explorer.data.T), explorer.data.labels[0])
    values = [float(explorer.data.scores[n][layer, head]) for n in explorer.data.bar_names]
    ax1.barh(range(len(values)), values)
    ax1.set_yticks(range(len(values)), explorer.data.bar_names)
    fig.colorbar(ax0.images[0], ax=ax0)
    fig.text(0.01, 0.02, explorer.ablation_text(layer, head))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return time.perf_counter() - start


def timed_update(explorer, **move) -> float:
    """Seconds one ``explorer.update(**move)`` takes (what a slider move costs in the kernel)."""
    start = time.perf_counter()
    explorer.update(**move)
    return time.perf_counter() - start


def full_redraw(explorer) -> float:
    start = time.perf_counter()
    buffer = io.BytesIO()
    explorer.figure.savefig(buffer, format="png")  # every artist, animated ones included
    return time.perf_counter() - start


def fit_to_cap(explorer, text: str) -> str:
    """``text``, cut word by word until it has at most MAX_TOKENS tokens."""
    from mhalab.widgets import MAX_TOKENS

    words = text.split()
    while True:
        candidate = " ".join(words)
        encoded = explorer.tokenizer(candidate)
        if getattr(encoded, "tokens", encoded).size(1) <= MAX_TOKENS:
            return candidate
        words = words[:-1]


def text_benchmark(args) -> None:
    from mhalab.pretrained import load_minilm, load_smollm2
    from mhalab.widgets.model_view import model_view

    model = load_smollm2() if args.model == "smollm2" else load_minilm()
    explorer = head_explorer(model, TEXTS[0])
    texts = [fit_to_cap(explorer, t) for t in TEXTS]
    view = None
    rows = []
    for with_view in (False, True):
        if with_view:
            view = model_view(explorer)
        timings: dict[int, list[float]] = {}
        for round_ in range(args.rounds):
            for text in texts:  # interleaved lengths; each set_text is a new text (the last one differs)
                start = time.perf_counter()
                explorer.set_text(text)
                elapsed = time.perf_counter() - start
                timings.setdefault(explorer.data.T, []).append(elapsed)
        for T, values in sorted(timings.items()):
            rows.append((with_view, T, statistics.median(values), max(values)))
    pick = []
    for i in range(args.rounds * 3):
        start = time.perf_counter()
        view.pick(layer=(i * 7) % explorer.data.n_layers, head=(i * 5) % explorer.data.n_heads)
        pick.append(time.perf_counter() - start)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{args.model}, {explorer.data.n_layers} layers x {explorer.data.n_heads} heads, "
          f"torch threads {args.threads}, "
          f"{args.rounds} rounds; load average {load} on {os.cpu_count()} CPUs")
    print(f"{'what':<28}{'tokens':>7}{'median ms':>11}{'max ms':>9}")
    for with_view, T, median, top in rows:
        what = "new text + model view" if with_view else "new text (explorer)"
        print(f"{what:<28}{T:>7}{1000 * median:>11.0f}{1000 * top:>9.0f}")
    print(f"{'pick in the model view':<28}{'':>7}{1000 * statistics.median(pick):>11.0f}{1000 * max(pick):>9.0f}")
    worst = max(median for _, _, median, _ in rows)
    verdict = "PASS" if worst <= TEXT_TARGET_S else "FAIL"
    print(f"slowest median for new text: {1000 * worst:.0f} ms; target <= {1000 * TEXT_TARGET_S:.0f} ms: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=32, help="moves timed per kind")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the explorer itself uses none)")
    parser.add_argument("--text", action="store_true", help="time new text with a pretrained model instead")
    parser.add_argument("--model", choices=("smollm2", "minilm"), default="smollm2")
    parser.add_argument("--rounds", type=int, default=5, help="--text: rounds over the three lengths")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.text:
        return text_benchmark(args)

    task = MultiRelationTask()
    torch.manual_seed(0)
    model = Transformer(ModelConfig.for_task(task, d_model=64, n_heads=8, n_layers=2))  # notebook 07's shape
    batch = task.sample(512, generator=torch.Generator().manual_seed(2024))
    start = time.perf_counter()
    explorer = head_explorer(model, batch, task)
    build = time.perf_counter() - start
    heads = explorer.data.heads

    kinds = ("head move", "example move", "highlight move", "full redraw", "new figure")
    timings: dict[str, list[float]] = {k: [] for k in kinds}
    options = explorer.highlight_options
    for i in range(args.moves):  # interleaved, so that load on a shared machine hits every kind alike
        layer, head = heads[(i * 5 + 3) % len(heads)]
        timings["head move"].append(timed_update(explorer, layer=layer, head=head))
        next_example = (explorer.example + 1) % explorer.data.n_examples
        timings["example move"].append(timed_update(explorer, example=next_example))
        timings["highlight move"].append(timed_update(explorer, highlight=options[i % len(options)]))
        timings["full redraw"].append(full_redraw(explorer))
        timings["new figure"].append(naive_new_figure(explorer, layer, head))

    medians = {k: statistics.median(v) for k, v in timings.items()}
    print(f"explorer built in {build:.2f} s (attention, scores and 16 ablations, once)")
    print(f"{'move':<16}{'median ms':>10}{'max ms':>9}{'vs head move':>14}")
    for kind, values in timings.items():
        ratio = medians[kind] / medians["head move"]
        print(f"{kind:<16}{1000 * medians[kind]:>10.1f}{1000 * max(values):>9.1f}{ratio:>13.1f}x")
    worst_move = max(medians["head move"], medians["example move"], medians["highlight move"])
    verdict = "PASS" if worst_move < TARGET_S else "FAIL"
    print(f"slowest kind of slider move: median {1000 * worst_move:.0f} ms; "
          f"target < {1000 * TARGET_S:.0f} ms: {verdict}")


if __name__ == "__main__":
    main()
