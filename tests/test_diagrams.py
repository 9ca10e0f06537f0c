"""The diagrams read their shapes off a real forward pass and draw them."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from mhalab import MultiHeadAttention
from mhalab.diagrams import mechanism_shapes, plot_block, plot_mechanism
from mhalab.hooks import hook_points
from mhalab.models import ModelConfig, Transformer


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


@pytest.mark.parametrize("n_key_value_heads", [None, 2])
def test_mechanism_shapes_are_read_off_a_forward(n_key_value_heads):
    m = MultiHeadAttention(16, 4, n_key_value_heads=n_key_value_heads, d_head=6)
    shapes = mechanism_shapes(m, torch.randn(2, 5, 16))
    G = n_key_value_heads or 4
    assert shapes == {
        "x": (2, 5, 16), "Q": (2, 5, 24), "K": (2, 5, G * 6), "V": (2, 5, G * 6),
        "Q heads": (2, 4, 5, 6), "K heads": (2, G, 5, 6), "V heads": (2, G, 5, 6),
        "pattern": (2, 4, 5, 5), "z": (2, 5, 4, 6), "concat": (2, 5, 24), "out": (2, 5, 16),
    }
    assert not any(p.is_hooked for p in hook_points(m).values())   # every hook removed afterwards
    fig = plot_mechanism(shapes)
    texts = _texts(fig)
    assert "[2, 4, 5, 5]" in texts and f"[2, {G}, 5, 6]" in texts and "[2, 5, 24]" in texts
    assert any(("sharing G = 2" in t) == (n_key_value_heads == 2) for t in texts if t.startswith("per head"))
    with pytest.raises(ValueError, match="lacks"):
        plot_mechanism({"x": (1, 2, 3)})
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        mechanism_shapes(torch.nn.Linear(4, 4), torch.randn(1, 2, 4))


def test_plot_block_reads_the_models_shapes():
    model = Transformer(ModelConfig(d_vocab=11, d_model=8, n_heads=2, n_layers=2, n_ctx=6))
    fig = plot_block(model, torch.randint(0, 11, (3, 6)))
    texts = _texts(fig)
    for name in ("blocks.0.attn", "blocks.1.attn", "blocks.1.mlp", "learned positions", "block 1"):
        assert name in texts, name
    assert "[3, 6, 11]" in texts and "[6, 8]" in texts      # logits [B, T, V]; the position table [T, D]
    assert not any(p.is_hooked for p in hook_points(model).values())
    with pytest.raises(TypeError, match="Transformer"):
        plot_block(MultiHeadAttention(8, 2), torch.zeros(1, 2, dtype=torch.long))
