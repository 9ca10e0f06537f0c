"""The course's figures: attention heat maps, tensor layouts, cost curves, training curves, head-count sweeps.

Figures are made at :data:`DPI` (a point of text is a point on screen); matplotlib is imported lazily.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DPI", "relation_style", "figure", "heatmap", "attention_maps", "show_memory_layout", "LAYOUTS",
    "plot_costs", "notebook_style", "score_and_weight_maps", "plot_history", "plot_sweep", "fit_tick_labels",
    "short_label",
]

DPI = 96  # figure dots per inch = CSS pixels per inch: text of n points shows n points tall
# Colours (and matching colour maps) for a task's relations, in ``batch.sources`` order.
RELATION_COLOURS = (
    "tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive",
)
RELATION_CMAPS = ("Reds", "Blues", "Greens", "Purples", "Oranges", "YlOrBr", "RdPu", "YlGn")


def relation_style(name: str, relations: list[str]) -> tuple[str, str]:
    """``(colour map, colour)`` of relation ``name`` among a task's ``relations``; greys for anything else."""
    if name not in relations:
        return "Greys", "0.4"
    i = relations.index(name) % len(RELATION_COLOURS)
    return RELATION_CMAPS[i], RELATION_COLOURS[i]


def figure(ncols: int = 1, nrows: int = 1, *, width: float = 3.2, height: float = 3.0):
    """``plt.subplots`` at :data:`DPI`, ``width x height`` inches a panel, laid out tightly whenever it is
    drawn (so titles added later fit too): ``(fig, axes [nrows, ncols])``."""
    import matplotlib.pyplot as plt

    figsize = (width * ncols, height * nrows)
    return plt.subplots(nrows, ncols, figsize=figsize, dpi=DPI, squeeze=False, layout="tight")


def short_label(label: str, width: int = 10) -> str:
    """``label`` on one line, at most ``width`` characters (an ellipsis marks a cut); blanks shown as ``␣``."""
    text = str(label).replace("\n", "\\n").replace("\t", "\\t")
    text = text if text.strip() else "␣" * max(1, min(len(text), 3))
    return text if len(text) <= width else text[: width - 1] + "…"


def fit_tick_labels(ax, axis: str, labels: Sequence[str], *, fontsize: float = 7, gap: float = 1.15) -> tuple[int, int]:
    """Put ``labels`` on ticks 0..n-1 of ``ax``'s ``axis`` ("x" or "y") so that no two drawn labels overlap.

    Measured with the figure's renderer: x labels lie flat when the widest fits its tick's share of the
    axis, else stand upright (rotated 90 degrees); if even the text height does not fit (x upright, or y),
    only every ``step``-th tick keeps its label. ``gap``: the room a label needs, as a multiple of its own
    size. Call it once the axes have their final size (no layout engine that shrinks them later).
    Returns ``(rotation, step)``.
    """
    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    labels = [str(label) for label in labels]
    n = len(labels)
    figure = ax.figure
    renderer = figure.canvas.get_renderer()
    box = ax.get_window_extent(renderer)  # display pixels
    length = box.width if axis == "x" else box.height
    spacing = length / max(n, 1)  # pixels between neighbouring ticks
    widths, heights = [], []
    for label in labels or [""]:
        text = figure.text(0, 0, label or " ", fontsize=fontsize)
        extent = text.get_window_extent(renderer)
        widths.append(extent.width)
        heights.append(extent.height)
        text.remove()
    widest, tallest = max(widths), max(heights)
    rotation, step = 0, 1
    if axis == "x":
        if widest * gap > spacing:
            rotation = 90
            step = max(1, math.ceil(tallest * gap / spacing))
    else:
        step = max(1, math.ceil(tallest * gap / spacing))
    shown = [label if i % step == 0 else "" for i, label in enumerate(labels)]
    if axis == "x":
        ax.set_xticks(range(n), shown, rotation=rotation, fontsize=fontsize)
    else:
        ax.set_yticks(range(n), shown, fontsize=fontsize)
    return rotation, step


def heatmap(weights, *, ax=None, x_labels: Sequence[str] | None = None, y_labels: Sequence[str] | None = None,
            title: str | None = None, annotate: bool = False, xlabel: str = "key (attended to)",
            ylabel: str = "query (attending)"):
    """Draw one ``[query, key]`` attention matrix (``annotate``: each weight in its cell); returns the Axes."""
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 2:
        raise ValueError(f"heatmap expects one [query, key] matrix, got shape {tuple(w.shape)}; "
                         "pick one batch element and one head first, e.g. weights[0, head]")
    if ax is None:
        ax = figure(width=0.45 * w.size(1) + 1.5, height=0.45 * w.size(0) + 1.0)[1][0, 0]
    ax.imshow(w.numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
    axes = ((x_labels, ax.set_xticks, w.size(1), "x"), (y_labels, ax.set_yticks, w.size(0), "y"))
    for labels, setter, n, axis in axes:
        if labels is not None:
            if len(labels) != n:
                what = "keys" if axis == "x" else "queries"
                raise ValueError(f"{axis}_labels has {len(labels)} labels for {n} {what}")
            setter(range(n), labels=list(labels), rotation=90 if axis == "x" else 0)
    if annotate:
        for (i, j), value in np.ndenumerate(w.numpy()):
            text = "0" if value == 0 else "1" if value >= 0.995 else f"{value:.2f}".lstrip("0")
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if value > 0.6 else "black")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def attention_maps(maps: Sequence, *, titles: Sequence[str], x_labels: Sequence[str] | None = None,
                   y_labels: Sequence[str] | None = None, annotate: bool = False,
                   panel_size: float = 2.8):
    """Several ``[query, key]`` matrices side by side, sharing labels; returns the Figure."""
    if len(maps) != len(titles):
        raise ValueError(f"got {len(maps)} maps but {len(titles)} titles")
    fig, axes = figure(len(maps), width=panel_size, height=panel_size)
    hidden = None if y_labels is None else [""] * len(y_labels)  # ticks without labels right of the first
    for k, (w, title, ax) in enumerate(zip(maps, titles, axes[0])):
        heatmap(w, ax=ax, x_labels=x_labels, y_labels=hidden if k else y_labels, title=title,
                annotate=annotate, ylabel="" if k else "query (attending)")
    return fig


LAYOUTS = ("B T D", "B T H dk", "B H T dk")


def show_memory_layout(t: Tensor, layout: str, *, d_head: int, title: str):
    """A batch-1 tensor of memory offsets (``torch.arange``) at one stage of the head split, ``layout`` one
    of :data:`LAYOUTS`; each cell shows its offset, coloured by the head it belongs to (``d_head``: the width of one
    head, d_k in the prose). Returns the Figure."""
    import matplotlib.pyplot as plt

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if t.dim() != len(layout.split()) or t.size(0) != 1:
        raise ValueError(f"a {layout!r} tensor of one sequence has shape [1, ...] with {len(layout.split())} axes, "
                         f"got {tuple(t.shape)}")
    values = t[0].detach().long()
    if layout == "B H T dk":  # H blocks of T x dk
        blocks, block_titles = list(values), [f"head {i}" for i in range(values.size(0))]
    else:  # one grid of T rows; "B T H dk" looks the same as "B T D" because it IS the same memory
        blocks, block_titles = [values.reshape(values.size(0), -1)], [None]
    d_model = values.numel() // blocks[0].size(0)  # features per token, whatever the layout
    rows, cols = blocks[0].shape
    fig, axes = figure(len(blocks), width=0.42 * cols + 0.7, height=0.42 * rows + 1.4)
    colours = plt.get_cmap("tab10")
    for block, block_title, ax in zip(blocks, block_titles, axes[0]):
        head_of = (block % d_model) // d_head  # which head's features the number came from
        ax.imshow(colours(head_of.numpy() % 10, alpha=0.5), aspect="equal")  # [rows, cols, 4] RGBA
        for (i, j), value in np.ndenumerate(block.numpy()):
            ax.text(j, i, str(value), ha="center", va="center", fontsize=8)
        if layout == "B T H dk":  # draw the cuts between heads
            for j in range(d_head, cols, d_head):
                ax.axvline(j - 0.5, color="black", linewidth=2.5)
        ax.set(xticks=range(cols), yticks=range(rows))
        ax.tick_params(labelsize=8)
        x_label = {"B T D": "feature", "B T H dk": "head | feature within head", "B H T dk": "feature within head"}
        ax.set_xlabel(x_label[layout], fontsize=8)
        ax.set_ylabel("token", fontsize=8)
        if block_title:
            ax.set_title(block_title, fontsize=9)
    fig.suptitle(f"{title}\n{layout}: shape {list(t.shape)}, strides {list(t.stride())}", fontsize=9)
    return fig


def plot_costs(table):
    """A :func:`mhalab.counting.cost_table` against h: parameters, KV cache (flat), d_k (falling); the Figure."""
    from matplotlib.ticker import FuncFormatter

    heads = [r.heads for r in table]
    fig, axes = figure(3, width=3.3, height=2.7)
    series = (
        ("parameters (Q, K, V, O)", [r.parameters for r in table], "tab:blue"),
        ("KV cache per token per layer", [r.kv_cache for r in table], "tab:orange"),
        ("d_k (width of each head)", [r.d_head for r in table], "tab:green"),
    )
    for ax, (label, values, colour) in zip(axes[0], series):
        ax.plot(heads, values, "o-", color=colour)
        ax.set_xscale("log", base=2)
        ax.set_xticks(heads, labels=[str(h) for h in heads])
        ax.set_xlabel("heads h")
        ax.set_title(label, fontsize=9)
        low, high = min(values), max(values)
        if low == high:  # a flat line: show it flat, with room around it, starting at zero
            ax.set_ylim(0, 1.25 * high)
        else:
            ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    fig.suptitle(f"d_model = {table.d_model}: what changes with the head count", fontsize=10)
    return fig


# ----------------------------------------------------------------------------- training curves
def plot_history(history, *, smooth: int = 20, title: str | None = None):
    """A :class:`~mhalab.train.History`: training loss (per step, ``smooth``-step mean), held-out accuracy."""
    fig, axes = figure(2, width=4.5, height=3.0)
    ax_loss, ax_acc = axes[0]
    if history.steps:
        ax_loss.plot(history.steps, history.train_loss, color="tab:blue", alpha=0.25, lw=0.8, label="train (per step)")
        k = max(1, min(smooth, len(history.train_loss)))
        smoothed = torch.tensor(history.train_loss).unfold(0, k, 1).mean(1)  # [steps - k + 1] running means
        ax_loss.plot(history.steps[k - 1 :], smoothed.tolist(), color="tab:blue", label=f"train ({k}-step mean)")
    if history.evals:
        if "loss" in history.evals[-1][1]:
            ax_loss.plot(*history.metric("loss"), "o-", color="tab:orange", ms=3, label="held-out")
        for name in sorted(history.evals[-1][1]):
            if name.startswith("accuracy"):
                main = name == "accuracy"
                ax_acc.plot(*history.metric(name), "o-" if main else "-", ms=3, lw=2 if main else 1,
                            label=name.replace("accuracy/", ""))
        ax_acc.legend(fontsize=7, loc="lower right")
    positive = [x for x in history.train_loss if x > 0]
    if positive and max(positive) / min(positive) > 20:
        ax_loss.set_yscale("log")
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    ax_loss.legend(fontsize=7)
    ax_acc.set(xlabel="step", ylabel="held-out accuracy", title="accuracy", ylim=(-0.02, 1.02))
    if title:
        fig.suptitle(title)
    return fig


def plot_pruning_curve(curve, *, ax=None, title: str | None = None):
    """A :class:`~mhalab.ablation.PruningCurve`: accuracy against the fraction of heads removed, least
    important first and in random orders (mean ± one std)."""
    if ax is None:
        ax = figure(width=5.5, height=3.4)[1][0, 0]
    x = curve.removed / max(curve.n_heads, 1)
    label = "by importance" + (" (recomputed)" if curve.recompute else "")
    ax.plot(x, curve.by_importance, "o-", ms=3, label=label)
    mean, std = curve.random.mean(axis=0), curve.random.std(axis=0)
    ax.plot(x, mean, "s--", ms=3, color="gray", label=f"random order (mean of {len(curve.random)})")
    ax.fill_between(x, mean - std, mean + std, color="gray", alpha=0.25, lw=0)
    ax.axhline(curve.baseline - 0.01, color="k", lw=0.6, ls=":", label="1 point below the full model")
    ax.set(xlabel="fraction of heads removed", ylabel="accuracy", title=title or "Pruning heads")
    ax.legend(fontsize=8, loc="lower left")
    return ax


def plot_sweep(results, metric: str = "accuracy", *, relations: bool = True, ax=None, title: str | None = None):
    """A :class:`~mhalab.sweep.SweepResults`: mean ``metric`` against the head count, bars min to max over
    seeds, a dot per seed, and (``relations``) the mean per relation as thin lines. Returns the Axes."""
    if ax is None:
        ax = figure(width=6.4, height=3.6)[1][0, 0]
    heads = results.heads
    values = results.by_heads(metric)
    mean = [sum(values[h]) / len(values[h]) for h in heads]
    spread = [[m - min(values[h]) for m, h in zip(mean, heads)], [max(values[h]) - m for m, h in zip(mean, heads)]]
    if relations and metric == "accuracy":
        for name in results.relations:
            means = results.mean(name)
            ax.plot(heads, [means[h] for h in heads], lw=1, alpha=0.55, label=name)
    for h in heads:
        ax.plot([h] * len(values[h]), values[h], "o", color="0.3", ms=3, alpha=0.6, zorder=3)
    ax.errorbar(heads, mean, yerr=spread, fmt="o-", color="black", lw=2, capsize=4, zorder=4,
                label=f"{metric} (mean; bars: min-max over {len(results.seeds)} seeds)")
    ax.set_xscale("log", base=2)
    d_head = {r.heads: r.d_head for r in results.rows}
    ax.set_xticks(heads, labels=[f"{h}\n{d_head[h]}" for h in heads])
    ax.set(xlabel=f"heads h  /  d_k = {results.d_model}/h", ylabel=f"held-out {metric}",
           title=title or f"d_model = {results.d_model}: same parameters in every column")
    if metric == "accuracy":
        ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower center")
    return ax


# ----------------------------------------------------------------------------- notebook style
def notebook_style() -> None:
    """Figures at :data:`DPI` with text of at least 8 points, saved by the inline backend at twice that
    density ("retina"): sharp on HiDPI screens. Call once, after importing pyplot."""
    import matplotlib

    matplotlib.rcParams.update({"figure.dpi": DPI, "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9,
                                "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8,
                                "figure.titlesize": 10})
    if "inline" in matplotlib.get_backend():  # in a notebook (plain Python has no inline backend)
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("retina")


# ----------------------------------------------------------------------------- scores and weights
def score_and_weight_maps(scores, weight_maps: dict, *, labels: Sequence[str] | None = None):
    """A ``[query, key]`` score matrix (colours diverging around 0) beside ``{title: [query, key] weights}``,
    each panel with its colour bar. Returns the Figure."""
    panels = [("raw scores Q Kᵀ", scores), *weight_maps.items()]
    top = float(torch.as_tensor(scores).abs().max()) or 1.0
    fig, axes = figure(len(panels), width=3.5, height=2.9)
    for k, (ax, (title, weights)) in enumerate(zip(axes[0], panels)):
        heatmap(weights, ax=ax, x_labels=labels, y_labels=labels, title=title, xlabel="key",
                ylabel="" if k else "query")
        if k == 0:  # scores: colours diverging around 0
            ax.images[0].set(cmap="RdBu_r", clim=(-top, top))
        label = "attention weight" if k else "score q·k"
        fig.colorbar(ax.images[0], ax=ax, fraction=0.046, pad=0.04, label=label)
    return fig
