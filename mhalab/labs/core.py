"""The exercise machinery: an exercise is an object with check(), hint() and solution(), registered in exNN.py.

Its checker is called as ``checker(answer, check)``: ``check`` (a :class:`Check`, one per verdict) is the only
way the checker learns whether it is grading, draws its hidden inputs (``check.generator(n)``, ``check.rng(n)``)
and runs the learner's code (``check.call(fn, *args)``).

A checker exception that is not a :class:`Wrong` is the checker's bug: the learner is told so and the
traceback goes to the ``mhalab.labs`` logger. With ``MHALAB_LABS_STRICT=1`` a failed check raises
``AssertionError`` (the tests use it so that nbval fails on it).
"""

from __future__ import annotations

import ast
import copy
import importlib
import logging
import os
import pkgutil
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..models import ModelConfig, Transformer

__all__ = ["Check", "Wrong", "Exercise", "register", "exercise", "load", "available_notebooks"]

log = logging.getLogger("mhalab.labs")
log.addHandler(logging.NullHandler())  # checker tracebacks are for instructors and tests, not printed to learners

PASSED, FAILED, UNANSWERED, ERROR, BROKEN = "passed", "failed", "unanswered", "error", "checker error"
STRICT_ENV = "MHALAB_LABS_STRICT"
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mhalab/


class Wrong(Exception):
    """Raised by a checker: the answer is wrong, and the message says what is off."""


class AnswerRaised(Wrong):
    """The learner's function raised on a hidden input (reported as an error)."""


@dataclass
class Check:
    """One run of an exercise's checker, ``checker(answer, check)``, made by :meth:`Exercise.verdict`: where the
    answer runs, which hidden inputs to draw, and what the answer's last call measured. Every check has its own,
    so checks running at the same time (a class graded in parallel) share nothing. ``Check()`` is ``q.check``'s."""

    template: tuple[str, tuple[str, ...]] | None = None  # the solution's def line: (name, parameters)
    remote: Any = None            # grading: the kernel the answer runs in (mhalab_grader.kernel.GradingKernel)
    key: str = ""                 # the exercise ("03.1")
    trusted: bool = False         # the course's own answers (tests): the reference may be handed in
    seed: int | None = None       # grading: hidden inputs drawn fresh from it (None: the fixed cases of q.check)
    last_call: tuple[str, str] = ("your answer", "")  # the last call's label, and what it returned (described)
    facts: dict = field(default_factory=dict)         # measured during the last call: see observe

    @property
    def grading(self) -> bool:
        """Whether the hidden inputs are drawn fresh (a grading run) rather than fixed (``q.check``)."""
        return self.seed is not None

    def _stream(self, n: int) -> int:
        return n if self.seed is None else (self.seed * 1_000_003 + n) % (2**63 - 1)

    def generator(self, n: int) -> torch.Generator:
        """A torch.Generator for hidden inputs: seeded with ``n`` in ``q.check`` (the same cases every time), and
        when grading with ``n`` mixed with the run's secret seed, so every grading run draws fresh inputs."""
        return torch.Generator().manual_seed(self._stream(n))

    def rng(self, n: int) -> random.Random:
        """Like :meth:`generator`, a ``random.Random`` for hidden sizes and counts."""
        return random.Random(self._stream(n))

    def hidden_model(self, config: Mapping[str, Any], seed: int, *, scale: float = 3.0) -> Transformer:
        """A small :class:`mhalab.models.Transformer` for hidden inputs (``config``: ModelConfig's fields), in eval
        mode, its weights drawn from :meth:`generator` ``(seed)`` without touching the global random state, then
        multiplied by ``scale``: larger than at initialisation, so that every head matters."""
        with torch.random.fork_rng():
            torch.manual_seed(self.generator(seed).initial_seed())
            model = Transformer(ModelConfig(**config)).eval()
            for p in model.parameters():
                p.data.mul_(scale)
        return model

    def call(self, fn: Callable, *args: Any, label: str | None = None, allow: tuple = (), copy_args: bool = True,
             forbid: tuple = (), facts: tuple = ()) -> Any:
        """The learner's ``fn(*args)``, called where this check runs it: :func:`mhalab.labs.calls.call_answer`."""
        from .calls import call_answer  # (calls.py imports this module)

        return call_answer(self, fn, *args, label=label, allow=allow, copy_args=copy_args, forbid=forbid, facts=facts)

    def observe(self, name: str) -> Any:
        """A fact measured during the learner's last call (``check.call(..., facts=(name,))``), where the call
        ran: "shares_memory", "largest_bytes", "model_changed" (see :func:`mhalab.labs.invoke.invoke`)."""
        if name not in self.facts:
            raise KeyError(f"the fact {name!r} was not measured: pass facts=({name!r},) to check.call")
        return self.facts[name]

    def calls(self, fn: Callable, cases: Iterable[tuple], reference: Callable, *,
              compare: Callable[..., None] | None = None) -> None:
        """Call ``fn`` and ``reference`` on every case (positional arguments) and ``compare`` the results
        (:func:`~mhalab.labs.checks.expect_close` by default, or ``expect_equal`` for exact ones); the message
        names the failing input."""
        from .checks import expect_close  # (checks.py imports this module)

        for args in cases:
            got = self.call(fn, *args)
            try:
                (compare or expect_close)(got, reference(*copy.deepcopy(args)), "the result")
            except Wrong as wrong:
                raise Wrong(f"{self.last_call[0]}: {wrong}") from None


class Exercise:
    """Exercise ``number`` of notebook ``notebook`` ("03"): ``checker(answer, check)`` raises :class:`Wrong`;
    ``hint`` is one hint or a list given one at a time; the first ``def`` line of ``solution`` is the template
    the learner's function is called by; ``reference`` passes, but scores 0 when handed in."""

    def __init__(self, notebook: str, number: int, title: str, checker: Callable[..., None], hint: str | Sequence[str],
                 solution: str, *, reference: Any, points: float = 1, minutes: int = 10, difficulty: int = 2,
                 importance: int = 3):
        hints = [hint] if isinstance(hint, str) else list(hint)
        if not callable(checker) or not hints or not solution.strip():
            raise ValueError(f"exercise {notebook}.{number} needs a checker, a hint and a solution")
        self.notebook, self.number, self.title = str(notebook).zfill(2), int(number), title
        self.checker, self.hints, self.solution_text, self.points = checker, hints, solution, points
        self.reference = reference
        for name, value, low, high in (("minutes", minutes, 1, 120), ("difficulty", difficulty, 1, 5),
                                       ("importance", importance, 1, 5)):
            if not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"exercise {notebook}.{number}: {name} is a whole number from {low} to {high}, "
                                 f"got {value!r}")
        # ARENA's labels: how hard (1-5), how much it matters for what follows (1-5), the minutes to spend on it
        self.minutes, self.difficulty, self.importance = minutes, difficulty, importance
        self.key = f"{self.notebook}.{self.number}"
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

    def verdict(self, answer: Any, *, remote: Any = None, seed: int | None = None,
                trusted: bool = False) -> tuple[str, str]:
        """(status, message) for ``answer``; never raises for anything the learner did. ``remote``: the grading
        kernel the answer runs in (``answer`` is then what stands for it here); ``seed``: draw the hidden inputs
        from it; ``trusted`` (the tests only) lets the answer be the course's reference."""
        if answer is None or answer is Ellipsis or answer is NotImplemented:
            return UNANSWERED, "not answered yet: replace the placeholder with your answer, then run the cell again."
        borrowed = self._borrowed(answer) if not trusted else None
        if borrowed:
            return FAILED, borrowed
        check = Check(self.template, remote, self.key, trusted, seed)
        try:
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
    """All exercises of a notebook, in order: ``q1, q2, q3 = labs.load("03")``."""
    text = str(notebook).strip()
    if not text.isdigit() or len(text) > 2:
        raise ValueError(f"notebook must be a notebook number like '03' (or 3), got {notebook!r}")
    text = text.zfill(2)
    if text in available_notebooks():
        importlib.import_module(f"{__package__}.ex{text}")
    found = tuple(ex for (nb, _), ex in sorted(_REGISTRY.items()) if nb == text)  # also the tests' "99"
    if not found:
        raise ValueError(f"there are no exercises for notebook {text!r}; notebooks with exercises: "
                         f"{available_notebooks()}")
    return found


def exercise(notebook: str | int, number: int) -> Exercise:
    """Exercise ``number`` of notebook ``notebook`` (e.g. ``exercise("03", 1)``)."""
    exercises = load(notebook)
    found = [ex for ex in exercises if ex.number == int(number)]
    if not found:
        have = [ex.number for ex in exercises]
        raise ValueError(f"notebook {exercises[0].notebook} has no exercise {number}; it has {have}")
    return found[0]
