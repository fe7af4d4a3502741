"""aiocache's own acceptance tests (``TestCache``, every backend's contract, and ``TestMemoryCache``, the memory
backend's, which this backend replaces) run against ``shmcache.contrib.aiocache.SharedMemoryCache``, from aiocache's
published sdist (``tests/suites.py``). Each test coroutine runs under ``asyncio.run`` with a new cache of its own as
the fixture (``namespace="test"``, as aiocache's fixtures make them).

Excluded, with the reason:
- ``TestMemoryCache.test_accept_explicit_args``: it constructs aiocache's ``SimpleMemoryCache`` itself, not the
  backend under test (this backend refuses an unknown keyword the same way: tests/test_aiocache.py).
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

pytest.importorskip("aiocache", reason="aiocache is in the test extra")

from shmcache import SharedCache
from shmcache.contrib.aiocache import SharedMemoryCache
from shmcache.contrib.backends import close_handles

from .conftest import unique_name
from .suites import aiocache_tests

_suite = aiocache_tests()
EXCLUDED = {("TestMemoryCache", "test_accept_explicit_args")}
CASES = [(cls, name) for cls in ("TestCache", "TestMemoryCache")
         for name, fn in inspect.getmembers(getattr(_suite, cls), inspect.iscoroutinefunction)
         if name.startswith("test_") and (cls, name) not in EXCLUDED]
pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("cls,name", CASES, ids=[f"{c}.{n}" for c, n in CASES])
def test_aiocache_suite(cls, name):
    cache_name = unique_name("aioc")
    method = getattr(getattr(_suite, cls)(), name)
    fixture = "cache" if "cache" in inspect.signature(method).parameters else "memory_cache"

    async def run():
        cache = SharedMemoryCache(name=cache_name, namespace="test", capacity_bytes=1 << 20, max_entries=1024)
        try:
            await method(**{fixture: cache})
        finally:
            await cache.close()

    try:
        asyncio.run(asyncio.wait_for(run(), 50))
    finally:
        close_handles()
        try:
            SharedCache.unlink_name(cache_name)
        except FileNotFoundError:
            pass


def test_aiocache_suite_has_the_contract_tests():
    assert len([c for c in CASES if c[0] == "TestCache"]) >= 20
