"""shmcache: one bounded cache in POSIX shared memory, shared by every process on a host.

Worker pools (pre-fork web servers, multiprocessing pools, DataLoader workers) open the same cache by name; entries,
limits, the eviction policy's order (``POLICIES``: exact LRU by default) and stats are global. No server runs: the
cache is a segment in /dev/shm and a lock inside it.
``shmcache.contrib`` holds thin adapters over this API for frameworks (``shmcache.contrib.django``: a Django cache
backend; ``shmcache.contrib.flask``: a Flask-Caching backend), imported only by those who use them; so is the Redis
tier (``TieredCache``, ``TierStats``: ``shmcache.tier``), on first use of either name.
"""

from typing import TYPE_CHECKING, Any

from .cache import SharedCache
from .errors import (
    AttachTimeout, CapacityWarning, ClosedError, CompiledSectionMissing, ComputeTimeout, CorruptionError,
    KindsFullError, LayoutError, LayoutVersionError, LockTimeout, NoSpaceError, OwnershipError, PinnedError,
    ReentrantCallError, RemoteError, SerializerMismatch, ShmCacheError, SnapshotError, SnapshotMismatch,
    SnapshotVersionError, SnapshotWarning, TooLargeError, TooLargeWarning,
)
from .kinds import KindStats, KindView
from .layout.dtypes import POLICY_NAMES as POLICIES
from .segment import sweep
from .snapshot import RestoreResult, SnapshotInfo
from .stats import CacheLimits, CacheStats, prometheus_text
from .verify import VerifyReport
from .view import View

if TYPE_CHECKING:
    from .tier import TierStats, TieredCache

__version__ = "0.1.0"

__all__ = [
    "AttachTimeout", "CacheLimits", "CacheStats", "CapacityWarning", "ClosedError", "CompiledSectionMissing",
    "ComputeTimeout", "CorruptionError", "KindStats", "KindView", "KindsFullError", "LayoutError", "LayoutVersionError",
    "LockTimeout", "NoSpaceError", "OwnershipError", "POLICIES", "PinnedError", "ReentrantCallError", "RemoteError",
    "RestoreResult", "SerializerMismatch", "SharedCache", "ShmCacheError", "SnapshotError", "SnapshotInfo",
    "SnapshotMismatch", "SnapshotVersionError", "SnapshotWarning", "TieredCache", "TierStats", "TooLargeError",
    "TooLargeWarning", "VerifyReport", "View", "__version__", "prometheus_text", "sweep",
]


_LAZY = ("TierStats", "TieredCache")  # the Redis tier: imported on first use (a fifth of the package's import time)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import tier

        value = getattr(tier, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
