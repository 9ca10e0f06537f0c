"""The course in one structure: the claims it makes, the notebooks that give evidence for each, what kind of
evidence each notebook gives and what it found. Notebook 00 draws it as the map of the course
(``plot_course_map("evidence")``), notebook 10 as its summary (``plot_course_map("found")``); the tests check that it
names every notebook of ``notebooks/`` and no other, so it changes when the course does.

The texts state no measured number: each notebook states and checks its own. ``shape_sheet`` builds the start
page's sheet of shapes, measured on a model it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Notebook", "Claim", "NOTEBOOKS", "CLAIMS", "WRAP", "claims_of", "plot_course_map",
           "shape_sheet", "sheet_table"]


@dataclass(frozen=True)
class Notebook:
    number: str  # "04"
    stem: str  # the file's name without .ipynb: "04_it_costs_nothing"
    title: str  # a few words, for the figure
    evidence: str  # how it tests its claims (the start page's map)
    found: str  # what it found (the wrap-up's map)


@dataclass(frozen=True)
class Claim:
    label: str  # the claim in a few words, for the figure
    notebooks: tuple[str, ...]  # numbers of the notebooks that give evidence for it, in course order


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook("00", "00_setup", "start here",
             "the map, the words, the shapes; a set-up check",
             "the map, the words, the shapes; a set-up check"),
    Notebook("01", "01_one_head", "one head",
             "attention by hand; one head against two, trained from several seeds",
             "one weighting must share itself; two heads of half the width learn both relations"),
    Notebook("02", "02_split_into_heads", "split into heads",
             "rebuilt from single heads, checked against PyTorch's own module",
             "h single heads, concatenated and mixed by W_O, equal PyTorch's layer"),
    Notebook("03", "03_where_it_sits", "where it sits",
             "a trained encoder-decoder: what each attention sees; operations counted and timed",
             "what encoder, decoder and cross-attention see; blocks run in turn; time grows with h"),
    Notebook("04", "04_it_costs_nothing", "it costs nothing",
             "weights counted on real modules; the KV cache and the attention weights' memory measured",
             "the same weights and cache at every h; the explicit path stores h·L·S weights"),
    Notebook("05", "05_what_heads_cost", "what heads cost",
             "proofs of what a narrow head can single out; a head-count sweep",
             "a width-one head singles out only the largest or smallest key"),
    Notebook("06", "06_the_trade_and_its_budget", "the trade and its budget",
             "a head-count sweep on two lookups, seed by seed, with learning curves",
             "at the budgets tried, too few and too many heads both fell short on two lookups"),
    Notebook("07", "07_what_heads_do", "what heads do",
             "a toy with planted relations: head scores, retraining, ablation, pruning",
             "roles appear unasked and differ by seed; most heads can go one at a time"),
    Notebook("08", "08_a_real_encoder", "a real encoder",
             "MiniLM on your sentences: head scores, ablation, pruning",
             "MiniLM: a previous-token head, sink heads on [CLS], many heads that can go"),
    Notebook("09", "09_a_real_llm", "a real LLM",
             "SmolLM2: its cost table, sinks, induction heads, ablation, patching",
             "SmolLM2: a smaller cache, sink heads; induction heads fed through their keys by one head"),
    Notebook("10", "10_wrap_up", "wrap-up",
             "the claims again, and what to read next",
             "the claims again, and what to read next"),
    Notebook("11", "11_heads_form", "heads form",
             "toy models recorded while they train; heads switched off; the key path cut",
             "most seeds form an induction head with a sudden drop of the loss; one layer formed none"),
    Notebook("12", "12_what_heads_compute", "what heads compute",
             "the weights alone: ranks, copying and composition scores, against random",
             "QK and OV circuits read from the weights; where they agree with patching and where not"),
    Notebook("13", "13_lookups_at_every_width", "lookups at every width",
             "every width with its own learning rate, at two budgets",
             "middle widths answer the lookup; the narrowest were still learning at the budgets tried"),
)

# Numbered in this order (the figure, top to bottom, and notebook 10's list). The order is the course's story, and it
# crosses few links: the text of each notebook's column fits one line of the figure (WRAP characters).
CLAIMS: tuple[Claim, ...] = (
    Claim("one weighting per token:\na lone head must share it", ("01",)),
    Claim("multi-head attention is h heads\nside by side, mixed by W_O", ("02", "03")),
    Claim("at d_head = d_model/h, heads cost no weights\nand no cache: 4·d_model² and 2·d_model", ("04", "09")),
    Claim("the heads of a block run in parallel,\nthe blocks one after another", ("03",)),
    Claim("what more heads cost: width per head,\nand h·L·S attention weights to compute",
          ("03", "04", "05", "06", "12", "13")),
    Claim("heads take on roles unasked;\nmany, not all, can go one at a time", ("07", "08", "09")),
    Claim("induction heads form in training\nand compose across layers", ("09", "11", "12")),
)
WRAP = 88  # characters of a notebook's column on one line of the figure

# One colour per claim (Okabe & Ito's palette, distinct for colour-blind readers too).
COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#CC79A7", "#0072B2", "#D55E00", "#6a3d9a")


def claims_of(number: str) -> list[Claim]:
    """The claims notebook ``number`` gives evidence for."""
    return [claim for claim in CLAIMS if number in claim.notebooks]


def plot_course_map(column: str = "evidence"):
    """The course as a map: the claims (left), each linked to the notebooks that give evidence for it (middle),
    and beside each notebook its ``column``: ``"evidence"`` (how it tests them) or ``"found"`` (what it found).
    Returns the Figure."""
    from matplotlib.patches import FancyBboxPatch, PathPatch
    from matplotlib.path import Path as MplPath

    from .plotting import figure

    if column not in ("evidence", "found"):
        raise ValueError(f"column must be 'evidence' or 'found', got {column!r}")
    n = len(NOTEBOOKS)
    row = {nb.number: n - 1 - i for i, nb in enumerate(NOTEBOOKS)}  # y of each notebook, first at the top
    fig, [[ax]] = figure(width=12.8, height=0.52 * n + 0.9)
    x_claim, w_claim, x_nb, w_nb, x_text = 0.0, 3.6, 4.6, 2.7, 7.5

    # Claims evenly spaced over the notebooks that test them, numbered top to bottom in CLAIMS order.
    top, bottom = row[NOTEBOOKS[1].number], row[NOTEBOOKS[-2].number]  # the span of the notebooks with claims
    step = (top - bottom) / max(1, len(CLAIMS) - 1)
    y_claim = {c: top - c * step for c in range(len(CLAIMS))}

    for c, claim in enumerate(CLAIMS):
        colour, y0 = COLOURS[c % len(COLOURS)], y_claim[c]
        ax.add_patch(FancyBboxPatch((x_claim, y0 - 0.4), w_claim, 0.8, boxstyle="round,pad=0.02,rounding_size=0.1",
                                    facecolor="white", edgecolor=colour, linewidth=1.6, zorder=3))
        ax.text(x_claim + 0.1, y0, f"{c + 1}", ha="left", va="center", fontsize=11, fontweight="bold",
                color=colour, zorder=4)  # the claim's number, as in notebook 10
        ax.text(x_claim + 0.3 + (w_claim - 0.3) / 2, y0, claim.label, ha="center", va="center", fontsize=8, zorder=4,
                linespacing=1.15)
        for number in claim.notebooks:  # a smooth link from the claim to each notebook
            y1, xa, xb = row[number], x_claim + w_claim, x_nb
            path = MplPath([(xa, y0), ((xa + xb) / 2, y0), ((xa + xb) / 2, y1), (xb, y1)],
                           [MplPath.MOVETO, MplPath.CURVE4, MplPath.CURVE4, MplPath.CURVE4])
            ax.add_patch(PathPatch(path, facecolor="none", edgecolor=colour, linewidth=1.4, alpha=0.85, zorder=2))

    for nb in NOTEBOOKS:
        y, linked = row[nb.number], bool(claims_of(nb.number))
        ax.add_patch(FancyBboxPatch((x_nb, y - 0.2), w_nb, 0.4, boxstyle="round,pad=0.02,rounding_size=0.08",
                                    facecolor="#dbe9f6" if linked else "#eeeeee", edgecolor="#333333",
                                    linewidth=0.8, zorder=3))
        ax.text(x_nb + 0.12, y, f"{nb.number} {nb.title}", ha="left", va="center", fontsize=8.5,
                fontweight="bold", zorder=4)
        ax.text(x_text, y, getattr(nb, column), ha="left", va="center", fontsize=8,
                color="#222222" if linked else "#666666", zorder=4)  # one line: tests hold each within WRAP

    heading = {"evidence": "how each notebook tests them", "found": "what each notebook found"}[column]
    for x, words, align in ((x_claim + w_claim / 2, "the claims", "center"),
                            (x_nb + w_nb / 2, "the notebooks", "center"), (x_text, heading, "left")):
        ax.text(x, n - 0.35, words, ha=align, va="center", fontsize=9, fontweight="bold", color="#444444")
    ax.set(xlim=(-0.1, 14.3), ylim=(-0.6, n))
    ax.axis("off")
    return fig


@dataclass(frozen=True)
class SheetRow:
    what: str  # in words
    where: str  # where to read it: a hook point, or a call
    bridge: str | None  # TransformerLens 4's TransformerBridge name where it differs; None: not a hook point
    axes: str  # its axes, in order: "batch pos d_model"
    tensor: object  # the tensor measured


def shape_sheet(model, tokens) -> tuple[list[SheetRow], dict]:
    """The start page's sheet of shapes: every activation of layer 0 of ``model`` (a causal mhalab ``Transformer``)
    run once on ``tokens [batch, pos]`` with ``run_with_cache``, and of the same model with grouped-query attention
    (half as many key/value heads). Returns ``(rows, caches)``, ``caches = {"model": ..., "gqa": ...}``."""
    import dataclasses

    from .hook_names import hook_aliases
    from .hooks import hook_points
    from .models import Transformer

    config = model.config
    gqa = Transformer(dataclasses.replace(config, n_key_value_heads=config.n_heads // 2))  # 2 query heads a K/V head
    logits, cache = model.run_with_cache(tokens)
    cache.compute_head_results()  # hook_result from hook_z and W_O, as use_attn_result would have cached it
    _, gqa_cache = gqa.run_with_cache(tokens)
    a = "blocks.0.attn."
    heads, kv = "batch pos n_heads d_head", "batch pos n_key_value_heads d_head"
    rows = [  # (what, where to read it, its axes, the tensor)
        ("tokens in", "tokens", "batch pos", tokens),
        ("token embeddings", "hook_embed", "batch pos d_model", cache["hook_embed"]),
        ("residual stream into block 0", "blocks.0.hook_resid_pre", "batch pos d_model",
         cache["blocks.0.hook_resid_pre"]),
        ("queries", a + "hook_q", heads, cache[a + "hook_q"]),
        ("keys", a + "hook_k", heads, cache[a + "hook_k"]),
        ("values", a + "hook_v", heads, cache[a + "hook_v"]),
        ("keys with grouped-query attention (values alike)", a + "hook_k", kv, gqa_cache[a + "hook_k"]),
        ("scores (+ mask), before the softmax", a + "hook_attn_scores", "batch n_heads query_pos key_pos",
         cache[a + "hook_attn_scores"]),
        ("attention pattern", a + "hook_pattern", "batch n_heads query_pos key_pos", cache[a + "hook_pattern"]),
        ("each head's output, before W_O", a + "hook_z", heads, cache[a + "hook_z"]),
        ("each head's write, after W_O", a + "hook_result", "batch pos n_heads d_model", cache[a + "hook_result"]),
        ("attention's output, all heads summed", "blocks.0.hook_attn_out", "batch pos d_model",
         cache["blocks.0.hook_attn_out"]),
        ("block 0's output", "blocks.0.hook_resid_post", "batch pos d_model", cache["blocks.0.hook_resid_post"]),
        ("logits", "logits", "batch pos d_vocab", logits),
        # every layer's weights, head by head, as TransformerLens's model.W_Q... give them
        *((f"{w} of layer 0", f"model.{w}[0]", "n_heads d_model d_head", getattr(model, w)[0])
          for w in ("W_Q", "W_K", "W_V")),
        ("W_O of layer 0", "model.W_O[0]", "n_heads d_head d_model", model.W_O[0]),
    ]
    bridge = {name: alias for alias, name in hook_aliases(model).items()}  # TransformerBridge's own names
    points = hook_points(model)
    sheet = [SheetRow(what, where, bridge.get(where, where) if where in points else None, axes, tensor)
             for what, where, axes, tensor in rows]
    return sheet, {"model": cache, "gqa": gqa_cache}


def sheet_table(sheet: list[SheetRow]) -> str:
    """``sheet`` as a Markdown table: what, where to read it, TransformerBridge's name, axes, the shape measured."""
    lines = ["| what | read it as | TransformerBridge's name | axes | shape here |", "|---|---|---|---|---|"]
    for r in sheet:
        other = "— (not a hook point)" if r.bridge is None else "the same" if r.bridge == r.where else f"`{r.bridge}`"
        lines.append(f"| {r.what} | `{r.where}` | {other} | `[{', '.join(r.axes.split())}]` | "
                     f"`{list(r.tensor.shape)}` |")
    return "\n".join(lines)
