"""mhalab.head_grid: every head of a layer at a glance, named as the explorer names it."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from mhalab.head_grid import head_grid




def test_head_grid(explorer_setup):
    task, model, batch, ex = explorer_setup
    fig = head_grid(ex, layer=1)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 4 and all(t.startswith(f"H{h}:") for h, t in enumerate(titles))
    # the grid and the explorer name every head the same way (mhalab.scores.role_of)
    assert [t.split(": ")[1].split(" ")[0] for t in titles] == [ex.role_name(1, h) for h in range(4)]
    assert all(ex.role(1, h).split(" ")[0] == ex.role_name(1, h) for h in range(4))
    plt.close(fig)
    fig = head_grid(model, batch, 0, task=task, columns=2)
    assert len(fig.axes) == 4
    plt.close(fig)
    with pytest.raises(IndexError, match="layer 5 is out of range"):
        head_grid(ex, layer=5)
    with pytest.raises(ValueError, match="needs the batch"):
        head_grid(model)
