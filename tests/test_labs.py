"""Tests for mhalab.labs' exercises and check helpers: every exercise of every notebook passes its
reference answer, fails each plausible wrong answer with a useful message, and prints its hint and
solution.

Exercises are discovered when the tests are collected (every ``mhalab/labs/exNN.py``), so a new
notebook's exercises are covered without editing this file. The student release and grading are
tested in test_labs_release.py and test_labs_grade.py.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest
import torch

import labs_fixture  # noqa: F401  (registers notebook "99"'s exercises)
import mhalab.labs as labs
from mhalab.labs import core
from mhalab.labs.checks import call_on_hidden_cases, case, expect_close, expect_equal, expect_shape, order_of_magnitude


# --------------------------------------------------------------------------- discovery


def exercise_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(labs.__path__) if re.fullmatch(r"ex\d\d", m.name))


def all_exercises() -> list[core.Exercise]:
    found = []
    for name in exercise_modules():
        importlib.import_module(f"mhalab.labs.{name}")
        found += labs.load(name[2:])
    return found


EXERCISES = all_exercises() + list(labs.load("99"))


@pytest.fixture(autouse=True)
def _fresh_outcomes(monkeypatch):
    monkeypatch.delenv(core.STRICT_ENV, raising=False)
    labs.reset()
    yield
    labs.reset()


# --------------------------------------------------------------------------- every exercise


def _mentions(message: str, value) -> bool:
    """Whether a message prints a numeric answer (plainly or with thousands separators)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) < 10:
        return False
    forms = {str(value), f"{value:,}"} if isinstance(value, int) else {f"{value:.4g}", str(value)}
    return any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d.])", message) for f in forms)


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.key)
def test_reference_passes(ex, capsys):
    assert ex.check(ex.reference) is True, ex.last_message
    out = capsys.readouterr().out
    assert out.startswith(f"✓ Exercise {ex.key}"), out
    assert labs.results()[ex.key] is True


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.key)
def test_wrong_answers_fail_with_a_useful_message(ex, capsys):
    for i, wrong in enumerate(ex.wrong):
        assert ex.check(wrong) is False, f"wrong answer {i} of exercise {ex.key} passes"
        out = capsys.readouterr().out
        message = ex.last_message
        assert out.startswith(f"✗ Exercise {ex.key}") and message in out
        assert labs.outcomes()[ex.key]["status"] in (core.FAILED, core.ERROR), (i, message)
        assert len(message) >= 20, f"wrong answer {i} of {ex.key}: {message!r} does not say what is off"
        assert not _mentions(message, ex.reference), f"the message for wrong answer {i} of {ex.key} gives the answer away: {message}"


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.key)
def test_hint_and_solution_print(ex, capsys):
    ex.hint()
    assert f"exercise {ex.key}" in capsys.readouterr().out
    ex.solution()
    out = capsys.readouterr().out
    assert ex.solution_text in out


@pytest.mark.parametrize("ex", [ex for ex in EXERCISES if callable(ex.reference)], ids=lambda ex: ex.key)
def test_printed_solution_passes(ex, capsys):
    """What ``solution()`` shows a learner is itself a right answer (not only the hidden reference)."""
    namespace: dict = {}
    exec("import math\nimport torch\n" + ex.solution_text, namespace)
    defined = [v for k, v in namespace.items() if callable(v) and not k.startswith("__") and k not in ("math", "torch")]
    if not defined:
        pytest.skip(f"the solution of {ex.key} defines no function (it is a value or a call)")
    assert ex.check(defined[-1]) is True, ex.last_message


def test_registry_is_consistent():
    by_notebook: dict[str, list[int]] = {}
    for ex in EXERCISES:
        by_notebook.setdefault(ex.notebook, []).append(ex.number)
        assert ex.title and ex.points > 0
    for nb_id, numbers in by_notebook.items():
        assert numbers == list(range(1, len(numbers) + 1)), f"notebook {nb_id}'s exercises are numbered {numbers}"
        assert 1 <= len(numbers) <= 4 or nb_id == "99"
    for name in exercise_modules():
        assert labs.load(name[2:]), f"mhalab/labs/{name}.py registers no exercises"


# --------------------------------------------------------------------------- core


def test_check_handles_missing_and_crashing_answers(capsys):
    q1, q2, q3 = labs.load("99")
    assert q2.check(None) is False and labs.outcomes()["99.2"]["status"] == core.UNANSWERED

    def placeholder(x):
        raise NotImplementedError("Your answer here")

    assert q1.check(placeholder) is False and labs.outcomes()["99.1"]["status"] == core.UNANSWERED

    def crashes(x):
        return x.nonexistent

    assert q1.check(crashes) is False
    outcome = labs.outcomes()["99.1"]
    assert outcome["status"] == core.ERROR and "AttributeError" in outcome["message"] and "crashes" in outcome["message"]
    assert labs.results() == {"99.1": False, "99.2": False}
    assert "no answer yet" in capsys.readouterr().out


def test_strict_mode_raises_on_failure(monkeypatch):
    q1 = labs.exercise("99", 1)
    monkeypatch.setenv(core.STRICT_ENV, "1")
    assert q1.check(q1.reference) is True
    with pytest.raises(AssertionError, match="99.1"):
        q1.check(q1.wrong[0])


def test_hints_come_one_at_a_time(capsys):
    q2 = labs.exercise(99, 2)
    q2.hint()
    q2.hint()
    out = capsys.readouterr().out
    assert "Hint 1 of 2" in out and "Hint 2 of 2" in out


def test_lookup_errors_are_clear():
    with pytest.raises(ValueError, match="no exercise 9"):
        labs.exercise("99", 9)
    with pytest.raises(ValueError, match="notebook number"):
        labs.load("three")
    with pytest.raises(ValueError, match="no exercises for notebook '98'"):
        labs.load("98")


def test_exercise_needs_a_wrong_answer():
    with pytest.raises(ValueError, match="wrong answer"):
        core.Exercise("99", 9, "t", lambda a: None, hint="h", solution="s", reference=1, wrong=[])


# --------------------------------------------------------------------------- checks


def _wrong(fn, *args, **kwargs) -> str:
    with pytest.raises(core.Wrong) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_expect_close_says_direction_and_magnitude_not_the_value():
    message = _wrong(expect_close, 4160, 16640, "the count")
    assert "too small" in message and "10^4" in message and "16640" not in message and "16,640" not in message
    expect_close(1.0 + 1e-6, 1.0)
    expect_close(torch.tensor([1.0]), 1.0)  # a one-element tensor is a scalar answer
    assert "wrong sign" in _wrong(expect_close, -2.0, 3.0)
    assert "single number" in _wrong(expect_close, "12", 12)


def test_expect_close_on_tensors_names_shape_transpose_and_scale():
    x = torch.randn(2, 4, 4)
    assert "[2, 4, 3]" in _wrong(expect_close, torch.zeros(2, 4, 3), torch.zeros(2, 3, 4))
    assert "another order" in _wrong(expect_close, torch.zeros(2, 4, 3), torch.zeros(2, 3, 4))
    assert "transposed" in _wrong(expect_close, x.transpose(-1, -2), x)
    assert "constant factor of about 2" in _wrong(expect_close, 2 * x, x)
    assert "NaN" in _wrong(expect_close, torch.full((3,), float("nan")), torch.zeros(3))
    expect_close(torch.tensor([0.5, float("-inf")]), torch.tensor([0.5, float("-inf")]))
    assert "['b']" in _wrong(expect_close, {"a": 1}, {"a": 1, "b": 2}, "table")
    assert "table['b']" in _wrong(expect_close, {"a": 1, "b": 3}, {"a": 1, "b": 2}, "table")
    assert "[1]" in _wrong(expect_close, (x, x), (x, x.mT.contiguous()))


def test_expect_equal_on_masks_and_counts():
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    assert "transposed" in _wrong(expect_equal, causal.T, causal, "mask")
    assert "inverted" in _wrong(expect_equal, ~causal, causal, "mask")
    assert "boolean" in _wrong(expect_equal, causal.float(), causal, "mask")
    off_by_one = _wrong(expect_equal, torch.ones(4, 4, dtype=torch.bool).tril(-1), causal, "mask")
    assert off_by_one.startswith("4 of 16 entries of mask are wrong")
    expect_equal(12.0, 12)
    assert "whole number" in _wrong(expect_equal, 12.5, 12)
    assert "too large" in _wrong(expect_equal, 1024, 256)


def test_expect_shape_wildcards():
    expect_shape(torch.zeros(2, 7), (2, None))
    assert "2 dimensions instead of 3" in _wrong(expect_shape, torch.zeros(2, 7), (2, 7, 1))
    assert "tensor of shape" in _wrong(expect_shape, 3, (1,))


def test_call_on_hidden_cases_describes_the_case_and_copies_inputs():
    def reference(x, n):
        return x.view(x.shape[0], n, -1)

    def mutates(x, n):
        x.zero_()
        return reference(x, n)

    x = torch.arange(12.0).view(2, 6)
    call_on_hidden_cases(reference, [case(x, 3)], reference)
    message = _wrong(call_on_hidden_cases, mutates, [case(x, 3)], reference)
    assert message.startswith("mutates(tensor[2, 6] float32, 3):") and torch.equal(x, torch.arange(12.0).view(2, 6))
    crash = _wrong(call_on_hidden_cases, lambda x, n: x.view(5, 5), [case(x, 2)], reference, name="split")
    assert "split(tensor[2, 6] float32, 2) raised RuntimeError" in crash
    labelled = _wrong(call_on_hidden_cases, lambda d, h: d, [case(96, 3, label="d_model=96, 3 heads")], lambda d, h: d // h, compare=expect_equal)
    assert "d_model=96, 3 heads" in labelled and "32" not in labelled
    assert order_of_magnitude(0.004) == "of order 10^-3"


