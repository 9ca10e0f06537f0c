"""Every head of one layer at a glance: small attention maps, each titled and coloured by its role.

The roles are the course's one vocabulary (:func:`mhalab.scores.role_of`), the same words the
:class:`~mhalab.widgets.HeadExplorer` uses.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ._checks import check_index
from .plotting import DPI, RELATION_CMAPS, RELATION_COLOURS
from .scores import NO_ROLE, role_of
from .widgets import HeadExplorer

__all__ = ["head_grid"]


def head_grid(
    model: nn.Module | HeadExplorer,
    batch: Any = None,
    layer: int = 0,
    *,
    task: Any = None,
    example: int = 0,
    threshold: float = 0.5,
    columns: int | None = None,
    size: float = 1.7,
    dpi: float = DPI,
):
    """All heads of one layer as small attention maps, each coloured and titled by its best-matching relation.

    Args:
        model: the model (with ``batch``), or a :class:`HeadExplorer` (reuses its precomputed attention).
        batch: a task ``Batch``; relation scores need its ``sources``.
        layer: which layer.
        task: for token labels (optional).
        example: which sequence of the batch to draw (scores use the whole batch).
        threshold: a head takes a relation's colour when at least this fraction of its attention lands there.
        columns: maps per row (default: up to 8).

    Returns:
        The matplotlib figure (made with pyplot, so a notebook shows it once at the end of the cell).
    """
    import matplotlib.pyplot as plt

    if isinstance(model, HeadExplorer):
        explorer = model
    else:
        if batch is None:
            raise ValueError("head_grid needs the batch to compute attention on: head_grid(model, batch, layer)")
        explorer = HeadExplorer(model, batch, task, examples=example + 1, ablation=False)
    N, H = explorer.n_layers, explorer.n_heads
    layer = check_index("layer", layer, N)
    example = check_index("example", example, explorer.n_examples)
    relations = explorer.relations
    columns = columns or min(H, 8)
    rows = -(-H // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(size * columns, (size + 0.3) * rows + 0.4), dpi=dpi, squeeze=False)
    for head in range(rows * columns):
        ax = axes[head // columns][head % columns]
        ax.set_xticks([])
        ax.set_yticks([])
        if head >= H:
            ax.axis("off")
            continue
        match = role_of(explorer.scores, layer, head, relations, threshold)  # the explorer's vocabulary
        if match in relations:
            i = relations.index(match)
            cmap, colour = RELATION_CMAPS[i % len(RELATION_CMAPS)], RELATION_COLOURS[i % len(RELATION_COLOURS)]
        else:
            cmap, colour = "Greys", "0.4"
        title = match if match == NO_ROLE else f"{match} {float(explorer.scores[match][layer, head]):.2f}"
        ax.imshow(explorer.attention[layer, example, head], vmin=0, vmax=1, cmap=cmap, interpolation="nearest")
        ax.set_title(f"H{head}: {title}", fontsize=10, color=colour)
        for spine in ax.spines.values():
            spine.set_edgecolor(colour)
            spine.set_linewidth(2 if match in relations else 0.8)
    fig.suptitle(f"layer {layer}: every head (rows = queries, columns = keys), example {example}", fontsize=11)
    fig.tight_layout()
    return fig
