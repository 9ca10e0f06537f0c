"""The course in one structure: the claims it makes, the notebooks that give evidence for each, what kind of
evidence each notebook gives and what it found. Notebook 00 draws it as the map of the course
(``plot_course_map("evidence")``), notebook 13 as its summary (``plot_course_map("found")``); the tests check that it
names every notebook of ``notebooks/`` and no other, so it changes when the course does.

The texts state no measured number: each notebook states and checks its own.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

__all__ = ["Notebook", "Claim", "NOTEBOOKS", "CLAIMS", "notebook", "claims_of", "plot_course_map"]


@dataclass(frozen=True)
class Notebook:
    number: str  # "03"
    stem: str  # the file's name without .ipynb: "03_it_costs_nothing"
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
    Notebook("03", "03_it_costs_nothing", "it costs nothing",
             "weights counted on real modules; the KV cache measured while decoding",
             "the same weights and cache at every head count; grouped-query attention shares K/V"),
    Notebook("04", "04_what_heads_cost", "what heads cost",
             "proofs of what a narrow head can single out; a head-count sweep",
             "a width-one head singles out only the largest or smallest key"),
    Notebook("05", "05_what_heads_do", "what heads do",
             "a toy with planted relations: head scores, retraining, ablation, pruning",
             "roles appear unasked and differ by seed; most heads can go one at a time"),
    Notebook("06", "06_where_it_sits", "where it sits",
             "a trained encoder-decoder: what each attention sees; operations counted and timed",
             "encoder sees all, decoder is causal, cross-attention reads the encoder; blocks run in turn"),
    Notebook("07", "07_a_real_encoder", "a real encoder",
             "MiniLM on your sentences: head scores, ablation, pruning",
             "MiniLM: a previous-token head, [CLS] sinks, many heads that can go"),
    Notebook("08", "08_a_real_llm", "a real LLM",
             "SmolLM2: its cost table, sinks, induction heads, ablation, patching",
             "SmolLM2: a smaller cache, sink heads, induction heads fed through their keys"),
    Notebook("09", "09_heads_form", "heads form",
             "toy models recorded while they train; heads switched off; the key path cut",
             "an induction head forms with a sudden drop of the repeat loss; one layer forms none"),
    Notebook("10", "10_what_heads_compute", "what heads compute",
             "the weights alone: ranks, copying and composition scores, against random",
             "QK and OV circuits read from the weights; where they agree with patching and where not"),
    Notebook("11", "11_the_trade_and_its_budget", "the trade and its budget",
             "a head-count sweep on two lookups, seed by seed, with learning curves",
             "on a task that needs both, too few and too many heads both fall short"),
    Notebook("12", "12_lookups_at_every_width", "lookups at every width",
             "every width with its own learning rate, at two budgets",
             "middle widths answer the lookup; the narrowest are still learning at this budget"),
    Notebook("13", "13_wrap_up", "wrap-up",
             "the claims again, and what to read next",
             "the claims again, and what to read next"),
)

CLAIMS: tuple[Claim, ...] = (
    Claim("one weighting per token:\na lone head must share it", ("01",)),
    Claim("multi-head attention is h heads\nside by side, mixed by W_O", ("02", "06")),
    Claim("heads cost no weights and no cache:\n4·d_model² and 2·d_model, for any h", ("03", "08")),
    Claim("the heads of a block run in parallel,\nthe blocks one after another", ("06",)),
    Claim("heads take on roles unasked,\nand many can go", ("05", "07", "08")),
    Claim("induction heads form in training\nand compose across layers", ("08", "09", "10")),
    Claim("what more heads cost\nis width per head", ("04", "10", "11", "12")),
)

# One colour per claim (Okabe & Ito's palette, distinct for colour-blind readers too).
COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#CC79A7", "#0072B2", "#D55E00", "#6a3d9a")


def notebook(number: str) -> Notebook:
    """The notebook numbered ``number`` ("03")."""
    found = [nb for nb in NOTEBOOKS if nb.number == number]
    if not found:
        raise KeyError(f"no notebook {number!r} in the course map; it has {[nb.number for nb in NOTEBOOKS]}")
    return found[0]


def claims_of(number: str) -> list[Claim]:
    """The claims notebook ``number`` gives evidence for."""
    return [claim for claim in CLAIMS if number in claim.notebooks]


def plot_course_map(column: str = "evidence", *, wrap: int = 88):
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

    # Claims evenly spaced, in the order of their notebooks' mean row, so that few links cross.
    def mean_row(c: int) -> float:
        return sum(row[k] for k in CLAIMS[c].notebooks) / len(CLAIMS[c].notebooks)

    order = sorted(range(len(CLAIMS)), key=mean_row, reverse=True)
    top, bottom = row[NOTEBOOKS[1].number], row[NOTEBOOKS[-2].number]  # the span of the notebooks with claims
    step = (top - bottom) / max(1, len(CLAIMS) - 1)
    y_claim = {c: top - k * step for k, c in enumerate(order)}

    for c, claim in enumerate(CLAIMS):
        colour, y0 = COLOURS[c % len(COLOURS)], y_claim[c]
        ax.add_patch(FancyBboxPatch((x_claim, y0 - 0.36), w_claim, 0.72, boxstyle="round,pad=0.02,rounding_size=0.1",
                                    facecolor="white", edgecolor=colour, linewidth=1.6, zorder=3))
        ax.text(x_claim + w_claim / 2, y0, claim.label, ha="center", va="center", fontsize=8, zorder=4,
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
        text = textwrap.fill(getattr(nb, column), wrap, break_on_hyphens=False)
        ax.text(x_text, y, text, ha="left", va="center", fontsize=8, color="#222222" if linked else "#666666",
                linespacing=1.1, zorder=4)

    heading = {"evidence": "how each notebook tests them", "found": "what each notebook found"}[column]
    for x, words, align in ((x_claim + w_claim / 2, "the claims", "center"),
                            (x_nb + w_nb / 2, "the notebooks", "center"), (x_text, heading, "left")):
        ax.text(x, n - 0.35, words, ha=align, va="center", fontsize=9, fontweight="bold", color="#444444")
    ax.set(xlim=(-0.1, 14.3), ylim=(-0.6, n))
    ax.axis("off")
    return fig
