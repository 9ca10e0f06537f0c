"""Exercises of notebook 06 (the head-count trade, and how far a training budget shows it): predict, from the task's
structure, which head counts have enough favourites for every lookup; then read a sweep, seed by seed, for the
trade (both ends short of the best)."""

from __future__ import annotations

import numpy as np
import torch

from .calls import Check
from .core import Exercise, register
from .invoke import Opaque
from .judging import answers_until_raised, consistent_mistake, unseparated
from .verdicts import Wrong


# ------------------------------------------------------------------------------------ exercise 1
def _divisors(d_model: int) -> list[int]:
    return [h for h in range(1, d_model + 1) if d_model % h == 0]


def _enough(d_model: int, n_tables: int, n_keys: int, *, divides=True, blend=True, strict_blend=False, thin="count",
            strict_thin=False, tables_in_thin=True, wide=2, strict_wide=False, wide_count=None) -> tuple[int, ...]:
    """The head counts with enough favourites (the checker's own reading, for drawing cases; the answer is the
    solution's), and with options, the readings a learner could make instead."""
    heads = _divisors(d_model) if divides else list(range(1, d_model + 1))
    out = []
    for h in heads:
        d_k = d_model // h
        needed = n_tables * n_keys if tables_in_thin else n_keys
        if (d_k > wide) if strict_wide else (d_k >= wide):    # a head wide enough to favour any entry
            if wide_count == "two":
                ok = 2 * h >= n_tables * n_keys
            elif wide_count == "per dimension":
                ok = h >= n_tables and 2 * d_k * h >= n_tables * n_keys
            else:
                ok = not blend or (h > n_tables if strict_blend else h >= n_tables)
        elif thin == "count":
            ok = 2 * h > needed if strict_thin else 2 * h >= needed
        else:
            ok = thin == "always"
        if ok:
            out.append(h)
    return tuple(out)


def _enough_mistakes(d_model: int, n_tables: int, n_keys: int) -> dict[str, tuple[int, ...]]:
    """{message: the head counts that reading returns} for one task shape."""
    right = _enough(d_model, n_tables, n_keys)
    return {
        "a head count must divide d_model (d_k = d_model / h is whole): the sweep tries only divisors":
            _enough(d_model, n_tables, n_keys, divides=False),
        "that gives head counts back as widths d_k; return the head counts h": tuple(sorted(d_model // h
                                                                                         for h in right)),
        "return every head count that has enough favourites, not only the smallest": right[:1],
        "fewer heads than tables blend: a head has one favourite per query, so each query needs n_tables heads at "
        "least, each serving one table": _enough(d_model, n_tables, n_keys, blend=False),
        "as many heads as tables is enough (one head per table): h >= n_tables, not h > n_tables":
            _enough(d_model, n_tables, n_keys, strict_blend=True),
        "a head of width one has at most two favourites whatever its queries (the top and the bottom of its key "
        "numbers): count them against the n_tables x n_keys (table, key) pairs":
            _enough(d_model, n_tables, n_keys, thin="always"),
        "width one is not ruled out by its width alone: h heads of width one have 2h favourites between them, "
        "enough when the (table, key) pairs are few":
            _enough(d_model, n_tables, n_keys, thin="never"),
        "2h favourites exactly as many as the pairs are enough: compare with >=, not >":
            _enough(d_model, n_tables, n_keys, strict_thin=True),
        "the pairs a query can ask for are n_tables x n_keys (every key, in every table), not n_keys":
            _enough(d_model, n_tables, n_keys, tables_in_thin=False),
        "a head of width two is wide enough to favour any entry (section 1's rotation, notebook 05's circle): "
        "d_k >= 2, not d_k > 2": _enough(d_model, n_tables, n_keys, strict_wide=True),
        "a head of width two or more is not limited to two favourites: its query can point at any entry, one per "
        "asked key": _enough(d_model, n_tables, n_keys, wide_count="two"),
        "a head of width two or more is not limited to two favourites per dimension: its query can point at any "
        "entry, one per asked key": _enough(d_model, n_tables, n_keys, wide_count="per dimension"),
    }


_ENOUGH_CASES = [  # (d_model, n_tables, n_keys), what the case is
    ((12, 2, 12), "12 heads of width one have exactly as many favourites as pairs"),
    ((16, 4, 12), "four tables"),
    ((6, 3, 2), "two keys: width one has favourites to spare"),
    ((4, 3, 12), "no head count has enough"),
    ((24, 2, 12), "every divisor but one"),
    ((10, 5, 4), "five tables; width one exactly enough"),
    ((7, 1, 5), "a prime width, one table"),
    ((9, 2, 4), "odd widths"),
    ((1, 1, 2), "one dimension"),
    ((32, 4, 20), "width one short by a few favourites"),
]


def _enough_cases(check: Check) -> list[tuple[tuple[int, int, int], str]]:
    """The fixed cases; when grading, three drawn fresh as well (again a few times at most until every reading gives
    an answer of its own on some case)."""
    cases = list(_ENOUGH_CASES)
    if not check.grading:
        return cases
    for attempt in range(20):
        r = check.rng(110 + 1000 * attempt)
        drawn = []
        for i in range(3):
            d_model = r.choice([6, 8, 12, 16, 18, 20, 24, 30, 36, 48, 64])
            n_tables = r.randint(1, 6)
            n_keys = r.choice([2, 3, 4, 6, 8, 12, 16, 24, 32])
            drawn.append(((d_model, n_tables, n_keys), f"drawn case {i}"))
        every = cases + drawn
        if not unseparated([_enough(*c) for c, _ in every], [_enough_mistakes(*c) for c, _ in every], _same):
            break
    return cases + drawn


def _heads_of(value) -> tuple[int, ...] | None:
    """``value`` as the sorted head counts it holds (a list, tuple, array or tensor of whole numbers), else None."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim != 1:
            return None
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        return None
    out = []
    for h in value:
        if isinstance(h, (torch.Tensor, np.ndarray)) and h.ndim == 0:
            h = h.item()  # a 0-d tensor or array (from a loop over torch.arange or np.arange)
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not float(h).is_integer():
            return None
        out.append(int(h))
    return tuple(sorted(out))


def _check_enough(heads_with_enough_favourites, check: Check) -> None:
    cases = _enough_cases(check)

    def call(case):
        (d_model, n_tables, n_keys), what = case
        label = f"d_model={d_model}, n_tables={n_tables}, n_keys={n_keys} ({what})"
        value = check.call(heads_with_enough_favourites, d_model, n_tables, n_keys, label=label)
        heads = _heads_of(value)
        if heads is None:
            kind = value.description if isinstance(value, Opaque) else check.last_call[1]
            raise Wrong(f"for {label}: return the head counts as a list of whole numbers (sorted(...) makes one), "
                        f"got {kind}")
        if len(set(heads)) != len(heads):
            raise Wrong(f"for {label}: you returned some head count more than once: name each once")
        return heads

    got, raised = answers_until_raised(cases, call)
    cases = cases[:len(got)]
    wants = [tuple(sorted(int(h) for h in check.reference(*c))) for c, _ in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    (d_model, n_tables, n_keys), what = cases[bad]
    label = f"d_model={d_model}, n_tables={n_tables}, n_keys={n_keys} ({what})"
    message = consistent_mistake(got, wants, [_enough_mistakes(*c) for c, _ in cases], _same)
    extra, missing = sorted(set(got[bad]) - set(wants[bad])), sorted(set(wants[bad]) - set(got[bad]))
    said = "; ".join(part for part in (f"h = {extra} should not be there" if extra else "",
                                       f"h = {missing} is missing" if missing else "") if part)
    raise Wrong(f"for {label}: {said}: " + (message or "a head count has enough favourites when it divides d_model "
                                            "and, with heads of width two or more, gives every table its own head, "
                                            "or, with heads of width one, has as many favourites as (table, key) "
                                            "pairs"))


register(Exercise(
    "06", 1, "how many heads have enough favourites",
    _check_enough,
    hint=["Split the head counts (the divisors of d_model) by their width d_k = d_model / h: two or more, or one. "
          "A head of width two or more can make any entry its favourite (the rotation of section 1), but it has one "
          "favourite per query: how many heads does each query need?",
          "A head of width one has at most two favourites in all, whatever the query. Every (table, key) pair a "
          "query can ask for (n_tables x n_keys of them) needs a head that favours it."],
    solution=(
        "def heads_with_enough_favourites(d_model, n_tables, n_keys):\n"
        "    enough = []\n"
        "    for h in range(1, d_model + 1):\n"
        "        if d_model % h:\n"
        "            continue                                  # d_k = d_model / h must be whole\n"
        "        if d_model // h >= 2:                         # any entry, but one favourite per query:\n"
        "            ok = h >= n_tables                        # each query needs a head per table\n"
        "        else:                                         # width one: two favourites in all\n"
        "            ok = 2 * h >= n_tables * n_keys           # ... for every (table, key) pair\n"
        "        if ok:\n"
        "            enough.append(h)\n"
        "    return enough"
    ),
    minutes=10, difficulty=3, importance=4,
))


# ------------------------------------------------------------------------------------ exercise 2
VERDICTS = ("every seed", "some seeds", "no seed")


def _ends(by_heads: dict) -> tuple[float, float]:
    return by_heads[min(by_heads)], by_heads[max(by_heads)]


def _mean_curve(accuracy: dict) -> dict:
    heads = next(iter(accuracy.values()))
    return {h: sum(a[h] for a in accuracy.values()) / len(accuracy) for h in heads}


def _neighbours_below(by_heads: dict) -> bool:
    heads = sorted(by_heads)
    return by_heads[heads[0]] < by_heads[heads[1]] and by_heads[heads[-1]] < by_heads[heads[-2]]


def _shows(a: dict, *, strict=True, ends=_ends, best=None) -> bool:
    """Whether one seed's {heads: accuracy} shows the trade: both ends below its best (with options, misreadings)."""
    top = max(a.values()) if best is None else best
    return all(e < top if strict else e <= top for e in ends(a))


def _verdict(showing: list[bool]) -> str:
    return VERDICTS[0] if all(showing) else VERDICTS[1] if any(showing) else VERDICTS[2]


def _trade(accuracy: dict) -> str:
    """The verdict (the checker's own reading, for drawing cases; the answer is the solution's)."""
    return _verdict([_shows(a) for a in accuracy.values()])


def _trade_mistakes(accuracy: dict) -> dict[str, str]:
    """{message: the verdict that reading gives} for one sweep."""
    every = list(accuracy.values())
    best_anywhere = max(max(a.values()) for a in every)
    right = [_shows(a) for a in every]

    def all_or_none(flag: bool) -> str:
        return VERDICTS[0] if flag else VERDICTS[2]

    return {
        "the mean over seeds can show the trade where a seed does not, or hide it: read each seed on its own":
            all_or_none(_shows(_mean_curve(accuracy))),
        "the ends are the smallest and the largest head count (min and max of the keys), not the first and last keys "
        "(the head counts need not be in order)":
            _verdict([_shows(a, ends=lambda a: (list(a.values())[0], list(a.values())[-1])) for a in every]),
        "an end that ties the best does not fall short: compare strictly":
            _verdict([_shows(a, strict=False) for a in every]),
        "a seed whose best is tied at an end does not show the trade, whichever head count max() names first: "
        "compare the ends' accuracies with the best strictly":
            _verdict([max(a, key=a.get) not in (min(a), max(a)) for a in every]),
        "check both ends: the fewest heads as well as the most heads":
            _verdict([a[max(a)] < max(a.values()) for a in every]),
        "check both ends: the most heads as well as the fewest heads":
            _verdict([a[min(a)] < max(a.values()) for a in every]),
        "that reads the first seed only; read every seed": all_or_none(right[0]),
        "one seed showing the trade is not every seed: when some seeds show it and others do not, say 'some seeds'":
            all_or_none(any(right)),
        "when some seeds show the trade and others do not, the verdict is 'some seeds', not 'no seed'":
            all_or_none(all(right)),
        "compare each seed's ends with that seed's own best, not with the best over all seeds":
            _verdict([_shows(a, best=best_anywhere) for a in every]),
        "an end below its neighbour is not enough: it must be below the seed's best (the curve can rise again)":
            _verdict([_neighbours_below(a) for a in every]),
    }


_TRADE_CASES = [  # (accuracy {seed: {heads: accuracy}}, what the case is)
    ({0: {1: 0.3, 4: 0.9, 32: 0.5}, 1: {1: 0.4, 4: 0.95, 32: 0.6}}, "the trade on both seeds"),
    ({0: {1: 1.0, 4: 1.0, 32: 0.7}}, "one head ties the best"),
    ({0: {32: 0.5, 1: 0.3, 4: 0.9}, 1: {4: 0.95, 32: 0.6, 1: 0.4}}, "the trade, head counts not in order"),
    ({0: {4: 0.9, 1: 0.95, 32: 0.5}}, "the best at one head, head counts not in order"),
    ({0: {1: 0.3, 4: 0.9, 32: 0.5}, 1: {1: 0.9, 4: 0.6, 32: 0.5}}, "one seed's best is at one head"),
    ({0: {1: 0.2, 2: 0.8, 8: 0.9}, 1: {1: 0.2, 2: 0.9, 8: 0.8}}, "one seed's best is at the thinnest heads"),
    ({0: {1: 0.5, 2: 0.7, 4: 0.6}, 1: {1: 0.5, 2: 0.5, 4: 0.9}, 2: {1: 0.5, 2: 0.9, 4: 0.4}},
     "the mean over seeds has the trade, one seed does not"),
    ({0: {1: 0.3, 4: 0.9, 32: 0.5}, 1: {1: 0.7, 4: 0.6, 32: 0.5}},
     "one seed's best is at one head, below the other seed's best"),
    ({0: {1: 0.5, 2: 0.4, 4: 0.9, 8: 0.3, 16: 0.35}, 1: {1: 0.6, 2: 0.65, 4: 0.8, 8: 0.7, 16: 0.75}},
     "five head counts, the trade on both seeds, the ends above their neighbours"),
    ({0: {2: 0.6, 4: 0.8, 8: 0.85, 16: 0.8}, 1: {2: 0.7, 4: 0.75, 8: 0.8, 16: 0.8}},
     "four head counts, one seed's widest end ties its best"),
    ({0: {1: 0.3, 4: 0.6, 32: 0.5}, 1: {1: 0.95, 4: 0.5, 32: 0.4}},
     "the first seed has the trade, the second its best at one head"),
    ({0: {1: 0.9, 2: 0.5, 4: 0.4}, 1: {1: 0.95, 2: 0.6, 4: 0.5}, 2: {1: 0.2, 2: 0.7, 4: 0.3}},
     "three seeds, the last alone has the trade"),
    ({0: {1: 0.6, 2: 0.9, 4: 0.9, 8: 0.5}, 1: {1: 0.4, 2: 0.8, 4: 0.95, 8: 0.95}},
     "two head counts tie for the best in the middle on one seed; an end ties it on the other"),
    ({0: {1: 0.2, 2: 0.4, 4: 0.6, 8: 0.8, 16: 0.9, 32: 0.95}}, "one seed, rising to the thinnest heads"),
    ({0: {1: 0.7, 2: 0.7, 4: 0.7}, 1: {1: 0.7, 2: 0.7, 4: 0.7}}, "flat on every seed"),
    ({0: {2: 0.8, 64: 0.3, 8: 0.9}, 1: {8: 0.85, 2: 0.6, 64: 0.5}, 2: {64: 0.4, 8: 0.7, 2: 0.65}, 3: {8: 0.9, 64: 0.8,
                                                                                                        2: 0.5}},
     "four seeds, the trade on every one, head counts not in order"),
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


def _trade_cases(check: Check) -> list[tuple[dict, str]]:
    """The fixed cases; when grading, each redrawn (:func:`_redrawn`), again a few times at most until every reading
    gives an answer of its own on some case (a shuffled order can hide the first-and-last-keys reading)."""
    if not check.grading:
        return list(_TRADE_CASES)
    for attempt in range(20):
        r = check.rng(111 + 1000 * attempt)
        cases = [(_redrawn(r, accuracy), what) for accuracy, what in _TRADE_CASES]
        if not unseparated([_trade(a) for a, _ in cases], [_trade_mistakes(a) for a, _ in cases], _same):
            break
    return cases


def _same(a, b) -> bool:
    """Two readings agree (head counts: a list and a tuple of the same numbers do)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return tuple(a) == tuple(b)
    return a == b


def _check_trade(trade_verdict, check: Check) -> None:
    cases = _trade_cases(check)

    def call(case):
        accuracy, what = case
        value = check.call(trade_verdict, accuracy, label=repr(accuracy))
        said = value.strip().lower() if isinstance(value, str) else None
        if said not in VERDICTS:
            shown = check.last_call[1] if not isinstance(value, bool) else repr(value)
            raise Wrong(f"return one of {', '.join(repr(v) for v in VERDICTS)}, got {shown} for {accuracy} ({what})")
        return said

    got, raised = answers_until_raised(cases, call)
    cases = cases[:len(got)]
    wants = [check.reference(accuracy) for accuracy, _ in cases]
    if got == wants:
        if raised is not None:
            raise raised
        return
    bad = next(i for i, (g, w) in enumerate(zip(got, wants)) if g != w)
    accuracy, what = cases[bad]
    message = consistent_mistake(got, wants, [_trade_mistakes(a) for a, _ in cases], _same)
    raise Wrong(f"for {accuracy} ({what}) the verdict is {wants[bad]!r}, you said {got[bad]!r}: " + (
        message or "a seed shows the trade when both its smallest and its largest head count score strictly below "
                   "that seed's best"))


register(Exercise(
    "06", 2, "does the sweep show the trade?",
    _check_trade,
    hint=["Decide for each seed on its own, then count. For one seed's {heads: accuracy}, the ends are the fewest "
          "and the most heads (min and max of the keys: they need not come in order).",
          "An end falls short only if it is strictly below that seed's best (a tie is not short); a seed shows the "
          "trade when both ends fall short. The mean over seeds can show a trade no seed has."],
    solution=(
        "def trade_verdict(accuracy):\n"
        "    showing = 0\n"
        "    for by_heads in accuracy.values():                  # one seed: {heads: accuracy}\n"
        "        best = max(by_heads.values())\n"
        "        fewest, most = min(by_heads), max(by_heads)     # the two ends of the sweep\n"
        "        if by_heads[fewest] < best and by_heads[most] < best:\n"
        "            showing += 1                                # both ends fall short on this seed\n"
        "    if showing == len(accuracy):\n"
        "        return 'every seed'\n"
        "    return 'some seeds' if showing else 'no seed'"
    ),
    minutes=10, difficulty=2, importance=4,
))
