"""Test-only exercises for notebook "99", used by tests/test_labs.py's synthetic notebooks.

Importing this module registers them, in the test process and in the kernels the tests start
(the synthetic notebooks put tests/ on sys.path and import it).
"""

import torch

from mhalab.labs.checks import call_on_hidden_cases, case, expect_callable, expect_equal
from mhalab.labs.core import Exercise, register


def _double(x):
    return 2 * x


def _check_double(answer):
    expect_callable(answer, "double")
    call_on_hidden_cases(answer, [case(3), case(-7), case(0.5)], _double, name="double")


def _check_count(answer):
    expect_equal(answer, 4, "n_heads")


def _causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def _check_mask(answer):
    expect_equal(answer, _causal(5), "mask")


register(Exercise(
    "99", 1, "double a number", _check_double,
    hint="Multiply by two.", solution="def double(x):\n    return 2 * x",
    reference=_double, wrong=[lambda x: x + 2, lambda x: x * x],
))
register(Exercise(
    "99", 2, "a head count", _check_count,
    hint=["It is a small power of two.", "Between 2 and 8."], solution="n_heads = 4",
    reference=4, wrong=[8, 4.5, "4"],
))
register(Exercise(
    "99", 3, "a causal mask of size 5", _check_mask,
    hint="torch.tril keeps the lower triangle.", solution="mask = torch.ones(5, 5, dtype=torch.bool).tril()",
    reference=_causal(5), wrong=[_causal(5).T, _causal(5).float(), ~_causal(5)],
))
