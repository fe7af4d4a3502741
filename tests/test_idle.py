"""Idle expiry (time to idle, layout version 14): an entry nobody reads for its ``tti`` expires; a read moves its
expiry, at most once per eighth of the tti, under every policy, on both paths and through the reads without the
lock; with a time to live too, it expires at the earlier of the two."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from shmcache import POLICIES, SharedCache
from shmcache.layout import dtypes as d

from .workers import entry_of, python_path, reap, switch_word_damage_is_repaired

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


def _blocks(c: SharedCache) -> int:
    """The bytes of /dev/shm the cache's file occupies (its backed pages: fallocate counts, as a write does)."""
    import os

    return os.fstat(c._seg.fd).st_blocks * 512


def _columns(c: SharedCache) -> int:
    """The bytes of the two idle columns for the entry slots the handle shows, less the pages either may share with
    a neighbour (at most one at each end of each)."""
    return 2 * (c._seg.slots_shown * 8 - 2 * 4096)


@pytest.mark.parametrize("switcher", PATHS)
@pytest.mark.parametrize("reader", PATHS)
def test_idle_columns_are_backed_once_an_entry_has_a_time_to_idle(name, clock, switcher, reader):
    """Version 16: a cache that has never stored a time to idle backs no idle columns (16 bytes an entry slot
    saved). The first store with one backs them and switches them on; another handle attached before it (its own
    mapping) takes them before its next call and moves the entry's expiry when it reads it. The switch counts no
    resize in stats()."""
    a = SharedCache(name, capacity_bytes=2**20, max_entries=4096, create=True, clock=clock)
    b = SharedCache(name, create=False, clock=clock)
    try:
        a, b = (python_path(a) if switcher == "python" else a), (python_path(b) if reader == "python" else b)
        assert b.get("none") is None  # (b has taken the tables: the switch must reach a handle that has)
        assert not a._seg.idle_shown and not b._seg.idle_shown
        a.put("plain", b"p", ttl=100)
        assert b.get("plain") == b"p" and a._seg.idle_words[d.D_IDLE_ON] == 0
        before = _blocks(a)
        a.put("idle", b"i", tti=8)
        assert a._seg.idle_shown and a._seg.idle_words[d.D_IDLE_ON] == 1
        assert _blocks(a) - before >= _columns(a) > 0  # (the switch backed them)
        stored = clock.now
        clock.advance(2)
        assert b.get("idle") == b"i" and b._seg.idle_shown
        e = entry_of(b, "idle")
        assert b._seg.expires_words[e] == stored + 10 * S  # (b's read moved it: a tti from then)
        assert b._seg.ttis_words[e] == 8 * S and a._seg.ttis_words[e] == 8 * S
        clock.advance(7)
        assert a.get("idle") == b"i" and a.get("plain") == b"p"
        assert a.stats().resizes == b.stats().resizes == 0
        b.put("more", b"m", tti=1)  # (no third switch: the first was the expires column's, version 18)
        assert a._seg.idle_words[d.D_SWITCH_BUMPS] == 2 and a.verify(deep=True).ok
    finally:
        b.close()
        a.close()
        SharedCache.unlink_name(name)


@pytest.mark.parametrize("version", [15, 16])
def test_idle_columns_at_creation(name, monkeypatch, version):
    """A default time to idle backs the columns at creation (every store will use them); without one, version 16
    backs none, and version 15 backs them with the tables, as it did, and never reads D_IDLE_ON."""
    from .workers import laid_out_as

    laid_out_as(monkeypatch, version)
    with SharedCache(name, capacity_bytes=2**20, max_entries=4096, create=True, default_tti=5) as c:
        try:
            assert c._seg.idle_shown and c._seg.idle_words[d.D_IDLE_ON] == (1 if version == 16 else 0)
            with_default, columns = _blocks(c), _columns(c)
        finally:
            c.unlink()
    with SharedCache(name, capacity_bytes=2**20, max_entries=4096, create=True) as c:
        try:
            assert c._seg.idle_shown == (version == 15)
            if version == 16:
                assert with_default - _blocks(c) >= columns > 0
            else:
                assert _blocks(c) == with_default
            c.put("k", b"v", tti=1)
            assert c._seg.idle_shown and c.verify().ok and c.stats().resizes == 0
        finally:
            c.unlink()


@pytest.mark.parametrize("path", PATHS)
def test_idle_columns_that_cannot_be_backed_refuse_the_store(name, monkeypatch, path):
    """A full /dev/shm when the first store with a time to idle must back the columns: that store raises
    NoSpaceError, nothing is switched, the cache serves on, and a store without a time to idle still succeeds."""
    from shmcache import NoSpaceError, space

    with SharedCache(name, capacity_bytes=2**20, max_entries=1000, create=True) as c:
        try:
            if path == "python":
                python_path(c)
            c["before"] = b"b"
            g, real = c._seg.geometry, space.back

            def full(fd, start, stop):
                if g.ttis_off <= start < g.arena_off:
                    return "No space left on device (ENOSPC)"
                return real(fd, start, stop)

            monkeypatch.setattr(space, "back", full)
            with pytest.raises(NoSpaceError, match="times to idle"):
                c.put("k", b"v", tti=1)
            assert not c._seg.idle_shown and c._seg.idle_words[d.D_IDLE_ON] == 0 and "k" not in c
            assert c.stats().recoveries == 0  # (a refusal, not damage: nothing repaired)
            c["after"] = b"a"
            assert (c["before"], c["after"]) == (b"b", b"a") and c.verify().ok
            monkeypatch.undo()
            c.put("k", b"v", tti=1)
            assert c["k"] == b"v" and c._seg.idle_shown
        finally:
            c.unlink()


@pytest.mark.parametrize("path", PATHS)
def test_idle_switch_cut_short_is_made_again(name, clock, path):
    """A switch killed after it set D_IDLE_ON but before it counted its resize leaves the other mappings without
    the columns: the next store in a mapping that does not show them, with a time to idle or not, switches again
    (one that wrote no idle words would leave the slot's last entry's), and every handle then reads the idle
    entries right. A D_IDLE_ON other than 0 and 1 is damage: verify reports it, and the repair sets
    it to 1 (the columns in use) and has every process take them."""
    a = SharedCache(name, capacity_bytes=2**20, max_entries=1000, create=True, clock=clock)
    b = SharedCache(name, create=False, clock=clock)
    try:
        if path == "python":
            python_path(b)
        assert a.get("x") is None and b.get("x") is None
        a._seg.idle_words[d.D_IDLE_ON] = 1  # (as a switch killed before its count left it)
        b.put("plain", b"p")  # (a store without a time to idle writes the idle words too once they are in use)
        assert b._seg.idle_shown and a._seg.idle_words[d.D_SWITCH_BUMPS] == 1
        b.put("k", b"v", tti=4)
        clock.advance(3)
        assert a.get("k") == b"v" and a._seg.idle_shown  # (a took the columns: the read moved the expiry)
        clock.advance(3)
        assert b.get("k") == b"v"
        switch_word_damage_is_repaired(name, d.D_IDLE_ON, "k", b"v", clock=clock)
    finally:
        b.close()
        a.close()
        SharedCache.unlink_name(name)


def _switch_worker(name: str, idx: int, path: str, go, out) -> None:
    """Attached before the switch: reads and writes values that carry their key and checksum, without a time to
    idle until ``go`` is set (another process has switched the columns on), then with one; reports its counts and
    whether its mapping shows the columns."""
    from .workers import check_value, make_value

    try:
        with SharedCache(name) as c:
            if path == "python":
                python_path(c)
            reads = wrong = after = 0
            out.put(("started", idx))
            i = 0
            while after < 1500:  # (until the switch, however long that takes, and 1,500 operations after it)
                i += 1
                if go.is_set():
                    after += 1
                key = f"k{(i * 7 + idx) % 64}"
                if i % 3 == 0:
                    if after:
                        c.put(key, make_value(key, i, 40 + i % 50), tti=30)
                    else:
                        c[key] = make_value(key, i, 40 + i % 50)
                else:
                    v = c.get(key)
                    if v is not None:
                        reads += 1
                        try:
                            check_value(key, v)
                        except AssertionError:
                            wrong += 1
            out.put((idx, reads, wrong, c._seg.idle_shown, c.verify().ok))
    except BaseException as exc:  # (reported, so that the test fails with it rather than a timeout)
        out.put((idx, repr(exc)))


@pytest.mark.parametrize("path", PATHS)
def test_idle_switch_while_processes_read_and_write(name, path):
    """Three processes attached before the idle columns are in use read and write values that carry their key and
    checksum; the test's process switches the columns on in the middle, and the children go on with times to idle.
    Every value read is its key's, every child ends showing the columns, and the segment verifies."""
    from .workers import make_value

    with SharedCache(name, capacity_bytes=2**20, max_entries=256, create=True) as c:
        try:
            go, out = ctx.Event(), ctx.Queue()
            procs = [ctx.Process(target=_switch_worker, args=(name, i, path, go, out)) for i in range(3)]
            for p in procs:
                p.start()
            try:
                assert sorted(out.get(timeout=60) for _ in procs) == [("started", i) for i in range(3)]
                for i in range(200):
                    c[f"p{i % 16}"] = make_value(f"p{i % 16}", i, 64)
                c.put("switch", make_value("switch", 0, 8), tti=30)
                go.set()
                results = sorted(out.get(timeout=120) for _ in procs)
            finally:
                reap(procs)
            assert all(len(r) == 5 for r in results), results
            assert all(wrong == 0 and shown and ok for _, _, wrong, shown, ok in results), results
            assert sum(r[1] for r in results) > 0 and c._seg.idle_shown and c.verify(deep=True).ok
            assert c.stats().resizes == 0 and c._seg.idle_words[d.D_SWITCH_BUMPS] >= 1
        finally:
            c.unlink()
