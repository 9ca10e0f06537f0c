"""Calling the learner's code, the one place a checker runs it (:func:`call_answer`). For the grader, every
call's outcome is recorded as plain data in the learner's kernel and replayed to the same checker here."""

from __future__ import annotations

import builtins
import copy
import inspect
import os
import sys
import traceback
from typing import Any, Callable

import numpy as np
import torch

from .core import PACKAGE, AnswerRaised, Wrong, session

__all__ = ["call_answer", "describe", "observe", "largest_tensor", "encode", "decode"]


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


class Opaque:
    """Stands in (when grading) for a returned object that cannot be recorded: only its description."""

    def __init__(self, description: str):
        self.description = description

    def __repr__(self) -> str:
        return self.description


def _replayed_function(name: str) -> Callable:
    """Stands in for the learner's function when grading: its calls come from the recording."""
    def answer(*args: Any) -> Any:
        raise RuntimeError("a replayed answer is only called through call_answer")
    answer.__name__ = name
    return answer


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data that ``torch.load(weights_only=True)`` reads back (no code runs)."""
    if isinstance(value, np.generic):  # before the next test: np.float64 and np.str_ are a float and a str
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, np.ndarray) and value.dtype != object:
        return {"__numpy__": torch.from_numpy(value.copy())}
    if depth < 6 and isinstance(value, (tuple, list)):  # torch.Size and named tuples become tuples
        return (list if isinstance(value, list) else tuple)(encode(v, depth + 1) for v in value)
    if depth < 6 and type(value) is dict:
        return {(encode(k, depth + 1) if isinstance(k, tuple) else k): encode(v, depth + 1) for k, v in value.items()}
    return {"__opaque__": describe(value)}


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`: NumPy arrays come back as NumPy, other objects as :class:`Opaque`."""
    if isinstance(value, dict):
        if set(value) == {"__numpy__"}:
            return value["__numpy__"].numpy()
        if set(value) == {"__opaque__"}:
            return Opaque(value["__opaque__"])
        if set(value) == {"__function__"}:  # the answer itself, recorded by Exercise.record
            return _replayed_function(str(value["__function__"]))
        return {k: decode(v) for k, v in value.items()}
    if type(value) in (tuple, list):
        return type(value)(decode(v) for v in value)
    return value


def where(error: BaseException) -> str:
    """Where ``error`` was raised in the learner's code, "line 3 of d_k_for" (mhalab and libraries skipped)."""
    skip = tuple(os.path.abspath(p) + os.sep for p in {PACKAGE, sys.prefix, sys.base_prefix, sys.exec_prefix} if p)
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        name = frame.filename
        if not name or name.startswith("<") or not os.path.abspath(name).startswith(skip):
            return f"line {frame.lineno} of {frame.name}"
    return ""


def _matches(name: str, prefixes: tuple) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


class _BorrowWatch:
    """A profile function noting the first mhalab function (outside this machinery) that runs, other than
    inside a permitted one (``uses``, e.g. "mhalab.models") unless it matches ``forbid``."""

    MACHINERY = {os.path.join(PACKAGE, "labs", f) for f in ("calls.py", "checks.py", "core.py")}

    def __init__(self, uses: tuple, forbid: tuple):
        self.uses, self.forbid = uses, forbid
        self.found: str | None = None
        self.inside = None  # the frame of the permitted mhalab call we are in

    def __call__(self, frame, event, arg):
        if event == "return" and frame is self.inside:
            self.inside = None
        importing = self.inside is not None and self.inside.f_code.co_name == "<module>"
        if self.found is not None or event != "call" or importing:
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(PACKAGE + os.sep) or filename in self.MACHINERY:
            return
        module = os.path.relpath(filename, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
        name = f"{module}.{_qualname(frame)}"
        if frame.f_code.co_name == "<module>":  # an import runs the module's body: the learner calls nothing
            self.inside = self.inside or frame
        elif _matches(name, self.forbid) or (self.inside is None and not _matches(name, self.uses)):
            self.found = name
        elif self.inside is None:
            self.inside = frame


def _qualname(frame) -> str:
    """The running function's qualified name (``MultiHeadAttention.__init__``). Python 3.10's code objects
    have no co_qualname: there a method is named after the class in its first argument's MRO that holds it."""
    code = frame.f_code
    if hasattr(code, "co_qualname"):
        return code.co_qualname
    if code.co_argcount:
        first = frame.f_locals.get(code.co_varnames[0])
        for klass in getattr(first if isinstance(first, type) else type(first), "__mro__", ()):
            function = klass.__dict__.get(code.co_name)
            if getattr(getattr(function, "__func__", function), "__code__", None) is code:
                return f"{klass.__qualname__}.{code.co_name}"
    return code.co_name


class _SizeWatch(torch.overrides.TorchFunctionMode):
    """Notes the largest tensor any torch function makes while it is active."""

    largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _check_signature(fn: Callable, args: tuple) -> None:
    """Wrong when ``fn`` cannot take the template's arguments (a builtin without a signature is just called)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args)
    except TypeError:
        template = session().template
        given = f"def {template[0]}({', '.join(template[1])})" if template else f"{len(args)} arguments"
        raise Wrong(f"your function takes ({', '.join(signature.parameters)}), but it is called with {len(args)} "
                    f"argument(s) as in `{given}`: keep the given parameters") from None


def _live_call(fn: Callable, args: tuple, label: str, allow: tuple, uses: tuple, forbid: tuple) -> Any:
    state = session()
    _check_signature(fn, args)
    watch, previous, sizes = _BorrowWatch(uses, forbid), sys.getprofile(), _SizeWatch()
    sys.setprofile(watch)
    try:
        with sizes:
            result = fn(*args)
    except (NotImplementedError, *allow):
        raise
    except Exception as error:
        at = where(error)
        raise AnswerRaised(f"{label} raised {type(error).__name__}: {error}" + (f" (at {at})" if at else "")) from error
    finally:
        sys.setprofile(previous)
        state.largest_tensor = sizes.largest
    if watch.found and not state.trusted:
        raise Wrong(f"your answer calls the course's own `{watch.found}`; this exercise asks you to write it yourself")
    return result


_RAISED = {cls.__name__: cls for cls in (NotImplementedError, Wrong, AnswerRaised)}


def call_answer(fn: Callable, *args: Any, label: str | None = None, allow: tuple = (), copy_args: bool = True,
                uses: tuple = (), forbid: tuple = ()) -> Any:
    """Call the learner's ``fn(*args)`` (positionally, on deep copies) and return what it returned. :class:`Wrong`
    when ``fn`` cannot take the template's arguments or runs mhalab code other than ``uses`` permits (or inside it
    what ``forbid`` names: module or function prefixes); :class:`AnswerRaised` when it raises (but ``allow``)."""
    state = session()
    name = state.template[0] if state.template else getattr(fn, "__name__", "your function")
    if label is None:
        label = ", ".join(repr(a) if isinstance(a, (bool, int, float, str)) or a is None else describe(a) for a in args)
    label = f"{name}({label})"
    if not callable(fn):
        raise Wrong(f"expected a function, got {describe(fn)}: define it with `def` and pass its name "
                    "without calling it (no parentheses)")
    if state.replay is not None:
        kind, payload = state.replayed("raised", "returned")
        if kind == "raised":
            cls = _RAISED.get(payload[0]) or getattr(builtins, payload[0], None)
            raise (cls if isinstance(cls, type) and issubclass(cls, Exception) else RuntimeError)(payload[1])
        result = decode(payload[0])
    else:
        try:
            result = _live_call(fn, copy.deepcopy(args) if copy_args else args, label, allow, uses, forbid)
        except (NotImplementedError, Wrong, *allow) as error:
            kind = next((n for n, cls in reversed(_RAISED.items()) if isinstance(error, cls)), type(error).__name__)
            state.record(("raised", kind, str(error)))
            raise
        state.record(("returned", encode(result)))
    state.last_call = (label, describe(result))
    return result


def observe(compute: Callable[[], Any]) -> Any:
    """A fact about the learner's last call that only their kernel can see (e.g. whether the result is a
    view of the input): computed live and recorded, or read back from the recording when grading."""
    state = session()
    if state.replay is None:
        value = compute()
        state.record(("fact", encode(value)))
        return value
    return decode(state.replayed("fact")[1][0])


def largest_tensor() -> int:
    """The number of entries of the largest tensor a torch function made during the last live call."""
    return session().largest_tensor
