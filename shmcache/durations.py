"""Durations given by callers, checked once: a time to live in seconds as ns, and bounded waits."""

from __future__ import annotations

import math

from .layout import MAX_TTL_NS

MAX_TTL = MAX_TTL_NS / 1e9  # seconds (73 years): clock + ttl stays below 2**63 ns for any CLOCK_MONOTONIC reading


def ttl_ns(ttl: float, name: str = "ttl") -> int:
    """A time to live (or, ``name`` "tti", to idle) in seconds as ns (0: never expires); raises ValueError or
    TypeError for anything else."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(ttl).__name__}")
    if not 0 <= ttl <= MAX_TTL:
        raise ValueError(f"{name} must be a number of seconds from 0 (never expires) to {MAX_TTL:.0f}, got {ttl!r}")
    return max(1, round(ttl * 1e9)) if ttl else 0


def seconds(name: str, value, *, none: bool = False, zero: bool = False):
    """``value``, a duration in seconds given as parameter ``name``, checked: a finite number above 0 (from 0 with
    ``zero``), or None where ``none`` allows it (no bound). NaN and the infinities are refused: an infinite wait is
    asked for with None where one is allowed, never with a number that later arithmetic cannot take.

    :raises ValueError: naming the parameter, for anything else.
    """
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not (
            value >= 0 if zero else value > 0):
        allowed = ("from 0" if zero else "above 0") + (", or None for no bound" if none else "")
        raise ValueError(f"{name} must be a finite number of seconds {allowed}; got {value!r}")
    return value
