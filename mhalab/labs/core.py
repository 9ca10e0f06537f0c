"""The exercise machinery: an exercise is an object with check(), hint() and solution().

Authoring an exercise (in ``mhalab/labs/exNN.py``)::

    from .checks import check_calls, expect_equal
    from .core import Exercise, register

    def _reference(d_model, n_heads):
        return d_model // n_heads

    def _check_dk(answer):
        # Raise Wrong("what is off, without giving the answer"); the helpers in checks.py apply the
        # tolerance policy and call the learner's function as the template's def line says.
        check_calls(answer, [(96, 3), (512, 8)], _reference, compare=expect_equal)

    register(Exercise(
        notebook="03", number=1, title="d_k for a new width",
        checker=_check_dk,
        hint="d_k is what each head gets when the width is shared equally.",
        solution="def d_k(d_model, n_heads):\\n    return d_model // n_heads",   # its def line is the template
        reference=_reference,
        wrong=[lambda d_model, n_heads: d_model],
    ))

In the notebook, load the exercises once (``q1, q2, q3 = labs.load("03")``); each exercise has one answer
cell carrying nbgrader's metadata (``grade_id`` ``ex03-1-answer``): the ``def`` line, the body between
``### BEGIN SOLUTION`` and ``### END SOLUTION``, and ``q1.check(d_k)`` at the end.

``check`` prints ✓ or what is off and returns nothing. A checker exception that is not a :class:`Wrong`
is the checker's bug, not the learner's: the learner is told which input their answer was given and what
it returned, and the traceback goes to the ``mhalab.labs`` logger. With ``MHALAB_LABS_STRICT=1`` a check
that does not pass raises ``AssertionError`` (the test suite uses it so that nbval fails on it).
"""

from __future__ import annotations

import ast
import importlib
import logging
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["Wrong", "Exercise", "register", "exercise", "load"]

log = logging.getLogger("mhalab.labs")
log.addHandler(logging.NullHandler())  # checker tracebacks are for instructors and tests, not printed to learners

PASSED, FAILED, UNANSWERED, ERROR, BROKEN = "passed", "failed", "unanswered", "error", "checker error"
STRICT_ENV = "MHALAB_LABS_STRICT"


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message says what is off."""


class AnswerRaised(Wrong):
    """The learner's function raised on a hidden input (reported as an error)."""


class Borrowed(Wrong):
    """The answer is the course's own reference or mhalab code, where the learner must write it."""


def where(error: BaseException) -> str:
    """Where ``error`` was raised in the learner's code: "line 3 of d_k_for" (or "").

    Frames inside mhalab, torch, numpy or the standard library are skipped.
    """
    skip = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    skip += [p for p in {sys.prefix, sys.base_prefix, sys.exec_prefix} if p]
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        filename = os.path.abspath(frame.filename) if frame.filename and not frame.filename.startswith("<") else ""
        if filename and any(filename.startswith(os.path.abspath(s) + os.sep) for s in skip):
            continue
        return f"line {frame.lineno} of {frame.name}"
    return ""


@dataclass
class _Session:
    """What one check knows while it runs: the template, and the calls it records or replays."""

    template: tuple[str, tuple[str, ...]] | None = None
    tape: list | None = None      # recording: each call of the learner's function is appended
    replay: list | None = None    # grading: the calls recorded in the learner's kernel, in order
    last_call: tuple[str, str] = ("your answer", "")
    largest_tensor: int = 0
    trusted: bool = False         # the course's own answers (tests): mhalab code may run

    def record(self, entry: tuple) -> None:
        if self.tape is not None:
            self.tape.append(entry)


_SESSIONS = [_Session()]


def session() -> _Session:
    return _SESSIONS[-1]


def _template(solution: str) -> tuple[str, tuple[str, ...]] | None:
    """(name, parameters) of the first ``def`` in the solution text: how the learner's function is called."""
    try:
        tree = ast.parse(solution)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            return node.name, tuple(a.arg for a in node.args.args)
    return None


class _Replayed:
    """Stands in for the learner's function when grading: its calls come from the recording."""

    def __init__(self, name: str):
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        raise RuntimeError("a replayed answer is only called through checks.call_answer")


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


class Exercise:
    """One auto-checked exercise of notebook ``notebook`` (e.g. "03"), number ``number`` (1, 2, ...).

    Args:
        checker: ``checker(answer, *context)`` raises :class:`Wrong` when ``answer`` is wrong.
        hint: a hint, or a list of hints that ``hint()`` gives one at a time.
        solution: the text of a solution; its first ``def`` line is the template the answer is called by.
        reference: an answer that passes; it scores 0 when handed in as the answer. (Alternative right
            answers and plausible wrong ones, with their messages, are in tests/labs_corpus.py.)
        prepare: turns the extra arguments of ``check`` (e.g. the explorer) into the plain data the
            checker reads (numbers, strings, tensors, lists and dicts), so the grader can record it.
        points: what the exercise is worth when graded.
    """

    def __init__(self, notebook: str, number: int, title: str, checker: Callable[..., None], hint: str | Sequence[str],
                 solution: str, *, reference: Any, prepare: Callable[..., tuple] | None = None,
                 points: float = 1):
        hints = [hint] if isinstance(hint, str) else list(hint)
        if not callable(checker) or not hints or not solution.strip():
            raise ValueError(f"exercise {notebook}.{number} needs a checker, a hint and a solution")
        self.notebook, self.number, self.title = str(notebook).zfill(2), int(number), title
        self.checker, self.hints, self.solution_text, self.points = checker, hints, solution, points
        self.reference, self.prepare = reference, prepare
        self.template = _template(solution)
        self.last_status: str | None = None
        self.last_message = ""
        self._hints_shown = 0

    @property
    def key(self) -> str:
        return f"{self.notebook}.{self.number}"

    def _borrowed(self, answer: Any) -> str | None:
        if answer is self.reference and (callable(answer) or not isinstance(answer, (bool, int, float, str, tuple, bytes))):
            return "your answer is the course's own reference (q.reference); write the answer yourself"
        if callable(answer) and str(getattr(answer, "__module__", "") or "").startswith("mhalab"):
            return f"your answer is mhalab's own `{answer.__module__}.{getattr(answer, '__qualname__', '?')}`; write it yourself"
        return None

    def verdict(self, answer: Any, *context: Any, tape: list | None = None, replay: list | None = None,
                prepared: bool = False, trusted: bool = False) -> tuple[str, str]:
        """(status, message) for ``answer``; never raises for anything the learner did.

        ``trusted`` (the tests only) lets the answer be or run the course's own code.
        """
        if answer is None or answer is Ellipsis or answer is NotImplemented:
            return UNANSWERED, "no answer yet: replace the placeholder with your answer, then run the cell again."
        borrowed = self._borrowed(answer) if replay is None and not trusted else None
        if borrowed:
            return FAILED, borrowed
        _SESSIONS.append(_Session(self.template, tape, replay, trusted=trusted))
        try:
            if self.prepare is not None and not prepared:
                context = self.prepare(*context)
            self.checker(answer, *context)
        except NotImplementedError:
            return UNANSWERED, "no answer yet: your code still raises NotImplementedError; replace that line with your answer."
        except AnswerRaised as raised:
            return ERROR, str(raised)
        except Wrong as wrong:
            return FAILED, str(wrong)
        except Exception:
            label, returned = _SESSIONS[-1].last_call
            log.exception("checker of exercise %s failed", self.key)
            detail = f" on {label}, which returned {returned}" if returned else ""
            return BROKEN, (f"the checker could not judge your answer{detail}. That is a bug in the exercise, not "
                            "necessarily in your answer: please tell your instructor.")
        finally:
            _SESSIONS.pop()
        return PASSED, "correct."

    def check(self, answer: Any, *context: Any) -> None:
        """Test ``answer`` (a function on hidden inputs, or a value) and print ✓ or what is off.

        Extra arguments are what the exercise asks to pass along (e.g. the explorer in notebook 05).
        """
        status, message = self.verdict(answer, *context)
        self.last_status, self.last_message = status, message
        print(f"{'✓' if status == PASSED else '✗'} Exercise {self.key} ({self.title}): {message}")
        if status != PASSED and strict():
            raise AssertionError(f"exercise {self.key} ({self.title}): {message}")

    def record(self, answer: Any, *context: Any) -> dict:
        """Check ``answer`` in the learner's kernel and return what the grader needs as plain data:
        the answer (a value, or a function's name), the prepared context and every call's result."""
        from .calls import _encode

        tape: list = []
        borrowed = self._borrowed(answer)
        prepared, problem = context, None
        if self.prepare is not None and answer is not None:
            try:
                prepared = self.prepare(*context)
            except Wrong as wrong:
                problem = str(wrong)
        if callable(answer):
            encoded = {"__function__": getattr(answer, "__name__", "answer"), "borrowed": borrowed}
        else:
            encoded = _encode(answer)
        if problem is None and not borrowed:
            self.verdict(answer, *prepared, tape=tape, prepared=True)
        return {"answer": encoded, "context": _encode(tuple(prepared)), "calls": tape, "problem": problem, "borrowed": borrowed}

    def replay(self, recorded: dict) -> tuple[str, str]:
        """(status, message) judged here from what :meth:`record` wrote in the learner's kernel."""
        from .calls import decode

        if recorded.get("problem"):
            return FAILED, recorded["problem"]
        if recorded.get("borrowed"):
            return FAILED, recorded["borrowed"]
        answer = recorded.get("answer")
        if isinstance(answer, dict) and "__function__" in answer:
            answer = _Replayed(str(answer["__function__"]))
        else:
            answer = decode(answer)
        return self.verdict(answer, *decode(recorded.get("context", ())), replay=list(recorded.get("calls", [])), prepared=True)

    def hint(self) -> None:
        """Print the next hint (all of them once every one has been shown)."""
        n = len(self.hints)
        if n == 1:
            print(f"Hint for exercise {self.key}: {self.hints[0]}")
        elif self._hints_shown >= n:
            print("\n".join(f"Hint {i} of {n} for exercise {self.key}: {t}" for i, t in enumerate(self.hints, 1)))
        else:
            self._hints_shown += 1
            print(f"Hint {self._hints_shown} of {n} for exercise {self.key}: {self.hints[self._hints_shown - 1]}")

    def solution(self) -> None:
        print(f"A solution to exercise {self.key} ({self.title}):\n{self.solution_text}")

    def __repr__(self) -> str:
        return f"<Exercise {self.key}: {self.title}>"


_REGISTRY: dict[tuple[str, int], Exercise] = {}


def register(ex: Exercise) -> Exercise:
    """Add ``ex`` to the registry (re-registering the same key replaces it, e.g. after a reload)."""
    _REGISTRY[(ex.notebook, ex.number)] = ex
    return ex


def _notebook_id(notebook: str | int) -> str:
    text = str(notebook).strip()
    if not text.isdigit() or len(text) > 2:
        raise ValueError(f"notebook must be a notebook number like '03' (or 3), got {notebook!r}")
    text = text.zfill(2)
    try:
        importlib.import_module(f"{__package__}.ex{text}")
    except ModuleNotFoundError as error:
        if error.name != f"{__package__}.ex{text}":
            raise
        if not any(nb == text for nb, _ in _REGISTRY):  # exercises registered elsewhere (the tests' "99") are fine
            raise ValueError(f"there are no exercises for notebook {text!r}; notebooks with exercises: {available_notebooks()}") from None
    return text


def available_notebooks() -> list[str]:
    """Notebook numbers that have an ``exNN`` module in mhalab.labs."""
    folder = os.path.dirname(os.path.abspath(__file__))
    return sorted(f[2:4] for f in os.listdir(folder) if len(f) == 7 and f.startswith("ex") and f.endswith(".py") and f[2:4].isdigit())


def exercise(notebook: str | int, number: int) -> Exercise:
    """Exercise ``number`` of notebook ``notebook`` (e.g. ``exercise("03", 1)``)."""
    notebook = _notebook_id(notebook)
    try:
        return _REGISTRY[(notebook, int(number))]
    except KeyError:
        have = sorted(n for nb, n in _REGISTRY if nb == notebook)
        raise ValueError(f"notebook {notebook} has no exercise {number}; it has {have}") from None


def load(notebook: str | int) -> tuple[Exercise, ...]:
    """All exercises of a notebook, in order: ``q1, q2, q3 = labs.load("03")``."""
    notebook = _notebook_id(notebook)
    return tuple(ex for (nb, _), ex in sorted(_REGISTRY.items()) if nb == notebook)
