"""The optional Redis tier: ``TieredCache``, a host's ``SharedCache`` in front of a namespace in Redis.

``tiered`` is the facade (``TieredCache``) and ``mapping`` its mapping API over Redis; ``copies`` keeps the host's
versioned copies in the local segment, ``remote`` speaks to Redis, ``listener`` applies the invalidations Redis
publishes, ``lease`` is ``get_or_compute``'s fleet-wide lock, ``stats`` the per-host stats segment, and ``layout``
the bytes of all of it (Redis values, invalidation messages, the stats segment).

The names below are imported on first use (PEP 562), so that ``segment.py`` can import ``tier.stats`` (to find and
remove the stats segments) without the facade and redis-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .stats import TierStats
    from .tiered import TieredCache, host_stats

__all__ = ["TierStats", "TieredCache", "host_stats"]


_HOMES = {"TierStats": "stats", "TieredCache": "tiered", "host_stats": "tiered"}  # name -> its module here


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
