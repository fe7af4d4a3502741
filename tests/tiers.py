"""Helpers of the TieredCache tests: simulated hosts (a local cache each, sharing one Redis), bounded waits for
what happens asynchronously (invalidations), and a look at a key's mark."""

from __future__ import annotations

import time
from contextlib import contextmanager

from shmcache import SharedCache, TieredCache
from shmcache.codec import KindKey, encode_key, fingerprint
from shmcache.layout import EMPTY
from shmcache.tier import copies

from .conftest import unique_name


def eventually(predicate, timeout: float = 10.0, what: str = "condition"):
    """Poll ``predicate`` until it is true; fail after ``timeout`` s (a bound on a wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.005)


class Host:
    """One simulated host: a local cache of its own and a TieredCache over it."""

    def __init__(self, url: str, namespace: str, **kwargs) -> None:
        self.name = unique_name("host")
        self.local = SharedCache(self.name, capacity_bytes=1 << 20, max_entries=kwargs.pop("max_entries", 512),
                                 create=True, clock=kwargs.pop("clock", None), policy=kwargs.pop("policy", None))
        self.tier = TieredCache(self.local, url, namespace=namespace, **kwargs)

    def local_copy(self, key, default=None):
        """What this host's local cache holds for ``key`` (without asking Redis)."""
        return self.local.get(KindKey(self.tier._n, key), default)

    def listening(self) -> bool:
        """Whether this host's listener has subscribed (its first subscription drops the copies made before)."""
        return self.tier.stats().listener_starts >= 1

    def close(self) -> None:
        self.tier.close()
        self.tier.unlink()
        self.local.close()
        SharedCache.unlink_name(self.name)


@contextmanager
def two_hosts(url: str, namespace: str, **kwargs):
    """Two hosts on one Redis, each subscribed for the other's invalidations; the namespace is cleared and both
    are removed after. Redis's timeout is 2 s unless given: at the default 0.1 s a loaded machine's Redis can seem
    down, and a host then computes on its own where a test means it to wait (the tests of a slow Redis set theirs)."""
    kwargs.setdefault("timeout", 2.0)
    made = [Host(url, namespace, **kwargs), Host(url, namespace, **kwargs)]
    try:
        for h in made:
            eventually(h.listening, what="listener subscribed")
        yield made
    finally:
        try:
            made[0].tier.clear()
        finally:
            for h in made:
                h.close()


def mark(host: Host, key) -> int:
    """The mark of ``key`` on ``host``: the highest invalidation applied since a fill of it began (-1: no mark)."""
    mkb = host.tier._mprefix + encode_key(key)

    def read(store):
        m = store.find_live(mkb, fingerprint(mkb))
        return -1 if m == EMPTY else copies._mark(store, m)

    return host.local._guard.run(read, host.local._store)
