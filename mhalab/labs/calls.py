"""A check, and the one place a checker runs the learner's code: :class:`Check` (one per verdict), whose
``check.call(fn, *args)`` is :func:`call_answer`. Where the answer runs is the check's *runner*: :data:`LOCAL`
here, in the learner's own kernel (``q.check``), or the grading kernel the grader hands to
``Exercise.verdict(answer, runner=...)`` (``mhalab_grader.kernel.GradingKernel``, in the separate grader
distribution). A runner has two methods:

- ``run(check, fn, args, *, facts, forbid, allow, copy_args)`` calls the answer on ``args`` and returns
  ``("returned", value, facts)``, ``("raised", (class name, message, where[, the error]), facts)`` or
  ``("unbound", parameters, {})`` when it cannot take them; the value is what crossed the grader's transport
  (:func:`mhalab.labs.plain.round_trip` here, so both judge the same value);
- ``received(answer)`` is what the checker sees of an answer that is a value, not a function.

Everything else (the messages, what is forbidden, what counts as tampering) is decided here, the same for both.
"""

from __future__ import annotations

import builtins
import copy
import os
import random
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..models import ModelConfig, Transformer
from .invoke import describe, invoke, where
from .judging import expect_close
from .plain import round_trip
from .verdicts import AnswerRaised, Wrong

__all__ = ["Check", "LOCAL", "LocalRunner", "PACKAGE", "call_answer"]

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mhalab/
_SKIP = tuple(os.path.abspath(p) + os.sep for p in {PACKAGE, sys.prefix, sys.base_prefix, sys.exec_prefix} if p)
_COURSE = ("mhalab.labs",)  # the exercises, their solutions and checkers: never callable from an answer


class LocalRunner:
    """Runs answers here, in the learner's own kernel (``q.check``)."""

    def run(self, check: Check, fn: Callable, args: tuple, *, facts: tuple, forbid: tuple, allow: tuple,
            copy_args: bool) -> tuple[str, Any, dict]:
        kind, value, found = invoke(fn, copy.deepcopy(args) if copy_args else args, facts=facts, forbid=forbid,
                                    package=PACKAGE, allow=allow)
        if kind == "raised":
            return kind, (type(value).__name__, str(value), where(value, _SKIP), value), found
        return kind, round_trip(value) if kind == "returned" else value, found

    def received(self, answer: Any) -> Any:
        return round_trip(answer)


LOCAL = LocalRunner()


@dataclass
class Check:
    """One run of an exercise's checker, ``checker(answer, check)``, made by ``Exercise.verdict``: where the
    answer runs, which hidden inputs to draw, the course's answer, and what the answer's last call measured. Every
    check has its own, so checks running at the same time (a class graded in parallel) share nothing.
    ``Check()`` is ``q.check``'s."""

    template: tuple[str, tuple[str, ...]] | None = None  # the solution's def line: (name, parameters)
    runner: Any = LOCAL           # where the answer runs (see the module's docstring)
    key: str = ""                 # the exercise ("04.1")
    trusted: bool = False         # the course's own answers (tests): the reference may be handed in
    seed: int | None = None       # grading: hidden inputs drawn fresh from it (None: the fixed cases of q.check)
    reference: Any = None         # the exercise's answer, run from its solution text: what the checker compares with
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
        """The learner's ``fn(*args)``, called where this check runs it: :func:`call_answer`."""
        return call_answer(self, fn, *args, label=label, allow=allow, copy_args=copy_args, forbid=forbid, facts=facts)

    def observe(self, name: str) -> Any:
        """A fact measured during the learner's last call (``check.call(..., facts=(name,))``), where the call
        ran: "largest_bytes", "model_changed" (see :func:`mhalab.labs.invoke.invoke`)."""
        if name not in self.facts:
            raise KeyError(f"the fact {name!r} was not measured: pass facts=({name!r},) to check.call")
        return self.facts[name]

    def calls(self, fn: Callable, cases: Iterable[tuple], reference: Callable | None = None, *,
              compare: Callable[..., None] | None = None) -> None:
        """Call ``fn`` and ``reference`` (by default the exercise's) on every case (positional arguments) and
        ``compare`` the results (:func:`~mhalab.labs.judging.expect_close` by default, or ``expect_equal`` for exact
        ones); the message names the failing input."""
        reference = self.reference if reference is None else reference
        for args in cases:
            got = self.call(fn, *args)
            try:
                (compare or expect_close)(got, reference(*copy.deepcopy(args)), "the result")
            except Wrong as wrong:
                raise Wrong(f"{self.last_call[0]}: {wrong}") from None


def _signature_message(template: tuple | None, parameters: list, n_args: int) -> str:
    given = f"def {template[0]}({', '.join(template[1])})" if template else f"{n_args} arguments"
    return (f"your function takes ({', '.join(parameters)}), but it is called with {n_args} argument(s) as in "
            f"`{given}`: keep the given parameters")


_RAISED = {cls.__name__: cls for cls in (NotImplementedError, Wrong, AnswerRaised)}


def call_answer(check: Check, fn: Callable, *args: Any, label: str | None = None, allow: tuple = (),
                copy_args: bool = True, forbid: tuple = (), facts: tuple = ()) -> Any:
    """Call the learner's ``fn(*args)`` (positionally, on copies) where ``check`` runs it and return what it
    returned. :class:`Wrong` when ``fn`` cannot take the template's arguments or runs course code it may not: the
    exercise modules always, and the code that ``forbid`` names (mhalab's module or function prefixes, or public
    names of other packages' functions and classes such as "torch.nn.MultiheadAttention": only what the
    exercise's prompt forbids; every other helper is fair); :class:`AnswerRaised` when it raises (but ``allow``).
    ``facts`` to measure during the call, read with ``check.observe``."""
    name = check.template[0] if check.template else getattr(fn, "__name__", "your function")
    if label is None:
        label = ", ".join(repr(a) if isinstance(a, (bool, int, float, str)) or a is None else describe(a) for a in args)
    label = f"{name}({label})"
    if not callable(fn):
        raise Wrong(f"expected a function, got {describe(fn)}: define it with `def` and pass its name "
                    "without calling it (no parentheses)")
    kind, value, found = check.runner.run(check, fn, args, facts=tuple(facts), forbid=tuple(forbid) + _COURSE,
                                          allow=tuple(allow), copy_args=copy_args)
    check.facts = found
    if kind == "unbound":
        raise Wrong(_signature_message(check.template, list(value), len(args)))
    if not check.trusted and found.get("tampered"):
        raise Wrong("your answer replaced the check's watch (sys.setprofile) while it ran; the exercise cannot "
                    "be judged that way")
    borrowed = str(found.get("borrowed") or "")
    if not check.trusted and borrowed.startswith(_COURSE[0]):
        raise Wrong(f"your answer calls the course's own reference or checker (`{borrowed}`); write the "
                    "answer yourself (when grading, the exercise modules cannot even be imported)")
    if not check.trusted and borrowed:
        # Named by the prompt's own entry (`mhalab.ablation`, not whichever of its functions the watch saw first,
        # which can differ between the learner's kernel and the grading kernel).
        named = next((f for f in forbid if borrowed == f or borrowed.startswith(f + ".")), borrowed)
        whose = "the course's own " if named.split(".")[0] == "mhalab" else ""
        raise Wrong(f"your answer calls {whose}`{named}`, which this exercise asks you not to use (see its prompt)")
    if kind == "raised":
        cls_name, message, at = value[:3]
        error = value[3] if len(value) > 3 else None
        cls = _RAISED.get(cls_name) or getattr(builtins, cls_name, None)
        if cls is NotImplementedError:
            raise NotImplementedError(message)
        if allow and isinstance(cls, type) and issubclass(cls, tuple(allow)):
            raise error if isinstance(error, tuple(allow)) else cls(message)
        raise AnswerRaised(f"{label} raised {cls_name}: {message}" + (f" (at {at})" if at else ""))
    check.last_call = (label, describe(value))
    return value
