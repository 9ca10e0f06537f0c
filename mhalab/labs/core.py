"""The exercise machinery: an exercise is an object with check(), hint() and solution().

Authoring an exercise (in ``mhalab/labs/exNN.py``)::

    from .checks import call_on_hidden_cases, case
    from .core import Exercise, register

    def _reference(d_model, n_heads):
        return d_model // n_heads

    def _check_dk(answer):
        # Raise Wrong("what is off, without giving the answer") when the answer is wrong;
        # the helpers in mhalab.labs.checks do that with consistent messages
        # (call_on_hidden_cases also says so when the answer is not a function).
        call_on_hidden_cases(answer, [case(96, 3), case(512, 8)], _reference)

    register(Exercise(
        notebook="03", number=1, title="d_k for a new width",
        checker=_check_dk,
        hint="d_k is what each head gets when the width is shared equally.",
        solution="def d_k(d_model, n_heads):\\n    return d_model // n_heads",
        reference=_reference,                        # passes the checker
        wrong=[lambda d_model, n_heads: d_model],    # plausible mistakes that must fail
    ))

In the notebook's last section, load the exercises once (``q1, q2 = labs.load("03")``), then give
each exercise a markdown cell with the task and one code cell: the ``def`` line outside the
``### BEGIN SOLUTION`` / ``### END SOLUTION`` markers, the body inside, and ``q1.check(f)`` at the
end of the same cell. (An answer that is a value checked in a later cell needs a placeholder before
the markers, ``mask = None``, so the student version reports "no answer yet", not a NameError.)

A checker receives the learner's answer (a value or a function), tests it (functions on cases
the learner did not see), and raises :class:`Wrong` with a useful message when it is off.
Any other exception raised by the learner's function is reported as such, with the line it came
from; a ``NotImplementedError`` (the student release's placeholder) counts as "not answered yet".

Every ``check`` records its outcome in this kernel: :func:`results` (key -> passed) and
:func:`outcomes` (key -> passed, status, message) are what ``python -m mhalab.labs grade`` reads.

With the environment variable ``MHALAB_LABS_STRICT=1`` a ``check`` that does not pass also raises
``AssertionError``: the test suite sets it so that a solution notebook whose check fails fails
under nbval, and nbgrader's autograder (which scores a test cell by whether it raises) can use it.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any, Callable, Sequence

__all__ = ["Wrong", "Exercise", "register", "exercise", "load", "results", "outcomes", "reset"]

# Outcome statuses, as recorded by Exercise.check and reported by the grader.
PASSED, FAILED, UNANSWERED, ERROR = "passed", "failed", "unanswered", "error"


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message says what is off."""


class AnswerRaised(Wrong):
    """Raised by a checker when the learner's function raised on a case (reported as an error)."""


def where(error: BaseException) -> str:
    """Where ``error`` was raised in the learner's code: "line 3 of d_k_for" (or "" if unknown).

    Frames inside mhalab, torch, numpy or the standard library are skipped: a shape error raised
    deep inside ``torch.matmul`` is reported at the learner's line that called it.
    """
    skip = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # the mhalab package
    skip += [p for p in {sys.prefix, sys.base_prefix, sys.exec_prefix} if p]
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        filename = os.path.abspath(frame.filename) if frame.filename and not frame.filename.startswith("<") else ""
        if filename and any(filename.startswith(os.path.abspath(s) + os.sep) for s in skip):
            continue
        return f"line {frame.lineno} of {frame.name}"
    return f"line {frames[-1].lineno} of {frames[-1].name}" if frames else ""


STRICT_ENV = "MHALAB_LABS_STRICT"


def strict() -> bool:
    """Whether a failing ``check`` raises (environment variable ``MHALAB_LABS_STRICT`` set to 1)."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


def _no_answer(answer: Any) -> bool:
    return answer is None or answer is NotImplemented or answer is Ellipsis


class Exercise:
    """One auto-checked exercise of notebook ``notebook`` (e.g. "03"), number ``number`` (1, 2, ...).

    Args:
        checker: ``checker(answer, *args, **kwargs)`` raises :class:`Wrong` when ``answer`` is wrong.
        hint: a hint, or a list of hints that ``hint()`` gives one at a time.
        solution: the text of a solution (code), printed by ``solution()``.
        reference: an answer that passes (the test suite checks it does).
        wrong: plausible wrong answers that must fail with a useful message (the tests check them).
        points: what the exercise is worth when graded.
    """

    def __init__(
        self,
        notebook: str,
        number: int,
        title: str,
        checker: Callable[..., None],
        hint: str | Sequence[str],
        solution: str,
        *,
        reference: Any,
        wrong: Sequence[Any],
        points: float = 1,
    ):
        if not callable(checker):
            raise TypeError(f"exercise {notebook}.{number}: checker must be a function that raises Wrong, got {type(checker).__name__}")
        if not wrong:
            raise ValueError(f"exercise {notebook}.{number} needs at least one plausible wrong answer in `wrong`")
        hints = [hint] if isinstance(hint, str) else list(hint)
        if not hints or not all(isinstance(h, str) and h.strip() for h in hints):
            raise ValueError(f"exercise {notebook}.{number}: hint must be a non-empty string or a list of them")
        if not isinstance(solution, str) or not solution.strip():
            raise ValueError(f"exercise {notebook}.{number}: solution must be the non-empty text of a solution")
        self.notebook, self.number, self.title = str(notebook).zfill(2), int(number), title
        self.checker, self.hints, self.solution_text, self.points = checker, hints, solution, points
        self.reference, self.wrong = reference, list(wrong)
        self.last_result: bool | None = None
        self.last_message: str = ""
        self._hints_shown = 0

    @property
    def key(self) -> str:
        return f"{self.notebook}.{self.number}"

    @property
    def hint_text(self) -> str:
        return "\n".join(self.hints)

    def _verdict(self, answer: Any, args: tuple, kwargs: dict) -> tuple[str, str]:
        """(status, message) for ``answer``; never raises for anything the learner did."""
        if _no_answer(answer):
            return UNANSWERED, "no answer yet: replace the placeholder with your answer, then run the cell again."
        try:
            self.checker(answer, *args, **kwargs)
        except NotImplementedError:
            return UNANSWERED, "no answer yet: your code still raises NotImplementedError; replace that line with your answer."
        except AnswerRaised as raised:
            return ERROR, str(raised)
        except Wrong as wrong:
            return FAILED, str(wrong)
        except Exception as error:  # the learner's function crashed on a hidden case
            at = where(error)
            return ERROR, f"your answer raised {type(error).__name__}: {error}" + (f" (at {at})" if at else "")
        return PASSED, "correct."

    def check(self, answer: Any, *args: Any, **kwargs: Any) -> bool:
        """Test ``answer``; print what is right or what is off; return True when correct.

        Extra arguments are passed to the checker (for exercises that need, say, the trained model).
        """
        status, message = self._verdict(answer, args, kwargs)
        mark = "✓" if status == PASSED else "✗"
        print(f"{mark} Exercise {self.key} ({self.title}): {message}")
        self.last_result, self.last_message = status == PASSED, message
        _OUTCOMES[self.key] = {"passed": self.last_result, "status": status, "message": message}
        if not self.last_result and strict():
            raise AssertionError(f"exercise {self.key} ({self.title}): {message}")
        return self.last_result

    def hint(self) -> None:
        """Print the next hint (all of them once every one has been shown)."""
        if len(self.hints) == 1:
            print(f"Hint for exercise {self.key}: {self.hints[0]}")
            return
        if self._hints_shown >= len(self.hints):
            for i, text in enumerate(self.hints, 1):
                print(f"Hint {i} of {len(self.hints)} for exercise {self.key}: {text}")
            return
        self._hints_shown += 1
        print(f"Hint {self._hints_shown} of {len(self.hints)} for exercise {self.key}: {self.hints[self._hints_shown - 1]}")

    def solution(self) -> None:
        print(f"A solution to exercise {self.key} ({self.title}):\n{self.solution_text}")

    def __repr__(self) -> str:
        return f"<Exercise {self.key}: {self.title}>"


_REGISTRY: dict[tuple[str, int], Exercise] = {}
_OUTCOMES: dict[str, dict[str, Any]] = {}


def register(ex: Exercise) -> Exercise:
    """Add ``ex`` to the registry (re-registering the same key replaces it, e.g. after a reload)."""
    if not isinstance(ex, Exercise):
        raise TypeError(f"register() takes an Exercise, got {type(ex).__name__}")
    _REGISTRY[(ex.notebook, ex.number)] = ex
    return ex


def _notebook_id(notebook: str | int) -> str:
    text = str(notebook).strip()
    if not text.isdigit() or len(text) > 2:
        raise ValueError(f"notebook must be a notebook number like '03' (or 3), got {notebook!r}")
    return text.zfill(2)


def _import_notebook(notebook: str) -> None:
    """Import ``mhalab.labs.exNN`` (which registers notebook NN's exercises)."""
    try:
        importlib.import_module(f"{__package__}.ex{notebook}")
    except ModuleNotFoundError as error:
        if error.name != f"{__package__}.ex{notebook}":
            raise
        if not any(nb == notebook for nb, _ in _REGISTRY):  # exercises registered elsewhere are fine
            have = sorted({nb for nb, _ in _REGISTRY} | set(available_notebooks()))
            raise ValueError(f"there are no exercises for notebook {notebook!r}; notebooks with exercises: {have}") from None


def available_notebooks() -> list[str]:
    """Notebook numbers that have an ``exNN`` module in mhalab.labs."""
    import pkgutil

    package = sys.modules[__package__]
    return sorted(
        m.name[2:] for m in pkgutil.iter_modules(package.__path__) if len(m.name) == 4 and m.name.startswith("ex") and m.name[2:].isdigit()
    )


def exercise(notebook: str | int, number: int) -> Exercise:
    """Exercise ``number`` of notebook ``notebook`` (e.g. ``exercise("03", 1)``)."""
    notebook = _notebook_id(notebook)
    _import_notebook(notebook)
    try:
        return _REGISTRY[(notebook, int(number))]
    except KeyError:
        have = sorted(n for nb, n in _REGISTRY if nb == notebook)
        raise ValueError(f"notebook {notebook} has no exercise {number}; it has {have}") from None


def load(notebook: str | int) -> tuple[Exercise, ...]:
    """All exercises of a notebook, in order: ``q1, q2, q3 = labs.load("03")``."""
    notebook = _notebook_id(notebook)
    _import_notebook(notebook)
    return tuple(ex for (nb, _), ex in sorted(_REGISTRY.items()) if nb == notebook)


def results() -> dict[str, bool]:
    """What every ``check`` in this session returned last, by exercise key ("03.1": True)."""
    return {key: outcome["passed"] for key, outcome in _OUTCOMES.items()}


def outcomes() -> dict[str, dict[str, Any]]:
    """The last ``check`` of every exercise in this session: key -> {"passed", "status", "message"}.

    ``status`` is "passed", "failed" (the checker found it wrong), "error" (the answer raised) or
    "unanswered" (no answer, or the NotImplementedError placeholder is still there).
    """
    return {key: dict(outcome) for key, outcome in _OUTCOMES.items()}


def reset() -> None:
    """Forget every recorded check (the registry is kept)."""
    _OUTCOMES.clear()
    for ex in _REGISTRY.values():
        ex.last_result, ex.last_message = None, ""
