"""Calling the learner's code, the one place a checker runs it (:func:`call_answer`, which checkers reach as
``check.call``): here, in the learner's own kernel (``q.check``), or, when grading, in the grading kernel, which
gets the inputs and sends back the result as plain data (:mod:`mhalab_grader.worker`, in the separate grader
distribution). The :class:`~mhalab.labs.core.Check` it is given says which."""

from __future__ import annotations

import builtins
import copy
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from .core import PACKAGE, AnswerRaised, Check, Wrong
from .invoke import Opaque, describe, invoke, where

__all__ = ["call_answer", "describe", "Opaque"]

_SKIP = tuple(os.path.abspath(p) + os.sep for p in {PACKAGE, sys.prefix, sys.base_prefix, sys.exec_prefix} if p)


def _check_signature(template: tuple | None, fn: Callable, args: tuple) -> None:
    """Wrong when ``fn`` cannot take the template's arguments (a builtin without a signature is just called)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args)
    except TypeError:
        raise Wrong(_signature_message(template, list(signature.parameters), len(args))) from None


def _signature_message(template: tuple | None, parameters: list, n_args: int) -> str:
    given = f"def {template[0]}({', '.join(template[1])})" if template else f"{n_args} arguments"
    return (f"your function takes ({', '.join(parameters)}), but it is called with {n_args} argument(s) as in "
            f"`{given}`: keep the given parameters")


_RAISED = {cls.__name__: cls for cls in (NotImplementedError, Wrong, AnswerRaised)}


def call_answer(check: Check, fn: Callable, *args: Any, label: str | None = None, allow: tuple = (),
                copy_args: bool = True, forbid: tuple = (), facts: tuple = ()) -> Any:
    """Call the learner's ``fn(*args)`` (positionally, on copies) where ``check`` runs it and return what it
    returned. :class:`Wrong` when ``fn`` cannot take the template's arguments or runs mhalab code that ``forbid``
    names (module or function prefixes: only what the exercise's prompt forbids; every other helper is fair);
    :class:`AnswerRaised` when it raises (but ``allow``). ``facts`` to measure during the call, read with
    ``check.observe``."""
    name = check.template[0] if check.template else getattr(fn, "__name__", "your function")
    if label is None:
        label = ", ".join(repr(a) if isinstance(a, (bool, int, float, str)) or a is None else describe(a) for a in args)
    label = f"{name}({label})"
    if not callable(fn):
        raise Wrong(f"expected a function, got {describe(fn)}: define it with `def` and pass its name "
                    "without calling it (no parentheses)")
    if check.remote is not None:  # grading: the answer runs in the grading kernel, on these inputs
        kind, value, found = check.remote.call(check.key, args, facts=facts, forbid=forbid)
    else:  # q.check: the exercise modules are here, so calling them is watched for too
        _check_signature(check.template, fn, args)
        forbid = tuple(forbid) + ("mhalab.labs",)
        kind, value, found = invoke(fn, copy.deepcopy(args) if copy_args else args, facts=facts, forbid=forbid,
                                    package=PACKAGE, allow=allow)
        if kind == "raised":
            value = (type(value).__name__, str(value), where(value, _SKIP), value)
    check.facts = found
    if kind == "unbound":
        raise Wrong(_signature_message(check.template, list(value), len(args)))
    if not check.trusted and found.get("tampered"):
        raise Wrong("your answer replaced the check's watch (sys.setprofile) while it ran; the exercise cannot "
                    "be judged that way")
    if not check.trusted and str(found.get("borrowed") or "").startswith("mhalab.labs"):
        raise Wrong(f"your answer calls the course's own reference or checker (`{found['borrowed']}`); write the "
                    "answer yourself (when grading, the exercise modules cannot even be imported)")
    if not check.trusted and found.get("borrowed"):
        # Named by the prompt's own entry (`mhalab.ablation`, not whichever of its functions the watch saw first,
        # which can differ between the learner's kernel and the grading kernel).
        borrowed = str(found["borrowed"])
        named = next((f for f in forbid if borrowed == f or borrowed.startswith(f + ".")), borrowed)
        raise Wrong(f"your answer calls the course's own `{named}`, which this exercise asks you not to "
                    "use (see its prompt)")
    if kind == "raised":
        cls_name, message, at = value[:3]
        error = value[3] if len(value) > 3 else None
        cls = _RAISED.get(cls_name) or getattr(builtins, cls_name, None)
        if cls is NotImplementedError:
            raise NotImplementedError(message)
        if allow and isinstance(cls, type) and issubclass(cls, allow):
            raise error if isinstance(error, allow) else cls(message)
        raise AnswerRaised(f"{label} raised {cls_name}: {message}" + (f" (at {at})" if at else ""))
    check.last_call = (label, describe(value))
    return value

