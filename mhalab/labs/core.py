"""The exercise machinery: an exercise is an object with check(), hint() and solution(), registered in exNN.py.

Its checker is called as ``checker(answer, check)``: ``check`` (a :class:`~mhalab.labs.calls.Check`, one per
verdict) is the only way the checker learns whether it is grading, draws its hidden inputs (``check.generator(n)``,
``check.rng(n)``), runs the learner's code (``check.call(fn, *args)``, where its runner runs it) and reaches the
course's answer (``check.reference``). That answer is written once, as the solution's text: the reference is what
running the text defines.

A checker exception that is not a :class:`Wrong` is the checker's bug: the learner is told so and the
traceback goes to the ``mhalab.labs`` logger. With ``MHALAB_LABS_STRICT=1`` a failed check raises
``AssertionError`` (the tests use it so that nbval fails on it).

Modules: :mod:`.verdicts` (statuses, :class:`Wrong`) and :mod:`.invoke` (calling an answer) import nothing of
this package; :mod:`.plain` (what an answer returned, as plain data) imports :mod:`.invoke`; :mod:`.judging` (the
tolerance policy) imports those; :mod:`.calls` (:class:`Check` and its runners) imports those; this module imports
:mod:`.calls`; the exercise modules import all of them. No module imports one that imports it.
"""

from __future__ import annotations

import ast
import importlib
import linecache
import logging
import os
import pkgutil
import re
from collections.abc import Callable, Sequence
from typing import Any

from .calls import LOCAL, PACKAGE, Check
from .verdicts import BROKEN, ERROR, FAILED, PASSED, STRICT_ENV, UNANSWERED, AnswerRaised, Wrong

__all__ = ["Check", "Wrong", "AnswerRaised", "Exercise", "register", "exercise", "load", "available_notebooks",
           "grade_id", "parse_grade_id", "solved", "PACKAGE", "PASSED", "FAILED", "UNANSWERED", "ERROR", "BROKEN",
           "STRICT_ENV"]

log = logging.getLogger("mhalab.labs")
log.addHandler(logging.NullHandler())  # checker tracebacks are for instructors and tests, not printed to learners

LABS = os.path.dirname(os.path.abspath(__file__))


def grade_id(key: str, kind: str = "answer") -> str:
    """nbgrader's ``grade_id`` of exercise ``key`` ("04.1"): ``ex04-1-answer`` (its answer cell), ``ex04-1-written``
    (a markdown answer), ``ex04-1-test`` (nbgrader's test cell)."""
    notebook, number = str(key).split(".")
    return f"ex{notebook.zfill(2)}-{int(number)}-{kind}"


_GRADE_ID = re.compile(r"ex(?P<nb>\d\d)-(?P<num>\d+)-(?P<kind>answer|written)")


def parse_grade_id(text: str) -> tuple[str, str] | None:
    """(exercise key, kind) of an answer cell's ``grade_id`` (``ex04-1-answer`` -> ("04.1", "answer")), else None."""
    m = _GRADE_ID.fullmatch(str(text))
    return (f"{m['nb']}.{int(m['num'])}", m["kind"]) if m else None


# What a solution may use without importing it: what the notebooks import before their exercises.
_SOLUTION_GLOBALS = "import math\nimport numpy as np\nimport torch\nimport torch.nn.functional as F\n"


def solved(key: str, solution: str) -> Any:
    """What running the solution's text defines: its function (the first ``def``), or for a value exercise the
    value its last assignment gives. Compiled under a file name inside this package, so that an answer that calls
    it is seen calling the course's own code (:func:`mhalab.labs.calls.call_answer`); its lines go to linecache, so
    tracebacks and ``inspect.getsource`` show them."""
    tree = ast.parse(solution)
    defs = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    assigned = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)]
    if not defs and not assigned:
        raise ValueError(f"exercise {key}: its solution defines no function and assigns no value")
    filename = os.path.join(LABS, f"ex{key.replace('.', '_solution_')}.py")  # mhalab.labs.ex04_solution_1
    linecache.cache[filename] = (len(solution), None, solution.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {"__name__": f"mhalab.labs.ex{key.replace('.', '_solution_')}"}
    exec(compile(_SOLUTION_GLOBALS, filename + ":imports", "exec"), namespace)  # noqa: S102 (the course's own text)
    exec(compile(solution, filename, "exec"), namespace)  # noqa: S102
    return namespace[defs[0] if defs else assigned[-1]]


class Exercise:
    """Exercise ``number`` of notebook ``notebook`` ("04"): ``checker(answer, check)`` raises :class:`Wrong`;
    ``hint`` is one hint or a list given one at a time; ``solution`` is the answer, written once: its first ``def``
    line is the template the learner's function is called by, and what its text defines is ``reference`` (what the
    checker compares with, as ``check.reference``), which passes but scores 0 when handed in."""

    def __init__(self, notebook: str, number: int, title: str, checker: Callable[..., None], hint: str | Sequence[str],
                 solution: str, *, points: float = 1, minutes: int = 10, difficulty: int = 2, importance: int = 3):
        hints = [hint] if isinstance(hint, str) else list(hint)
        if not callable(checker) or not hints or not solution.strip():
            raise ValueError(f"exercise {notebook}.{number} needs a checker, a hint and a solution")
        self.notebook, self.number, self.title = str(notebook).zfill(2), int(number), title
        self.checker, self.hints, self.solution_text, self.points = checker, hints, solution, points
        for name, value, low, high in (("minutes", minutes, 1, 120), ("difficulty", difficulty, 1, 5),
                                       ("importance", importance, 1, 5)):
            if not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"exercise {notebook}.{number}: {name} is a whole number from {low} to {high}, "
                                 f"got {value!r}")
        # ARENA's labels: how hard (1-5), how much it matters for what follows (1-5), the minutes to spend on it
        self.minutes, self.difficulty, self.importance = minutes, difficulty, importance
        self.key = f"{self.notebook}.{self.number}"
        self.reference = solved(self.key, solution)
        defs = [node for node in ast.parse(solution).body if isinstance(node, ast.FunctionDef)]
        self.template = (defs[0].name, tuple(a.arg for a in defs[0].args.args)) if defs else None
        self.last_status, self.last_message = None, ""  # of the last check()
        self._last_answer: Any = None  # what the last check() judged (use() trusts its verdict)
        self._hints_shown = 0

    def _borrowed(self, answer: Any) -> str | None:
        plain = isinstance(answer, (bool, int, float, str, tuple, bytes))  # a plain value is anyone's
        if answer is self.reference and (callable(answer) or not plain):
            return "your answer is the course's own reference (q.reference); write the answer yourself"
        return None

    @property
    def grade_id(self) -> str:
        """nbgrader's ``grade_id`` of this exercise's answer cell: ``ex04-1-answer``."""
        return grade_id(self.key)

    def verdict(self, answer: Any, *, runner: Any = None, seed: int | None = None,
                trusted: bool = False) -> tuple[str, str]:
        """(status, message) for ``answer``; never raises for anything the learner did. ``runner``: where the answer
        runs (default here; when grading, the grading kernel, and ``answer`` is what stands for it here: see
        :mod:`mhalab.labs.calls`); ``seed``: draw the hidden inputs from it; ``trusted`` (the tests only) lets the
        answer be the course's reference."""
        if answer is None or answer is Ellipsis or answer is NotImplemented:
            return UNANSWERED, "not answered yet: replace the placeholder with your answer, then run the cell again."
        borrowed = self._borrowed(answer) if not trusted else None
        if borrowed:
            return FAILED, borrowed
        check = Check(template=self.template, runner=runner or LOCAL, key=self.key, trusted=trusted, seed=seed,
                      reference=self.reference)
        try:
            if not callable(answer):  # a value: the checker judges what the grader's transport would carry
                answer = check.runner.received(answer)
            self.checker(answer, check)
        except NotImplementedError:
            return UNANSWERED, ("not answered yet: your code still raises NotImplementedError; replace that line with "
                                "your answer.")
        except AnswerRaised as raised:
            return ERROR, str(raised)
        except Wrong as wrong:
            return FAILED, str(wrong)
        except Exception:
            label, returned = check.last_call
            log.exception("checker of exercise %s failed", self.key)
            detail = f" on {label}, which returned {returned}" if returned else ""
            return BROKEN, (f"the checker could not judge your answer{detail}. That is a bug in the exercise, not "
                            "necessarily in your answer: please tell your instructor.")
        return PASSED, "correct."

    def check(self, answer: Any) -> None:
        """Test ``answer`` (a function on hidden inputs, or a value) and print ✓ or what is off."""
        status, message = self.verdict(answer)
        self.last_status, self.last_message, self._last_answer = status, message, answer
        mark = "✓" if status == PASSED else "○" if status == UNANSWERED else "✗"
        print(f"{mark} Exercise {self.key} ({self.title}): {message}")
        if status != PASSED and os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes"):
            raise AssertionError(f"exercise {self.key} ({self.title}): {message}")

    def use(self, answer: Any) -> Any:
        """What the cells after an exercise should use: ``answer`` once it passes its check, and until then the
        course's own answer, saying so, so that a notebook runs to its end before every exercise is done."""
        if answer is self._last_answer and self.last_status is not None:
            status = self.last_status
        else:
            status, _ = self.verdict(answer)
        if status == PASSED:
            return answer
        why = "is not answered yet" if status == UNANSWERED else "does not pass its check yet"
        print(f"Exercise {self.key} {why}: the cells below use the course's answer until yours passes (where they "
              "say 'yours', read 'the course's').")
        return self.reference

    @property
    def label(self) -> str:
        """The line under the exercise's heading: ``difficulty ●●○○○ · importance ●●●○○ · about 10 minutes``."""
        dots = "●" * self.difficulty + "○" * (5 - self.difficulty), "●" * self.importance + "○" * (5 - self.importance)
        return f"*Difficulty {dots[0]} · importance {dots[1]} · about {self.minutes} minutes*"

    def hint(self) -> None:
        """Print the next hint (all of them once every one has been shown)."""
        n, self._hints_shown = len(self.hints), self._hints_shown + 1
        for i in [self._hints_shown] if self._hints_shown <= n else range(1, n + 1):
            print(f"Hint{'' if n == 1 else f' {i} of {n}'} for exercise {self.key}: {self.hints[i - 1]}")

    def solution(self) -> None:
        print(f"A solution to exercise {self.key} ({self.title}):\n{self.solution_text}")

    def __repr__(self) -> str:
        return f"<Exercise {self.key}: {self.title}>"


_REGISTRY: dict[tuple[str, int], Exercise] = {}


def register(ex: Exercise) -> Exercise:
    """Add ``ex`` to the registry (re-registering the same key replaces it, e.g. after a reload)."""
    _REGISTRY[(ex.notebook, ex.number)] = ex
    return ex


def available_notebooks() -> list[str]:
    """Notebook numbers that have an ``exNN`` module in mhalab.labs."""
    here = [os.path.dirname(os.path.abspath(__file__))]
    return sorted(m.name[2:] for m in pkgutil.iter_modules(here) if re.fullmatch(r"ex\d\d", m.name))


def load(notebook: str | int) -> tuple[Exercise, ...]:
    """All exercises of a notebook, in order: ``q1, q2, q3 = labs.load("04")``."""
    text = str(notebook).strip()
    if not text.isdigit() or len(text) > 2:
        raise ValueError(f"notebook must be a notebook number like '04' (or 4), got {notebook!r}")
    text = text.zfill(2)
    if text in available_notebooks():
        importlib.import_module(f"{__package__}.ex{text}")
    found = tuple(ex for (nb, _), ex in sorted(_REGISTRY.items()) if nb == text)  # also the tests' "99"
    if not found:
        raise ValueError(f"there are no exercises for notebook {text!r}; notebooks with exercises: "
                         f"{available_notebooks()}")
    return found


def exercise(notebook: str | int, number: int) -> Exercise:
    """Exercise ``number`` of notebook ``notebook`` (e.g. ``exercise("04", 1)``)."""
    exercises = load(notebook)
    found = [ex for ex in exercises if ex.number == int(number)]
    if not found:
        have = [ex.number for ex in exercises]
        raise ValueError(f"notebook {exercises[0].notebook} has no exercise {number}; it has {have}")
    return found[0]
