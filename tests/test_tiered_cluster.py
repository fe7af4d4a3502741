"""TieredCache against a local 3-node Redis Cluster: the keys of a namespace spread over the nodes' slots, every
command keeps to one slot, and writes, invalidations, clear, atomic operations and fleet-wide single-flight all work
across the nodes."""

from __future__ import annotations

import threading
import uuid

import pytest

from shmcache.codec import encode_key

from .tiers import eventually, two_hosts
from .workers import check_value, make_value

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def cluster_hosts(redis_cluster_url):
    with two_hosts(redis_cluster_url, f"c{uuid.uuid4().hex[:12]}", cluster=True) as made:
        yield made


def test_tiered_cluster_spreads_and_shares(cluster_hosts):
    a, b = cluster_hosts
    keys = [f"k{i}" for i in range(60)]
    for k in keys:
        a.tier.put(k, make_value(k, 1, 40))
    client = a.tier._remote.client
    nodes = {client.get_node_from_key(a.tier._remote.key(encode_key(k))).name for k in keys}
    assert len(nodes) == 3, "the namespace's keys should lie on every node"
    for k in keys:
        check_value(k, b.tier.get(k))
    # Invalidations published on one node reach the subscriber on whichever node it listens.
    for k in keys[:10]:
        a.tier.put(k, make_value(k, 2, 40))
    eventually(lambda: all(b.local_copy(k) is None for k in keys[:10]), what="invalidations across nodes")
    assert all(b.tier.get(k)["seq"] == 2 for k in keys[:10])


def test_tiered_cluster_operations(cluster_hosts):
    a, b = cluster_hosts
    assert a.tier.add("x", 1) and not b.tier.add("x", 2)
    value, version = b.tier.get_with_version("x")
    assert b.tier.cas("x", 5, version) and not a.tier.cas("x", 6, version)
    assert a.tier.incr("n") == 1 and b.tier.incr("n", 2) == 3
    assert a.tier.pop("n") == 3
    eventually(lambda: "n" not in b.tier, what="b's copy invalidated")
    assert a.tier.touch("x", 30) and a.tier.delete("x") and not b.tier.delete("x")
    calls = []
    f = b.tier.memoize(lambda v: calls.append(v) or v * 2, name="double")
    g = a.tier.memoize(lambda v: calls.append(v) or v * 2, name="double")
    assert [f(i) for i in range(20)] == [g(i) for i in range(20)] and len(calls) == 20
    assert g.cache_clear() == 20  # scanned on every node


def test_tiered_cluster_single_flight_and_clear(cluster_hosts):
    a, b = cluster_hosts
    runs = []
    barrier = threading.Barrier(4)

    def ask(tier):
        barrier.wait(10)
        check_value("slow", tier.get_or_compute("slow", lambda: runs.append(1) or make_value("slow", 3, 8)))

    threads = [threading.Thread(target=ask, args=(h.tier,)) for h in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(runs) == 1
    for i in range(100):
        a.tier.put(i, i)
    assert a.tier.clear() == 101
    eventually(lambda: b.tier._kind.stats().entries == 0, what="b's copies cleared")
    assert all(b.tier.get(i) is None for i in range(100))
