"""Every head of one layer at a glance: small attention maps, each titled and coloured by its role.

Roles are named as the :class:`~mhalab.widgets.HeadExplorer` names them (:func:`mhalab.scores.role_of`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ._checks import check_index
from .plotting import figure, relation_style
from .scores import NO_ROLE
from .widgets import HeadExplorer

__all__ = ["head_grid"]


def head_grid(model: nn.Module | HeadExplorer, batch: Any = None, layer: int = 0, *, task: Any = None,
              example: int = 0, columns: int | None = None, size: float = 1.7):
    """All heads of ``layer`` as small ``[query, key]`` maps of one ``example``, coloured and titled by role.

    ``model``: a model with a task ``batch`` (and ``task`` for token labels), or a :class:`HeadExplorer`
    (reuses its attention). ``columns``: maps per row (default: up to 8). Returns the pyplot Figure.
    """
    explorer = model
    if not isinstance(model, HeadExplorer):
        if batch is None:
            raise ValueError("head_grid needs the batch to compute attention on: head_grid(model, batch, layer)")
        explorer = HeadExplorer(model, batch, task, examples=example + 1, ablation=False)
    H = explorer.n_heads
    layer = check_index("layer", layer, explorer.n_layers)
    example = check_index("example", example, explorer.n_examples)
    columns = columns or min(H, 8)
    rows = -(-H // columns)
    fig, axes = figure(columns, rows, width=size, height=size + 0.3 + 0.4 / rows)  # 0.4 inches for the title
    for head, ax in enumerate(axes.flat):
        ax.set(xticks=[], yticks=[])
        if head >= H:
            ax.axis("off")
            continue
        role = explorer.role_name(layer, head)
        cmap, colour = relation_style(role, explorer.relations)
        title = role if role == NO_ROLE else f"{role} {float(explorer.scores[role][layer, head]):.2f}"
        ax.imshow(explorer.attention[layer, example, head], vmin=0, vmax=1, cmap=cmap, interpolation="nearest")
        ax.set_title(f"H{head}: {title}", fontsize=10, color=colour)
        ax.spines[:].set_edgecolor(colour)
        ax.spines[:].set_linewidth(2 if role in explorer.relations else 0.8)
    fig.suptitle(f"layer {layer}: every head (rows = queries, columns = keys), example {example}", fontsize=11)
    return fig
