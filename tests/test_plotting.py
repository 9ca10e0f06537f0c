"""The plotting helpers draw without error, at the course's dpi, and refuse input they cannot draw."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.text import Text

from mhalab import MultiHeadAttention
from mhalab.counting import cost_table
from mhalab.plotting import (
    DPI,
    attention_maps,
    figure,
    heatmap,
    notebook_style,
    plot_costs,
    score_and_weight_maps,
    show_memory_layout,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_heatmap_and_maps():
    w = torch.rand(4, 4).softmax(-1)
    ax = heatmap(w, x_labels=list("abcd"), y_labels=list("abcd"), annotate=True, title="t")
    assert ax.figure.dpi == DPI <= 100   # the retina format doubles the pixels, not the figure
    fig = attention_maps([w, w], titles=["a", "b"], x_labels=list("abcd"), y_labels=list("abcd"))
    assert len(fig.axes) == 2


def test_heatmap_rejects_bad_input():
    with pytest.raises(ValueError, match="one batch element and one head"):
        heatmap(torch.rand(2, 3, 3))
    with pytest.raises(ValueError, match="x_labels has 2 labels for 3 keys"):
        heatmap(torch.rand(3, 3), x_labels=["a", "b"])


def test_memory_layout_all_three_stages():
    m = MultiHeadAttention(8, 2)
    x = torch.arange(32.0).view(1, 4, 8)
    for t, layout, panels in ((x, "B T D", 1), (x.view(1, 4, 2, 4), "B T H dk", 1), (m.split_heads(x), "B H T dk", 2)):
        fig = show_memory_layout(t, layout, d_head=4, title="t")
        assert len(fig.axes) == panels
        assert any(str(list(t.stride())) in text.get_text() for text in fig.findobj(Text))
    with pytest.raises(ValueError, match="layout must be one of"):
        show_memory_layout(x, "B D", d_head=4, title="t")
    with pytest.raises(ValueError, match="shape"):
        show_memory_layout(x.view(4, 8), "B T D", d_head=4, title="t")


def test_plot_costs():
    fig = plot_costs(cost_table(64, (1, 2, 4)))
    assert len(fig.axes) == 3


def test_notebook_style_sets_readable_defaults():
    with matplotlib.rc_context():
        notebook_style()   # outside a kernel: only the defaults change
        assert matplotlib.rcParams["figure.dpi"] == DPI
        for key in ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize", "ytick.labelsize",
                    "legend.fontsize"):
            assert matplotlib.rcParams[key] >= 8, key


def test_score_and_weight_maps_label_their_colour_bars():
    s = torch.randn(4, 4)
    fig = score_and_weight_maps(s, {"a": s.softmax(-1), "b": (2 * s).softmax(-1)}, labels=list("wxyz"))
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels.count("attention weight") == 2 and "score q·k" in labels


@pytest.mark.parametrize("n, word", [(8, "cat"), (8, "quickest"), (20, "brown"), (32, "<|endofte…")])
def test_fit_tick_labels_never_overlaps(n, word):
    from mhalab.plotting import fit_tick_labels

    fig, axes = figure(width=3.5, height=2.5)
    fig.set_layout_engine("none")  # the axes keep the size they were measured at (as in the head explorer)
    fig.subplots_adjust(left=0.3, bottom=0.35)
    ax = axes[0, 0]
    ax.imshow(torch.rand(n, n).numpy(), aspect="auto")
    labels = [f"{word}{i}" for i in range(n)]
    rotation, step = fit_tick_labels(ax, "x", labels)
    _, y_step = fit_tick_labels(ax, "y", labels)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ticks, every in ((ax.get_xticklabels(), step), (ax.get_yticklabels(), y_step)):
        shown = [t for t in ticks if t.get_text()]
        assert [t.get_text() for t in shown] == labels[::every]  # every step-th label, in order
        boxes = [t.get_window_extent(renderer) for t in shown]
        assert not any(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1 for a, b in zip(boxes, boxes[1:]))
    if (n, word) == (8, "cat"):
        assert (rotation, step) == (0, 1)  # short labels that fit lie flat, all of them
    if n == 32:
        assert rotation == 90 and step > 1  # too many to stand even upright: thinned
    plt.close(fig)


def test_short_label():
    from mhalab.plotting import short_label

    assert short_label("<|endoftext|>") == "<|endofte…" and len(short_label("x" * 40)) == 10
    assert short_label(" ") == "␣" and short_label("\n") == "\\n" and short_label(" cat") == " cat"
