"""``mhalab.labs`` in the grading kernel: the grader copies this file there as ``mhalab/labs/__init__.py``, beside
the package's leaf modules (:mod:`mhalab.labs.verdicts`, :mod:`mhalab.labs.invoke`, :mod:`mhalab.labs.plain`) and
instead of the exercise modules (their solutions, references and checkers), which stay out of the kernel.

``q.check(answer)`` only hands the answer over: the grader reads it from the worker (``ANSWERS`` of
``_mhalab_grading``, :mod:`mhalab_grader.worker`) and judges it in its own process. ``q.use(answer)`` gives the
learner's answer back as it is, so the instructor's cells after an exercise run on it. Hints, solutions and
references are not here. The exercises of the assignment come from the grader, in ``MHALAB_GRADING_SPEC``:
``{notebook: [[number, title, label], ...]}``.

Never imported by the grader itself: it runs only inside the kernel, where ``mhalab.labs`` is this module.
"""

from __future__ import annotations

import json
import os
from typing import Any

from mhalab.labs.verdicts import Wrong

__all__ = ["Exercise", "Wrong", "available_notebooks", "exercise", "load"]

_SPEC = json.loads(os.environ.get("MHALAB_GRADING_SPEC", "{}"))


class Exercise:
    """What a notebook's ``q`` is while it is graded: it hands answers to the grader."""

    reference = None
    solution_text = ""

    def __init__(self, notebook: str, number: int, title: str, label: str = ""):
        self.notebook, self.number, self.title, self.label = notebook, int(number), title, label
        self.key = f"{notebook}.{self.number}"
        self.last_status, self.last_message = None, ""

    def check(self, answer: Any) -> None:
        import _mhalab_grading  # the worker, running as the kernel's main module (imported once it is running)

        _mhalab_grading.ANSWERS[self.key] = answer
        print(f"Exercise {self.key} ({self.title}): handed in; the grader judges it.")

    def use(self, answer: Any) -> Any:
        return answer  # the cells after an exercise run on the learner's own answer while it is graded

    def hint(self) -> None:
        print(f"(no hints while grading: exercise {self.key})")

    def solution(self) -> None:
        print(f"(no solutions while grading: exercise {self.key})")

    def __repr__(self) -> str:
        return f"<Exercise {self.key}: {self.title}>"


_EXERCISES = {nb: tuple(Exercise(nb, *item) for item in items) for nb, items in _SPEC.items()}


def available_notebooks() -> list[str]:
    return sorted(_EXERCISES)


def load(notebook: str | int) -> tuple[Exercise, ...]:
    text = str(notebook).strip().zfill(2)
    if text not in _EXERCISES:
        raise ValueError(f"there are no exercises for notebook {text!r} in this assignment")
    return _EXERCISES[text]


def exercise(notebook: str | int, number: int) -> Exercise:
    return next(ex for ex in load(notebook) if ex.number == int(number))
