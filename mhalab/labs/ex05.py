"""Exercises of notebook 05 (what the heads do): find the previous-token head with the explorer, name the
roles of heads, and compute a previous-token score yourself.

Exercises 1 and 2 are answered by looking: the learner reads heads off the explorer, and the check
confirms them against that explorer's scores, passed along as the second argument::

    q1.check((1, 5), explorer)                     # "layer 1, head 5 is the previous-token head"
    q2.check({(0, 2): "left1", (1, 0): None}, explorer)

``DEMO`` is a small hand-made stand-in for an explorer (two layers of three heads), used by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..scores import FRACTION_SCORES, head_scores, previous_token_score
from .checks import call_answer, expect_close, expect_whole, first_match
from .core import Exercise, Wrong, register

_NONE = "none"  # the explorer's name for "no role" (heads_matching says None)


@dataclass
class ScoredHeads:
    """What a check needs from an explorer: every head's scores and the names they go by."""

    scores: dict[str, Any]  # name -> [N, H]
    relations: list[str]
    threshold: float = 0.5

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
    attention = torch.stack([torch.stack([prev, uniform, first]), torch.stack([nxt, left2, mixed])])[:, None]  # [N, B, H, T, T]
    sources = torch.arange(T)[None] - 2
    sources[sources < 0] = -1

    class _Batch:
        pass

    batch = _Batch()
    batch.sources = {"left2": sources}
    return ScoredHeads(dict(head_scores(attention, batch)), ["left2"])


DEMO = _demo()


def _prepare(explorer: Any = None) -> tuple[dict]:
    """The explorer's scores as plain data (what the grader records)."""
    if explorer is None:
        raise Wrong("this check needs the explorer you looked at, passed along: q.check(your_answer, explorer)")
    if not (hasattr(explorer, "scores") and hasattr(explorer, "bar_names")):
        raise Wrong(f"the second argument must be the explorer you looked at (from head_explorer(...)), got {type(explorer).__name__}")
    names = list(explorer.bar_names)
    scores = {n: torch.as_tensor(explorer.scores[n], dtype=torch.float64) for n in names + ["next-token"] if n in explorer.scores}
    return ({"scores": scores, "relations": list(explorer.relations), "names": names,
             "threshold": float(getattr(explorer, "threshold", 0.5))},)


def _head(pair: Any, ctx: dict, what: str) -> tuple[int, int]:
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise Wrong(f"{what} should be a (layer, head) pair such as (0, 3), got {pair!r}"[:200])
    layer, head = (expect_whole(v, f"the {n} in {what}") for v, n in zip(pair, ("layer", "head")))
    n_layers, n_heads = ctx["scores"]["previous-token"].shape
    if not 0 <= layer < n_layers:
        raise Wrong(f"{what}: there is no layer {layer}; this model has layers 0..{n_layers - 1}")
    if not 0 <= head < n_heads:
        raise Wrong(f"{what}: there is no head {head}; each layer has heads 0..{n_heads - 1}")
    return layer, head


def _fits(ctx: dict, layer: int, head: int) -> set[str]:
    """Every name that describes the head: at least the threshold and close to its best score."""
    values = {name: float(ctx["scores"][name][layer, head]) for name in ctx["names"]}
    top = max(values.values())
    if top < ctx["threshold"]:
        return {_NONE}
    return {name for name, v in values.items() if v >= ctx["threshold"] and v >= top - 0.05}


# ------------------------------------------------------------------------------------ exercise 1
def _check_previous_token_head(answer, ctx: dict) -> None:
    layer, head = _head(answer, ctx, "your answer")
    prev = ctx["scores"]["previous-token"]
    score = float(prev[layer, head])
    if score >= max(ctx["threshold"], float(prev.max()) - 0.1):
        return
    if "next-token" in ctx["scores"] and float(ctx["scores"]["next-token"][layer, head]) >= ctx["threshold"]:
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
    prepare=_prepare,
))


# ------------------------------------------------------------------------------------ exercise 2
def _check_roles(answer, ctx: dict) -> None:
    if not isinstance(answer, dict):
        raise Wrong(f"answer with a dict {{(layer, head): role}}, e.g. {{(0, 3): 'left2', (1, 0): None}}, got {type(answer).__name__}")
    if len(answer) < 3:
        raise Wrong(f"name the roles of at least three heads; you named {len(answer)}")
    names = ctx["names"] + [_NONE]
    named = {_head(pair, ctx, f"key {pair!r}"): _NONE if role is None else role for pair, role in answer.items()}
    for role in named.values():
        if role not in names:
            raise Wrong(f"{role!r} is not a role the explorer knows; use one of {names} (or None for no role)"[:300])
    if _NONE not in named.values():
        raise Wrong("include at least one head that matches no relation and no generic score (role None or 'none')")
    for (layer, head), role in named.items():
        if role in _fits(ctx, layer, head):
            continue
        if role == _NONE:
            raise Wrong(f"layer {layer}, head {head} does have a clear role: more than half of its attention lands "
                        "on one kind of position")
        score = float(ctx["scores"][role][layer, head])
        raise Wrong(f"layer {layer}, head {head} is not a {role!r} head: only {score:.0%} of its attention lands where "
                    f"{role!r} points (highlight it in the explorer to see)")
    carries = [lh for lh, role in named.items() if role != _NONE
               and any(float(ctx["scores"][r][lh]) >= ctx["threshold"] for r in ctx["relations"])]
    if ctx["relations"] and not carries:
        raise Wrong(f"include at least one head that carries a relation of the task ({', '.join(ctx['relations'])}): "
                    "one whose bar for that relation passes the dotted line")


register(Exercise(
    "05", 2, "name the roles of three heads",
    _check_roles,
    hint=["The bar chart beside the heat map shows how much of the head's attention lands where each relation "
          "points; a head has a role when one bar is well past the dotted line (half of its attention).",
          "A head whose bars are all short spreads its attention or mixes positions: its role is None ('none')."],
    solution=(
        "roles = {(0, 0): 'previous-token', (1, 1): 'left2', (0, 1): None}   # for the DEMO heads\n"
        "# in the notebook: heads read off the explorer, e.g. {lh: explorer.role_name(*lh) for lh in heads}\n"
        "q2.check(roles, explorer)"
    ),
    reference={(0, 0): "previous-token", (1, 1): "left2", (0, 1): None},
    prepare=_prepare,
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
        cases.append((scores.softmax(-1),))
    return cases


def _check_prev_score(previous_token_score) -> None:
    for (attention,) in _pattern_cases():
        label = f"attention {list(attention.shape)}"
        got = call_answer(previous_token_score, attention, label=label)
        mistake = first_match(got, {
            "that is the attention to the token itself (the diagonal); the previous token is the key just left of it, q - 1":
                attention.diagonal(0, -2, -1).mean(dim=(0, 2)),
            "that is the attention to the *next* token (q + 1); the previous token is the key q - 1":
                attention.diagonal(1, -2, -1).mean(dim=(0, 2)),
            "the mean runs over all T queries; only the T - 1 queries that have a previous token count":
                attention.diagonal(-1, -2, -1).sum(-1).mean(0) / attention.size(-1),
        })
        if mistake and first_match(got, {"": _prev_reference(attention)}) is None:
            raise Wrong(f"previous_token_score({label}): {mistake}")
        try:
            expect_close(got, _prev_reference(attention), "the result")
        except Wrong as wrong:
            raise Wrong(f"previous_token_score({label}): {wrong}") from None


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
))
