"""verify() and repair: damaged or hostile segment bytes lead to a report, a repair or a clear error -- never a
hang, a crash or a wrong value."""

from __future__ import annotations

import mmap
import os
import random

import numpy as np
import pytest

from shmcache import CorruptionError, SharedCache, ShmCacheError
from shmcache.codec import fingerprint
from shmcache import index
from shmcache.layout import dtypes as d
from tests.workers import check_value, entry_of, make_value, versioned

SMALL = dict(capacity_bytes=16_000, max_entries=32)


def _filled(name: str, n: int = 20) -> SharedCache:
    c = SharedCache(name, create=True, **SMALL)
    for i in range(n):
        c.put(f"k{i}", make_value(f"k{i}", i, 100 + 17 * i))
    return c


class Raw:
    """A second, independent mapping of the segment, to damage it as another program could."""

    def __init__(self, name: str, cache: SharedCache) -> None:
        fd = os.open(f"/dev/shm/shmcache.{name}", os.O_RDWR)
        self.mm = mmap.mmap(fd, cache._seg.geometry.total_nbytes)
        os.close(fd)
        self.g = cache._seg.geometry
        self.osh = cache._seg.records.osh

    def word(self, off: int, value: int) -> None:
        self.mm[off : off + 8] = int(value).to_bytes(8, "little", signed=True)

    def plant(self, off: int, nbytes: int, value: int) -> None:
        """Write the low ``nbytes`` bytes of ``value`` (two's complement) at ``off``: any bit pattern."""
        self.mm[off : off + nbytes] = (int(value) & ((1 << 8 * nbytes) - 1)).to_bytes(nbytes, "little")

    def field(self, e: int, name: str, value: int) -> None:
        """Plant ``value`` in entry ``e``'s record field ``name`` (a field of the segment's record dtype, wide or
        narrow; ``off`` given in bytes, written as the format keeps it), as raw bytes of the field's width."""
        dt, at = self.g.entry_dtype.fields[name][:2]
        self.plant(self.g.entries_off + e * self.g.entry_nbytes + at, dt.itemsize,
                   value >> self.osh if name == "off" else value)

    def most(self, name: str, value: int) -> int:
        """``value``, or the largest that record field ``name`` holds if it is larger (a narrow field is 32 bits)."""
        return min(value, int(np.iinfo(self.g.entry_dtype.fields[name][0]).max))

    def close(self) -> None:
        self.mm.close()


def _all_ops_sound(c: SharedCache, keys) -> None:
    """Every key either reads back its own value, is missing, or raises a project error."""
    for k in keys:
        try:
            v = c.get(k)
        except ShmCacheError:
            continue
        if v is not None:
            check_value(k, v)


def test_verify_clean_cache_is_ok(name):
    with _filled(name) as c:
        r = c.verify()
        assert r.ok and r.problems == () and r.entries == 20 and bool(r)


DAMAGE = {
    "lru prev": lambda raw: raw.field(3, "prev", 7),
    "lru next cycle": lambda raw: raw.field(5, "next", 5),
    "lru next out of range": lambda raw: raw.field(2, "next", 10**9),
    "entry offset": lambda raw: raw.field(4, "off", 8),
    "entry value length": lambda raw: raw.field(6, "val_nbytes", 3),
    "entry key length": lambda raw: raw.field(6, "key_nbytes", raw.most("key_nbytes", 10**12)),
    "index slot emptied": lambda raw: raw.word(raw.g.index_off + (int(raw.mm_index_slot(1)) * 2 + 1) * 8, 0),
    "header entries": lambda raw: raw.word(d.H_ENTRIES * 8, 5),
    "header retained": lambda raw: raw.word(d.H_RETAINED * 8, -1),
    "ring tail": lambda raw: raw.word(d.H_TAIL * 8, 12),
    "arena value byte": lambda raw: raw.mm.__setitem__(raw.g.arena_off + 30, 0x55),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", sorted(DAMAGE))
def test_verify_damage_is_reported_and_repaired(name, what):
    with _filled(name) as c:
        raw = Raw(name, c)
        raw.mm_index_slot = lambda e: c._seg.records.slot[e]
        try:
            DAMAGE[what](raw)
        finally:
            raw.close()
        report = c.verify()
        assert not report.ok and report.problems
        c.verify(repair_damage=True)
        assert c.verify().ok, c.verify().problems
        assert c.stats().recoveries >= 1
        _all_ops_sound(c, [f"k{i}" for i in range(20)])
        c.put("new", make_value("new", 1, 10))
        check_value("new", c.get("new"))
        assert c.verify().ok
        c.unlink()


@pytest.mark.parametrize("value, at", [(None, 20), (np.arange(64.0), 12), (np.arange(64.0), 60),
                                       (np.arange(64.0), 400)])
def test_verify_damaged_value_is_never_returned(name, value, at):
    """A flipped byte anywhere in a value -- for arrays, in the header between tag and data or in the data -- makes
    the get raise and drop the entry, never return it."""
    with _filled(name) as c:
        if value is not None:
            c.put("k19", value)
        e = entry_of(c, "k19")
        off = c._seg.records.off[e] << c._seg.records.osh
        raw = Raw(name, c)
        try:
            raw.mm[raw.g.arena_off + off + at] ^= 0x01  # flip a bit inside k19's value
        finally:
            raw.close()
        with pytest.raises((CorruptionError, ValueError)):
            c.get("k19")
        assert c.get("k19") is None  # dropped by the repair, never returned damaged
        assert c.stats().recoveries == 1 and c.verify().ok
        c.unlink()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", range(6))
def test_verify_garbage_everywhere_never_hangs_or_lies(name, seed):
    rng = random.Random(seed)
    with _filled(name) as c:
        raw = Raw(name, c)
        try:
            # (line 0, identity, and line 1, the lock, kept intact; to the end of the ring the capacity uses: the
            # file past it is sized for max_capacity_bytes, which most garbage would land in and nothing reads)
            lo, hi = 128, raw.g.arena_off + c._seg.ring()
            for _ in range(rng.choice([5, 50, 500])):
                off = rng.randrange(lo, hi - 8) & ~7
                if 64 <= off < 128:
                    continue
                raw.word(off, rng.choice([0, 1, -1, 8, 2**31, 2**62, rng.getrandbits(63)]))
        finally:
            raw.close()
        keys = [f"k{i}" for i in range(20)] + ["x", "y"]
        for _ in range(3):
            _all_ops_sound(c, keys)
            for k in keys[:5]:
                try:
                    c.put(k, make_value(k, 99, 50))
                    c.delete(keys[-1])
                except ShmCacheError:
                    pass
        c.verify(repair_damage=True)
        assert c.verify().ok
        c.put("after", make_value("after", 1, 30))
        check_value("after", c.get("after"))
        c.unlink()


@pytest.mark.timeout(60)
def test_verify_is_bounded_on_a_large_garbage_segment(name):
    with SharedCache(name, create=True, capacity_bytes=4 << 20, max_entries=20_000) as c:
        for i in range(5000):
            c.put(i, b"x" * 50)
        g = c._seg.geometry
        raw = Raw(name, c)
        try:
            noise = np.random.default_rng(0).integers(0, 256, g.total_nbytes - g.index_off, dtype=np.uint8)
            raw.mm[g.index_off :] = noise.tobytes()
        finally:
            raw.close()
        report = c.verify()
        assert not report.ok and len(report.problems) <= 50
        c.verify(repair_damage=True)
        assert c.verify().ok
        c.unlink()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("head", [-8, -(1 << 20), 1 << 40, 12])
def test_verify_damaged_ring_head_never_aims_a_write_outside_the_arena(name, head):
    with _filled(name) as c:
        line0 = bytes(c._mm[:128])  # identity and mutex
        raw = Raw(name, c)
        try:
            raw.word(d.H_HEAD * 8, head)
        finally:
            raw.close()
        try:
            c.put("new", b"\xff" * 200)  # the compiled section hands over with dirty set: repaired, then stored
        except CorruptionError:
            pass  # the Python path found it while writing: repaired, and reported
        assert c.stats().recoveries == 1
        assert bytes(c._mm[:64]) == line0[:64]
        c.put("new", b"\xff" * 200)  # repaired: works
        assert c.get("new") == b"\xff" * 200 and c.verify().ok
        _all_ops_sound(c, [f"k{i}" for i in range(20)])
        c.unlink()


@pytest.mark.multiprocess
@pytest.mark.timeout(30)
def test_verify_holder_dying_inside_set_limits_leaves_limits_enforced(name):
    """A process killed after writing a new byte limit but before evicting: the next locker's repair evicts."""
    import multiprocessing as mp

    with _filled(name) as c:
        most = c.stats().retained_bytes // 4
        ctx = mp.get_context("fork")
        p = ctx.Process(target=_set_limits_then_die, args=(name, None, most))
        p.start()
        p.join(timeout=20)
        assert p.exitcode == 0
        assert not c.delete("absent")  # takes over the dead holder's lock and repairs
        s = c.stats()
        assert s.max_retained_bytes == most and 0 < s.retained_bytes <= most and s.recoveries == 1
        assert s.evictions == 20 - s.entries and c.verify().ok
        assert all(c.get(f"k{i}") is None for i in range(10))  # the oldest went first (none was read)
        c.unlink()


def test_verify_holder_dying_inside_an_entry_limit_leaves_the_old_one(name):
    """A process killed at its first eviction for a lower entry limit (a resize of the tables, layout version 10):
    the limit is written once the evictions are made, so the old one stays, met, and a retry sets the new one."""
    import multiprocessing as mp

    with _filled(name) as c:
        ctx = mp.get_context("fork")
        p = ctx.Process(target=_set_limits_then_die, args=(name, 3, None))
        p.start()
        p.join(timeout=20)
        assert p.exitcode == 0
        check_value("k19", c.get("k19"))  # takes over the dead holder's lock (and repairs, if anything is wrong)
        s = c.stats()
        assert (s.max_entries, s.entries) == (SMALL["max_entries"], 20) and c.verify().ok
        c.set_limits(max_entries=3)
        assert len(c) == 3 and all(c.get(f"k{i}") is None for i in range(16)) and c.verify().ok
        c.unlink()


def _set_limits_then_die(name: str, max_entries: int | None, max_retained_bytes: int | None) -> None:
    cache = SharedCache(name, create=False)
    from shmcache.table import Table

    Table.remove = lambda self, e: os._exit(0)  # dies at its first eviction, holding the lock
    cache.set_limits(max_entries=max_entries, max_retained_bytes=max_retained_bytes)
    os._exit(1)



@pytest.mark.timeout(30)
@pytest.mark.parametrize("free_head", [-1, 3, 10**6])
def test_verify_damaged_free_list_head_never_overwrites_a_resident_entry(name, free_head):
    with _filled(name) as c:
        c.delete("k0")  # a real free list, so the damage replaces a meaningful word
        raw = Raw(name, c)
        try:
            raw.word(d.H_FREE_HEAD * 8, free_head)
        finally:
            raw.close()
        try:
            c.put("new", make_value("new", 1, 40))
        except CorruptionError:
            c.put("new", make_value("new", 1, 40))  # repaired, then it works
        check_value("new", c.get("new"))
        _all_ops_sound(c, [f"k{i}" for i in range(20)])
        for i in range(1, 20):  # nothing resident was overwritten: every survivor reads back whole
            v = c.get(f"k{i}")
            assert v is not None
            check_value(f"k{i}", v)
        assert c.verify().ok
        c.unlink()


# Values whose checksum is right but whose bytes do not decode: (tag, body) as a put would store them.
UNDECODABLE = {
    "msgpack never-used byte": (ord("M"), b"\xc1"),
    "msgpack truncated": (ord("M"), b"\x92\x01"),
    "msgpack extra data": (ord("M"), b"\x01\x02"),
    "msgpack unknown ext": (ord("M"), b"\xd4\x09\x00"),
    "array short data": (ord("A"), b"\x00\x05\x00\x00\x00\x00\x00" + b"\x92\xa3<i8\x91\x03" + b"\0" * 3),
    "unknown tag": (ord("Z"), b"payload"),
}


def _plant(c: SharedCache, key: str, tag: int, body: bytes) -> None:
    """Store ``body`` under ``key`` as a put would, with a correct checksum, through the cache's own store."""
    from shmcache.layout import EMPTY

    c._guard.run(c._store.store, EMPTY, c._store.encode(key, None, parts=(tag, body)), 0)


@pytest.mark.parametrize("what", sorted(UNDECODABLE))
def test_verify_deep_reports_a_value_that_does_not_decode_and_repair_drops_it(name, what):
    with _filled(name) as c:
        _plant(c, "bad", *UNDECODABLE[what])
        assert c.verify(deep=False).ok  # its block and checksum are in order: only decoding tells
        r = c.verify(deep=True)
        assert not r.ok and any("does not decode" in p for p in r.problems), r.problems
        c.verify(repair_damage=True)
        assert c.verify().ok and c.get("bad") is None
        for i in range(20):
            check_value(f"k{i}", c.get(f"k{i}"))


@pytest.mark.parametrize("what", sorted(UNDECODABLE))
def test_verify_get_of_a_value_that_does_not_decode_raises_corruption_and_drops_it(name, what):
    with _filled(name) as c:
        _plant(c, "bad", *UNDECODABLE[what])
        with pytest.raises(CorruptionError):  # (an array's header is read under the lock: damage, repaired)
            c.get("bad")
        assert c.get("bad") is None and c.verify().ok and len(c) == 20
        _plant(c, "bad", *UNDECODABLE[what])
        with pytest.raises(CorruptionError):
            c.get_with_version("bad")
        _plant(c, "bad", *UNDECODABLE[what])
        with pytest.raises(CorruptionError):
            c.pop("bad")
        assert c.get("bad") is None and c.verify().ok


CONFIG_WORDS = ("config_check", "saved_ttl_ns", "saved_max_entries", "saved_max_retained", "saved_check", "progress",
                "seq")
HEADER_WORDS = [n for n in d.HEADER.names if n != "lock" and n not in CONFIG_WORDS]  # (checksums, seq: no range)
BAD_WORDS = [-1, 2**63 - 1, -(2**63), 2**62 + 12345]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("word", HEADER_WORDS)
def test_verify_header_word_out_of_range_is_reported_and_repaired(name, word):
    """Each header word, damaged to values out of its range: check() names it, and after the repair the word is in
    range, verify() is ok, put and get work, len() and stats() answer, and a new handle can attach."""
    from shmcache.verify import check, header_ranges

    w = d.HEADER.fields[word][1] // 8
    with _filled(name) as c:
        lo, hi = header_ranges(c._seg.geometry)[w]
        for n, bad in enumerate(BAD_WORDS):
            if lo <= bad <= hi:
                continue  # (created_ns: any time from 0 on is one)
            c._seg.header_words[w] = bad
            report = check(c._seg)
            assert not report.ok and any(p.startswith(f"header word {word}=") for p in report.problems), \
                (bad, report.problems)
            c.verify(repair_damage=True)
            assert lo <= c._seg.header_words[w] <= hi, (bad, c._seg.header_words[w])
            assert c.verify().ok, c.verify().problems
            _all_ops_sound(c, [f"k{i}" for i in range(20)])
            for i in range(10):
                key = f"n{n}-{i}"
                c.put(key, make_value(key, i, 60))
                check_value(key, c.get(key))  # not vanished (default_ttl), not refused (clock, counters)
            assert 0 <= len(c) <= 32 and c.stats().entries == len(c)
            with SharedCache(name, create=False) as other:  # line 0 restored: attach is not refused
                assert len(other) == len(c)


@pytest.mark.parametrize("bad", [-1, -(2**63), 2**63 - 1])
def test_verify_len_of_a_damaged_entry_count_repairs_and_answers(name, bad):
    with _filled(name) as c:
        c._seg.header_words[d.H_ENTRIES] = bad
        assert len(c) == 20 and c.verify().ok


@pytest.mark.parametrize("bad", [-1, -(2**63), 2**63 - 1])
def test_verify_kind_len_of_a_damaged_count_repairs_and_answers(name, bad):
    with _filled(name) as c:
        kind = c.kind("k")
        kind.put("a", 1)
        kw = c._seg.kind_words
        kw[kind._n * d.KIND_WORDS + d.K_ENTRIES] = bad
        assert len(kind) == 1 and c.verify().ok


@pytest.mark.parametrize("bad", [-1, -(10**9), -(2**63)])
def test_verify_damaged_default_ttl_never_makes_puts_vanish(name, bad):
    with _filled(name) as c:
        c._seg.header_words[d.H_DEFAULT_TTL] = bad
        try:
            c.put("new", "v")
        except CorruptionError:  # found damaged by the put itself, and repaired
            c.put("new", "v")
        assert c.get("new") == "v" and c.verify().ok


def test_verify_version_clock_near_the_top_never_stops_puts(name):
    with _filled(name) as c:
        c._seg.header_words[d.H_VERSION_CLOCK] = 2**63 - 1
        failures = 0
        for i in range(60):
            try:
                c.put(f"v{i}", i)
            except CorruptionError:
                failures += 1
                continue
            assert c.get(f"v{i}") == i  # stored and found, whatever the policy evicts next
        assert failures <= 1 and c.verify().ok


@pytest.mark.parametrize("clock", [d.MAX_VERSION, d.MAX_VERSION - 3])
def test_verify_repair_keeps_the_clock_in_range_with_fresh_versions(name, clock):
    """A clock damaged to just below the top, in range, and entries whose versions the repair must replace: the
    fresh versions never take the clock past the range (the fuzzer's garbage met it), and every version stays
    unique, below the clock."""
    with _filled(name) as c:
        versioned(c)  # (the column in use: version 16 backs it once a caller asks for a version)
        h, ver = c._seg.header_words, c._seg.versions_words
        h[d.H_VERSION_CLOCK] = clock
        live = [e for e in range(1, c._seg.geometry.entry_slots) if c._seg.records.check[e]]
        for e in live[:5]:
            ver[e] = -1  # damaged
        c.verify(repair_damage=True)
        assert c.verify().ok
        for i in range(20):
            c.put(f"after{i}", i)
        assert c.verify().ok
        versions = [ver[e] for e in range(1, c._seg.geometry.entry_slots) if c._seg.records.check[e]]
        assert len(set(versions)) == len(versions) and max(versions) <= h[d.H_VERSION_CLOCK] <= d.MAX_VERSION


@pytest.mark.parametrize("bad", [255, 7, -1, 2**63 - 1])
def test_verify_kinds_used_damaged_never_fills_the_kind_table(name, bad):
    """kinds_used set beyond the records that have names (in range or not): check() reports it, and a new kind can
    still be made afterwards (a count of 255 made every new kind() fail with "255 kinds already")."""
    from shmcache.verify import check

    with _filled(name) as c:
        c.kind("a").put("x", 1)
        c._seg.header_words[d.H_KINDS_USED] = bad
        assert not check(c._seg).ok
        try:
            b = c.kind("b")
        except CorruptionError:  # out of range: found by kind() itself, repaired
            b = c.kind("b")
        b.put("y", 2)
        assert c.verify().ok and c.kind("a").get("x") == 1 and b.get("y") == 2
        assert c._seg.header_words[d.H_KINDS_USED] == 2


# Every path that hands out a key or a value read from the segment (not looked up by a key the caller gave) checks the
# key bytes against the entry's fingerprint and the value against its checksum: a damaged entry is left out (and
# repaired), never returned as a key that was never stored, or under another key.

def _entry_damage(field: str, how):
    """Set entry ``e``'s record field ``field`` to ``how`` of its value (``off`` in bytes, in both formats)."""
    def damage(c: SharedCache, raw: Raw, e: int) -> None:
        raw.field(e, field, how(c._seg.records.column(field, e + 1)[e]))
    return damage


def _fingerprint_damage(c: SharedCache, raw: Raw, e: int) -> None:
    """Flip a bit of the fingerprint the entry's key bytes are checked against: the record's ``fp`` in a wide record;
    a narrow one keeps none, so the index tag (the low 32 bits of the packed index word at its ``slot``) instead."""
    rec = c._seg.records
    if rec.fp is not None:
        raw.field(e, "fp", rec.fp[e] ^ 1)
    else:
        s = rec.slot[e]
        raw.plant(raw.g.index_off + s * raw.g.index_slot_nbytes, 4, (c._seg.index_words[s] & 0xFFFFFFFF) ^ 1)


def _arena_flip(at):
    def damage(c: SharedCache, raw: Raw, e: int) -> None:
        rec = c._seg.records
        v0 = (rec.off[e] << rec.osh) + 8 + (rec.vlen[e] if at == "key" else 1)
        raw.mm[raw.g.arena_off + v0] ^= 0x01
    return damage


ENTRY_DAMAGE = {
    "key length 0": _entry_damage("key_nbytes", lambda v: 0),
    "key length +1": _entry_damage("key_nbytes", lambda v: v + 1),
    "key length -1": _entry_damage("key_nbytes", lambda v: v - 1),
    "key length huge": lambda c, raw, e: raw.field(e, "key_nbytes", raw.most("key_nbytes", 10**12)),
    "value length +1": _entry_damage("val_nbytes", lambda v: v + 1),
    "value length -1": _entry_damage("val_nbytes", lambda v: v - 1),
    "offset +64": _entry_damage("off", lambda v: v + 64),
    "offset 0": _entry_damage("off", lambda v: 0),
    "fingerprint": _fingerprint_damage,
    "checksum": _entry_damage("check", lambda v: v ^ 2),
    "key byte": _arena_flip("key"),
    "value byte": _arena_flip("value"),
}

PLAIN, KINDED = [f"k{i}" for i in range(10)], [f"kd{i}" for i in range(5)]


def _popped(m) -> list:
    out = []
    for _ in range(100):
        try:
            out.append(m.popitem())
        except KeyError:
            return out
    raise AssertionError("popitem never emptied the cache")


READING_PATHS = {
    "iter": lambda m, keys: [(k, None) for k in m],
    "keys": lambda m, keys: [(k, None) for k in m.keys()],
    "reversed": lambda m, keys: [(k, None) for k in reversed(m)],
    "values": lambda m, keys: [(None, v) for v in m.values()],
    "items": lambda m, keys: list(m.items()),
    "popitem": lambda m, keys: _popped(m),
    "get_many": lambda m, keys: [(k, v) for k, v in zip(keys, m.get_many(keys)) if v is not None],
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", sorted(READING_PATHS))
@pytest.mark.parametrize("damage", sorted(ENTRY_DAMAGE))
def test_verify_reading_paths_hand_out_only_stored_keys_and_values(name, damage, path):
    with SharedCache(name, create=True, capacity_bytes=64_000, max_entries=64) as c:
        kind = c.kind("kd")
        for i, k in enumerate(PLAIN):
            c.put(k, make_value(k, i, 40 + 9 * i))
        for i, k in enumerate(KINDED):
            kind.put(k, make_value(k, i, 30 + 7 * i))
        raw = Raw(name, c)
        try:
            for m, key in ((c, "k6"), (kind, "kd2")):
                kb = m._encode_key(key)
                e = index.of(c._seg.geometry).find(c._ix, c._seg.records, c._mm, c._base, c._mask, fingerprint(kb), kb)
                ENTRY_DAMAGE[damage](c, raw, e)
        finally:
            raw.close()
        for m, stored in ((c, PLAIN), (kind, KINDED)):
            try:
                got = READING_PATHS[path](m, stored)
            except CorruptionError:
                if path != "get_many":  # a get of a damaged value raises (and drops it); listings leave it out
                    raise
                got = READING_PATHS[path](m, stored)  # repaired: asked again, it is a miss
            for k, v in got:
                assert k is None or k in stored, f"{path} handed out {k!r}, a key never stored"
                if v is not None:
                    check_value(v["key"] if k is None else k, v)
                    assert v["key"] in stored
        c.verify(deep=True, repair_damage=True)  # what the path did not meet (a keys listing reads no value)
        report = c.verify(deep=True)
        assert report.ok, report.problems
        c.unlink()


# The configuration words (default_ttl_ns, max_entries, max_retained_bytes): a damaged value in range changes what
# every process does without breaking a structure, so each is checksummed, with a checked copy (shmcache/config.py).

CONFIG_DAMAGE = {
    "default_ttl small": (d.H_DEFAULT_TTL, 1),
    "max_entries 1": (d.H_MAX_ENTRIES, 1),
    "max_retained 1": (d.H_MAX_RETAINED, 1),
    "config_check": (d.H_CONFIG_CHECK, 12345),
    "saved ttl": (d.H_SAVED_TTL, 1),
    "saved max_entries": (d.H_SAVED_MAX_ENTRIES, 2),
    "saved check": (d.H_SAVED_CHECK, 0),
}


@pytest.mark.parametrize("undo", ["verify", "clear", "stats"])
@pytest.mark.parametrize("what", sorted(CONFIG_DAMAGE))
def test_verify_a_damaged_configuration_word_is_found_and_restored(name, what, undo):
    with SharedCache(name, create=True, capacity_bytes=16_000, max_entries=32, default_ttl=3600) as c:
        c.set_limits(max_entries=20, max_retained_bytes=12_000)
        word, bad = CONFIG_DAMAGE[what]
        c._seg.header_words[word] = bad
        report = c.verify()
        if word == d.H_MAX_ENTRIES:  # the tables follow the limit: the next call (verify's) takes them, and repairs
            assert report.ok and c.stats().recoveries == 1, report.problems
        else:
            assert not report.ok and any("configuration" in p for p in report.problems), report.problems
        if undo == "verify":
            c.verify(repair_damage=True)
        elif undo == "clear":
            c.clear()
        else:
            c.stats()  # the O(1) header check every stats() makes
        assert c.verify().ok, c.verify().problems
        limits = c.limits()
        assert (limits.max_entries, limits.max_retained_bytes) == (20, 12_000)  # the values set, not the damage
        c.put("new", "v")
        assert c.get("new") == "v" and 3500 < c.ttl("new") <= 3600  # neither expired at once nor immortal


def test_verify_configuration_crash_windows_restore_old_or_new_values():
    """config.write writes the copy, then the words: cut short anywhere, restore() finds the old values or the new
    ones, never a mixture and never the damage-proof defaults."""
    from shmcache import config
    from shmcache.layout import Geometry

    g = Geometry.for_capacity(16_000, 32)
    old, new = (5, 30, 9_000, 10_000), (7, 20, 12_000, 14_000)
    writes = []

    class Recording(list):
        def __setitem__(self, w, v):
            writes.append((w, v))
            super().__setitem__(w, v)

    h = Recording([0] * d.HEADER_WORDS)
    config.write(h, *old)
    writes.clear()
    config.write(h, *new)
    done = list(writes)
    for cut in range(len(done) + 1):
        h2 = [0] * d.HEADER_WORDS
        config.write(h2, *old)
        for w, v in done[:cut]:
            h2[w] = v
        config.restore(h2, g)
        got = (h2[d.H_DEFAULT_TTL], h2[d.H_MAX_ENTRIES], h2[d.H_MAX_RETAINED], h2[d.H_CAPACITY])
        assert got in (old, new), (cut, got)
        assert not config.problems(h2, g)
