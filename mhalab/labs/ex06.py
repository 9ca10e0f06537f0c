"""Exercise of notebook 06 (the head-count trade, and how far a training budget shows it): reading a sweep for
an interior maximum, seed by seed."""

from __future__ import annotations

import numpy as np
import torch

from .calls import Check
from .core import Exercise, register
from .judging import consistent_mistake, unseparated
from .verdicts import AnswerRaised, Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _ends(by_heads: dict) -> tuple[float, float]:
    return by_heads[min(by_heads)], by_heads[max(by_heads)]


def _mean_curve(accuracy: dict) -> dict:
    heads = next(iter(accuracy.values()))
    return {h: sum(a[h] for a in accuracy.values()) / len(accuracy) for h in heads}


def _neighbours_below(by_heads: dict) -> bool:
    heads = sorted(by_heads)
    return by_heads[heads[0]] < by_heads[heads[1]] and by_heads[heads[-1]] < by_heads[heads[-2]]


def _hump_mistakes(accuracy: dict) -> dict[str, bool]:
    """{message: what that reading returns} for one sweep."""
    def hump(a, *, strict=True, ends=_ends, best=None):
        top = max(a.values()) if best is None else best
        return all(e < top if strict else e <= top for e in ends(a))

    every = list(accuracy.values())
    best_anywhere = max(max(a.values()) for a in every)
    return {
        "the mean over seeds can hide a seed without the hump: check each seed on its own":
            hump(_mean_curve(accuracy)),
        "the ends are the smallest and the largest head count (min and max of the keys), not the first and last keys "
        "(the head counts need not be in order)": all(hump(a, ends=lambda a: (list(a.values())[0],
                                                                              list(a.values())[-1])) for a in every),
        "an end that ties the best is not below it: use a strict comparison": all(hump(a, strict=False) for a in every),
        "a seed whose best sits at an end ties the best there: the best head count must be neither end (compare the "
        "ends with the best strictly)": all(max(a, key=a.get) not in (min(a), max(a)) for a in every),
        "check both ends: the fewest heads as well as the most heads":
            all(a[max(a)] < max(a.values()) for a in every),
        "check both ends: the most heads as well as the fewest heads":
            all(a[min(a)] < max(a.values()) for a in every),
        "that judges the first seed only; every seed must show the hump": hump(every[0]),
        "one seed with the hump is not enough: it must be on *every* seed": any(hump(a) for a in every),
        "compare each seed's ends with that seed's own best, not with the best over all seeds":
            all(hump(a, best=best_anywhere) for a in every),
        "an end below its neighbour is not enough: it must be below the seed's best (the curve can rise again)":
            all(_neighbours_below(a) for a in every),
    }


_HUMP_CASES = [  # (accuracy {seed: {heads: accuracy}}, what the case is)
    ({0: {1: 0.3, 4: 0.9, 32: 0.5}, 1: {1: 0.4, 4: 0.95, 32: 0.6}}, "a hump on both seeds"),
    ({0: {1: 1.0, 4: 1.0, 32: 0.7}}, "one head ties the best"),
    ({0: {32: 0.5, 1: 0.3, 4: 0.9}, 1: {4: 0.95, 32: 0.6, 1: 0.4}}, "a hump, head counts not in order"),
    ({0: {4: 0.9, 1: 0.95, 32: 0.5}}, "the best at one head, head counts not in order"),
    ({0: {1: 0.3, 4: 0.9, 32: 0.5}, 1: {1: 0.9, 4: 0.6, 32: 0.5}}, "one seed's best is at one head"),
    ({0: {1: 0.2, 2: 0.8, 8: 0.9}, 1: {1: 0.2, 2: 0.9, 8: 0.8}}, "one seed's best is at the thinnest heads"),
    ({0: {1: 0.5, 2: 0.7, 4: 0.6}, 1: {1: 0.5, 2: 0.5, 4: 0.9}, 2: {1: 0.5, 2: 0.9, 4: 0.4}},
     "the mean over seeds has a hump, one seed does not"),
    ({0: {1: 0.3, 4: 0.9, 32: 0.5}, 1: {1: 0.7, 4: 0.6, 32: 0.5}},
     "one seed's best is at one head, below the other seed's best"),
    ({0: {1: 0.5, 2: 0.4, 4: 0.9, 8: 0.3, 16: 0.35}, 1: {1: 0.6, 2: 0.65, 4: 0.8, 8: 0.7, 16: 0.75}},
     "five head counts, a hump on both seeds, the ends above their neighbours"),
    ({0: {2: 0.6, 4: 0.8, 8: 0.85, 16: 0.8}, 1: {2: 0.7, 4: 0.75, 8: 0.8, 16: 0.8}},
     "four head counts, one seed's widest end ties its best"),
    ({0: {1: 0.3, 4: 0.6, 32: 0.5}, 1: {1: 0.95, 4: 0.5, 32: 0.4}},
     "the first seed has the hump, the second its best at one head"),
]


def _redrawn(r, accuracy: dict) -> dict:
    """``accuracy`` with fresh numbers and the same answer to every reading: its values mapped by one increasing
    affine map (which keeps every comparison, tie and mean), its head counts by one increasing map onto others, each
    seed's head counts listed in a shuffled order."""
    scale = r.uniform(0.5, 0.9)
    shift = r.uniform(0.0, 1.0 - scale)
    old = sorted(next(iter(accuracy.values())))
    new = sorted(r.sample([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128], len(old)))
    out = {}
    for seed, by_heads in accuracy.items():
        order = list(by_heads)
        r.shuffle(order)
        out[seed] = {new[old.index(h)]: scale * by_heads[h] + shift for h in order}
    return out


def _hump_cases(check: Check) -> list[tuple[dict, str]]:
    """The fixed cases; when grading, each redrawn (:func:`_redrawn`), again a few times at most until every reading
    gives an answer of its own on some case (a shuffled order can hide the first-and-last-keys reading)."""
    if not check.grading:
        return list(_HUMP_CASES)
    for attempt in range(20):
        r = check.rng(111 + 1000 * attempt)
        cases = [(_redrawn(r, accuracy), what) for accuracy, what in _HUMP_CASES]
        right = [_hump_every_seed(a) for a, _ in cases]
        if not unseparated(right, [_hump_mistakes(a) for a, _ in cases], _same):
            break
    return cases


def _hump_every_seed(accuracy: dict) -> bool:
    """The hump on every seed (the checker's own reading, for drawing cases; the answer is the solution's)."""
    return all(max(_ends(a)) < max(a.values()) for a in accuracy.values())


def _same(a, b) -> bool:
    return a == b


def _as_bool(got) -> bool | None:
    """``got`` as a bool when it is one: Python's, NumPy's, or a one-element boolean tensor or array; else None."""
    if isinstance(got, (bool, np.bool_)):
        return bool(got)
    dtype = getattr(got, "dtype", None)
    if dtype in (torch.bool, np.dtype(bool)) and getattr(got, "ndim", None) == 0:
        return bool(got)
    return None


def _check_hump(hump_on_every_seed, check: Check) -> None:
    cases, got, raised = _hump_cases(check), [], None
    for accuracy, what in cases:
        try:
            value = _as_bool(check.call(hump_on_every_seed, accuracy, label=repr(accuracy)))
        except AnswerRaised as error:  # judged after the cases before it: a wrong answer there is said first
            raised = error
            break
        if value is None:
            raise Wrong(f"return True or False, got {check.last_call[1]} for {accuracy} ({what})")
        got.append(value)
    cases = cases[:len(got)]
    wants = [bool(check.reference(accuracy)) for accuracy, _ in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    accuracy, what = cases[bad]
    message = consistent_mistake(got, wants, [_hump_mistakes(a) for a, _ in cases], _same)
    raise Wrong(f"for {accuracy} ({what}) the answer is {wants[bad]}, you returned {got[bad]}: " + (
        message or "return True exactly when, on every seed, both the smallest and the largest head count score "
                   "strictly below that seed's best"))


register(Exercise(
    "06", 1, "an interior maximum on every seed",
    _check_hump,
    hint=["Loop over the seeds. For one seed's {heads: accuracy}, the ends are the smallest and the largest head "
          "count (min and max of the keys, not the first and last keys).",
          "A seed shows the hump only if both ends are strictly below that seed's best; one seed without it is "
          "enough to return False. The mean over seeds can hide such a seed."],
    solution=(
        "def hump_on_every_seed(accuracy):\n"
        "    for by_heads in accuracy.values():                  # one seed: {heads: accuracy}\n"
        "        best = max(by_heads.values())\n"
        "        fewest, most = min(by_heads), max(by_heads)     # the two ends of the sweep\n"
        "        if by_heads[fewest] >= best or by_heads[most] >= best:\n"
        "            return False\n"
        "    return True"
    ),
    minutes=10, difficulty=2, importance=2,
))
