"""Shared fixtures: unique cache names, caches that are always unlinked, a check that every test leaves /dev/shm as
it found it, and real Redis servers on loopback (standalone, and a 3-node cluster), stopped and removed always.

The Redis fixtures skip a test when redis-server (or, for the cluster, redis-cli) is not on PATH, unless
SHMCACHE_REQUIRE_REDIS=1, which makes them fail it instead."""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from shmcache import SharedCache
from tests import suites
from tests.tiering import tier_of
from tests.servers import REDIS_BINARY, REDIS_CLI_BINARY, RedisClusterServers, RedisServer

SHM_DIR = "/dev/shm"
PREFIXES = ("shmcache.", "shmcache-tier.")  # caches, and TieredCache stats segments


def pytest_configure(config: pytest.Config) -> None:
    suites.configure(config)  # its downloads, at collection, say so on the terminal


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Mark every test with its module's tier (tests/tiering.py); a module named in no tier fails the run."""
    unknown = set()
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        try:
            item.add_marker(getattr(pytest.mark, tier_of(module)))
        except KeyError:
            unknown.add(module)
    if unknown:
        raise pytest.UsageError(f"test modules in no tier of tests/tiering.py: {sorted(unknown)}")


def unique_name(tag: str = "t") -> str:
    return f"{tag}-{os.getpid()}-{uuid.uuid4().hex[:10]}"


def _segments() -> set[str]:
    """Segments named by this test process (unique_name embeds its pid), so parallel runs never see each other's."""
    mark = f"-{os.getpid()}-"
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(PREFIXES) and mark in n}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def leaves_no_segment():
    """Fail a test that leaves a segment behind (and remove it, so one leak does not fail the tests after it)."""
    before = _segments()
    yield
    leaked = _segments() - before
    for n in leaked:
        os.unlink(os.path.join(SHM_DIR, n))
    assert not leaked, f"test left shared-memory segments behind: {sorted(leaked)}"


@pytest.fixture
def name() -> str:
    """A cache name no other test uses; unlinked after the test if it still exists."""
    n = unique_name()
    yield n
    try:
        SharedCache.unlink_name(n)
    except FileNotFoundError:
        pass


def policy_of(request) -> str | None:
    """The policy that the test's ``@pytest.mark.policy(name)`` names for the caches its fixtures make (None: the
    package's default): for a test of one policy's order or locking."""
    marker = request.node.get_closest_marker("policy")
    return None if marker is None else marker.args[0]


@pytest.fixture
def clock():
    """A CLOCK_MONOTONIC stand-in the test moves by hand (``workers.FakeClock``), for the handles' ``clock``."""
    from tests.workers import FakeClock

    return FakeClock()


@pytest.fixture
def cache(name, request):
    """A small cache: 64 KiB of payload, 64 entries."""
    c = SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True, policy=policy_of(request))
    yield c
    c.close()


# Real Redis servers on loopback, for the tests of clients of Redis ----------------------------------------------------


def _need_redis(*binaries: str) -> None:
    """Skip the test when a Redis binary is not on PATH, or fail it where SHMCACHE_REQUIRE_REDIS=1 (as in CI)."""
    missing = [b for b in binaries if shutil.which(b) is None]
    if not missing:
        return
    verb = "is" if len(missing) == 1 else "are"
    reason = f"{' and '.join(missing)} {verb} not on PATH (Debian: apt-get install redis-server)"
    if os.environ.get("SHMCACHE_REQUIRE_REDIS") == "1":
        pytest.fail(f"SHMCACHE_REQUIRE_REDIS=1: Redis is required, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of a standalone Redis server on 127.0.0.1 that the whole session shares (``redis://127.0.0.1:P/0``);
    tests keep to keys of their own."""
    _need_redis(REDIS_BINARY)
    with RedisServer(tcp=True) as server:
        yield server.url


@pytest.fixture
def redis_server() -> RedisServer:
    """A standalone Redis server on 127.0.0.1 for this test alone, which it may ``stop()`` and ``start()`` again on the
    same port (``.port``, ``.url``); stopped and removed after the test however it left it."""
    _need_redis(REDIS_BINARY)
    with RedisServer(tcp=True) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster_url() -> str:
    """The URL of one node of a 3-node Redis Cluster on 127.0.0.1 (masters only, every slot served) that the whole
    session shares; a cluster client finds the other nodes from it. Database 0 only."""
    _need_redis(REDIS_BINARY, REDIS_CLI_BINARY)
    with RedisClusterServers() as cluster:
        yield cluster.url


@pytest.fixture
def namespace() -> str:
    """A TieredCache namespace no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def hosts(redis_url, namespace):
    """Two simulated hosts (``tests/tiers.py``) on one Redis, each subscribed for the other's invalidations."""
    from .tiers import two_hosts

    with two_hosts(redis_url, namespace) as made:
        yield made
