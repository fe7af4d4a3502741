"""The optional Redis tier: ``TieredCache``, a host's ``SharedCache`` in front of a namespace in Redis.

``tiered`` is the facade (``TieredCache``) and ``mapping`` its mapping API over Redis; ``copies`` keeps the host's
versioned copies in the local segment, ``remote`` speaks to Redis, ``listener`` applies the invalidations Redis
publishes, ``lease`` is ``get_or_compute``'s fleet-wide lock, ``stats`` the per-host stats segment, and ``layout``
the bytes of all of it (Redis values, invalidation messages, the stats segment).
"""

from .stats import TierStats
from .tiered import TieredCache, host_stats

__all__ = ["TierStats", "TieredCache", "host_stats"]
