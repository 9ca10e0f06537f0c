"""Exercise of notebook 11 (the head-count trade, and how far a training budget shows it): reading a sweep for
an interior maximum, seed by seed."""

from __future__ import annotations

from .calls import Check
from .core import Exercise, register
from .verdicts import Wrong

# ------------------------------------------------------------------------------------ exercise 1
# (accuracy {seed: {heads: accuracy}}, what the case tests, what a wrong answer to it usually missed)
_EVERY_SEED = "check each seed on its own: the mean over seeds can hide a seed without the hump"
_ORDER = "the ends are the smallest and the largest head count (min and max of the keys), not the first and last keys"
_STRICT = "an end that ties the best is not below it: use a strict comparison"
_BOTH = "check both ends: the fewest heads and the most heads"
_HUMP = "both ends strictly below that seed's best, on every seed, is the hump: return True"
_HUMP_CASES = [
    ({0: {1: 0.3, 4: 0.9, 32: 0.5}, 1: {1: 0.4, 4: 0.95, 32: 0.6}}, "a hump on both seeds", _HUMP),
    ({0: {1: 1.0, 4: 1.0, 32: 0.7}}, "one head ties the best", _STRICT),
    ({0: {32: 0.5, 1: 0.3, 4: 0.9}, 1: {4: 0.95, 32: 0.6, 1: 0.4}}, "a hump, head counts not in order", _ORDER),
    ({0: {4: 0.9, 1: 0.95, 32: 0.5}}, "the best at one head, head counts not in order", _ORDER),
    ({0: {1: 0.3, 4: 0.9, 32: 0.5}, 1: {1: 0.9, 4: 0.6, 32: 0.5}}, "one seed's best is at one head", _EVERY_SEED),
    ({0: {1: 0.2, 2: 0.8, 8: 0.9}, 1: {1: 0.2, 2: 0.9, 8: 0.8}}, "one seed's best is at the thinnest heads", _BOTH),
    ({0: {1: 0.5, 2: 0.7, 4: 0.6}, 1: {1: 0.5, 2: 0.5, 4: 0.9}, 2: {1: 0.5, 2: 0.9, 4: 0.4}},
     "the mean over seeds has a hump, one seed does not", _EVERY_SEED),
]


def _hump_cases(check: Check) -> list[tuple[dict, str, str]]:
    """The fixed cases, and when grading four drawn fresh."""
    cases = list(_HUMP_CASES)
    if check.grading:
        r = check.rng(111)
        for i in range(4):
            heads = r.sample([1, 2, 4, 8, 16, 32, 64], r.randint(3, 6))
            accuracy = {s: {h: round(r.random(), 3) for h in heads} for s in range(r.randint(1, 4))}
            cases.append((accuracy, f"drawn case {i}", _EVERY_SEED))
    return cases


def _check_hump(hump_on_every_seed, check: Check) -> None:
    for accuracy, what, missed in _hump_cases(check):
        got = check.call(hump_on_every_seed, accuracy, label=repr(accuracy))
        if type(got).__name__ not in ("bool", "bool_"):  # Python's or NumPy's
            raise Wrong(f"return True or False, got {got!r} for {accuracy} ({what})")
        want = check.reference(accuracy)
        if bool(got) != want:
            raise Wrong(f"for {accuracy} ({what}) the answer is {want}, you returned {bool(got)}: {missed}")


register(Exercise(
    "11", 1, "an interior maximum on every seed",
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
