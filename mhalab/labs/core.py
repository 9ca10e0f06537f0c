"""The exercise machinery: an exercise is an object with check(), hint() and solution().

Authoring an exercise (in ``mhalab/labs/exNN.py``)::

    def _check_dk(answer):
        # Raise Wrong("what is off, without giving the answer") when the answer is wrong.
        ...

    register(Exercise(
        notebook="03", number=1, title="d_k for a new width",
        checker=_check_dk,
        hint="d_k is what each head gets when the width is shared equally.",
        solution="def d_k(d_model, n_heads):\\n    return d_model // n_heads",
        reference=lambda d_model, n_heads: d_model // n_heads,   # passes the checker
        wrong=[lambda d_model, n_heads: d_model],                  # plausible mistakes that must fail
    ))

A checker receives the learner's answer (a value or a function), tests it (functions on cases
the learner did not see), and raises :class:`Wrong` with a useful message when it is off.
Any other exception raised by the learner's function is reported as such.
"""

from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Wrong", "Exercise", "register", "exercise", "load", "results"]


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message says what is off."""


@dataclass
class Exercise:
    notebook: str
    number: int
    title: str
    checker: Callable[[Any], None]
    hint_text: str
    solution_text: str
    points: int = 1
    last_result: bool | None = field(default=None, repr=False)

    def __init__(self, notebook, number, title, checker, hint, solution, *, reference, wrong, points=1):
        """``reference`` is an answer that passes; ``wrong`` lists plausible wrong answers that must
        fail with a useful message (the test suite checks both)."""
        if not wrong:
            raise ValueError(f"exercise {notebook}.{number} needs at least one plausible wrong answer in `wrong`")
        self.notebook, self.number, self.title = str(notebook), int(number), title
        self.checker, self.hint_text, self.solution_text, self.points = checker, hint, solution, points
        self.reference, self.wrong = reference, list(wrong)
        self.last_result = None

    @property
    def key(self) -> str:
        return f"{self.notebook}.{self.number}"

    def check(self, answer: Any) -> bool:
        """Test ``answer``; print what is right or what is off; return True when correct."""
        if answer is NotImplemented or answer is Ellipsis or answer is None:
            print(f"✗ Exercise {self.key} ({self.title}): no answer yet; replace the placeholder with yours.")
            self.last_result = False
            return False
        try:
            self.checker(answer)
        except Wrong as wrong:
            print(f"✗ Exercise {self.key} ({self.title}): {wrong}")
            self.last_result = False
        except Exception as error:  # the learner's function crashed on a hidden case
            frame = traceback.extract_tb(error.__traceback__)[-1]
            print(
                f"✗ Exercise {self.key} ({self.title}): your answer raised "
                f"{type(error).__name__}: {error} (at line {frame.lineno} of {frame.name})"
            )
            self.last_result = False
        else:
            print(f"✓ Exercise {self.key} ({self.title}): correct.")
            self.last_result = True
        _RESULTS[self.key] = self.last_result
        return self.last_result

    def hint(self) -> None:
        print(f"Hint for exercise {self.key}: {self.hint_text}")

    def solution(self) -> None:
        print(f"A solution to exercise {self.key}:\n{self.solution_text}")

    def __repr__(self) -> str:
        return f"<Exercise {self.key}: {self.title}>"


_REGISTRY: dict[tuple[str, int], Exercise] = {}
_RESULTS: dict[str, bool] = {}


def register(ex: Exercise) -> Exercise:
    _REGISTRY[(ex.notebook, ex.number)] = ex
    return ex


def _import_notebook(notebook: str) -> None:
    notebook = str(notebook).zfill(2)
    try:
        importlib.import_module(f"mhalab.labs.ex{notebook}")
    except ModuleNotFoundError as error:
        if error.name == f"mhalab.labs.ex{notebook}":
            raise ValueError(f"there are no exercises for notebook {notebook!r}; use a two-digit notebook number like '03'") from None
        raise


def exercise(notebook: str, number: int) -> Exercise:
    """Exercise ``number`` of notebook ``notebook`` (e.g. ``exercise("03", 1)``)."""
    notebook = str(notebook).zfill(2)
    _import_notebook(notebook)
    try:
        return _REGISTRY[(notebook, int(number))]
    except KeyError:
        have = sorted(n for nb, n in _REGISTRY if nb == notebook)
        raise ValueError(f"notebook {notebook} has no exercise {number}; it has {have}") from None


def load(notebook: str) -> tuple[Exercise, ...]:
    """All exercises of a notebook, in order: ``q1, q2, q3 = labs.load("03")``."""
    notebook = str(notebook).zfill(2)
    _import_notebook(notebook)
    return tuple(ex for (nb, _), ex in sorted(_REGISTRY.items()) if nb == notebook)


def results() -> dict[str, bool]:
    """What every ``check`` in this session returned last, by exercise key."""
    return dict(_RESULTS)
