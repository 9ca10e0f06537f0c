"""mhalab.widgets.head_grid: every head of a layer at a glance, named as the explorer names it."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from mhalab.widgets.head_grid import head_grid


def test_head_grid(explorer_setup):
    task, model, batch, ex = explorer_setup
    fig = head_grid(ex, layer=1)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 4 and all(t.split("\n")[0].split(" ")[0] == f"H{h}" for h, t in enumerate(titles))
    # the grid and the explorer name every head the same way (mhalab.head_roles.role_of)
    assert [t.split("\n")[1] for t in titles] == [ex.data.role_name(1, h) for h in range(4)]
    assert all(ex.data.role(1, h).split(" ")[0] == ex.data.role_name(1, h) for h in range(4))
    plt.close(fig)
    fig = head_grid(model, batch, 0, task=task, columns=2)
    assert len(fig.axes) == 4
    plt.close(fig)
    with pytest.raises(IndexError, match="layer 5 is out of range"):
        head_grid(ex, layer=5)
    with pytest.raises(ValueError, match="needs the batch"):
        head_grid(model)


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("columns, size", [(4, 1.7), (4, 0.9), (2, 0.6)])
def test_head_grid_titles_never_overlap(explorer_setup, columns, size):
    """Titles such as "H2 1.00 / previous-token" in narrow panels: shrunk (or cut) to fit, never run together."""
    _, _, _, ex = explorer_setup
    fig = head_grid(ex, layer=0, columns=columns, size=size)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    assert len(boxes) == 4
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(box.width <= size * fig.dpi for box in boxes)  # no title wider than its panel's share
    plt.close(fig)
