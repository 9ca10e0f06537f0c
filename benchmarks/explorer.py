"""How fast the head explorer answers a slider move, against redrawing naively.

Notebook 05's explorer must answer a slider move in well under half a second on a CPU. It keeps one
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
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import torch

from mhalab.models import ModelConfig, Transformer
from mhalab.tasks import MultiRelationTask
from mhalab.widgets import head_explorer

TARGET_S = 0.5  # a slider move must answer faster than this


def naive_new_figure(explorer, layer: int, head: int) -> float:
    """A new pyplot figure per move: heat map + bars + text, rendered to PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = time.perf_counter()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=72)
    ax0.imshow(explorer.attention[layer, 0, head], vmin=0, vmax=1)
    ax0.set_xticks(range(explorer.S), explorer.labels[0])
    ax0.set_yticks(range(explorer.T), explorer.labels[0])
    values = [float(explorer.scores[n][layer, head]) for n in explorer.bar_names]
    ax1.barh(range(len(values)), values)
    ax1.set_yticks(range(len(values)), explorer.bar_names)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=32, help="moves timed per kind")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the explorer itself uses none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    task = MultiRelationTask()
    torch.manual_seed(0)
    model = Transformer(ModelConfig.for_task(task, d_model=64, n_heads=8, n_layers=2))  # notebook 05's shape
    batch = task.sample(512, generator=torch.Generator().manual_seed(2024))
    start = time.perf_counter()
    explorer = head_explorer(model, batch, task)
    build = time.perf_counter() - start
    heads = explorer.heads

    timings: dict[str, list[float]] = {k: [] for k in ("head move", "example move", "highlight move", "full redraw", "new figure")}
    options = explorer.highlight_options
    for i in range(args.moves):  # interleaved, so that load on a shared machine hits every kind alike
        layer, head = heads[(i * 5 + 3) % len(heads)]
        timings["head move"].append(timed_update(explorer, layer=layer, head=head))
        timings["example move"].append(timed_update(explorer, example=(explorer.example + 1) % explorer.n_examples))
        timings["highlight move"].append(timed_update(explorer, highlight=options[i % len(options)]))
        timings["full redraw"].append(full_redraw(explorer))
        timings["new figure"].append(naive_new_figure(explorer, layer, head))

    medians = {k: statistics.median(v) for k, v in timings.items()}
    print(f"explorer built in {build:.2f} s (attention, scores and 16 ablations, once)")
    print(f"{'move':<16}{'median ms':>10}{'max ms':>9}{'vs head move':>14}")
    for kind, values in timings.items():
        print(f"{kind:<16}{1000 * medians[kind]:>10.1f}{1000 * max(values):>9.1f}{medians[kind] / medians['head move']:>13.1f}x")
    worst_move = max(medians["head move"], medians["example move"], medians["highlight move"])
    verdict = "PASS" if worst_move < TARGET_S else "FAIL"
    print(f"slowest kind of slider move: median {1000 * worst_move:.0f} ms; target < {1000 * TARGET_S:.0f} ms: {verdict}")


if __name__ == "__main__":
    main()
