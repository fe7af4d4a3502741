"""Eviction policies: chosen at creation and recorded in the segment; what each keeps, and that every other
guarantee (both limits, set_limits, expiry first, kinds, pins, batches, verify and repair) holds under each."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sys

import numpy as np
import pytest

import shmcache
from shmcache import POLICIES, SharedCache, prometheus_text
from shmcache.codec import fingerprint
from shmcache.layout.dtypes import (
    A_HITS, A_LAST_PPM, A_PERIODS, A_REQUESTS, A_STEP, A_TARGET, H_SMALL, H_SMALL_FIRST, MARK_SMALL, SENTINEL,
)
from shmcache.policies import auto
from tests.conftest import unique_name
from tests.workers import python_path

S = 10**9


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def make(name):
    """A factory of small caches of one name at a time (closed and removed after the test)."""
    made: list[SharedCache] = []

    def _make(policy, max_entries=10, capacity_bytes=1 << 16, **kw):
        c = SharedCache(unique_name("pol"), capacity_bytes=capacity_bytes, max_entries=max_entries, create=True,
                        policy=policy, **kw)
        made.append(c)
        return c

    yield _make
    for c in made:
        c.close()
        c.unlink()


def test_policies_names_the_default_and_the_segments_own(name):
    assert POLICIES == ("lru", "s3fifo", "keep", "auto")
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True) as c:
        assert c.policy == "auto" and c.stats().policy == "auto"
    SharedCache.unlink_name(name)
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True, policy="s3fifo") as c:
        with SharedCache(name) as d:  # no policy named: the segment's
            assert d.policy == "s3fifo"
        with SharedCache(name, policy="s3fifo") as d:
            assert d.stats().policy == "s3fifo"
        with pytest.raises(ValueError, match=r"exists with policy='s3fifo', not 'lru'"):
            SharedCache(name, policy="lru")
        assert c.verify().ok
    SharedCache.unlink_name(name)


def test_policies_an_unknown_name_is_refused_before_anything_is_made(name):
    with pytest.raises(ValueError, match=r"policy must be one of 'lru', 's3fifo', 'keep', 'auto', got 'fifo'"):
        SharedCache(name, capacity_bytes=4096, max_entries=8, create=True, policy="fifo")
    with pytest.raises(FileNotFoundError):
        SharedCache(name, create=False)


def test_policies_lru_stays_exact(make):
    c = make("lru", max_entries=3)
    for k in "abc":
        assert c.put(k, k) is True
    c.get("a")
    c.put("d", "d")  # b is the least recently used
    assert list(c.keys()) == ["d", "a", "c"]
    assert c.stats().admitted == 4 and c.stats().not_admitted == 0 and c.stats().small_entries == 0


def test_policies_s3fifo_keeps_what_was_hit_through_a_scan(make):
    c = make("s3fifo", max_entries=20)
    for k in range(10):
        c.put(f"hot{k}", k)
    for _ in range(2):
        for k in range(10):
            assert c.get(f"hot{k}") == k
    for k in range(200):  # one-hit wonders, ten times the cache
        c.put(f"scan{k}", k)
    assert all(c.get(f"hot{k}") == k for k in range(10))  # LRU would keep none
    s = c.stats()
    assert s.promoted >= 10 and s.entries == 20 and s.evictions == 210 - 20
    assert 1 <= s.small_entries <= 20
    assert c.verify().ok


def test_policies_s3fifo_readmits_a_key_the_ghost_remembers_to_main(make):
    c = make("s3fifo", max_entries=10)
    for k in range(11):
        c.put(f"k{k}", k)  # k0 leaves small unhit: its fingerprint enters the ghost
    assert "k0" not in c and c.stats().ghost_hits == 0
    c.put("k0", 0)
    s = c.stats()
    assert s.ghost_hits == 1 and c.get("k0") == 0
    e = c._store.find_live(b"k0", fingerprint(b"k0"))
    assert not c._seg.marks_bytes[e] & MARK_SMALL  # in main
    assert c._seg.records.next[SENTINEL] == e  # main's newest: the sentinel's next
    c.put("k0", 1)  # replaced: stays where it is
    assert c._seg.records.next[SENTINEL] == e and c.stats().ghost_hits == 1
    assert c.verify().ok


def test_policies_auto_keeps_main_through_a_loop(make):
    """A cyclic scan of 150 keys through 100 entries: LRU and S3-FIFO evict every key before its next use and hit
    never; auto's sketch finds each key no more frequent than main's victim and keeps main, as keep would."""
    c = make("auto", max_entries=100, capacity_bytes=1 << 18)
    hits = 0
    for n in range(150 * 30):
        k = f"k{n % 150}"
        v = c.get(k)
        if v is None:
            c.put(k, (k, n))
        else:
            assert v[0] == k
            hits += n >= 150 * 10
    assert hits / (150 * 20) > 0.5  # keep's is 100 / 150
    s = c.stats()
    assert s.filter_refused > s.filter_admitted and s.entries == 100 and c.verify().ok


def test_policies_auto_keeps_what_was_hit_through_a_scan(make):
    c = make("auto", max_entries=20)
    for _ in range(3):
        for k in range(10):
            if c.get(f"hot{k}") is None:
                c.put(f"hot{k}", k)
    for k in range(200):  # one-hit wonders, ten times the cache
        c.put(f"scan{k}", k)
    assert all(c.get(f"hot{k}") == k for k in range(10))
    s = c.stats()
    assert s.entries == 20 and s.evictions == 210 - 20 and 1 <= s.window_target < 20
    assert s.filter_refused > 0 and c.verify().ok


def _replay(c, keys) -> bytearray:
    hits = bytearray(len(keys))
    for i, k in enumerate(keys):
        v = c.get(k)
        if v is None:
            c.put(k, k)
        else:
            assert v == k
            hits[i] = 1
    return hits


def _phases(seed: int) -> list[str]:
    """Zipf traffic over 400 keys, then a loop over 300, then Zipf over other keys, then a working set that drifts
    (48 keys, one new every 8 lookups: recency pays), then a burst of one-offs and Zipf again: workloads that pull
    the window's target one way, then the other."""
    rng = np.random.default_rng(seed)
    z = lambda n, a, off: [f"z{off + int(x) % n}" for x in rng.zipf(a, 6000)]  # noqa: E731
    loop = [f"l{n % 300}" for n in range(6000)]
    drift = [f"d{n // 8 + int(rng.integers(0, 48))}" for n in range(6000)]
    return (z(400, 1.3, 0) + loop + z(400, 1.1, 1000) + drift + [f"once{n}" for n in range(2000)]
            + z(400, 1.2, 0))


@pytest.mark.parametrize("seed", [1, 2])
def test_policies_auto_hits_where_its_model_does_and_climbs_as_it(make, seed):
    """The real cache (on this handle's path: the suite runs on both) against benchmarks.hitratio's model of auto:
    the same hit on every lookup, the same window target at the end, the same filter counts."""
    from benchmarks.hitratio import Auto, first_mismatch

    keys = _phases(seed)
    c = make("auto", max_entries=64, capacity_bytes=1 << 18)
    hits = _replay(c, keys)
    model, targets = Auto(64), set()
    expected = bytearray()
    for k in keys:
        expected.append(model.access(k))
        targets.add(model.window_target())
    assert first_mismatch(hits, expected) is None and len(targets) > 8  # the phases moved the target about
    s = c.stats()
    assert c._seg.ghost_words[A_PERIODS] == model.periods >= 20  # the climber closed its periods
    assert s.window_target == model.window_target() and c._seg.ghost_words[A_TARGET] == model.target
    assert (s.filter_admitted, s.filter_refused) == (model.preferred, model.refused) and model.refused
    assert s.promoted == model.promoted > 0  # what the climber's guards read, counted as the model counts it
    assert s.hits == sum(hits) and c.verify().ok


def test_policies_auto_any_state_word_is_harmless(make):
    """Every state word and sketch word of auto damaged, at random, between operations: values stay right, nothing
    raises, verify() finds nothing to repair (the words are hints), and the state is back in range."""
    c = make("auto", max_entries=32, capacity_bytes=1 << 16)
    rng = random.Random(5)
    words = c._seg.ghost_words
    extremes = [0, -1, 1, 2**63 - 1, -(2**63), 2**62, 10**6 + 1, -(10**6)]
    for n in range(4000):
        if n % 50 == 0:
            for w in (A_TARGET, A_STEP, A_LAST_PPM, A_REQUESTS, A_HITS, A_PERIODS, rng.randrange(len(words))):
                words[w] = rng.choice(extremes + [rng.randrange(-(2**63), 2**63)])
        k = f"k{rng.randrange(80)}"
        v = c.get(k)
        assert v is None or v == k
        if v is None:
            c.put(k, k)
    assert c.verify().ok and 1 <= c.stats().window_target <= 31


def test_policies_auto_clear_starts_afresh(make):
    c = make("auto", max_entries=16)
    for k in range(400):
        c.put(f"k{k % 40}", k)
        c.get(f"k{k % 7}")
    assert any(c._seg.ghost_words)
    c.clear()
    assert not any(c._seg.ghost_words) and c.stats().window_target == 1  # 1 % of 16: one, at least
    c.put("a", 1)
    assert c.stats().small_entries == 1 and c.get("a") == 1 and c.verify().ok


def test_policies_auto_sketch_counts_saturate_and_halve():
    words = [0] * 32
    fp = 0x1234_5678_9ABC_DEF0 & (2**63 - 1)
    for _ in range(20):
        auto.sketch_add(words, fp)
    assert auto.frequency(words, fp) == 15 and not any(words[:8])  # block 0 is the state's
    other = [w for w in range(32) if words[w]]
    assert 2 <= len(other) <= 4 and all(8 <= w < 32 for w in other)
    halved = [(w >> 1) & 0x7777777777777777 for w in words]
    assert auto.frequency(halved, fp) == 7


def test_policies_keep_admits_until_full_then_keeps(make):
    c = make("keep", max_entries=4)
    assert all(c.put(f"k{k}", k) for k in range(4))
    assert c.put("late", 1) is False  # full: not admitted, nothing evicted
    assert "late" not in c and all(c.get(f"k{k}") == k for k in range(4))
    assert c.put("k2", "new") is True and c.get("k2") == "new"  # a resident key is replaced in place
    s = c.stats()
    assert (s.admitted, s.not_admitted, s.evictions, s.entries) == (4, 1, 0, 4)
    assert list(c.keys()) == ["k3", "k2", "k1", "k0"]  # hits move nothing: the order is admission's
    assert c.delete("k1") and c.put("late", 1) is True  # a delete makes room
    assert c.popitem() == ("k0", 0)  # the oldest
    c.set_limits(max_entries=2)  # the oldest go
    assert sorted(c.keys()) == ["k3", "late"] and c.verify().ok


def test_policies_keep_lets_expired_entries_make_room(make):
    clock = FakeClock()
    c = make("keep", max_entries=2, clock=clock)
    c.put("a", 1, ttl=1)
    c.put("b", 2)
    assert c.put("c", 3) is False
    clock.now += 2 * S
    assert c.put("c", 3) is True and "a" not in c and c.stats().expired == 1


def test_policies_keep_refuses_by_bytes_too(make):
    c = make("keep", max_entries=100, capacity_bytes=4096)
    assert c.put("big", b"x" * 3000) is True
    assert c.put("big2", b"y" * 2000) is False and c.stats().not_admitted == 1
    assert c.put_many({"small": b"z", "big3": b"w" * 2000}) is None  # a batch goes on past one not admitted
    assert "small" in c and "big3" not in c and c.stats().not_admitted == 2
    assert c.add("big4", b"v" * 2000) is False


@pytest.mark.parametrize("policy", POLICIES)
def test_policies_every_policy_holds_both_limits(make, policy):
    c = make(policy, max_entries=16, capacity_bytes=8192)
    rng = random.Random(7)
    for _ in range(2000):
        k = f"k{rng.randrange(64)}"
        op = rng.random()
        if op < 0.5:
            v = c.get(k)
            assert v is None or v[0] == k
        elif op < 0.9:
            c.put(k, (k, b"x" * rng.randrange(0, 900)))
        else:
            c.delete(k)
        s = c.stats()
        assert s.entries <= 16 and s.retained_bytes <= s.max_retained_bytes
    assert c.verify().ok
    s = c.stats()
    assert s.admitted + s.not_admitted >= s.entries and (s.not_admitted == 0) == (policy != "keep")


@pytest.mark.parametrize("policy", POLICIES)
def test_policies_set_limits_evicts_at_once(make, policy):
    c = make(policy, max_entries=20)
    for k in range(20):
        c.put(f"k{k}", k)
    c.set_limits(max_entries=5)
    assert len(c) == 5 and c.stats().evictions == 15 and c.verify().ok
    c.set_limits(max_retained_bytes=12)
    assert c.stats().retained_bytes <= 12 and c.verify().ok


@pytest.mark.parametrize("policy", POLICIES)
def test_policies_expired_entries_go_first(make, policy):
    clock = FakeClock()
    c = make(policy, max_entries=4, clock=clock)
    c.put("short", 0, ttl=1)
    for k in range(3):
        c.put(f"k{k}", k)
        c.get(f"k{k}")
        c.get(f"k{k}")
    clock.now += 2 * S
    assert c.put("new", 1) is True
    assert sorted(c.keys()) == ["k0", "k1", "k2", "new"] and c.stats().expired == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_policies_kinds_share_the_one_policy(make, policy):
    c = make(policy, max_entries=6)
    a, b = c.kind("a"), c.kind("b")
    for k in range(5):
        a.put(k, k)
        b.put(k, -k)
    s = c.stats()
    assert s.entries == 6 and s.kinds["a"].entries + s.kinds["b"].entries == 6 and c.verify().ok


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_policies_a_pinned_entry_is_passed_over(make, policy):
    c = make(policy, max_entries=4)
    c.put("pinned", np.arange(4))
    with c.view("pinned") as v:
        for k in range(20):
            c.put(f"k{k}", k)
        assert "pinned" in c and list(v) == [0, 1, 2, 3]
        c.set_limits(max_entries=1)
        assert list(c.keys()) == ["pinned"]
        assert c.put("more", 1) is False and c.stats().not_admitted == 1  # the room is all pinned
    del v  # (the array holds its pin until it goes)
    assert c.put("more", 1) is True and c.verify().ok


@pytest.mark.parametrize("policy", POLICIES)
def test_policies_batches_match_single_calls(make, policy):
    c, d = make(policy, max_entries=8), make(policy, max_entries=8)
    rng = random.Random(3)
    for _ in range(300):
        ks = [f"k{rng.randrange(20)}" for _ in range(rng.randrange(1, 6))]
        if rng.random() < 0.5:
            assert c.get_many(ks) == [d.get(k) for k in ks]
        else:
            c.put_many({k: k for k in ks})
            for k in dict.fromkeys(ks):
                d.put(k, k)
    assert list(c.keys()) == list(d.keys())
    sc, sd = c.stats(), d.stats()
    assert (sc.hits, sc.misses, sc.admitted, sc.evictions) == (sd.hits, sd.misses, sd.admitted, sd.evictions)


def test_policies_verify_finds_and_repair_restores_damaged_queue_words(make):
    c = make("s3fifo", max_entries=10)
    for k in range(30):
        c.put(f"k{k}", k)
        c.get(f"k{k % 7}")
    before = dict(c.items())
    h = c._h
    h[H_SMALL] += 1
    assert any("small queue" in p for p in c.verify().problems)
    c.verify(repair_damage=True)
    assert c.verify().ok and dict(c.items()) == before
    marks = c._seg.marks_bytes
    e = h[H_SMALL_FIRST]
    marks[e] = 0x40 | MARK_SMALL  # a bit no policy sets
    assert any("marks" in p for p in c.verify().problems)
    c.verify(repair_damage=True)
    assert c.verify().ok and dict(c.items()) == before and marks[e] == MARK_SMALL


def test_policies_verify_finds_small_words_under_lru(make):
    c = make("lru", max_entries=10)
    c.put("a", 1)
    c._h[H_SMALL] = 1
    assert any("small queue words" in p for p in c.verify().problems)
    c.verify(repair_damage=True)
    assert c.verify().ok and c.get("a") == 1


def test_policies_stats_show_in_prometheus(make):
    c = make("keep", max_entries=1)
    c.put("a", 1)
    c.put("b", 2)
    text = prometheus_text({"x": c.stats()})
    assert 'shmcache_not_admitted_total{cache="x"} 1' in text
    assert 'shmcache_admitted_total{cache="x"} 1' in text
    assert 'shmcache_policy_info{cache="x",policy="keep"} 1' in text
    assert shmcache.CacheStats.__dataclass_fields__["policy"].default == "lru"


# ------------------------------------------------------------------------------------------------- crash windows

ctx = mp.get_context("fork")
_TRACED = ("shmcache/policies/s3fifo.py", "shmcache/policies/auto.py", "shmcache/policies/base.py",
           "shmcache/table.py", "shmcache/store.py")


def _put_and_die_at_line(name: str, n: int, key: str, value) -> None:
    """``put(key, value)`` on the Python path, SIGKILLed at the ``n``-th line it runs in the policy, table or store
    modules (exit 3 if it ends first)."""
    cache = python_path(SharedCache(name, create=False))
    seen = 0

    def trace(frame, event, arg):
        nonlocal seen
        if not frame.f_code.co_filename.endswith(_TRACED):
            return None
        if event == "line":
            seen += 1
            if seen == n:
                os.kill(os.getpid(), signal.SIGKILL)
        return trace

    sys.settrace(trace)
    cache.put(key, value)
    sys.settrace(None)
    os._exit(3)


def _queues_full(name: str, policy: str) -> SharedCache:
    """An s3fifo (or auto) cache of 8 entries, full, whose next eviction promotes from small (the window), rotates
    main and feeds the ghost (asks the sketch): every step of the policy's eviction is on the next put's path."""
    c = SharedCache(name, capacity_bytes=1 << 14, max_entries=8, create=True, policy=policy)
    for k in range(12):
        c.put(f"k{k}", (f"k{k}", k))
    for k in (8, 9, 10):  # in small: hit twice, promoted at the next eviction
        c.get(f"k{k}")
        c.get(f"k{k}")
    for k in (3, 4):  # in main: hit once, reinserted once
        c.get(f"k{k}")
    return c


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy", ["s3fifo", "auto"])
def test_policies_queues_put_killed_at_any_line_is_repaired(name, policy):
    """A put under s3fifo (auto) SIGKILLed at each line it runs of the policy, table and store code in turn: the
    next handle repairs, every value it returns is the one stored for its key, and verify() passes."""
    n = 1
    while True:
        c = _queues_full(name, policy)
        try:
            p = ctx.Process(target=_put_and_die_at_line, args=(name, n, "new", ("new", -1)), daemon=True)
            p.start()
            p.join(60)
            assert p.exitcode in (-9, 3), p.exitcode
            for k in [f"k{k}" for k in range(12)] + ["new"]:
                v = c.get(k)
                assert v is None or v == (k, -1 if k == "new" else int(k[1:])), (n, k, v)
            assert c.verify().ok, (n, c.verify().problems)
            s = c.stats()
            assert s.entries <= 8 and s.small_entries <= s.entries
        finally:
            c.close()
            c.unlink()
        if p.exitcode == 3:
            break
        n += 1
    assert n > 50  # the put ran through the eviction's steps: promotions, a rotation, the ghost


def test_policies_clear_empties_the_queues_and_the_ghost(make):
    c = make("s3fifo", max_entries=10)
    for k in range(40):
        c.put(f"k{k}", k)
    assert c.stats().small_entries and any(c._seg.ghost_words)
    c.clear()
    s = c.stats()
    assert (s.entries, s.small_entries, s.admitted, s.ghost_hits) == (0, 0, 0, 0) and not any(c._seg.ghost_words)
    c.put("k0", 0)  # forgotten: back into small, not main
    assert c.stats().ghost_hits == 0 and c.stats().small_entries == 1 and c.verify().ok
