"""Argument checks shared by the modules, so every bad int gets the same clear message."""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: Any, minimum: int, *, maximum: int | None = None, why: str = "") -> int:
    """Return ``value`` if it is an int (not a bool) in ``[minimum, maximum]``; else raise, naming ``name``.

    ``why`` is appended to the range in the message (e.g. ``" (keys are distinct)"``).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(f"{name} must be {allowed}{why}, got {name}={value}")
    return value
