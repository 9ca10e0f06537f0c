"""Calling the learner's code: the one place a checker runs it (:func:`call_answer`).

A call gets deep copies of the inputs, positionally as the exercise's template (its ``def`` line) says;
an exception is reported as the learner's error with the input that caused it; an answer that runs
mhalab's own code (the course's reference) is refused. For the grader, every call's result is recorded
as plain data in the learner's kernel and replayed, in the grader's process, to the same checker.
"""

from __future__ import annotations

import builtins
import copy
import inspect
import os
import sys
from typing import Any, Callable

import torch

from .core import AnswerRaised, Borrowed, Wrong, session, where

__all__ = ["call_answer", "describe", "expect_callable", "observe", "largest_tensor", "decode"]


def describe(value: Any) -> str:
    """A short description that shows no more than needed: shapes for tensors, ``an int (3)`` for numbers."""
    if isinstance(value, Opaque):
        return value.description
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"tensor{list(value.shape)} {dtype}" if value.dim() else f"tensor({value.item():.4g})"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # NumPy
        return f"array{list(value.shape)} {value.dtype}"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return f"an int ({value})"
    if isinstance(value, float):
        return f"a float ({value:.4g})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) < 40 else "a string"
    if isinstance(value, (list, tuple)) and len(value) <= 6:
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    article = "an" if type(value).__name__[:1].lower() in "aeiou" else "a"
    return f"{article} {type(value).__name__}"


def expect_callable(answer: Any, name: str = "your answer") -> None:
    """The answer must be a function: "expected a function, got an int (3)"."""
    if not callable(answer):
        raise Wrong(f"expected a function, got {describe(answer)}: define it with `def` and pass its name "
                    "without calling it (no parentheses)")


class Opaque:
    """Stands in (when grading) for a returned object that cannot be recorded: only its description."""

    def __init__(self, description: str):
        self.description = description

    def __repr__(self) -> str:
        return self.description


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mhalab/
_MACHINERY = {os.path.join(_PACKAGE, "labs", f) for f in ("calls.py", "checks.py", "core.py")}


class _BorrowWatch:
    """Notes the first function of the mhalab package (other than this machinery) that runs during a call.

    ``uses`` names mhalab code the exercise lets the answer run (module or function prefixes such as
    ``"mhalab.models"``: a model's forward pass); whatever runs inside it is fine, except what matches
    ``forbid`` (e.g. ``"mhalab.hooks.ablate_heads"`` in an exercise that asks for that hook).
    """

    def __init__(self, uses: tuple = (), forbid: tuple = ()):
        self.found: str | None = None
        self.uses, self.forbid = tuple(uses), tuple(forbid)
        self.inside = None  # the frame of the permitted mhalab call we are in

    @staticmethod
    def _matches(name: str, prefixes: tuple) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    def __call__(self, frame, event, arg):
        if self.found is not None:
            return
        if event == "return" and frame is self.inside:
            self.inside = None
            return
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE + os.sep) or filename in _MACHINERY:
            return
        module = os.path.relpath(filename, os.path.dirname(_PACKAGE))[:-3].replace(os.sep, ".")
        name = f"{module}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"
        if self._matches(name, self.forbid):
            self.found = name
        elif self.inside is None:
            if self._matches(name, self.uses):
                self.inside = frame
            else:
                self.found = name


def _signature_problem(fn: Callable, args: tuple, template: tuple[str, tuple[str, ...]] | None) -> str | None:
    try:
        inspect.signature(fn).bind(*args)
    except TypeError:
        pass
    except ValueError:  # no signature (a builtin): just call it
        return None
    else:
        return None
    try:
        yours = f"({', '.join(inspect.signature(fn).parameters)})"
    except (TypeError, ValueError):
        yours = "other parameters"
    given = f"def {template[0]}({', '.join(template[1])})" if template else f"{len(args)} arguments"
    return f"your function takes {yours}, but it is called with {len(args)} argument(s) as in `{given}`: keep the given parameters"


def _encode(value: Any, depth: int = 0) -> Any:
    """A returned value as plain data that ``torch.load(weights_only=True)`` reads back (no code runs)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if type(value).__module__ == "numpy" and hasattr(value, "dtype"):
        if getattr(value, "shape", ()) == () and not hasattr(value, "__len__"):
            return value.item()
        if value.dtype != object:
            return {"__numpy__": torch.from_numpy(value.copy())}
    if depth < 6 and isinstance(value, (tuple, list)):  # torch.Size and named tuples become tuples
        return (list if isinstance(value, list) else tuple)(_encode(v, depth + 1) for v in value)
    if depth < 6 and type(value) is dict:
        return {(_encode(k, depth + 1) if isinstance(k, tuple) else k): _encode(v, depth + 1) for k, v in value.items()}
    return {"__opaque__": describe(value)}


def decode(value: Any) -> Any:
    """The inverse of the recording (NumPy arrays come back as NumPy, other objects as :class:`Opaque`)."""
    if isinstance(value, dict):
        if set(value) == {"__numpy__"}:
            return value["__numpy__"].numpy()
        if set(value) == {"__opaque__"}:
            return Opaque(value["__opaque__"])
        return {k: decode(v) for k, v in value.items()}
    if type(value) in (tuple, list):
        return type(value)(decode(v) for v in value)
    return value


class _SizeWatch(torch.overrides.TorchFunctionMode):
    """Notes the largest tensor any torch function makes while it is active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _live_call(fn: Callable, args: tuple, label: str, allow: tuple, uses: tuple = (), forbid: tuple = ()) -> Any:
    state = session()
    problem = _signature_problem(fn, args, state.template)
    if problem:
        raise Wrong(problem)
    watch, previous, sizes = _BorrowWatch(uses, forbid), sys.getprofile(), _SizeWatch()
    sys.setprofile(watch)
    try:
        with sizes:
            result = fn(*args)
    except NotImplementedError:
        raise
    except allow:
        raise
    except Exception as error:
        at = where(error)
        raise AnswerRaised(f"{label} raised {type(error).__name__}: {error}" + (f" (at {at})" if at else "")) from error
    finally:
        sys.setprofile(previous)
        state.largest_tensor = sizes.largest
    if watch.found and not state.trusted:
        raise Borrowed(f"your answer calls the course's own `{watch.found}`; this exercise asks you to write it yourself")
    return result


def call_answer(fn: Callable, *args: Any, label: str | None = None, allow: tuple = (), copy_args: bool = True,
                uses: tuple = (), forbid: tuple = ()) -> Any:
    """Call the learner's ``fn(*args)`` (positionally, on deep copies) and return what it returned.

    Raises :class:`Wrong` when ``fn`` is not a function or cannot take the template's arguments,
    :class:`AnswerRaised` (naming the input and the learner's line) when it raises, unless the exception
    is one of ``allow`` (re-raised for the checker, e.g. a ``ValueError`` the exercise asks for), and
    :class:`Borrowed` when it runs mhalab's own code, other than what ``uses`` permits (module or function
    prefixes, e.g. ``("mhalab.models", "mhalab.hooks.run_with_hooks")`` to run a model; code those run is
    fine unless it matches ``forbid``). While grading, calls are recorded or replayed.
    """
    state = session()
    name = state.template[0] if state.template else getattr(fn, "__name__", "your function")
    if label is None:
        label = ", ".join(repr(a) if isinstance(a, (bool, int, float, str)) or a is None else describe(a) for a in args)
    label = f"{name}({label})"
    expect_callable(fn)
    if state.replay is not None:
        kind, *payload = state.replay.pop(0) if state.replay else ("missing",)
        if kind == "returned":
            result = decode(payload[0])
        elif kind == "allowed":
            ename, text = payload
            cls = getattr(builtins, ename, None)
            raise (cls if isinstance(cls, type) and issubclass(cls, Exception) else RuntimeError)(text)
        elif kind == "wrong":
            cls = {"AnswerRaised": AnswerRaised, "Borrowed": Borrowed}.get(payload[0], Wrong)
            raise cls(payload[1])
        elif kind == "unanswered":
            raise NotImplementedError(payload[0] if payload else "")
        else:
            raise Wrong(f"what the notebook's kernel recorded ends before {label}: the recording does not match this check")
        state.last_call = (label, describe(result))
        return result
    try:
        result = _live_call(fn, copy.deepcopy(args) if copy_args else args, label, allow, uses, forbid)
    except NotImplementedError as error:
        state.record(("unanswered", str(error)))
        raise
    except Wrong as error:
        state.record(("wrong", type(error).__name__, str(error)))
        raise
    except allow as error:
        state.record(("allowed", type(error).__name__, str(error)))
        raise
    state.record(("returned", _encode(result)))
    state.last_call = (label, describe(result))
    return result


def observe(compute: Callable[[], Any]) -> Any:
    """A fact about the learner's last call that only their kernel can see (e.g. whether the result is a
    view of the input): computed live and recorded, or read back from the recording when grading."""
    state = session()
    if state.replay is not None:
        kind, *payload = state.replay.pop(0) if state.replay else ("missing",)
        if kind != "fact":
            raise Wrong("what the notebook's kernel recorded does not match this check")
        return decode(payload[0])
    value = compute()
    state.record(("fact", _encode(value)))
    return value


def largest_tensor() -> int:
    """The number of entries of the largest tensor a torch function made during the last live call."""
    return session().largest_tensor



