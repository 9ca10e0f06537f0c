"""Calling the learner's code and describing what it returned: :func:`invoke` (with the facts a check
measures during the call), :func:`describe`, :class:`Opaque`, :func:`where`. ``q.check`` calls answers with
these in the learner's own kernel (the local runner of :mod:`mhalab.labs.calls`); the grading kernel (of the
separate ``mhalab_grader`` distribution) imports this module from its copy of the package, where the exercise
modules are left out. A leaf module: it imports nothing of mhalab.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
import tracemalloc
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ForbidWatch", "Opaque", "SizeWatch", "describe", "invoke", "where"]

# --------------------------------------------------------------------------- plain descriptions


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
    """Stands in (when grading) for a returned object that plain data cannot carry: only its description."""

    def __init__(self, description: str):
        self.description = str(description)[:200]

    def __repr__(self) -> str:
        return self.description


# --------------------------------------------------------------------------- calling an answer


def _matches(name: str, prefixes: tuple) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


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


class ForbidWatch:
    """A profile function noting the first call of a function that ``forbid`` names: module or function prefixes
    of mhalab (e.g. "mhalab.ablation"), also when it runs inside other mhalab code, or public names of functions
    and classes of other packages (e.g. "torch.nn.MultiheadAttention"), whose code is found where it is defined;
    ``found`` is then the entry itself."""

    def __init__(self, forbid: tuple, package: str):
        self.forbid, self.package = tuple(forbid), package
        root = os.path.basename(package) or "mhalab"
        defined = {f: _defined_as(f) for f in self.forbid if f.split(".")[0] != root}
        self.outside = {f"{d[0]}.{d[1]}": f for f, d in defined.items() if d}  # where defined -> the entry
        self.modules = frozenset(d[0] for d in defined.values() if d)
        self.found: str | None = None

    def __call__(self, frame, event, arg):
        if self.found is not None or event != "call":
            return
        filename = frame.f_code.co_filename
        if self.modules and frame.f_globals.get("__name__", "") in self.modules:
            name = f"{frame.f_globals['__name__']}.{_qualname(frame)}"
            entry = next((self.outside[d] for d in self.outside if _matches(name, (d,))), None)
            if entry is not None:
                self.found = entry
            return
        if not filename.startswith(self.package + os.sep) or filename == __file__:  # (this file: the size watch)
            return
        module = os.path.relpath(filename, os.path.dirname(self.package))[:-3].replace(os.sep, ".")
        if frame.f_code.co_name != "<module>" and _matches(f"{module}.{_qualname(frame)}", self.forbid):
            self.found = f"{module}.{_qualname(frame)}"


def _defined_as(entry: str) -> tuple[str, str] | None:
    """Where the function or class that ``entry`` names is defined ("torch.nn.MultiheadAttention" ->
    ("torch.nn.modules.activation", "MultiheadAttention")); None when it cannot be found."""
    parts = entry.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        return (module, qualname) if isinstance(module, str) and isinstance(qualname, str) else None
    return None


class SizeWatch(torch.overrides.TorchFunctionMode):
    """Notes the bytes of the largest tensor any torch function makes while it is active."""

    largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def _model_output(args: tuple) -> Any:
    model, tokens = args[0], args[1]
    with torch.no_grad():
        out = model(tokens)
    return out.detach().clone() if isinstance(out, torch.Tensor) else None


def invoke(fn: Callable, args: tuple, *, facts: tuple = (), forbid: tuple = (), package: str = "",
           allow: tuple = ()) -> tuple[str, Any, dict]:
    """Call ``fn(*args)``: ("returned", value, facts) or ("raised", (class name, message, where), facts).
    ``facts`` to measure: "largest_bytes" (the largest tensor or NumPy allocation made, in bytes),
    "model_changed" (args[0], a model, gives another output on args[1] after the call); with ``forbid``,
    "borrowed" (the forbidden mhalab function that ran) and "tampered" (the answer replaced the watch)."""
    found: dict[str, Any] = {}
    try:
        inspect.signature(fn).bind(*args)
    except ValueError:  # a builtin without a signature is just called
        pass
    except TypeError:
        try:
            return "unbound", list(inspect.signature(fn).parameters), found
        except (TypeError, ValueError):
            pass
    before = _model_output(args) if "model_changed" in facts else None
    watch, previous = (ForbidWatch(forbid, package), sys.getprofile()) if forbid else (None, None)
    sizes = SizeWatch() if "largest_bytes" in facts else None
    tracing = sizes is not None and not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start()
    if sizes is not None:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
    if watch is not None:
        sys.setprofile(watch)
    outcome: tuple
    try:
        if sizes is not None:
            with sizes:
                result = fn(*args)
        else:
            result = fn(*args)
        outcome = ("returned", result)
    except BaseException as error:  # noqa: B036 (a KeyboardInterrupt is the grader stopping an endless call)
        if isinstance(error, (SystemExit, GeneratorExit)) and not isinstance(error, allow):
            error = RuntimeError(f"{type(error).__name__} ({error})")
        outcome = ("raised", error)
    finally:
        if watch is not None:
            found["tampered"] = sys.getprofile() is not watch
            sys.setprofile(previous)
            found["borrowed"] = watch.found
        if sizes is not None:
            found["largest_bytes"] = max(sizes.largest, tracemalloc.get_traced_memory()[1] - start)
            if tracing:
                tracemalloc.stop()
    if outcome[0] == "returned":
        if before is not None:
            after = _model_output(args)
            found["model_changed"] = after is None or not torch.equal(after, before)
    return outcome[0], outcome[1], found


def where(error: BaseException, skip: tuple) -> str:
    """Where ``error`` was raised in the learner's code, "line 3 of d_k_for" (``skip``: folders of libraries)."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        name = frame.filename
        if not name or name.startswith("<") or not os.path.abspath(name).startswith(skip):
            return f"line {frame.lineno} of {frame.name}"
    return ""


