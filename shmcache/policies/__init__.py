"""The eviction policies, one module each behind one interface (``base.Policy``), as cachebox keeps its policies
behind one trait: ``lru`` (exact LRU), ``s3fifo`` (S3-FIFO and its ghost), ``keep`` (admitted while it fits) and
``auto`` (the default: a window, a frequency sketch and main, the window's share climbed to the hit ratio). A segment's
policy is chosen once, at its creation (the header's ``policy`` word), and each handle takes its object once
(``of``); what a policy does is asked of that object, never of its number."""

from __future__ import annotations

from ..layout.dtypes import POLICY_NAMES
from .auto import Auto
from .base import Policy
from .keep import Keep
from .lru import Lru
from .s3fifo import S3fifo

__all__ = ["POLICIES", "Policy", "number", "of"]

POLICIES: tuple[Policy, ...] = tuple(sorted((Lru(), S3fifo(), Keep(), Auto()), key=lambda p: p.number))
if tuple(p.name for p in POLICIES) != POLICY_NAMES or [p.number for p in POLICIES] != list(range(len(POLICIES))):
    raise ImportError("policies: one object per POLICY_* number, named as layout/dtypes.py names them")


def of(number: int) -> Policy:
    """The policy of header word ``policy`` = ``number`` (checked at attach: layout/geometry.py)."""
    return POLICIES[number]


def number(name: str) -> int:
    """The POLICY_* number of policy ``name``; ValueError for a name that is none."""
    try:
        return POLICY_NAMES.index(name)
    except ValueError:
        raise ValueError(f"policy must be one of {', '.join(map(repr, POLICY_NAMES))}, got {name!r}") from None
