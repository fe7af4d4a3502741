"""Crafted or damaged data from Redis -- values with a valid checksum but a version or flags out of range, garbled
invalidation messages -- is refused, counted and never adopted: the host's cache keeps working."""

from __future__ import annotations

import math

import pytest

from shmcache.codec import encode_key, encode_parts
from shmcache.layout import MAX_REMOTE_VERSION, MAX_VERSION
from shmcache.layout.dtypes import H_VERSION_CLOCK
from shmcache.tier.layout import MESSAGE_HEADER, OP_KEY, REMOTE_HEADER, REMOTE_MAGIC
from shmcache.tier.remote import pack_payload

from .tiers import eventually, mark
from .workers import check_value, make_value

BAD_VERSIONS = [2.0**63 - 1, 2.0**63 - 2**11, 2.0**62, float(MAX_REMOTE_VERSION) * 2, math.nan, math.inf, -math.inf,
                -5.0, 0.0, 1.5]


def _crafted(key, value, version: float, flags: int = 0) -> bytes:
    """A value for ``key`` with a valid checksum, as the write script would lay it out, but with ``version`` and
    ``flags`` as given."""
    kb = encode_key(key)
    payload = pack_payload(kb, *encode_parts(value))[REMOTE_HEADER.size:]
    return REMOTE_HEADER.pack(REMOTE_MAGIC, version, flags) + payload


def _local_puts_all_work(host, n: int = 200) -> None:
    for i in range(n):
        host.local.put(f"p{i}", make_value(f"p{i}", i, 50 + i))
    for i in range(n):
        check_value(f"p{i}", host.local.get(f"p{i}"))
    assert host.local.verify().ok
    assert 0 <= host.local._h[H_VERSION_CLOCK] <= MAX_VERSION


@pytest.mark.parametrize("version", BAD_VERSIONS, ids=repr)
def test_tiered_value_with_version_out_of_range_is_refused_and_counted(hosts, version):
    a, b = hosts
    client = a.tier._remote.client
    client.set(a.tier._remote.key(encode_key("crafted")), _crafted("crafted", "evil", version))
    before = a.tier.stats().remote_errors
    assert a.tier.get("crafted") is None and a.local_copy("crafted") is None
    assert a.tier.get_with_version("crafted") == (None, None)
    assert a.tier.stats().remote_errors == before + 2
    _local_puts_all_work(a)
    a.local.clear()
    _local_puts_all_work(a)
    # The key heals with its next write: the script takes a version out of range for none.
    a.tier.put("crafted", "good")
    value, v = b.tier.get_with_version("crafted")
    assert value == "good" and 1 <= v <= MAX_REMOTE_VERSION
    assert b.tier.get("crafted") == "good" and b.local_copy("crafted") == "good"


def test_tiered_value_with_unknown_flags_is_refused(hosts):
    a, _ = hosts
    client = a.tier._remote.client
    client.set(a.tier._remote.key(encode_key("flags")), _crafted("flags", "evil", 1e15, flags=0x80))
    before = a.tier.stats().remote_errors
    assert a.tier.get("flags") is None and a.tier.stats().remote_errors == before + 1
    a.tier.put("flags", "good")  # KEEPTTL-free write: the flags are the script's own again
    assert a.tier.get("flags") == "good"


def test_tiered_crafted_versions_never_raise_the_clock_of_a_host_that_puts_a_lot(hosts):
    """The reported failure: one crafted value near 2**63, read once, and local puts failed from then on."""
    a, _ = hosts
    client = a.tier._remote.client
    for i, version in enumerate(BAD_VERSIONS):
        client.set(a.tier._remote.key(encode_key(f"c{i}")), _crafted(f"c{i}", i, version))
        assert a.tier.get(f"c{i}") is None
    failures = 0
    for i in range(600):
        try:
            a.local.put(f"q{i}", i)
            a.tier.put(f"t{i % 50}", i)
        except Exception:
            failures += 1
    assert failures == 0 and a.local.verify().ok


@pytest.mark.parametrize("version", [2.0**62, 2.0**63 - 1, math.nan, math.inf, -1.0, 0.5], ids=repr)
def test_tiered_invalidation_with_version_out_of_range_is_not_adopted(hosts, version):
    a, b = hosts
    a.tier.put("k", "v1")
    assert b.tier.get("k") == "v1" and b.local_copy("k") == "v1"
    before = b.tier.stats().remote_errors
    client = a.tier._remote.client
    client.publish(a.tier._remote.channel, MESSAGE_HEADER.pack(OP_KEY, version) + encode_key("k"))
    eventually(lambda: b.tier.stats().remote_errors > before, what="the crafted message refused")
    # Refused, and the copy it named dropped (counted first, dropped just after): never kept past a message.
    eventually(lambda: b.local_copy("k") is None, what="the copy named dropped")
    assert mark(b, "k") <= MAX_REMOTE_VERSION  # not adopted as the key's mark
    a.tier.put("k", "v2")
    eventually(lambda: b.tier.get("k") == "v2" and b.local_copy("k") == "v2", what="b keeps a copy of v2 again")
    _local_puts_all_work(b, 50)


@pytest.mark.parametrize("data", [b"", b"k", b"z" + bytes(8) + b"key", b"k\x00\x00"], ids=repr)
def test_tiered_garbled_invalidation_is_refused_and_drops_the_namespace_copies(hosts, data):
    a, b = hosts
    a.tier.put("k", "v1")
    assert b.tier.get("k") == "v1" and b.local_copy("k") == "v1"
    before = b.tier.stats().remote_errors
    a.tier._remote.client.publish(a.tier._remote.channel, data)
    eventually(lambda: b.tier.stats().remote_errors > before, what="the garbled message refused")
    eventually(lambda: b.local_copy("k") is None, what="b's copies dropped")
    a.tier.put("k", "v2")
    eventually(lambda: b.tier.get("k") == "v2" and b.local_copy("k") == "v2", what="b keeps a copy of v2 again")


def test_tiered_stats_row_counts_out_of_range_start_over(redis_url, namespace):
    """A stats row left with counts near 2**63 (damaged, or written by hand) must not make the next increment, on
    the hot path of the process that claims it, overflow and fail its call."""
    from .tiers import Host

    h = Host(redis_url, namespace)
    try:
        rows = h.tier._rows
        for r in range(4):  # the next claimers' rows
            rows.words[r][:] = 2**63 - 1
        h.tier.close()
        from shmcache import TieredCache

        t = TieredCache(h.local, redis_url, namespace=namespace)
        try:
            t.put("k", 1)
            assert t.get("k") == 1 and t.get("absent") is None
            assert 0 <= t._row[0] < 2**62
        finally:
            t.close()
    finally:
        h.close()
