"""Argument validation shared by the modules (``validate_*``), so every bad value gets the same clear message."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


def validate_int(name: str, value: Any, minimum: int, *, maximum: int | None = None, why: str = "") -> int:
    """``value`` if it is an int (not a bool) in ``[minimum, maximum]``; else raise, naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(f"{name} must be {allowed}{why}, got {name}={value}")
    return value


def validate_float(name: str, value: Any, *, positive: bool = False, high: float | None = None) -> float:
    """``value`` if it is a finite number (int or float, not a bool) >= 0 (> 0 if ``positive``, <= ``high``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0) or (high is not None and value > high):
        bound = f"{'>' if positive else '>='} 0.0" + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"{name} must be {bound}, got {name}={value}")
    return value


def validate_distinct_ints(name: str, values: int | Iterable[int]) -> list[int]:
    """``values`` (one int, or several without repeats) as a non-empty list; else raise, naming ``name``."""
    values = [values] if isinstance(values, int) else list(values)
    if not values:
        raise ValueError(f"{name} must list at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must hold ints, got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} has repeats: {values} (each must be distinct)")
    return values


def validate_task(task: Any) -> None:
    """Raise unless ``task`` has what :class:`mhalab.tasks.Task` promises (what training draws on)."""
    missing = [a for a in ("sample", "loss", "metrics", "vocab_size", "seq_len") if not hasattr(task, a)]
    if missing:
        raise TypeError(f"task must follow mhalab.tasks.Task (sample, loss, metrics, vocab_size, seq_len); "
                        f"{type(task).__name__} lacks {missing}")


def validate_model_fits_task(model: Any, task: Any) -> None:
    """Catch a model built for another task before any training happens."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "d_vocab"):
        return
    problems = []
    if cfg.d_vocab != task.vocab_size:
        problems.append(f"d_vocab {cfg.d_vocab} != task's vocab_size {task.vocab_size}")
    if getattr(cfg, "n_ctx", task.seq_len) < task.seq_len:
        problems.append(f"n_ctx {cfg.n_ctx} < task's seq_len {task.seq_len}")
    if getattr(cfg, "n_targets", 1) != getattr(task, "n_targets", 1):
        problems.append(f"n_targets {cfg.n_targets} != task's {task.n_targets}")
    if problems:
        raise ValueError(f"the model does not fit task {getattr(task, 'name', type(task).__name__)!r}: "
                         + "; ".join(problems) + ". Build it with ModelConfig.for_task(task, d_model=..., n_heads=...)")


def validate_index(name: str, value: Any, limit: int, *, valid: str = "choose") -> int:
    """``value`` as an int if it is a whole number (Python or numpy) in ``0 .. limit - 1``; else raise
    ``IndexError("{name} {value} is out of range: {valid} 0..{limit - 1}")``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if not 0 <= int(value) < limit:
        raise IndexError(f"{name} {value} is out of range: {valid} 0..{limit - 1}")
    return int(value)


def valid_head_counts(d_model: int) -> list[int]:
    """Every n_heads that divides ``d_model`` (so that d_k = d_model / n_heads is whole)."""
    return [h for h in range(1, d_model + 1) if d_model % h == 0]


def validate_head_count(d_model: int, n_heads: int) -> int:
    """Validate ``(d_model, n_heads)`` and return d_k, or raise a ValueError/TypeError that says the fix."""
    validate_int("d_model", d_model, 1)
    valid = _short_list(valid_head_counts(d_model))
    if validate_int("n_heads", n_heads, -math.inf) < 1:  # type checked here; the message below lists valid counts
        raise ValueError(f"n_heads must be at least 1, got n_heads={n_heads}; "
                         f"valid head counts for d_model={d_model}: {valid}")
    if d_model % n_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}: each head works in d_k = "
                         f"d_model / n_heads dimensions, which must be a whole number. "
                         f"Valid head counts for d_model={d_model}: {valid}")
    return d_model // n_heads


def validate_head_shape(
    d_model: int, n_heads: int, *, n_key_value_heads: int | None = None, d_head: int | None = None
) -> tuple[int, int]:
    """``(n_key_value_heads, d_head)`` with defaults filled in: ``d_head = d_model / n_heads`` (then whole),
    ``n_key_value_heads = n_heads`` (it must divide n_heads: each K/V head serves a whole group of query heads)."""
    if d_head is None:
        d_head = validate_head_count(d_model, n_heads)  # d_model / n_heads, or an error listing valid n_heads
    else:  # any head size: d_model need not be n_heads * d_head (T5, Gemma)
        validate_int("d_model", d_model, 1)
        validate_int("n_heads", n_heads, 1)
        validate_int("d_head", d_head, 1)
    G = n_heads if n_key_value_heads is None else n_key_value_heads
    validate_int("n_key_value_heads", G, 1, maximum=n_heads, why=" (query heads share K/V heads, not the reverse)")
    if n_heads % G != 0:
        raise ValueError(
            f"n_heads={n_heads} is not a multiple of n_key_value_heads={G}: each K/V head must serve the same "
            f"number of query heads. Valid n_key_value_heads for n_heads={n_heads}: "
            f"{_short_list(valid_head_counts(n_heads))}"
        )
    return G, d_head


def _short_list(values: list[int], limit: int = 24) -> str:
    shown = values if len(values) <= limit else [*values[: limit - 2], "...", *values[-2:]]
    return ", ".join(map(str, shown))
