"""Idle expiry (time to idle, layout version 14): an entry nobody reads for its ``tti`` expires; a read moves its
expiry, at most once per eighth of the tti, under every policy, on both paths and through the reads without the
lock; with a time to live too, it expires at the earlier of the two."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from shmcache import POLICIES, SharedCache
from shmcache.layout import dtypes as d

from .workers import entry_of, python_path, reap

S = 10**9  # ns per second
ctx = mp.get_context("fork")
PATHS = ("compiled", "python")


def _open(name, clock, policy, path, **kw) -> SharedCache:
    c = SharedCache(name, capacity_bytes=256 * 1024, max_entries=64, create=True, clock=clock, policy=policy, **kw)
    return python_path(c) if path == "python" else c


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("policy", POLICIES)
def test_idle_an_entry_read_every_tenth_lives_and_one_left_alone_goes(name, clock, policy, path):
    """The issue's case: tti=0.4; one key read every 0.1 s for 3 s lives, its neighbour stored beside it and never
    read is gone by 0.4 s; then left alone for 0.8 s, the read one is gone too, and both are counted expired."""
    with _open(name, clock, policy, path) as c:
        try:
            c.put("read", b"r", tti=0.4)
            c.put("left", b"l", tti=0.4)
            for step in range(30):
                clock.advance(0.1)
                assert c.get("read") == b"r", step
                if step >= 3:
                    assert "left" not in c
            clock.advance(0.8)
            assert c.get("read") is None and "read" not in c
            assert c.stats().expired == 2 and c.verify(deep=True).ok
        finally:
            c.unlink()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("policy", POLICIES)
def test_idle_a_hit_moves_the_expiry_once_an_eighth_is_gained(name, clock, policy, path):
    """A hit writes the expiry word only once it would move it by an eighth of the tti: a thousand reads at one
    instant leave it as the store wrote it; a read an eighth later moves it to a tti from then, never past the
    deadline a time to live set."""
    with _open(name, clock, policy, path) as c:
        try:
            c.put("k", b"v", tti=8)
            c.put("both", b"v", ttl=10, tti=8)
            exp = c._seg.expires_words
            e, f = entry_of(c, "k"), entry_of(c, "both")
            stored = clock.now
            assert exp[e] == exp[f] == stored + 8 * S
            clock.advance(0.999)
            for _ in range(1000):
                assert c.get("k") == b"v"
            assert exp[e] == stored + 8 * S
            clock.advance(0.001)
            assert c.get("k") == b"v" and c.get("both") == b"v"
            assert exp[e] == exp[f] == stored + 9 * S
            clock.advance(5)  # both moved to a tti from now: "both" only as far as its deadline
            assert c.get("k") == b"v" and c.get("both") == b"v"
            assert (exp[e], exp[f]) == (stored + 14 * S, stored + 10 * S)
            clock.advance(4.5)
            assert c.get("both") is None and c.get("k") == b"v"
            assert c.verify(deep=True).ok
        finally:
            c.unlink()


@pytest.mark.parametrize("path", PATHS)
def test_idle_batches_and_views_are_reads_and_in_is_not(name, clock, path):
    """get_many and a view move an idle entry's expiry as a get does; ``in``, like a put of another key, does
    not."""
    with _open(name, clock, "auto", path) as c:
        try:
            for k in ("batch", "view", "in"):
                c.put(k, b"x" * 64, tti=1)
            for step in range(5):
                clock.advance(0.5)
                assert c.get_many(["batch"]) == [b"x" * 64]
                with c.view("view") as v:
                    assert bytes(v) == b"x" * 64
                assert ("in" in c) is (step == 0)
            assert "in" not in c and c.get("batch") == b"x" * 64 and c.get("view") == b"x" * 64
        finally:
            c.unlink()


@pytest.mark.parametrize("path", PATHS)
def test_idle_default_applies_where_a_put_gives_none(name, clock, path):
    """``default_tti`` (creation only) is the time to idle of a store that gives none, batches, setdefault and
    get_or_compute included; ``tti=0`` stores without one. Another handle asking for another default is refused."""
    with _open(name, clock, "s3fifo", path, default_tti=1) as c:
        try:
            c.put("default", 1)
            c.put("never", 2, tti=0)
            c.put_many({"many": 3})
            c.setdefault("set", 4)
            assert c.get_or_compute("computed", lambda: 5) == 5
            clock.advance(1)
            assert [k for k in ("default", "never", "many", "set", "computed") if k in c] == ["never"]
            with pytest.raises(ValueError, match="default_tti"):
                SharedCache(name, default_tti=2)
            with SharedCache(name, default_tti=1) as again:
                assert again.get("never") == 2
        finally:
            c.unlink()


@pytest.mark.parametrize("path", PATHS)
def test_idle_touch_is_a_read_with_a_new_deadline_and_incr_keeps_both(name, clock, path):
    """touch(ttl) gives an idle entry a new deadline and counts as a read; incr, a store, restarts its idle time
    and keeps its time to idle and deadline, as it keeps a time to live."""
    with _open(name, clock, "lru", path) as c:
        try:
            c.put("t", b"v", ttl=1, tti=2)
            clock.advance(0.9)
            assert c.touch("t", ttl=5)
            clock.advance(1.9)
            assert c.get("t") == b"v"
            clock.advance(3.1)  # past the new deadline, though read 3.1 s ago
            assert c.get("t") is None
            c.put("n", 1, ttl=3, tti=1)
            for i in range(4):
                clock.advance(0.6)
                assert c.incr("n") == 2 + i
            clock.advance(0.6)  # 3 s after the put: its deadline, though stored to 0.6 s ago
            assert "n" not in c
            c.put("m", 1, tti=1)
            c.incr("m")
            clock.advance(1)
            assert "m" not in c and c.verify().ok
        finally:
            c.unlink()


def test_idle_tti_is_checked_before_the_lock(name):
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as c:
        try:
            for bad in (-1, float("nan"), 10**12):
                with pytest.raises(ValueError, match="tti"):
                    c.put("k", 1, tti=bad)
            with pytest.raises(TypeError, match="tti"):
                c.put("k", 1, tti="1")
            with pytest.raises(ValueError, match="default_tti"):
                SharedCache(name + "-x", default_tti=-1)
            assert "k" not in c
        finally:
            c.unlink()


@pytest.mark.parametrize("path", PATHS)
def test_idle_damaged_words_are_found_and_mended(name, clock, path):
    """A time to idle out of range, an expiry past its deadline, and a default whose checksum fails are reported
    by verify and mended by the repair to what can do no harm: no time to idle, the earlier of the deadline and
    the time to idle from now, no default."""
    from shmcache import config

    with _open(name, clock, "auto", path, default_tti=3) as c:
        try:
            c.put("a", b"v", tti=2)
            c.put("b", b"v", ttl=5, tti=2)
            a, b = entry_of(c, "a"), entry_of(c, "b")
            seg = c._seg
            seg.ttis_words[a] = -5
            seg.expires_words[b] = seg.deadlines_words[b] + S
            seg.idle_words[d.D_DEFAULT_TTI] = 7
            report = c.verify()
            assert not report.ok and len(report.problems) >= 3, report.problems
            assert not c.verify(repair_damage=True).ok and c.verify().ok
            # (b's expiry back to the earlier of its deadline and its tti from now: no read sets it further)
            assert seg.ttis_words[a] == 0 and seg.expires_words[b] == clock() + 2 * S
            assert config.default_tti(seg.idle_words) == 0 and seg.idle_words[d.D_DEFAULT_TTI] == 0
            assert c.get("a") == b"v" and c.get("b") == b"v"  # (a keeps the expiry it had, and no tti moves it)
            clock.advance(1.5)
            assert c.get("a") == b"v" and c.get("b") == b"v"
            clock.advance(0.5)
            assert c.get("a") is None and c.get("b") == b"v"
        finally:
            c.unlink()


@pytest.mark.parametrize("path", PATHS)
def test_idle_an_expiry_pushed_past_the_time_to_idle_is_brought_back(name, clock, path):
    """A stray write that moves an idle entry's expiry into the future (no read sets it further than its tti from
    now) would keep it for good, since only a read moves it: verify reports it, and the repair brings it back to
    the tti from now, or the deadline where that comes first. An entry without a tti may expire whenever."""
    with _open(name, clock, "lru", path) as c:
        try:
            c.put("a", b"v", tti=2)
            c.put("b", b"v", ttl=3, tti=2)
            c.put("c", b"v", ttl=100)
            a, b, x = entry_of(c, "a"), entry_of(c, "b"), entry_of(c, "c")
            seg = c._seg
            now = clock()
            seg.expires_words[a] = now + 50 * S
            seg.deadlines_words[b] = now + S  # (its deadline made earlier: then the expiry passes it too)
            assert c.verify().ok is False
            assert not c.verify(repair_damage=True).ok and c.verify().ok
            assert seg.expires_words[a] == now + 2 * S and seg.expires_words[b] == now + S
            assert seg.expires_words[x] == now + 100 * S
            clock.advance(1.5)
            assert c.get("a") == b"v" and c.get("b") is None
            clock.advance(2.5)
            assert c.get("a") is None and c.get("c") == b"v"
        finally:
            c.unlink()


def _reader(name: str, now, steps: int, pipe) -> None:
    """Read ``k`` at each instant the parent sets, and say what was read."""
    with SharedCache(name, clock=lambda: now.value) as c:
        for _ in range(steps):
            pipe.recv()
            pipe.send(c.get("k"))


def test_idle_a_read_in_one_process_keeps_the_entry_for_all(name):
    """One process reads an idle entry and another sees it live long past its tti; once the reads stop, every
    process sees it gone. The clock is one both processes read, moved by the test."""
    now = ctx.Value("q", 1_000 * S, lock=False)
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True, clock=lambda: now.value) as c:
        try:
            c.put("k", {"k": "k", "n": 7}, tti=1)
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=_reader, args=(name, now, 20, theirs))
            p.start()
            try:
                for _ in range(20):
                    now.value += S // 2
                    ours.send(None)
                    assert ours.poll(30) and ours.recv() == {"k": "k", "n": 7}
                assert c.get("k") == {"k": "k", "n": 7}
                now.value += S
                assert c.get("k") is None
            finally:
                reap([p])
            assert p.exitcode == 0
        finally:
            c.unlink()
