"""The plotting helpers draw without error, at the course's dpi, and refuse input they cannot draw."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.text import Text
import pytest
import torch

from mhalab import MultiHeadAttention
from mhalab.counting import cost_table
from mhalab.models import ModelConfig, Transformer
from mhalab.plotting import (
    DPI,
    attention_maps,
    heatmap,
    mechanism_shapes,
    notebook_style,
    plot_block,
    plot_costs,
    plot_mechanism,
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
        fig = show_memory_layout(t, layout, d_k=4, title="t")
        assert len(fig.axes) == panels
        assert any(str(list(t.stride())) in text.get_text() for text in fig.findobj(Text))
    with pytest.raises(ValueError, match="layout must be one of"):
        show_memory_layout(x, "B D", d_k=4, title="t")
    with pytest.raises(ValueError, match="shape"):
        show_memory_layout(x.view(4, 8), "B T D", d_k=4, title="t")


def test_plot_costs():
    fig = plot_costs(cost_table(64, (1, 2, 4)))
    assert len(fig.axes) == 3


def test_notebook_style_sets_readable_defaults():
    with matplotlib.rc_context():
        notebook_style()   # outside a kernel: only the defaults change
        assert matplotlib.rcParams["figure.dpi"] == DPI
        for key in ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize", "ytick.labelsize", "legend.fontsize"):
            assert matplotlib.rcParams[key] >= 8, key


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_mechanism_shapes_are_read_off_a_forward(n_kv_heads):
    m = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, d_head=6)
    shapes = mechanism_shapes(m, torch.randn(2, 5, 16))
    G = n_kv_heads or 4
    assert shapes == {
        "x": (2, 5, 16), "Q": (2, 5, 24), "K": (2, 5, G * 6), "V": (2, 5, G * 6),
        "Q heads": (2, 4, 5, 6), "K heads": (2, G, 5, 6), "V heads": (2, G, 5, 6),
        "pattern": (2, 4, 5, 5), "z": (2, 5, 4, 6), "concat": (2, 5, 24), "out": (2, 5, 16),
    }
    assert not m.pattern.active and not m.qkv_proj._forward_hooks   # every hook removed afterwards
    fig = plot_mechanism(shapes)
    texts = _texts(fig)
    assert "[2, 4, 5, 5]" in texts and f"[2, {G}, 5, 6]" in texts and "[2, 5, 24]" in texts
    assert any(("sharing G = 2" in t) == (n_kv_heads == 2) for t in texts if t.startswith("per head"))
    with pytest.raises(ValueError, match="lacks"):
        plot_mechanism({"x": (1, 2, 3)})
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        mechanism_shapes(torch.nn.Linear(4, 4), torch.randn(1, 2, 4))


def test_score_and_weight_maps_label_their_colour_bars():
    s = torch.randn(4, 4)
    fig = score_and_weight_maps(s, {"a": s.softmax(-1), "b": (2 * s).softmax(-1)}, labels=list("wxyz"))
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels.count("attention weight") == 2 and "score q·k" in labels


def test_plot_block_reads_the_models_shapes():
    model = Transformer(ModelConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=2, max_len=6))
    fig = plot_block(model, torch.randint(0, 11, (3, 6)))
    texts = _texts(fig)
    for name in ("blocks.0.attn", "blocks.1.attn", "blocks.1.mlp", "learned positions", "block 1"):
        assert name in texts, name
    assert "[3, 6, 11]" in texts and "[6, 8]" in texts      # logits [B, T, V]; the position table [T, D]
    assert not any(m._forward_hooks for m in model.modules())
    with pytest.raises(TypeError, match="Transformer"):
        plot_block(MultiHeadAttention(8, 2), torch.zeros(1, 2, dtype=torch.long))
