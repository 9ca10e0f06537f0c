"""Every head of one layer at a glance: small attention maps, each titled and coloured by its role.

Roles are named as the :class:`~mhalab.widgets.HeadExplorer` names them (:func:`mhalab.head_roles.role_of`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..arguments import validate_index
from ..head_data import HeadData, head_data
from ..head_roles import NO_ROLE
from ..plotting import figure, relation_style
from .heads import HeadExplorer

__all__ = ["head_grid"]


def head_grid(model: nn.Module | HeadExplorer | HeadData, batch: Any = None, layer: int = 0, *, task: Any = None,
              example: int = 0, columns: int | None = None, size: float = 1.7):
    """All heads of ``layer`` as small ``[query, key]`` maps of one ``example``, coloured and titled by role.

    ``model``: a model with a task ``batch`` (and ``task`` for token labels), or the
    :class:`~mhalab.head_data.HeadData` of a :class:`HeadExplorer` (or the explorer: its data is reused).
    ``columns``: maps per row (default: up to 8). Returns the pyplot Figure.
    """
    data = model.data if isinstance(model, HeadExplorer) else model
    if not isinstance(data, HeadData):
        if batch is None:
            raise ValueError("head_grid needs the batch to compute attention on: head_grid(model, batch, layer)")
        data = head_data(model, batch, task, examples=example + 1, ablation=False)
    H = data.n_heads
    layer = validate_index("layer", layer, data.n_layers)
    example = validate_index("example", example, data.n_examples)
    columns = columns or min(H, 8)
    rows = -(-H // columns)
    fig, axes = figure(columns, rows, width=size, height=size + 0.45 + 0.4 / rows)  # two title lines, the suptitle
    titles = []
    for head, ax in enumerate(axes.flat):
        ax.set(xticks=[], yticks=[])
        if head >= H:
            ax.axis("off")
            continue
        role = data.role_name(layer, head)
        cmap, colour = relation_style(role, data.relations)
        score = "" if role == NO_ROLE else f" {float(data.scores[role][layer, head]):.2f}"
        ax.imshow(data.attention[layer, example, head], vmin=0, vmax=1, cmap=cmap, interpolation="nearest")
        titles.append(ax.set_title(f"H{head}{score}\n{role}", fontsize=10, color=colour))  # two short lines
        ax.spines[:].set_edgecolor(colour)
        ax.spines[:].set_linewidth(2 if role in data.relations else 0.8)
    _fit_titles(fig, titles, width_px=size * fig.dpi)
    fig.suptitle(f"layer {layer}: every head (rows = queries, columns = keys), example {example}", fontsize=11)
    return fig


def _fit_titles(fig, titles, width_px: float, smallest: float = 6.0) -> None:
    """Shrink the titles' font (one size for all) until the widest fits its panel; cut what still does not."""
    renderer = fig.canvas.get_renderer()
    widest = max((t.get_window_extent(renderer).width for t in titles), default=0.0)
    room = 0.92 * width_px  # a little space between neighbours
    size = max(smallest, min(10.0, 10.0 * room / widest)) if widest else 10.0
    for t in titles:
        t.set_fontsize(size)
        first, role = t.get_text().split("\n")
        while t.get_window_extent(renderer).width > room and len(role) > 2:  # too wide even so: cut the role
            role = role[:-1]
            t.set_text(f"{first}\n{role}…")
