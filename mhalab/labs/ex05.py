"""Exercises of notebook 05 (what the heads do): find the previous-token head with the explorer, name the
roles of heads, and compute a previous-token score yourself.

Exercises 1 and 2 are answered by looking: the learner reads heads off the explorer and the check
confirms them against that explorer's scores, passed as the second argument::

    q1.check((1, 5), explorer)          # "layer 1, head 5 is the previous-token head"
    q2.check({(0, 2): "left1", ...}, explorer)

Without an explorer the checks use a small hand-made one (``DEMO``), on which the reference answers
pass (that is what the test suite checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any

import torch

from ..scores import FRACTION_SCORES, head_scores, previous_token_score
from .checks import call_on_hidden_cases, case
from .core import Exercise, Wrong, register

_NONE = "none"


@dataclass
class ScoredHeads:
    """What a check needs from an explorer: every head's scores and the names they go by."""

    scores: dict[str, Any]  # name -> [N, H]
    relations: list[str]
    threshold: float = 0.5

    @property
    def n_layers(self) -> int:
        return len(next(iter(self.scores.values())))

    @property
    def n_heads(self) -> int:
        return len(next(iter(self.scores.values()))[0])

    @property
    def bar_names(self) -> list[str]:
        return list(self.relations) + list(FRACTION_SCORES)


def _demo() -> ScoredHeads:
    """Two layers of three hand-made heads on 6 tokens, with one relation ("left2")."""
    T = 6
    eye = torch.eye(T)
    prev = torch.roll(eye, -1, dims=1)  # row q has its 1 at q - 1 ...
    prev[0] = eye[0]  # ... except query 0, which looks at itself
    nxt = torch.roll(eye, 1, dims=1)
    nxt[-1] = eye[-1]
    left2 = torch.roll(eye, -2, dims=1)
    left2[:2] = eye[:2]
    uniform = torch.full((T, T), 1.0 / T)
    first = torch.zeros(T, T)
    first[:, 0] = 1.0
    mixed = 0.4 * prev + 0.4 * nxt + 0.2 * eye
    layers = [torch.stack([prev, uniform, first]), torch.stack([nxt, left2, mixed])]  # each [H=3, T, T]
    attention = torch.stack(layers)[:, None]  # [N=2, B=1, H=3, T, T]
    sources = torch.arange(T)[None] - 2
    sources[sources < 0] = -1

    class _Batch:
        pass

    batch = _Batch()
    batch.sources = {"left2": sources}
    scores = {k: v.numpy() for k, v in head_scores(attention, batch).items()}
    return ScoredHeads(scores, ["left2"])


DEMO = _demo()


def _context(explorer: Any) -> Any:
    if explorer is None:
        return DEMO
    if not (hasattr(explorer, "scores") and hasattr(explorer, "bar_names")):
        raise Wrong(
            f"the second argument must be the explorer you looked at (from head_explorer(...)), got "
            f"{type(explorer).__name__}"
        )
    return explorer


def _head(pair: Any, ctx: Any, what: str) -> tuple[int, int]:
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise Wrong(f"{what} should be a (layer, head) pair such as (0, 3), got {pair!r}")
    layer, head = pair
    for name, value in (("layer", layer), ("head", head)):
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise Wrong(f"the {name} in {what} should be a whole number, got {value!r}")
    if not 0 <= layer < ctx.n_layers:
        raise Wrong(f"{what}: there is no layer {layer}; this model has layers 0..{ctx.n_layers - 1}")
    if not 0 <= head < ctx.n_heads:
        raise Wrong(f"{what}: there is no head {head}; each layer has heads 0..{ctx.n_heads - 1}")
    return int(layer), int(head)


def _fits(ctx: Any, layer: int, head: int) -> set[str]:
    """Every name that describes the head: at least the threshold and close to its best score."""
    values = {name: float(ctx.scores[name][layer][head]) for name in ctx.bar_names}
    top = max(values.values())
    threshold = getattr(ctx, "threshold", 0.5)
    if top < threshold:
        return {_NONE}
    return {name for name, v in values.items() if v >= threshold and v >= top - 0.05}


# ------------------------------------------------------------------------------------ exercise 1
def _check_previous_token_head(answer, explorer=None) -> None:
    ctx = _context(explorer)
    layer, head = _head(answer, ctx, "your answer")
    prev = ctx.scores["previous-token"]
    score = float(prev[layer][head])
    best = max(float(prev[l][h]) for l in range(ctx.n_layers) for h in range(ctx.n_heads))
    if score >= max(0.5, best - 0.1):
        return
    if "next-token" in ctx.scores and float(ctx.scores["next-token"][layer][head]) >= 0.5:
        raise Wrong(f"layer {layer}, head {head} looks at the *next* token (its bright cells sit just right of the "
                    "diagonal); the previous token is on the other side")
    raise Wrong(f"layer {layer}, head {head} puts only {score:.0%} of its attention on the previous token; another "
                "head puts much more there. Highlight 'previous-token' and look for bright cells on the red circles")


register(Exercise(
    "05", 1, "find the previous-token head",
    _check_previous_token_head,
    hint=["Choose 'previous-token' in the highlight menu: red circles mark the cell just left of the diagonal "
          "in every row. Move the layer and head sliders until the bright cells sit on them.",
          "The bar chart beside the map gives the same score for the whole batch: you want a head whose "
          "previous-token bar is close to 1."],
    solution=(
        "# Read off the explorer (highlight 'previous-token'), or take the best score:\n"
        "previous_token_head = max(explorer.heads, key=lambda lh: explorer.scores['previous-token'][lh])\n"
        "q1.check(previous_token_head, explorer)"
    ),
    reference=(0, 0),
    wrong=[(1, 0), (0, 1), (1, 2), (2, 0)],
))


# ------------------------------------------------------------------------------------ exercise 2
def _check_roles(answer, explorer=None) -> None:
    ctx = _context(explorer)
    if not isinstance(answer, dict):
        raise Wrong(f"answer with a dict {{(layer, head): role}}, e.g. {{(0, 3): 'left2'}}, got {type(answer).__name__}")
    names = ctx.bar_names + [_NONE]
    if len(answer) < 3:
        raise Wrong(f"name the roles of at least three heads; you named {len(answer)}")
    named = [_head(pair, ctx, f"key {pair!r}") for pair in answer]
    roles = list(answer.values())
    for role in roles:
        if role not in names:
            raise Wrong(f"{role!r} is not a role the explorer knows; use one of {names}")
    if _NONE not in roles:
        raise Wrong("include at least one head that matches no relation and no generic score (role 'none')")
    if ctx.relations and not any(r in ctx.relations for r in roles):
        raise Wrong(f"include at least one head that carries a relation of the task ({', '.join(ctx.relations)})")
    for (layer, head), role in zip(named, roles):
        fits = _fits(ctx, layer, head)
        if role in fits:
            continue
        if role == _NONE:
            raise Wrong(f"layer {layer}, head {head} does have a clear role: more than half of its attention lands "
                        "on one kind of position")
        score = float(ctx.scores[role][layer][head])
        raise Wrong(f"layer {layer}, head {head} is not a {role!r} head: only {score:.0%} of its attention lands where "
                    f"{role!r} points (highlight it in the explorer to see)")


register(Exercise(
    "05", 2, "name the roles of three heads",
    _check_roles,
    hint=["The bar chart beside the heat map shows how much of the head's attention lands where each relation "
          "points; a head has a role when one bar is well past the dotted line (half of its attention).",
          "A head whose bars are all short spreads its attention or mixes positions: its role is 'none'."],
    solution=(
        "roles = {(0, 0): 'previous-token', (1, 1): 'left2', (0, 1): 'none'}   # for the DEMO heads\n"
        "# in the notebook: heads read off the explorer, e.g. {lh: explorer.role_name(*lh) for lh in heads}\n"
        "q2.check(roles, explorer)"
    ),
    reference={(0, 0): "previous-token", (1, 1): "left2", (0, 1): _NONE},
    wrong=[
        {(0, 0): "next-token", (1, 1): "left2", (0, 1): _NONE},  # the wrong side of the diagonal
        {(0, 0): "previous-token", (1, 2): "left2", (0, 1): _NONE},  # a mixed head named after a relation
        {(0, 0): "previous-token", (1, 1): "left2", (1, 0): _NONE},  # a clear head called 'none'
        {(0, 0): "previous-token", (1, 1): "left2"},  # too few
    ],
))


# ------------------------------------------------------------------------------------ exercise 3
def _prev_reference(attention: torch.Tensor) -> torch.Tensor:
    return previous_token_score(attention[None])[0]  # [1, B, H, T, S] -> [H]


def _pattern_cases() -> list:
    g = torch.Generator().manual_seed(5)
    cases = []
    for B, H, T, causal in [(2, 3, 5, False), (1, 4, 9, True), (3, 1, 2, False), (2, 2, 7, True)]:
        scores = torch.randn(B, H, T, T, generator=g) * 3
        if causal:
            scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        cases.append(case(scores.softmax(-1)))
    return cases


def _check_prev_score(previous_token_score) -> None:
    call_on_hidden_cases(previous_token_score, _pattern_cases(), _prev_reference, name="previous_token_score",
                         rtol=1e-4, atol=1e-6)


register(Exercise(
    "05", 3, "a previous-token score of your own",
    _check_prev_score,
    hint=["attention[b, h, q, k] is how much query q attends to key k. The previous token of query q is key q - 1, "
          "which exists for q = 1 .. T-1 only.",
          "torch.diagonal(attention, offset=-1, dim1=-2, dim2=-1) gives attention[..., q, q - 1] for every q >= 1; "
          "average it over the batch and those queries."],
    solution=(
        "def previous_token_score(attention):\n"
        "    # attention: [B, H, T, T] -> [H]\n"
        "    below = torch.diagonal(attention, offset=-1, dim1=-2, dim2=-1)   # [B, H, T-1]: attention[q, q-1]\n"
        "    return below.mean(dim=(0, 2))"
    ),
    reference=lambda attention: torch.diagonal(attention, offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2)),
    wrong=[
        lambda attention: torch.diagonal(attention, dim1=-2, dim2=-1).mean(dim=(0, 2)),  # the token itself
        lambda attention: torch.diagonal(attention, offset=1, dim1=-2, dim2=-1).mean(dim=(0, 2)),  # the next token
        lambda attention: torch.diagonal(attention, offset=-1, dim1=-2, dim2=-1).sum(-1).mean(0) / attention.size(-1),
    ],
))
