"""The one tolerance policy of the exercise checkers (README, "What counts as right"), and its helpers.

Numbers by value (``32.0 == 32``); floats in float64 within ``ATOL + RTOL * |expected|``; integers and
booleans exactly; a list may stand for a tuple. Messages say what is off without printing the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..hooks import ActivationCache
from .invoke import describe
from .verdicts import AnswerRaised, Wrong

__all__ = [
    "ATOL", "RTOL", "answers_until_raised", "as_float64", "consistent_mistake", "describe", "expect_close",
    "expect_equal", "expect_shape", "expect_whole", "first_match", "judge", "name_miss", "only_output",
    "pattern_cache", "unseparated",
]

RTOL, ATOL = 1e-4, 1e-5


def pattern_cache(patterns: Sequence[torch.Tensor]) -> ActivationCache:
    """Hidden attention patterns ``[B, H, T, T]``, one per layer, as ``model.run_with_cache(tokens,
    names_filter=<the hook_pattern points>)`` returns them: an :class:`~mhalab.hooks.ActivationCache` in layer
    order, read as ``cache["blocks.0.attn.hook_pattern"]`` or ``cache["pattern", 0]``."""
    return ActivationCache({f"blocks.{i}.attn.hook_pattern": p for i, p in enumerate(patterns)})


def _magnitude(x: float) -> str:
    """"of order 10^3" for 4160 (the power of ten below |x|); "zero" for 0."""
    if x == 0:
        return "zero"
    return f"of order 10^{math.floor(math.log10(abs(x)))}" if math.isfinite(x) else str(x)


def _fmt(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.4g}"


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    """``value`` as a CPU tensor (torch, NumPy, numbers, nested lists), or Wrong saying it is not numeric."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    numeric = isinstance(value, (bool, int, float, list, tuple)) or hasattr(value, "__array__")
    if not numeric or isinstance(value, str):
        raise Wrong(f"{name} should be a number or a tensor, got {describe(value)}")
    try:
        array = np.asarray(value)
        if array.dtype != object:
            return torch.from_numpy(array.copy())
    except (TypeError, ValueError):
        pass
    raise Wrong(f"{name} should be numbers (a tensor, an array or a rectangular nested list), got {describe(value)}")


def only_output(value: Any, name: str = "your answer") -> Any:
    """``value`` unchanged, or Wrong when it is a pair (output, weights) as attention modules return."""
    if (isinstance(value, tuple) and len(value) == 2 and hasattr(value[0], "shape")
            and (value[1] is None or hasattr(value[1], "shape"))):
        raise Wrong(f"{name} is a pair {describe(value)}: return only the output, not (output, weights)")
    return value


def as_float64(value: Any, name: str = "your answer") -> torch.Tensor:
    """``value`` (tensor/array/list of any float or int dtype) as a float64 tensor; Wrong if it is not numeric."""
    got = _as_tensor(value, name)
    if got.dtype == torch.bool:
        raise Wrong(f"{name} should hold numbers, got a boolean tensor")
    if got.is_complex():
        raise Wrong(f"{name} should hold real numbers, got dtype {got.dtype}")
    return got.double()


def _single(value: Any, name: str, what: str = "a single number") -> float:
    """``value`` (a number, or a tensor/array of one element) as a float; Wrong for anything else."""
    if isinstance(value, (bool, str, Mapping, list, tuple)) or value is None:
        raise Wrong(f"{name} should be {what}, got {describe(value)}")
    got = as_float64(value, name)
    if got.numel() != 1 or got.dim() > 1:
        raise Wrong(f"{name} should be a single number, got a tensor of shape {list(got.shape)}")
    return got.item()


def expect_whole(value: Any, name: str = "your answer") -> int:
    """``value`` as an int: an int, a float that is a whole number, or a one-element tensor/array of one."""
    x = _single(value, name, "a whole number")
    if not math.isfinite(x) or not x.is_integer():
        raise Wrong(f"{name} should be a whole number, got {x:.4g}")
    return int(x)


def expect_shape(value: Any, shape: Sequence[int], name: str = "your answer") -> None:
    """``value`` must be a tensor/array of ``shape``."""
    if not hasattr(value, "shape"):
        raise Wrong(f"{name} should be a tensor of shape {list(shape)}, got {describe(value)}")
    got, want = list(value.shape), list(shape)
    if got == want:
        return
    message = f"{name} has shape {got}; expected {want}"
    if len(got) != len(want):
        message += f" ({len(got)} dimensions instead of {len(want)})"
    elif sorted(got) == sorted(want):
        message += " (the same sizes in another order: check which dimensions you transposed or viewed)"
    elif math.prod(got) == math.prod(want):
        message += " (the same number of elements: check how you reshaped)"
    raise Wrong(message)


def _structure(value: Any, expected: Any, name: str, compare: Callable[[Any, Any, str], None]) -> bool:
    """Compare tuples/lists/dicts item by item (a list may stand for a tuple); True when handled here."""
    if isinstance(expected, Mapping):
        if not isinstance(value, Mapping):
            raise Wrong(f"{name} should be a dict, got {describe(value)}")
        missing, extra = [k for k in expected if k not in value], [k for k in value if k not in expected]
        if missing or extra:
            parts = (([f"is missing the keys {missing}"] if missing else [])
                     + ([f"has unexpected keys {extra}"] if extra else []))
            raise Wrong(f"{name} " + " and ".join(parts))
        pairs = [(value[k], expected[k], f"{name}[{k!r}]") for k in expected]
    elif isinstance(expected, tuple) or (
            isinstance(expected, list) and any(isinstance(e, (torch.Tensor, tuple, list, Mapping)) for e in expected)):
        if not isinstance(value, (tuple, list)):
            raise Wrong(f"{name} should be a tuple of {len(expected)} items, got {describe(value)}")
        if len(value) != len(expected):
            raise Wrong(f"{name} has {len(value)} items; expected {len(expected)}")
        pairs = [(v, e, f"{name}[{i}]") for i, (v, e) in enumerate(zip(value, expected))]
    else:
        return False
    for pair in pairs:
        compare(*pair)
    return True


def _scalar_miss(got: float, expected: float, name: str) -> str:
    if not math.isfinite(got):
        return f"{name} is {got}; expected a finite number"
    if expected == 0:
        return f"{name} is {_fmt(got)}; expected a value near zero"
    if got == 0:
        return f"{name} is 0; expected a nonzero number {_magnitude(expected)}"
    if (got > 0) != (expected > 0):
        return f"{name} is {_fmt(got)}, which has the wrong sign"
    direction = "too large" if abs(got) > abs(expected) else "too small"
    if _magnitude(got) != _magnitude(expected):
        return f"{name} is {_fmt(got)}, which is {direction}; the expected value is {_magnitude(expected)}"
    # The same power of ten (9.883 and 5.2): saying it would not help; say by how much, in coarse bands
    factor = max(abs(got / expected), abs(expected / got))
    by = ("by less than 10%" if factor < 1.1 else "by less than a factor of 2" if factor < 2
          else "by a factor of 2 to 10")
    return f"{name} is {_fmt(got)}, which is {direction} {by}"


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> torch.Tensor:
    return torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


def _first_index(bad: torch.Tensor) -> list[int]:
    return bad.nonzero()[0].tolist()


def _transposed(got: torch.Tensor, want: torch.Tensor, same: Callable = torch.equal) -> bool:
    """Whether ``got`` is ``want`` with its last two (equal) dimensions swapped."""
    return got.dim() >= 2 and got.shape[-1] == got.shape[-2] and bool(same(got.transpose(-1, -2), want))


def _tensor_miss(got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, name: str) -> str:
    finite = torch.isfinite(want) & torch.isfinite(got)
    diff = (got - want).abs()[finite & bad]
    scale = want[torch.isfinite(want)].abs().max().item() if torch.isfinite(want).any() else 0.0
    message = f"{int(bad.sum())} of {bad.numel()} entries of {name} are off (the first at index {_first_index(bad)})"
    if diff.numel():
        message += (f"; the largest difference is {diff.max().item():.3g}, where the expected values are "
                    f"{_magnitude(scale)}")
    if _transposed(got, want, lambda g, w: _close(g, w).all()):
        message += ". It matches the expected result transposed (the last two dimensions swapped)"
    elif finite.all() and want.abs().max() > ATOL:
        ratio = (got * want).sum() / (want * want).sum()
        if ratio.abs() > 1e-6 and abs(ratio.item() - 1) > 1e-3 and _close(got, ratio * want).all():
            message += (f". It is the expected result times a constant factor of about {ratio.item():.3g} (a missing "
                        "or extra scale?)")
    return message


def expect_close(value: Any, expected: Any, name: str = "your answer", *, rtol: float = RTOL,
                 atol: float = ATOL) -> None:
    """``value`` equals ``expected`` within the tolerance, compared in float64 (shape first; also in containers)."""
    if _structure(value, expected, name, lambda v, e, n: expect_close(v, e, n, rtol=rtol, atol=atol)):
        return
    want = as_float64(expected, "the expected value")
    got = torch.tensor(_single(value, name), dtype=torch.float64) if want.dim() == 0 else as_float64(value, name)
    expect_shape(got, want.shape, name)
    if torch.isnan(got).any() and not torch.isnan(want).any():
        raise Wrong(f"{name} contains NaN ({int(torch.isnan(got).sum())} of {got.numel()} entries): look for 0/0, "
                    "inf - inf or a softmax over a row that is fully masked")
    bad = ~_close(got, want, rtol, atol)
    if bad.any():
        raise Wrong(_scalar_miss(got.item(), want.item(), name) if want.dim() == 0
                    else _tensor_miss(got, want, bad, name))


def expect_equal(value: Any, expected: Any, name: str = "your answer") -> None:
    """``value`` equals ``expected`` exactly: whole numbers (an integral float counts), integer and boolean
    tensors (masks: how many entries differ, and whether it is transposed or inverted), or containers of them."""
    if _structure(value, expected, name, expect_equal):
        return
    if isinstance(expected, int):
        got = expect_whole(value, name)
        if got != expected:
            raise Wrong(_scalar_miss(float(got), float(expected), name))
        return
    want, got = _as_tensor(expected, "the expected value"), _as_tensor(value, name)
    expect_shape(got, want.shape, name)
    if want.dtype == torch.bool and got.dtype != torch.bool:
        raise Wrong(f"{name} should be a boolean tensor (True/False), got dtype {str(got.dtype).replace('torch.', '')}")
    if got.is_floating_point():
        if not torch.equal(got, got.round()):
            raise Wrong(f"{name} should be whole numbers, got fractional values")
        got = got.long()
    bad = got != want
    if not bad.any():
        return
    message = f"{int(bad.sum())} of {bad.numel()} entries of {name} are wrong (the first at index {_first_index(bad)})"
    if want.dtype == torch.bool:
        message += (f": {int((got & ~want).sum())} are True where they should be False and "
                    f"{int((~got & want).sum())} are False where they should be True")
        if _transposed(got, want):
            message += " (it is the expected mask transposed)"
        elif torch.equal(~got, want):
            message += " (it is the expected mask inverted: check which value means 'allowed')"
    raise Wrong(message)


def answers_until_raised(cases: list, call) -> tuple[list, AnswerRaised | None]:
    """The answer's result on every case, in order, until one raises (judged after the cases before it, so that a
    wrong answer there is said first)."""
    got = []
    for case in cases:
        try:
            got.append(call(case))
        except AnswerRaised as error:
            return got, error
    return got, None


def first_match(got: Any, candidates: Mapping[str, Any], *, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """The first message (of message -> the value that mistake gives) whose value ``got`` is close to."""
    def close(value: Any) -> bool:
        try:
            g, v = as_float64(got), as_float64(value)
        except Wrong:
            return False
        return g.shape == v.shape and bool(_close(g, v, rtol, atol).all())

    return next((message for message, value in candidates.items() if close(value)), None)


def judge(got: Any, want: Any, label: str, mistakes: Callable[[], Mapping[str, Any]] | None = None, *,
          note: str = "") -> None:
    """Pass when ``got`` is close to ``want``; else name the first of ``mistakes()`` (message -> value, built
    only for a wrong answer) it matches, else say how it differs (``note`` appended), after ``label``."""
    if first_match(got, {"": want}) is not None:
        return
    mistake = first_match(got, mistakes()) if mistakes is not None else None
    if mistake:
        raise Wrong(f"{label}: {mistake}")
    try:
        expect_close(got, want, "the result")
    except Wrong as wrong:
        raise Wrong(f"{label}: {wrong}{note}") from None


def name_miss(got: Any, mistakes: Sequence[tuple[Any, str]]) -> str | None:
    """The message of the first (value, message) whose value equals ``got`` (numbers, by value)."""
    return next((message for value, message in mistakes if value == got), None)


# --------------------------------------------------------------------------- naming a mistake over every case
# A checker that calls the answer on every case first, then names the mistake that explains *every* result, blames
# no mistake for a coincidence on one case (issue 47: a smoothed onset that happened to fall where the "from zero"
# mistake falls was told to measure from the first value). Its hidden cases are drawn so that every mistake it names
# differs from the right answer, and from every other mistake, on some case (:func:`unseparated`).


def _readings(right: Sequence, mistakes: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """{message: what that mistake gives on every case}; on a case whose dict lacks it, it gives the right answer
    (it does not apply there: a rising curve read as rising is read right)."""
    return {m: [case.get(m, want) for case, want in zip(mistakes, right)]
            for m in dict.fromkeys(m for case in mistakes for m in case)}


def consistent_mistake(got: Sequence, right: Sequence, mistakes: Sequence[Mapping[str, Any]],
                       same: Callable[[Any, Any], bool]) -> str | None:
    """The first message of ``mistakes`` whose readings are what the answer gave on every case: ``got[i]`` is the
    answer's result on case ``i``, ``right[i]`` the right one and ``mistakes[i]`` {message: what that mistake gives
    on case ``i``} (absent: it gives the right answer there). In the order the messages first appear."""
    return next((m for m, values in _readings(right, mistakes).items()
                 if all(same(g, v) for g, v in zip(got, values))), None)


def unseparated(right: Sequence, mistakes: Sequence[Mapping[str, Any]], same: Callable[[Any, Any], bool]) -> list[str]:
    """The mistakes that the cases do not tell apart: those that give the right answer on every case, or what an
    earlier mistake gives on every case (whose message would then be shown for them). Empty when every mistake is
    separated; a checker redraws hidden cases until it is, and the tests check the fixed cases."""
    readings, found = list(_readings(right, mistakes).items()), []
    for i, (message, values) in enumerate(readings):
        if all(same(v, w) for v, w in zip(values, right)):
            found.append(f"{message} (gives the right answer on every case)")
            continue
        other = next((m for m, earlier in readings[:i] if all(same(v, e) for v, e in zip(values, earlier))), None)
        if other is not None:
            found.append(f"{message} (gives what {other!r} gives)")
    return found
