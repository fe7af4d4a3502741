"""cachetools' own cache tests (``CacheTestMixin`` and ``test_lru.py``'s LRUCacheTest) run against SharedCache, from
cachetools' published sdist (``tests/suites.py``), through an adapter that is cachetools' ``Cache(maxsize)``
interface: ``maxsize`` is ``max_entries`` (``math.inf``: 4096), ``currsize`` is ``len()``, ``getsizeof`` is
cachetools' default (1 per entry). test_lru.py's tests name ``LRUCache`` directly: that name is bound to the adapter.

Excluded, with the reason:
- the ``getsizeof`` tests (``test_getsizeof_*``, ``test_missing_getsizeof``, ``test_lru_getsizeof``; and
  ``test_clear_getsizeof``, which the adapter skips when given a ``getsizeof``): an entry's size is its encoded
  bytes, bounded by ``max_retained_bytes``; there is no pluggable size function.
- ``test_maxsize_zero`` and ``test_pickle_maxsize`` (whose first case is ``maxsize=0``): a SharedCache holds at
  least one entry (``max_entries=0`` is refused at creation).
- ``test_maxsize_negative``: its ``maxsize=-math.inf`` is a float, which ``max_entries`` refuses with TypeError,
  not ValueError (``maxsize=-1``, its other half, raises ValueError: tests/test_mapping.py checks it).
"""

from __future__ import annotations

import math
import unittest

from shmcache import SharedCache

from .conftest import unique_name
from .suites import cachetools_tests

_package, _lru = cachetools_tests()
_made: list = []


class SharedLRU(SharedCache):
    """cachetools' ``LRUCache(maxsize, getsizeof=None)`` as a new SharedCache of policy lru."""

    def __init__(self, maxsize, getsizeof=None) -> None:
        if getsizeof is not None:
            raise unittest.SkipTest("getsizeof is not supported (excluded: see the module docstring)")
        super().__init__(unique_name("ctools"), capacity_bytes=1 << 20,
                         max_entries=4096 if maxsize == math.inf else maxsize, create=True, policy="lru")
        _made.append(self)

    @property
    def maxsize(self) -> int:
        return self.limits().max_entries

    @property
    def currsize(self) -> int:
        return len(self)

    @staticmethod
    def getsizeof(value) -> int:
        return 1


_lru.LRUCache = SharedLRU  # test_lru.py's own tests name the class directly


def _excluded(reason: str):
    @unittest.skip(reason)
    def test(self):
        raise AssertionError("excluded")

    return test


_NO_GETSIZEOF = "no pluggable getsizeof: an entry's size is its encoded bytes"


class TestSharedCacheAsCachetoolsLRU(_lru.LRUCacheTest):
    Cache = SharedLRU
    test_getsizeof_param = _excluded(_NO_GETSIZEOF)
    test_getsizeof_replace_grow = _excluded(_NO_GETSIZEOF)
    test_getsizeof_replace_same_size = _excluded(_NO_GETSIZEOF)
    test_getsizeof_replace_shrink = _excluded(_NO_GETSIZEOF)
    test_getsizeof_negative = _excluded(_NO_GETSIZEOF)
    test_missing_getsizeof = _excluded(_NO_GETSIZEOF)
    test_lru_getsizeof = _excluded(_NO_GETSIZEOF)
    test_getsizeof_subclass = _excluded(_NO_GETSIZEOF)
    test_maxsize_zero = _excluded("a SharedCache holds at least one entry: max_entries=0 is refused")
    test_pickle_maxsize = _excluded("its first case is maxsize=0: max_entries=0 is refused")
    test_maxsize_negative = _excluded("maxsize=-math.inf is a float: max_entries refuses it with TypeError")

    def tearDown(self) -> None:
        while _made:
            c = _made.pop()
            c.close()
            SharedCache.unlink_name(c.name)
