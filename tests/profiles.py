"""How many examples the property tests draw, and how many seeded runs the long differential tests make:
``SHMCACHE_EXAMPLES`` = ``smoke`` (CI's sanitizer stage, where each example costs several times more: a tenth),
``quick`` (CI's other pull-request stages: a quarter), unset (as written), or ``long`` (the nightly script: ten
times). Each test states its own count, scaled here, so that the proportions between tests stay
as chosen."""

from __future__ import annotations

import os

_SCALE = {"smoke": 0.1, "quick": 0.25, "": 1.0, "long": 10.0}


def _scale() -> float:
    return _SCALE.get(os.environ.get("SHMCACHE_EXAMPLES", ""), 1.0)


def examples(n: int) -> int:
    """``n`` examples, scaled by ``SHMCACHE_EXAMPLES``; at least 10."""
    return max(10, int(n * _scale()))


def seeds(n: int) -> range:
    """The seeds of a test parametrized over ``n`` seeded runs, scaled the same way; at least 4."""
    return range(max(4, int(n * _scale())))
