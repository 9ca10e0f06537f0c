"""Diagrams of the architecture, labelled with shapes read off one forward pass of a real module
(so the picture cannot disagree with the code): the mechanism, and where it sits in a block."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .models import Transformer
from .plotting import figure

__all__ = ["mechanism_shapes", "plot_mechanism", "plot_block"]


def _run_recording(model: nn.Module, names: list[str], *inputs: Any) -> tuple[Any, dict[str, tuple]]:
    """``model(*inputs)`` without gradients, and ``{name: (inputs, output)}`` of each submodule named."""
    seen: dict[str, tuple] = {}

    def record(name: str):
        return lambda module, args, out: seen.__setitem__(name, (args, out))

    handles = [model.get_submodule(name).register_forward_hook(record(name)) for name in names]
    try:
        with torch.no_grad():
            return model(*inputs), seen
    finally:
        for handle in handles:
            handle.remove()


# ----------------------------------------------------------------------------- the mechanism
def mechanism_shapes(module, x: Tensor) -> dict[str, tuple[int, ...]]:
    """Every stage's shape when ``x`` ``[B, T, D]`` runs through a real :class:`~mhalab.MultiHeadAttention`.

    In order: ``x``, ``Q``/``K``/``V`` (projections), ``Q heads``/``K heads``/``V heads`` (``split_heads``),
    ``pattern`` and ``z`` (the hook points ``hook_pattern``, ``hook_z``), ``concat`` (what W_O reads) and ``out``.
    """
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"mechanism_shapes expects a mhalab.MultiHeadAttention, got {type(module).__name__}")
    # The hook points are submodules too (a hook on "hook_pattern" makes the pattern computed).
    (out, _), seen = _run_recording(module, ["qkv_proj", "hook_pattern", "hook_z", "out_proj"], x)
    H, G, dk = module.n_heads, module.n_key_value_heads, module.d_head
    q, k, v = seen["qkv_proj"][1].split((H * dk, G * dk, G * dk), dim=-1)  # [B, T, H dk], 2 x [B, T, G dk]
    shapes = {"x": x, "Q": q, "K": k, "V": v}
    shapes.update({f"{name} heads": module.split_heads(t) for name, t in (("Q", q), ("K", k), ("V", v))})
    shapes.update(pattern=seen["hook_pattern"][1], z=seen["hook_z"][1], concat=seen["out_proj"][0][0], out=out)
    return {name: tuple(t.shape) for name, t in shapes.items()}


def _box(ax, x: float, y: float, name: str, shape, *, width: float = 2.0, height: float = 1.0,
         colour: str = "#dbe9f6", layers: int = 1, dims: str | None = None) -> None:
    """A rounded box at (x, y): ``name`` over ``shape`` over ``dims``; ``layers`` > 1 stacks copies behind."""
    from matplotlib.patches import FancyBboxPatch

    for k in reversed(range(layers)):  # copies behind, up and to the right, like Vaswani's Figure 2
        ax.add_patch(FancyBboxPatch((x - width / 2 + 0.13 * k, y - height / 2 + 0.13 * k), width, height,
                                    boxstyle="round,pad=0.02,rounding_size=0.12", facecolor=colour,
                                    edgecolor="#333333", linewidth=0.8, zorder=3 - 0.1 * k))
    lines = [(name, dict(fontsize=9, fontweight="bold"))]
    if shape is not None:
        lines.append((shape if isinstance(shape, str) else str(list(shape)), dict(fontsize=8, family="monospace")))
    if dims is not None:
        lines.append((dims, dict(fontsize=8, color="#555555")))
    step = height / (len(lines) + 0.6)
    for k, (text, style) in enumerate(lines):
        ax.text(x, y + step * ((len(lines) - 1) / 2 - k), text, ha="center", va="center", zorder=4, **style)


def _arrow(ax, start, end) -> None:
    ax.annotate("", xy=end, xytext=start, zorder=2,
                arrowprops=dict(arrowstyle="-|>", color="#444444", lw=1.0, shrinkA=0, shrinkB=0))


def plot_mechanism(shapes: dict, *, title: str | None = None):
    """Multi-head attention as Vaswani et al.'s Figure 2 draws it, labelled with :func:`mechanism_shapes`;
    stacked boxes run once per head, in parallel. Returns the Figure."""
    need = ("x", "Q", "K", "V", "Q heads", "K heads", "V heads", "pattern", "z", "concat", "out")
    missing = [k for k in need if k not in shapes]
    if missing:
        raise ValueError(f"shapes lacks {missing}: pass what mechanism_shapes(module, x) returns")
    B, H, L, S = shapes["pattern"]
    G = shapes["K heads"][1]
    fig, [[ax]] = figure(width=9.6, height=3.5)  # one panel
    stack = min(H, 3)  # stacked copies drawn behind a per-head box
    y_q, y_k, y_v = 4.4, 2.9, 1.4
    # The per-head region first, so that it sits behind the boxes.
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((4.55, 0.65), 7.85, 4.75, boxstyle="round,pad=0.02,rounding_size=0.2",
                                facecolor="#f6f6f6", edgecolor="#888888", linestyle="--", linewidth=0.8, zorder=0))
    heads_text = f"per head: H = {H} heads in parallel" + ("" if G == H else f", sharing G = {G} K/V heads")
    ax.text(8.4, 5.62, heads_text, ha="center", va="center", fontsize=8, color="#444444")
    kv = "H" if G == H else "G"
    _box(ax, 1.0, y_k, "input x", shapes["x"], colour="#eeeeee", dims="B, T, D")
    for y, name in ((y_q, "Q"), (y_k, "K"), (y_v, "V")):
        heads = "H" if name == "Q" else kv
        _box(ax, 3.3, y, f"Linear W_{name}", shapes[name], colour="#fde8c8", dims=f"B, T, {heads}·dk")
        _arrow(ax, (2.0, y_k), (2.3, y))
        layers = stack if heads == "H" else min(G, stack)
        _box(ax, 5.9, y, f"{name}: split heads", shapes[f"{name} heads"], layers=layers, width=2.2,
             dims=f"B, {heads}, T, dk")
        _arrow(ax, (4.3, y), (4.8, y))
    y_p, y_z = (y_q + y_k) / 2, 2.1
    _box(ax, 8.7, y_p, "softmax(QKᵀ/√d_k)", shapes["pattern"], layers=stack, width=2.6, dims="B, H, T, T")
    ax.text(8.7, y_p - 0.75, "hook: pattern", ha="center", fontsize=8, color="#555555")
    _arrow(ax, (7.0, y_q), (7.4, y_p + 0.2))
    _arrow(ax, (7.0, y_k), (7.4, y_p - 0.2))
    x_z = 10.9  # its stacked copies end inside the per-head region (right edge 12.4)
    _box(ax, x_z, y_z, "weights · V", shapes["z"], layers=stack, width=2.0, dims="B, T, H, dk")
    ax.text(x_z, y_z - 0.75, "hook: z", ha="center", fontsize=8, color="#555555")
    _arrow(ax, (9.9, y_p - 0.35), (x_z - 0.92, y_z + 0.5))  # left of the copies behind
    _arrow(ax, (7.0, y_v), (x_z - 1.0, y_z - 0.2))
    _box(ax, 13.7, y_k, "concat heads", shapes["concat"], colour="#e3f1df", dims="B, T, H·dk")
    _arrow(ax, (x_z + 1.0, y_z + 0.2), (12.7, y_k))
    _box(ax, 16.3, y_k, "Linear W_O", shapes["out"], colour="#fde8c8", dims="B, T, D")
    _arrow(ax, (14.7, y_k), (15.3, y_k))
    ax.set(xlim=(-0.1, 17.4), ylim=(0.4, 5.9), aspect="equal")
    ax.axis("off")
    fig.suptitle(title or f"multi-head attention, shapes as they flow: B={B}, T={L}, D={shapes['x'][-1]}, "
                 f"H={H}, d_k={shapes['Q heads'][-1]}", fontsize=10)
    return fig


# ----------------------------------------------------------------------------- the block
def plot_block(model, tokens: Tensor):
    """Where attention sits: a :class:`~mhalab.models.Transformer`'s residual stream, each part labelled with
    its module name and output shape for ``tokens`` ``[B, T]``. Returns the Figure."""
    from matplotlib.patches import Circle, FancyArrow

    if not isinstance(model, Transformer):
        raise TypeError(f"plot_block draws a mhalab.models.Transformer, got {type(model).__name__}")
    parts = ["embed.tokens", "ln_final", "head"]
    for i in range(len(model.blocks)):
        parts += [f"blocks.{i}.attn", f"blocks.{i}.mlp"]  # the LayerNorms are drawn without a shape
    _, seen = _run_recording(model, parts, tokens)
    shapes = {name: str(list((out[0] if isinstance(out, tuple) else out).shape))  # attention returns a tuple
              for name, (_, out) in seen.items()}
    shapes["embed.positions"] = f"[{tokens.size(1)}, {model.config.d_model}]"  # a table, not a module call

    n_blocks = len(model.blocks)
    start, branch, end = 3.0, 5.0, 4.8
    width = start + 2 * branch * n_blocks + end
    fig, [[ax]] = figure(width=0.55 * width, height=3.1)
    y_stream, y_branch = 1.0, 3.0
    ax.add_patch(FancyArrow(start, y_stream, width - start - 0.2, 0, width=0.16, head_width=0.4, head_length=0.3,
                            length_includes_head=True, color="#cccccc", zorder=1))
    ax.text(start + 0.4, y_stream - 0.45, f"residual stream {shapes['embed.tokens']} (B, T, D)",
            fontsize=8, color="#555555", ha="left")

    def plus(x):
        ax.add_patch(Circle((x, y_stream), 0.22, facecolor="white", edgecolor="#333333", zorder=5))
        ax.text(x, y_stream, "+", ha="center", va="center", fontsize=11, zorder=6)

    _box(ax, 1.3, y_branch, "token embedding", shapes["embed.tokens"], width=2.5, colour="#eeeeee")
    kind = model.config.positional_embedding_type
    _box(ax, 1.3, y_stream - 0.9, f"{'learned' if kind == 'standard' else kind} positions", shapes["embed.positions"],
         width=2.5, colour="#eeeeee")
    plus(start)
    _arrow(ax, (1.3, y_branch - 0.5), (start - 0.15, y_stream + 0.17))
    _arrow(ax, (1.3, y_stream - 0.4), (start - 0.17, y_stream - 0.12))
    x = start + 0.3
    for i in range(n_blocks):
        ax.text(x + branch - 0.2, y_branch + 0.8, f"block {i}", ha="center", fontsize=9, color="#444444")
        for sub, colour in (("attn", "#dbe9f6"), ("mlp", "#e3f1df")):
            name = f"blocks.{i}.{sub}"
            _box(ax, x + 0.85, y_branch, "LayerNorm", None, width=1.5, height=0.7, colour="#f3f3f3")
            _box(ax, x + 3.0, y_branch, name, shapes[name], width=2.4, colour=colour)
            _arrow(ax, (x, y_stream + 0.1), (x + 0.45, y_branch - 0.35))
            _arrow(ax, (x + 1.6, y_branch), (x + 1.8, y_branch))
            plus(x + branch - 0.3)
            _arrow(ax, (x + 4.05, y_branch - 0.5), (x + branch - 0.38, y_stream + 0.21))
            x += branch
    _box(ax, x + 1.0, y_branch, "ln_final", shapes["ln_final"], width=1.8, colour="#f3f3f3")
    _box(ax, x + 3.3, y_branch, "unembedding: head", shapes["head"], width=2.4, colour="#fde8c8")
    _arrow(ax, (x, y_stream + 0.1), (x + 0.45, y_branch - 0.5))
    _arrow(ax, (x + 1.9, y_branch), (x + 2.1, y_branch))
    ax.set(xlim=(-0.1, width + 0.3), ylim=(-0.6, 4.1), aspect="equal")
    ax.axis("off")
    fig.suptitle(f"where attention sits: {n_blocks} pre-norm block{'s' if n_blocks > 1 else ''}; "
                 f"each branch adds its output to the residual stream", fontsize=10)
    return fig
