"""Helpers that make checkers short and their messages consistent.

Each helper raises :class:`~mhalab.labs.core.Wrong` with a message that says what is off (the type,
the shape, the size and direction of a wrong value, the hidden case a function fails on) without
printing the expected answer. A checker is then a few lines::

    def _check_split(answer):
        # call_on_hidden_cases first checks that the answer is a function (expect_callable)
        call_on_hidden_cases(answer, [case(torch.randn(2, 5, 12), 3), case(torch.randn(1, 7, 8), 2)],
                             reference=_split_reference, name="split_heads")

Values may be Python numbers, tensors, NumPy arrays, nested lists, or tuples/lists/dicts of those
(compared element by element, with the position in the message).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from .core import AnswerRaised, Wrong, where

__all__ = [
    "Case",
    "case",
    "call_on_hidden_cases",
    "describe",
    "expect_callable",
    "expect_close",
    "expect_equal",
    "expect_shape",
    "expect_type",
    "order_of_magnitude",
]


# --------------------------------------------------------------------------- describing values


def order_of_magnitude(x: float) -> str:
    """"of order 10^3" for 4160 (the power of ten below |x|); "zero" for 0."""
    if x == 0:
        return "zero"
    if not math.isfinite(x):
        return str(x)
    return f"of order 10^{math.floor(math.log10(abs(x)))}"


def describe(value: Any) -> str:
    """A short description of an input that shows no more than needed: shapes for tensors."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"tensor{list(value.shape)} {dtype}" if value.dim() else f"tensor({value.item():.4g})"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # NumPy
        return f"array{list(value.shape)} {value.dtype}"
    if isinstance(value, (bool, int, str)) or value is None:
        return repr(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and len(value) <= 6:
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    return f"a {type(value).__name__}"  # a module, a function, ...


def _fmt_number(x: float) -> str:
    if isinstance(x, bool):
        return str(x)
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.4g}"


def _fmt_shape(shape: Iterable) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    """``value`` as a CPU tensor, or Wrong saying it is not numeric."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if hasattr(value, "__array__") and not isinstance(value, (list, tuple)):
        try:
            import numpy as np

            return torch.from_numpy(np.asarray(value).copy())
        except (TypeError, ValueError):
            pass
    if isinstance(value, (bool, int, float, list, tuple)):
        try:
            return torch.tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise Wrong(f"{name} should be numbers (a tensor, or a rectangular nested list); it has rows of different lengths or non-numbers") from None
    raise Wrong(f"{name} should be a number or a tensor, got {describe(value)}")


# --------------------------------------------------------------------------- simple expectations


def expect_callable(answer: Any, name: str = "your answer") -> None:
    """The answer must be a function (for exercises that ask for one)."""
    if not callable(answer):
        raise Wrong(f"{name} should be a function (define it with `def` and pass its name, without calling it), got {describe(answer)}")


def expect_type(value: Any, types: type | tuple[type, ...], name: str = "your answer") -> None:
    """``value`` must be an instance of ``types`` (say which were expected)."""
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise Wrong(f"{name} should be a {names}, got {describe(value)}")


def expect_shape(value: Any, shape: Sequence[int | None], name: str = "your answer") -> None:
    """``value`` must be a tensor/array of ``shape`` (``None`` matches any size in that place)."""
    if not hasattr(value, "shape"):
        raise Wrong(f"{name} should be a tensor of shape {_fmt_shape(shape)}, got {describe(value)}")
    got, want = list(value.shape), list(shape)
    if len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want)):
        return
    message = f"{name} has shape {_fmt_shape(got)}; expected {_fmt_shape(want)}"
    if len(got) != len(want):
        message += f" ({len(got)} dimensions instead of {len(want)})"
    elif None not in want and sorted(got) == sorted(want):
        message += " (the same sizes in another order: check which dimensions you transposed or viewed)"
    elif None not in want and math.prod(got) == math.prod(want):
        message += " (the same number of elements: check how you reshaped)"
    raise Wrong(message)


# --------------------------------------------------------------------------- values


def _check_structure(value: Any, expected: Any, name: str, compare: Callable[[Any, Any, str], None]) -> bool:
    """Recurse into tuples/lists/dicts of values; return True when handled here."""
    if isinstance(expected, Mapping):
        if not isinstance(value, Mapping):
            raise Wrong(f"{name} should be a dict, got {describe(value)}")
        missing = [k for k in expected if k not in value]
        extra = [k for k in value if k not in expected]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"is missing the keys {missing}")
            if extra:
                parts.append(f"has unexpected keys {extra}")
            raise Wrong(f"{name} " + " and ".join(parts))
        for key in expected:
            compare(value[key], expected[key], f"{name}[{key!r}]")
        return True
    if isinstance(expected, (tuple, list)) and (
        isinstance(expected, tuple) or any(isinstance(e, (torch.Tensor, tuple, list, Mapping, str)) for e in expected)
    ):
        if not isinstance(value, (tuple, list)):
            raise Wrong(f"{name} should be a {type(expected).__name__} of {len(expected)} items, got {describe(value)}")
        if len(value) != len(expected):
            raise Wrong(f"{name} has {len(value)} items; expected {len(expected)}")
        for i, (v, e) in enumerate(zip(value, expected)):
            compare(v, e, f"{name}[{i}]")
        return True
    return False


def _scalar_miss(got: float, expected: float, name: str) -> str:
    if not math.isfinite(got):
        return f"{name} is {got}; expected a finite number"
    if expected == 0:
        return f"{name} is {_fmt_number(got)}; expected a value near zero"
    if got == 0:
        return f"{name} is 0; expected a nonzero number {order_of_magnitude(expected)}"
    if (got > 0) != (expected > 0):
        return f"{name} is {_fmt_number(got)}, which has the wrong sign"
    direction = "too large" if abs(got) > abs(expected) else "too small"
    return f"{name} is {_fmt_number(got)}, which is {direction}; the expected value is {order_of_magnitude(expected)}"


def _tensor_miss(got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, name: str, rtol: float, atol: float) -> str:
    n_bad, n = int(bad.sum()), bad.numel()
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    finite = torch.isfinite(want) & torch.isfinite(got)
    diff = (got - want).abs()[finite & bad]
    scale = want[torch.isfinite(want)].abs().max().item() if torch.isfinite(want).any() else 0.0
    message = f"{n_bad} of {n} entries of {name} are off (the first at index {list(first)})"
    if diff.numel():
        message += f"; the largest difference is {diff.max().item():.3g}, where the expected values are {order_of_magnitude(scale)}"
    # Two common slips that are worth naming: a transpose and a missing/extra constant factor.
    if got.dim() >= 2 and got.shape[-1] == got.shape[-2] and torch.allclose(got.transpose(-1, -2), want, rtol=rtol, atol=atol, equal_nan=True):
        message += ". It matches the expected result transposed (the last two dimensions swapped)"
    elif finite.all() and want.abs().max() > atol:
        ratio = (got * want).sum() / (want * want).sum()
        if ratio.abs() > 1e-6 and not torch.isclose(ratio, torch.ones_like(ratio), rtol=1e-3) and torch.allclose(got, ratio * want, rtol=rtol, atol=atol):
            message += f". It is the expected result times a constant factor of about {ratio.item():.3g} (a missing or extra scale?)"
    return message


def expect_close(value: Any, expected: Any, name: str = "your answer", *, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    """``value`` must equal ``expected`` within ``|value - expected| <= atol + rtol * |expected|``.

    Works for numbers, tensors/arrays (shape checked first), and tuples/lists/dicts of them. The
    message gives the shape, the size and direction of the miss and the expected order of
    magnitude, never the expected value itself. NaN/inf must match where ``expected`` has them.
    """
    if _check_structure(value, expected, name, lambda v, e, n: expect_close(v, e, n, rtol=rtol, atol=atol)):
        return
    want = _as_tensor(expected, "the expected value")
    if want.dim() == 0 and not isinstance(value, torch.Tensor) and not hasattr(value, "shape"):
        if not _is_number(value) and not isinstance(value, bool):
            raise Wrong(f"{name} should be a single number, got {describe(value)}")
    got = _as_tensor(value, name)
    if want.dim() == 0 and got.numel() == 1 and got.dim() <= 1:
        got = got.reshape(())  # a 1-element tensor is a fine scalar answer
    if want.dim() == 0 and got.dim() != 0:
        raise Wrong(f"{name} should be a single number, got a tensor of shape {_fmt_shape(got.shape)}")
    expect_shape(got, want.shape, name)
    if got.dtype == torch.bool and want.dtype != torch.bool:
        raise Wrong(f"{name} should hold numbers, got a boolean tensor")
    got, want = got.double(), want.double()
    if torch.isnan(got).any() and not torch.isnan(want).any():
        raise Wrong(f"{name} contains NaN ({int(torch.isnan(got).sum())} of {got.numel()} entries): look for 0/0, inf - inf or a softmax over a row that is fully masked")
    bad = ~torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return
    if want.dim() == 0:
        raise Wrong(_scalar_miss(got.item(), want.item(), name))
    raise Wrong(_tensor_miss(got, want, bad, name, rtol, atol))


def expect_equal(value: Any, expected: Any, name: str = "your answer") -> None:
    """``value`` must equal ``expected`` exactly: integers, booleans, strings, integer/bool tensors.

    For integer counts the message gives the direction and order of magnitude of the miss; for
    boolean tensors (masks) how many entries differ and where the first one is.
    """
    if _check_structure(value, expected, name, expect_equal):
        return
    if isinstance(expected, str):
        if value != expected:
            raise Wrong(f"{name} is {describe(value)}, which is not the expected text" if isinstance(value, str) else f"{name} should be a string, got {describe(value)}")
        return
    if isinstance(expected, bool):
        if not isinstance(value, (bool, torch.Tensor)) and not hasattr(value, "dtype"):
            raise Wrong(f"{name} should be True or False, got {describe(value)}")
        if bool(value) != expected:
            raise Wrong(f"{name} is {bool(value)}, which is not right")
        return
    want = _as_tensor(expected, "the expected value")
    if want.is_floating_point():
        raise TypeError("expect_equal is for exact values; use expect_close for floating-point ones")
    if want.dim() == 0 and not hasattr(value, "shape") and not _is_number(value):
        raise Wrong(f"{name} should be a whole number, got {describe(value)}")
    got = _as_tensor(value, name)
    if want.dim() == 0 and got.numel() == 1 and got.dim() <= 1:
        got = got.reshape(())
    if want.dim() == 0 and got.dim() != 0:
        raise Wrong(f"{name} should be a single number, got a tensor of shape {_fmt_shape(got.shape)}")
    expect_shape(got, want.shape, name)
    if want.dtype == torch.bool and got.dtype != torch.bool:
        raise Wrong(f"{name} should be a boolean tensor (True/False), got dtype {str(got.dtype).replace('torch.', '')}")
    if got.is_floating_point():
        if not torch.equal(got, got.round()):
            raise Wrong(f"{name} should be whole numbers, got fractional values" if got.dim() else f"{name} is {got.item():.4g}; expected a whole number")
        got = got.long()
    bad = got != want
    if not bad.any():
        return
    if want.dim() == 0:
        raise Wrong(_scalar_miss(float(got.item()), float(want.item()), name))
    first = [int(i) for i in bad.nonzero()[0].tolist()]
    message = f"{int(bad.sum())} of {bad.numel()} entries of {name} are wrong (the first at index {first})"
    if want.dtype == torch.bool:
        extra = int((got & ~want).sum())
        missing = int((~got & want).sum())
        message += f": {extra} are True where they should be False and {missing} are False where they should be True"
        if got.dim() >= 2 and torch.equal(got.transpose(-1, -2), want):
            message += " (it is the expected mask transposed)"
        elif torch.equal(~got, want):
            message += " (it is the expected mask inverted: check which value means 'allowed')"
    raise Wrong(message)


# --------------------------------------------------------------------------- functions on hidden cases


@dataclass
class Case:
    """Arguments for one hidden call: ``fn(*args, **kwargs)``; ``label`` replaces the description."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    label: str | None = None

    def describe(self) -> str:
        if self.label:
            return self.label
        parts = [describe(a) for a in self.args] + [f"{k}={describe(v)}" for k, v in self.kwargs.items()]
        return ", ".join(parts)


def case(*args: Any, label: str | None = None, **kwargs: Any) -> Case:
    """A hidden case: ``case(96, 3)`` or ``case(q, k, v, mask=m, label="a causal mask")``."""
    return Case(args, kwargs, label)


def _as_case(c: Any) -> Case:
    if isinstance(c, Case):
        return c
    if isinstance(c, dict):
        return Case((), dict(c))
    if isinstance(c, tuple):
        return Case(c)
    return Case((c,))


def call_on_hidden_cases(
    fn: Callable,
    cases: Iterable[Any],
    reference: Callable,
    *,
    name: str | None = None,
    compare: Callable[..., None] | None = None,
    **compare_kwargs: Any,
) -> None:
    """Call ``fn`` and ``reference`` on every case and compare the results.

    ``cases`` holds :func:`case` objects (or tuples of positional arguments, or dicts of keyword
    arguments). Each call gets its own deep copy of the arguments, so a function that modifies its
    inputs cannot change the reference's. ``compare`` defaults to :func:`expect_close` (pass
    :func:`expect_equal` for exact results); extra keyword arguments (``rtol``, ``atol``) go to it.
    The message names the failing case by its inputs (shapes for tensors), not by its answer.
    """
    expect_callable(fn, name or "your answer")
    name = name or f"{getattr(fn, '__name__', 'your function')}"
    compare = compare or expect_close
    for c in map(_as_case, cases):
        expected = reference(*copy.deepcopy(c.args), **copy.deepcopy(c.kwargs))
        args, kwargs = copy.deepcopy(c.args), copy.deepcopy(c.kwargs)
        try:
            got = fn(*args, **kwargs)
        except (Wrong, NotImplementedError):
            raise
        except Exception as error:
            at = where(error)
            raise AnswerRaised(
                f"{name}({c.describe()}) raised {type(error).__name__}: {error}" + (f" (at {at})" if at else "")
            ) from error
        try:
            compare(got, expected, "the result", **compare_kwargs)
        except Wrong as wrong:
            raise Wrong(f"{name}({c.describe()}): {wrong}") from None
