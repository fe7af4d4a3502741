"""The binary layout: golden sizes and offsets, region alignment, and malformed headers that must each raise the
right error on attach."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from shmcache import LayoutError, LayoutVersionError, SharedCache, index, layout
from shmcache.codec import encode_key
from shmcache.layout import Geometry
from shmcache.layout import dtypes as d


def test_layout_golden_itemsizes():
    assert layout.HEADER.itemsize == 576
    assert layout.INDEX_SLOT.itemsize == 16 and layout.INDEX_SLOT_PACKED.itemsize == 8
    assert layout.ENTRY.itemsize == 64


def test_layout_golden_offsets():
    f = layout.HEADER.fields
    assert [f[n][1] for n in ("magic", "version", "features", "total_nbytes")] == [0, 8, 16, 24]
    assert f["lock"][1] == 64 and f["hits"][1] == 128 and f["entries"][1] == 192 and f["free_head"][1] == 256
    assert [layout.ENTRY.fields[n][1] for n in layout.ENTRY.names] == [0, 8, 16, 24, 32, 40, 48, 56]


def test_layout_golden_version_3_additions():
    f = layout.HEADER.fields
    assert [f[n][1] for n in ("version_clock", "next_expiry", "expired", "default_ttl_ns", "kinds_used",
                              "writing")] == [320, 328, 336, 344, 352, 360]
    assert layout.KIND.itemsize == 64 and [layout.KIND.fields[n][1] for n in layout.KIND.names] == [0, 8, 16, 24]
    assert (d.EXPIRES.str, d.VERSIONS.str, d.KINDS.str, d.PINS.str) == ("<i8", "<i8", "|u1", "|u1")
    assert layout.KIND_PREFIX == 0xF5 and layout.MAX_KINDS == 255


def test_layout_golden_version_4_additions():
    f = layout.HEADER.fields
    assert f["config_check"][1] == 368 and d.H_CONFIG_CHECK == 46
    assert [f[n][1] for n in ("saved_ttl_ns", "saved_max_entries", "saved_max_retained", "saved_check")] == \
        [384, 392, 400, 408]


def test_layout_golden_version_5_additions():
    f = layout.HEADER.fields
    assert f["admitted"][1] == 376
    assert [f[n][1] for n in ("policy", "ghost_slots", "small_first", "small", "ghost_clock", "not_admitted",
                              "promoted", "ghost_hits")] == list(range(448, 512, 8))
    assert d.POLICY_NAMES == ("lru", "s3fifo", "keep", "auto")
    assert (d.MARK_FREQ, d.MARK_SMALL, d.GHOST_WAYS, d.GHOST_STAMP_BITS) == (3, 4, 16, 32)
    lru, s3 = (layout.Geometry.for_capacity(1 << 20, 1000, p, 16) for p in (0, 1))
    assert lru.ghost_slots == 0 and s3.ghost_slots == s3.index_slots == 2048
    # (version 17's index is 1430 slots, its ghost the power of two of the index before it: Geometry.ghost_for)
    s3_17 = layout.Geometry.for_capacity(1 << 20, 1000, 1, 17)
    assert (s3_17.version, s3_17.index_slots, s3_17.ghost_slots) == (17, 1430, 2048)
    assert s3.arena_off >= s3.ghost_off + 2048 * 8 and lru.ghost_off == s3.ghost_off
    auto15 = layout.Geometry.for_capacity(1 << 20, 1000, d.POLICY_AUTO, 15)  # its sketch where s3fifo's ghost is
    assert (auto15.ghost_off, auto15.ghost_slots, auto15.arena_off) == (s3.ghost_off, 2048, s3.arena_off)
    assert layout.Geometry.for_capacity(4096, 1, 1).ghost_slots == d.GHOST_WAYS  # a group at least


def test_layout_golden_version_6_additions():
    f = layout.HEADER.fields
    assert [f[n][1] for n in ("seq", "reader_slots", "base_hits", "base_misses", "base_retries",
                              "base_fallbacks")] == list(range(512, 560, 8))
    assert d.LAYOUT_VERSION >= 6 and layout.HEADER.itemsize == 576 and d.READER_SLOTS == 256
    # (version 9 added ``reading``, word 5, in what was the first line's padding)
    assert d.READER.itemsize == 256 and [d.READER.fields[n][1] for n in d.READER.names] == [0, 8, 16, 24, 32, 40, 64]
    assert (d.READER_PINS, d.R_PINS, d.PIN_SLOT_MASK) == (24, 8, 2**32 - 1)
    for policy in (0, 1):
        g = layout.Geometry.for_capacity(1 << 20, 1000, policy)
        assert g.index_off == 576 and g.readers_off % 64 == 0
        assert g.readers_off >= g.ghost_off + g.ghost_slots * 8 and g.arena_off >= g.readers_off + 256 * 256


def test_layout_golden_version_7_last_put(name):
    """Version 7: line 6's ``last_put_ns`` holds the writer's monotonic clock at a store, to the second (rewritten
    only when a second or more old), on both paths; 0 until the first store."""
    clock = [10**12]
    assert layout.HEADER.fields["last_put_ns"][1] == 424 and d.H_LAST_PUT == 53
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True, clock=lambda: clock[0]) as c:
        h = c._seg.header_words
        assert h[d.H_LAST_PUT] == 0
        c.put("a", 1)
        assert h[d.H_LAST_PUT] == 10**12
        clock[0] += 10**9 - 1  # within the second: the word, and its line, stay as they are
        c.put("a", 2)
        c.incr("n")
        assert h[d.H_LAST_PUT] == 10**12
        clock[0] += 1
        c.incr("n")
        assert h[d.H_LAST_PUT] == 10**12 + 10**9
        clock[0] += 5 * 10**9
        c.put("b", 1)
        assert h[d.H_LAST_PUT] == 10**12 + 6 * 10**9
        c.get("a")
        c.delete("a")
        assert h[d.H_LAST_PUT] == 10**12 + 6 * 10**9  # lookups and deletes store nothing
        h[d.H_LAST_PUT] = 2**62  # ahead of the clock (damaged): the next store sets it back
        clock[0] += 1
        c.put("b", 2)
        assert h[d.H_LAST_PUT] == clock[0] and c.verify().ok


def test_layout_golden_version_7_lock_words(name):
    """Version 7: the lock's line holds shmcache's own words (word, holder, wakes at bytes 64, 68, 72), zero as
    made, and nothing else is ever read there; a held lock names its thread and this handle's holder slot."""
    import threading

    from shmcache import lock

    assert d.LAYOUT_VERSION >= 7 and d.H_LOCK_OFF == 64 and d.LOCK_NBYTES == 64
    assert (lock.HOLDER_OFF, lock.WAKES_OFF) == (4, 8)
    assert lock.HOLDER_BASE == 2**62 + 2**40 + 2**21 and lock.HOLDER_SLOTS == 2**20
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True) as c:
        with open(f"/dev/shm/shmcache.{name}", "rb") as f:
            assert f.read(128)[64:128] == bytes(64)
        c._guard.hold()
        try:
            words = bytes(c._seg.lock_mm[64:76])
            assert int.from_bytes(words[:4], "little") == threading.get_native_id()
            assert int.from_bytes(words[4:8], "little") == c._guard.slot.number > 0
        finally:
            c._guard.let_go()
        assert bytes(c._seg.lock_mm[64:72]) == bytes(8)


@pytest.mark.parametrize("policy", [0, 1, 2])
def test_layout_policy_words_as_created(name, policy):
    SharedCache(name, capacity_bytes=4096, max_entries=8, create=True, policy=d.POLICY_NAMES[policy]).close()
    with open(f"/dev/shm/shmcache.{name}", "rb") as f:
        head = f.read(512)
    assert int.from_bytes(head[448:456], "little") == policy
    # the ghost reserved for 16 times the 8 entries (a power of two: 512 words for an index of 185 slots), and the
    # index in force, word 5, for 8 (and the sentinel) at a load of 0.7 at most: 13 slots
    assert int.from_bytes(head[456:464], "little") == (512 if policy == 1 else 0)
    assert int.from_bytes(head[40:48], "little") == 13


def test_layout_an_unknown_policy_word_is_refused_on_attach(name):
    SharedCache(name, capacity_bytes=4096, max_entries=8, create=True).close()
    with open(f"/dev/shm/shmcache.{name}", "r+b") as f:
        f.seek(448)
        f.write((7).to_bytes(8, "little"))
    with pytest.raises(LayoutError, match="impossible geometry: policy must be a number below 4, got 7"):
        SharedCache(name)


def test_layout_golden_features():
    assert layout.FEATURE_PICKLE == 1 and layout.FEATURES == 1  # bit 0 only; every other bit is refused on attach
    assert d.H_FEATURES == 2


@pytest.mark.parametrize("serializer,word", [("msgpack", 0), ("pickle", 1)])
def test_layout_features_word_as_created(name, serializer, word):
    SharedCache(name, capacity_bytes=4096, max_entries=8, create=True, serializer=serializer).close()
    with open(f"/dev/shm/shmcache.{name}", "rb") as f:
        assert int.from_bytes(f.read(24)[16:24], "little") == word


def test_layout_columns_follow_the_entry_table_in_order_and_aligned():
    g = layout.Geometry.for_capacity(1 << 20, 1000)
    offs = [g.entries_off, g.expires_off, g.versions_off, g.kinds_off, g.pins_off, g.marks_off, g.kind_table_off,
            g.ghost_off, g.arena_off]
    assert offs == sorted(offs) and all(o % layout.ALIGN == 0 for o in offs)
    assert g.expires_off >= g.entries_off + g.entry_slots * g.entry_nbytes
    assert g.versions_off >= g.expires_off + g.entry_slots * 8
    assert g.pins_off >= g.kinds_off + g.entry_slots and g.marks_off >= g.pins_off + g.entry_slots
    assert g.kind_table_off >= g.marks_off + g.entry_slots
    assert g.arena_off >= g.kind_table_off + 256 * 64 and g.arena_off % layout.PAGE == 0


def test_layout_all_words_little_endian():
    for dt in (layout.HEADER, layout.INDEX_SLOT, layout.ENTRY):
        for n in dt.names:
            fdt = dt.fields[n][0]
            assert fdt.kind == "V" or fdt.str == "<i8", (n, fdt)


def test_layout_word_constants_match_dtypes():
    from shmcache.records import Records

    assert d.H_HITS * 8 == layout.HEADER.fields["hits"][1]
    assert d.I_ENTRY * 8 == layout.INDEX_SLOT.fields["entry"][1]
    # The entry records: each view of Records (records.py) is its dtype's field, in both formats.
    for narrow, dt in ((False, layout.ENTRY), (True, d.ENTRY_NARROW)):
        rec = Records(memoryview(bytearray(3 * dt.itemsize)), narrow)
        views = {"prev": rec.prev, "next": rec.next, "fp": rec.fp, "off": rec.off, "key_nbytes": rec.klen,
                 "val_nbytes": rec.vlen, "slot": rec.slot, "check": rec.check}
        assert (rec.narrow, rec.nbytes, rec.dtype) == (narrow, dt.itemsize, dt)
        assert sorted(n for n, v in views.items() if v is not None) == sorted(dt.names)
        for i, n in enumerate(dt.names):
            views[n][1] = 11 + i
        rows = rec.rows(3)
        assert [int(rows[1][n]) for n in dt.names] == [11 + i for i in range(len(dt.names))]
        assert not rows[0].tobytes().strip(b"\0") and not rows[2].tobytes().strip(b"\0")


@pytest.mark.parametrize("cap,n", [(1, 1), (4096, 10), (64 << 20, 65536), (10**9, 10**6)])
def test_layout_geometry_regions_aligned_and_disjoint(cap, n):
    g = Geometry.for_capacity(cap, n)
    assert g.index_off % 64 == 0 and g.entries_off % 64 == 0 and g.arena_off % 4096 == 0
    assert g.index_off >= layout.HEADER_NBYTES
    assert g.entries_off >= g.index_off + g.index_slots * 8 and g.index_slot_nbytes == 8
    assert g.arena_off >= g.entries_off + g.entry_slots * g.entry_nbytes
    assert g.total_nbytes >= g.arena_off + g.arena_nbytes and g.total_nbytes % 4096 == 0
    assert g.index_slots == layout.index_for(n) and 7 * g.index_slots >= 10 * g.entry_slots  # (a load of 0.7 at most)
    # Any set of entries within the limits fits physically (header + padding per entry).
    assert g.arena_nbytes >= cap + n * layout.BLOCK_OVERHEAD


@pytest.mark.parametrize("cap,n", [(0, 1), (1, 0), (-5, 1), (1, 2**31)])
def test_layout_geometry_rejects_impossible_sizes(cap, n):
    with pytest.raises(ValueError):
        Geometry.for_capacity(cap, n)


def _raw_segment(name: str, nbytes: int) -> tuple[int, mmap.mmap]:
    fd = os.open(f"/dev/shm/shmcache.{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, nbytes)
    return fd, mmap.mmap(fd, nbytes)


def _words(mm) -> np.ndarray:
    return np.frombuffer(mm, dtype="<i8", count=8)


def _corrupt_and_attach(name, mutate):
    SharedCache(name, capacity_bytes=4096, max_entries=8, create=True).close()
    fd = os.open(f"/dev/shm/shmcache.{name}", os.O_RDWR)
    try:
        with mmap.mmap(fd, 4096) as mm:
            w = _words(mm)
            mutate(w, fd)
            del w
    finally:
        os.close(fd)
    return lambda: SharedCache(name, create=False)


MALFORMED = [
    ("bad magic", lambda w, fd: w.__setitem__(d.H_MAGIC, 12345), LayoutError),
    ("other version", lambda w, fd: w.__setitem__(d.H_VERSION, 99), LayoutVersionError),
    ("unknown feature", lambda w, fd: w.__setitem__(d.H_FEATURES, 1 << 40), LayoutVersionError),
    ("unknown feature bit 1", lambda w, fd: w.__setitem__(d.H_FEATURES, 2), LayoutVersionError),
    ("pickle with an unknown bit", lambda w, fd: w.__setitem__(d.H_FEATURES, 3), LayoutVersionError),
    ("negative features", lambda w, fd: w.__setitem__(d.H_FEATURES, -1), LayoutVersionError),
    ("impossible geometry", lambda w, fd: w.__setitem__(d.H_ENTRY_SLOTS, -3), LayoutError),
    ("header disagrees", lambda w, fd: w.__setitem__(d.H_ARENA_NBYTES, 17), LayoutError),
    ("truncated", lambda w, fd: os.ftruncate(fd, 8192), LayoutError),
]


@pytest.mark.parametrize("what,mutate,error", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_layout_malformed_header_raises(name, what, mutate, error):
    attach = _corrupt_and_attach(name, mutate)
    with pytest.raises(error) as raised:
        attach()
    # A cache's own error says how to remove it and what that loses; another program's object is not for removing.
    removable = f"`shmcache rm {name}`" in str(raised.value) and "every entry it holds is lost" in str(raised.value)
    assert removable == (what != "bad magic"), str(raised.value)


def test_layout_version_error_names_both_versions(name):
    attach = _corrupt_and_attach(name, lambda w, fd: w.__setitem__(d.H_VERSION, 99))
    with pytest.raises(LayoutVersionError, match=f"99.*{d.LAYOUT_VERSION}|{d.LAYOUT_VERSION}.*99"):
        attach()


def test_layout_not_a_shmcache_segment(name):
    fd, mm = _raw_segment(name, 4096)
    try:
        mm[:8] = b"GARBAGE!"
        with pytest.raises(LayoutError):
            SharedCache(name)
    finally:
        mm.close()
        os.close(fd)


def test_layout_golden_version_8_arena_extent(name):
    """Version 8: line 6's last word (byte 440) is ``arena_extent``, what the creator backed of the arena
    (``Geometry.initial_extent``), and the file beyond it is not backed (st_blocks); a store past it raises it."""
    assert d.LAYOUT_VERSION >= 8 and d.H_ARENA_EXTENT * 8 == 440 and 7 in d.READ_VERSIONS
    g = Geometry.for_capacity(16 * 8 * 2**20, 16 * 64, 0)
    assert g.initial_extent(8 * 2**20, 64) == 256 * 1024
    with SharedCache(name, capacity_bytes=8 * 2**20, max_entries=64, create=True, policy="lru") as c:  # g's
        with open(f"/dev/shm/shmcache.{name}", "rb") as f:
            assert int.from_bytes(f.read(448)[440:448], "little") == 256 * 1024
        # (the header, the tables for 64 entries, the kind table and reader slots, and the arena's first pages)
        backed = sum(stop - start for start, stop in g.backed(256, 65, 256 * 1024))
        assert os.stat(f"/dev/shm/shmcache.{name}").st_blocks * 512 <= backed
        for i in range(8):
            c[f"k{i}"] = bytes(100_000)
        assert c._seg.header_words[d.H_ARENA_EXTENT] >= 800_000


def test_layout_golden_version_9_capacity(name):
    """Version 9: line 0's ``capacity_bytes`` is what the arena is sized for (``max_capacity_bytes``), the file is
    that long but sparse; line 8's words 6 and 7 (bytes 560, 568) are the capacity in force and the resizes, and
    both configuration checksums cover the capacity."""
    from shmcache import config

    assert d.LAYOUT_VERSION >= 9 and 9 in d.READ_VERSIONS
    assert (d.H_CAPACITY * 8, d.H_RESIZES * 8) == (560, 568)
    with SharedCache(name, capacity_bytes=2**20, max_entries=64, create=True) as c:
        h = c._seg.header_words
        assert (h[d.H_CAPACITY_BYTES], h[d.H_CAPACITY], h[d.H_RESIZES]) == (16 * 2**20, 2**20, 0)
        assert os.fstat(c._seg.fd).st_size == c._seg.geometry.total_nbytes > 16 * 2**20
        assert h[d.H_CONFIG_CHECK] == h[d.H_SAVED_CHECK] == config.checksum(0, 64, 2**20, 2**20)
        assert config.checksum(0, 64, 2**20, 2**20) != config.checksum(0, 64, 2**20)
        c.resize(capacity_bytes=3 * 2**20)
        assert (h[d.H_CAPACITY], h[d.H_RESIZES], h[d.H_MAX_RETAINED]) == (3 * 2**20, 1, 3 * 2**20)


def test_layout_golden_version_10_tables(name):
    """Version 10: line 0's ``entry_slots`` (byte 32) are the most entries a resize reaches (16 times the
    ``max_entries`` of creation, and the sentinel) and ``index_slots`` (byte 40) the index in force, the one the
    limit needs (``index_for``); the tables are backed for the limit alone (st_blocks), and a resize past it backs
    more of them and moves ``index_slots``, every entry kept."""
    assert d.LAYOUT_VERSION >= 10 and 10 in d.READ_VERSIONS
    assert (d.H_ENTRY_SLOTS * 8, d.H_INDEX_SLOTS * 8) == (32, 40)
    assert [layout.index_for(n, 16) for n in (1, 3, 4, 1000, 10000)] == [8, 8, 16, 2048, 32768]
    assert [layout.index_for(n) for n in (1, 3, 4, 1000, 10000)] == [8, 8, 8, 1430, 14288]  # (version 17)
    with SharedCache(name, capacity_bytes=2**20, max_entries=1000, create=True) as c:
        h, g = c._seg.header_words, c._seg.geometry
        assert (h[d.H_ENTRY_SLOTS], h[d.H_INDEX_SLOTS], g.index_slots) == (16001, 1430, 22859)
        for i in range(1000):
            c[f"k{i}"] = i.to_bytes(4, "little")
        before = os.fstat(c._seg.fd).st_blocks * 512
        assert before < g.entries_off + 16001 * (g.entry_nbytes + 19)  # (not the reserved tables)
        c.resize(max_entries=10000)
        assert (h[d.H_INDEX_SLOTS], h[d.H_MAX_ENTRIES], h[d.H_RESIZES]) == (14288, 10000, 1)
        grown = os.fstat(c._seg.fd).st_blocks * 512
        # (page rounding aside: what the first 1000 slots' pages already held)
        assert grown - before >= 0.95 * (9000 * (g.entry_nbytes + 8 + 8 + 3) + 12858 * g.index_slot_nbytes)
        assert all(c[f"k{i}"] == i.to_bytes(4, "little") for i in range(1000)) and c.verify().ok
        for i in range(1000, 10000):
            c[f"k{i}"] = i.to_bytes(4, "little")
        assert len(c) == 10000 and c.verify().ok
        c.resize(max_entries=1000)
        assert (h[d.H_INDEX_SLOTS], len(c)) == (1430, 1000) and c.verify().ok


def test_layout_golden_version_11_stripes(name):
    """Version 11: after the reader slots, on lines of their own, the stripes: word 0 the mask of the stripes the
    hold under way opened, then each of the 64 stripes' sequence words alone on a line; the arena after them, page
    aligned. A stripe is a run of the index in force's slots, 16 at least; a store opens its key's alone."""
    from shmcache.seqlock import stripe_of
    from .workers import entry_of

    assert d.LAYOUT_VERSION >= 11 and d.READ_VERSIONS[:5] == (7, 8, 9, 10, 11)
    assert (d.STRIPES, d.STRIPE_MIN_SHIFT, d.STRIPE_WORDS, d.S_OPEN, d.STRIPES_NBYTES) == (64, 4, 8, 0, 65 * 64)
    g = Geometry.for_capacity(2**20, 1000, version=11)
    assert g.stripes_off == g.readers_off + 256 * 256 and g.stripes_nbytes == 65 * 64
    assert g.arena_off == -(-(g.stripes_off + 65 * 64) // 4096) * 4096
    old = Geometry.for_capacity(2**20, 1000, version=10)
    assert old.stripes_nbytes == 0 and old.arena_off == -(-(old.readers_off + 256 * 256) // 4096) * 4096
    assert [stripe_of(s, 2**20 - 1) for s in (0, 2**14 - 1, 2**14, 2**20 - 1)] == [0, 0, 1, 63]
    assert [stripe_of(s, 63) for s in (0, 15, 16, 63)] == [0, 0, 1, 3]
    for policy in ("auto", "lru"):
        with SharedCache(f"{name}-{policy}", capacity_bytes=2**20, max_entries=1000, create=True,
                         policy=policy) as c:
            try:
                w = np.frombuffer(c._seg.stripe_words, dtype=np.int64)
                assert len(w) == 65 * 8 and not w.any()
                c["a"] = b"x"
                k = stripe_of(c._seg.records.slot[entry_of(c, "a")], c._seg.mask)
                if policy == "lru":  # nobody reads without the lock: nothing is opened
                    assert not w.any()
                else:  # one hold opened the key's stripe and closed it: nothing else moved
                    assert w[d.STRIPE_WORDS * (1 + k)] == 2 and w.sum() == 2
            finally:
                c.unlink()


def test_layout_golden_version_12_held_entries(name):
    """Version 12: the stripes region's first line holds, after the open mask, the held entries' list head, count
    and bytes (words 1-3), and a held entry's ``slot`` word is -1; the geometry is version 11's."""
    from .workers import entry_of

    assert d.LAYOUT_VERSION >= 12 and d.READ_VERSIONS[:6] == (7, 8, 9, 10, 11, 12)
    assert (d.S_HELD_FIRST, d.S_HELD, d.S_HELD_BYTES, d.HELD_SLOT) == (1, 2, 3, -1)
    g11, g12 = (Geometry.for_capacity(2**20, 1000, version=v) for v in (11, 12))
    assert (g11.stripes_off, g11.arena_off, g11.total_nbytes) == (g12.stripes_off, g12.arena_off, g12.total_nbytes)
    with SharedCache(name, capacity_bytes=2**20, max_entries=1000, create=True) as c:
        try:
            w = c._seg.stripe_words
            c["a"] = b"xyz"
            e = entry_of(c, "a")
            with c.view("a"):
                c["a"] = b"new"
                assert (w[1], w[2], w[3]) == (e, 1, len(encode_key("a")) + 1 + 3)  # (the key, the tagged value)
                assert c._seg.records.slot[e] == -1
        finally:
            c.unlink()


def test_layout_golden_version_13_ring_sized_for_every_slot(name):
    """Version 13: the regions are version 12's, and the ring has room for a block header per entry slot the tables
    reach, whatever the entry limit in force (12's followed the limit): a new max_entries leaves the ring's size as
    it is. The extent grows only as far as the limit needs (``extent_top``, 12's ring), and a lower limit lowers
    that top (the blocks slid below it, the memory past them given back)."""
    assert d.LAYOUT_VERSION >= 13 and d.READ_VERSIONS[:7] == (7, 8, 9, 10, 11, 12, 13)
    g12, g13 = (Geometry.for_capacity(2**20, 1000, version=v) for v in (12, 13))
    assert (g12.stripes_off, g12.arena_off, g12.total_nbytes) == (g13.stripes_off, g13.arena_off, g13.total_nbytes)
    most = g13.ring_nbytes(2**19, 1000)
    assert [g13.ring_nbytes(2**19, n) for n in (1, 10, 999)] == [most] * 3
    assert most == g12.ring_nbytes(2**19, 1000) and most - g12.ring_nbytes(2**19, 10) in range(
        990 * d.BLOCK_OVERHEAD - d.ALIGN, 990 * d.BLOCK_OVERHEAD + d.ALIGN)  # (12's followed the limit)
    assert [g13.extent_top(2**19, n) for n in (10, 1000)] == [g12.ring_nbytes(2**19, n) for n in (10, 1000)]
    with SharedCache(name, capacity_bytes=2**18, max_entries=100, create=True) as c:
        try:
            for i in range(300):
                c[f"k{i}"] = bytes(900)
            h, ring, top = c._seg.header_words, c._seg.ring(), c._seg.extent_top()
            assert c._seg.geometry.max_entries > 100 and top < ring and 0 < h[d.H_ARENA_EXTENT] <= top
            c.set_limits(max_entries=200)  # (a higher limit: every block where it was)
            words = [h[w] for w in (d.H_HEAD, d.H_TAIL, d.H_FILL, d.H_ARENA_EXTENT)]
            c.set_limits(max_entries=400)
            assert c._seg.ring() == ring and [h[w] for w in (d.H_HEAD, d.H_TAIL, d.H_FILL, d.H_ARENA_EXTENT)] == words
            c.set_limits(max_entries=20)
            assert c._seg.ring() == ring and c._seg.extent_top() < top
            assert h[d.H_TAIL] + h[d.H_FILL] < h[d.H_ARENA_EXTENT] <= c._seg.extent_top() + d.EXTENT_STEP
            assert c.stats().entries == 20 and c.verify(deep=True).ok
        finally:
            c.unlink()


def test_layout_golden_version_14_idle_region(name):
    """Version 14: after the stripes, the idle region: a line whose words 0 and 1 are the default time to idle and
    its checksum, then the ttis and deadlines columns, a word per entry slot each, on lines of their own; the arena
    after them, page aligned. Version 13 is 14 without the region. A store with a time to idle writes its tti, its
    deadline and its expiry (the earlier of the two); without one, zeros beside its expiry."""
    from shmcache import config
    from .workers import entry_of

    assert d.LAYOUT_VERSION >= 14 and d.READ_VERSIONS[:8] == (7, 8, 9, 10, 11, 12, 13, 14)
    assert (d.D_DEFAULT_TTI, d.D_TTI_CHECK, d.IDLE_HEAD_NBYTES, d.IDLE_SHARE) == (0, 1, 64, 8)
    g13, g14 = (Geometry.for_capacity(2**20, 1000, version=v) for v in (13, 14))
    end = g14.stripes_off + g14.stripes_nbytes
    assert (g13.stripes_off, g13.readers_off) == (g14.stripes_off, g14.readers_off) and g14.idle_off == end
    assert g14.ttis_off == end + 64 and g14.deadlines_off == -(-(g14.ttis_off + 8 * g14.entry_slots) // 64) * 64
    assert g14.arena_off == -(-(g14.deadlines_off + 8 * g14.entry_slots) // 4096) * 4096
    assert g13.arena_off == -(-end // 4096) * 4096 and g13.ttis_off == g13.deadlines_off == g13.idle_end == end
    shown = {off: (n, most) for off, n, most in g14.tables(16, 10)}
    assert shown[g14.ttis_off] == shown[g14.deadlines_off] == (80, 8 * g14.entry_slots)
    assert not {off for off, _, _ in g13.tables(16, 10)} & {g14.ttis_off, g14.deadlines_off}
    t = [0]
    with SharedCache(name, capacity_bytes=2**20, max_entries=1000, create=True, default_tti=3,
                     clock=lambda: t[0]) as c:
        try:
            idle = c._seg.idle_words
            assert (idle[0], idle[1]) == (3 * 10**9, config.tti_checksum(3 * 10**9))
            t[0] = 10**9
            c.put("both", b"x", ttl=2, tti=5)
            c.put("idle", b"x")  # (the default tti)
            c.put("none", b"x", tti=0)
            cols = c._seg.expires_words, c._seg.ttis_words, c._seg.deadlines_words
            words = {k: [col[entry_of(c, k)] for col in cols] for k in ("both", "idle", "none")}
            assert words == {"both": [3 * 10**9, 5 * 10**9, 3 * 10**9], "idle": [4 * 10**9, 3 * 10**9, 0],
                             "none": [0, 0, 0]}
        finally:
            c.unlink()


def test_layout_version_13_segment_has_no_idle_expiry(name, monkeypatch):
    """A segment of layout version 13 (no idle region) is attached and used on both paths as it is: a put with a
    time to idle is refused with a ValueError naming the version, one without stores as before, and a repair never
    rewrites it to version 14."""
    from .workers import laid_out_as, python_path

    laid_out_as(monkeypatch, 13)
    with SharedCache(name, capacity_bytes=2**20, max_entries=256, create=True) as c:
        c["old"] = b"kept"
    monkeypatch.undo()
    try:
        for path in ("compiled", "python"):
            with SharedCache(name, create=False) as c:
                if path == "python":
                    python_path(c)
                assert c._seg.version == 13 and c._seg.idle_words is None
                with pytest.raises(ValueError, match="version 13"):
                    c.put("k", 1, tti=5)
                c.put(path, 1, tti=0)
                c.put(path + "2", 2)
                assert c["old"] == b"kept" and c[path] == 1 and c.verify(repair_damage=True).ok
                assert c._seg.header_words[d.H_VERSION] == 13
        with pytest.raises(ValueError, match="default_tti"):
            SharedCache(name, default_tti=5)
    finally:
        SharedCache.unlink_name(name)


def test_layout_golden_version_17_index_of_any_size(name):
    """Version 17: the index has the fewest slots that keep it at most 0.7 full (the limit and the sentinel counted),
    not a power of two, and a key's home slot is its tag scaled to them, ``(tag * slots) >> 32``; a probe goes round
    from the last slot to the first, and a delete shifts a cluster back across that end. Both paths lay out the same
    words, each key at its place, and every key is found again (version 16: a power of two, the tag's low bits)."""
    from shmcache.codec import fingerprint
    from .workers import python_path

    assert d.LAYOUT_VERSION >= 17 and d.READ_VERSIONS[:11] == tuple(range(7, 18))
    assert [layout.index_for(n) for n in (1, 5, 100, 10**6)] == [8, 9, 145, 1428573]
    assert [layout.index_for(n, 16) for n in (1, 5, 100, 10**6)] == [8, 16, 256, 2097152]
    assert Geometry.for_capacity(2**20, 100).index_slots == 145
    # The ghost and auto's sketch, powers of two, keep the sizes of version 16 for every limit (2**k - 1 included)
    for policy in (d.POLICY_S3FIFO, d.POLICY_AUTO):
        g16, g17 = (Geometry.for_capacity(2**20, 10, policy, v) for v in (16, 17))
        limits = [*range(1, 3000), *(2**k + j for k in range(3, 31) for j in (-2, -1, 0, 1)), 2**31 - 2]
        assert [g17.ghost_for(layout.index_for(m)) for m in limits] == [g16.ghost_for(layout.index_for(m, 16))
                                                                         for m in limits]
        assert all(g17.limit_for(layout.index_for(m)) >= m for m in limits)
    assert Geometry.for_capacity(2**20, 100, 0, 16).index_slots == 256
    n, keys = 145, []
    for i in range(200000):  # keys whose home is one of the index's last two slots or its first: clusters that wrap
        if (fingerprint(encode_key(f"w{i}")) & 0xFFFFFFFF) * n >> 32 in (n - 2, n - 1, 0):
            keys.append(f"w{i}")
            if len(keys) == 12:
                break
    caches = [SharedCache(f"{name}{p}", capacity_bytes=2**20, max_entries=100, create=True) for p in "cp"]
    try:
        python_path(caches[1])
        for c in caches:
            assert c._seg.version >= 17 and c._seg.mask + 1 == n
            for i, k in enumerate(keys):
                c[k] = i
            for k in keys[::3]:
                del c[k]
            for i, k in enumerate(keys):
                assert c.get(k) == (None if i % 3 == 0 else i)
            assert c.verify().ok
            ix = np.asarray(c._ix[:n])
            held = ix[ix != 0]
            assert len(held) == 8 and {int(w & 0xFFFFFFFF) * n >> 32 for w in held} <= {n - 2, n - 1, 0}
            assert ix[0] != 0 and ix[n - 1] != 0  # (the cluster crosses the end)
        assert np.array_equal(np.asarray(caches[0]._ix[:n]), np.asarray(caches[1]._ix[:n]))
    finally:
        for c in caches:
            c.unlink()
            c.close()


def test_layout_golden_version_15_index_slots(name):
    """Version 15: an index slot is one little-endian word, the entry slot in its high 32 bits and the key's
    fingerprint's low 32 bits below (its tag and its home slot's bits), 0 when empty; 8 bytes a slot where 14 has 16.
    Written so on both paths, and a delete empties the slot."""
    from shmcache.codec import fingerprint
    from .workers import entry_of, python_path

    assert d.LAYOUT_VERSION >= 15 and d.READ_VERSIONS[:9] == (7, 8, 9, 10, 11, 12, 13, 14, 15)
    assert layout.INDEX_SLOT_PACKED.fields["fp"][1:] == (0,) and layout.INDEX_SLOT_PACKED.fields["entry"][1:] == (4,)
    assert (d.PACKED_ENTRY_SHIFT, d.PACKED_TAG_MASK) == (32, 2**32 - 1)
    g14, g15 = (Geometry.for_capacity(2**20, 1000, version=v) for v in (14, 15))
    assert (g14.index_slot_nbytes, g15.index_slot_nbytes) == (16, 8) and g15.index_slots == g14.index_slots
    assert g15.entries_off == -(-(g15.index_off + 8 * g15.index_slots) // 64) * 64
    with SharedCache(name, capacity_bytes=2**20, max_entries=1000, create=True) as c:
        try:
            for path in ("compiled", "python"):
                if path == "python":
                    python_path(c)
                c.put(path, b"x")
                kb = encode_key(path)
                fp, e, mask = fingerprint(kb), entry_of(c, path), c._seg.mask
                s = c._seg.records.slot[e]
                home = index.of(c._seg.geometry).home(fp, mask)
                assert s == home and c._ix[s] == (e << 32) | (fp & 0xFFFFFFFF)  # (no other key: at home)
                del c[path]
                assert c._ix[s] == 0
            assert c.verify().ok
        finally:
            c.unlink()


@pytest.mark.parametrize("policy", ["lru", "auto"])
def test_layout_version_14_segment_keeps_its_two_word_index(name, monkeypatch, policy):
    """A segment of layout version 14 (index slots of two words) is attached and used on both paths as it is, the
    reads without the lock included: what it holds is found, stores, deletes and a resize that rebuilds its index
    write two-word slots, verify finds nothing wrong, and it is never rewritten to version 15."""
    from .workers import laid_out_as, python_path

    laid_out_as(monkeypatch, 14)
    with SharedCache(name, capacity_bytes=2**20, max_entries=256, create=True, policy=policy) as c:
        for i in range(100):
            c[f"old{i}"] = i
    monkeypatch.undo()
    try:
        for path in ("compiled", "python"):
            with SharedCache(name, create=False) as c:
                if path == "python":
                    python_path(c)
                assert c._seg.version == 14 and c._seg.geometry.index_slot_nbytes == 16
                assert all(c.get(f"old{i}") == (i if path == "compiled" else None) for i in range(50))
                assert all(c[f"old{i}"] == i for i in range(50, 100))
                for i in range(50):
                    c[f"{path}{i}"] = i
                    c.pop(f"old{i}", None)
                c.resize(max_entries=2000 if path == "compiled" else 256)  # (the index rebuilt at another size)
                assert all(c.get(f"old{i}") is None for i in range(50))
                assert all(c[f"old{i}"] == i for i in range(50, 100)) and all(c[f"{path}{i}"] == i for i in range(50))
                assert c.verify().ok and c._seg.header_words[d.H_VERSION] == 14
                _, index_arr, _ = c._seg.arrays()
                assert index_arr.dtype == layout.INDEX_SLOT and (index_arr["entry"] != 0).sum() == len(c)
    finally:
        SharedCache.unlink_name(name)


def test_layout_version_11_segment_refuses_to_replace_a_viewed_entry(name, monkeypatch):
    """A segment of layout version 11 may be shared with processes of the release before, which know no held
    entries: on it a put or delete of a key a view pins is refused (PinnedError), on both paths, as it was."""
    from shmcache import PinnedError
    from .workers import python_path

    from .workers import laid_out_as

    laid_out_as(monkeypatch, 11)
    with SharedCache(name, capacity_bytes=2**20, max_entries=256, create=True) as c:
        c["old"] = b"kept"
    monkeypatch.undo()
    for path in ("compiled", "python"):
        with SharedCache(name, create=False) as c:
            if path == "python":
                python_path(c)
            assert c._seg.version == 11 and not c._seg.holds
            with c.view("old"):
                with pytest.raises(PinnedError):
                    c["old"] = b"new"
                with pytest.raises(PinnedError):
                    del c["old"]
            assert c["old"] == b"kept" and c.stats().held_entries == 0 and c.verify().ok
    SharedCache.unlink_name(name)


def test_layout_version_10_segment_reads_against_seq_alone(name, monkeypatch):
    """A segment of layout version 10 has no stripes: it is attached and used on both paths, its writers open
    ``seq`` where version 11's open a stripe (so that a process of the older release reads it right), gets read
    without the lock against ``seq`` alone, and a repair never rewrites it to version 11."""
    from .workers import python_path

    g = _old_segment(name, monkeypatch, 10, capacity_bytes=2**20, max_capacity_bytes=2**21)
    assert g.version == 10 and g.stripes_nbytes == 0
    for path in ("compiled", "python"):
        with SharedCache(name, create=False) as c:
            if path == "python":
                python_path(c)
            h = c._seg.header_words
            assert c._seg.version == 10 and c._seg.stripe_words is None and c.policy == "auto"
            before = h[d.H_SEQ]
            c[path] = b"v" * 100
            assert h[d.H_SEQ] == before + 2  # the store's one hold opened seq and closed it
            assert c["old"] == b"kept" and c[path] == b"v" * 100 and c.verify().ok
    with SharedCache(name, create=False) as c:
        before = c.stats()
        assert [c.get(k) for k in ("old", "compiled", "python", "none")] == [b"kept", b"v" * 100, b"v" * 100, None]
        s = c.stats()
        assert (s.hits - before.hits, s.misses - before.misses) == (3, 1)
        if c._core is not None:  # read without the lock, validated by seq
            assert s.unlocked_reads - before.unlocked_reads == 4 and s.read_fallbacks == before.read_fallbacks
        c._seg.header_words[d.H_DIRTY] = 1
        assert c.verify(repair_damage=True) is not None
        assert c._seg.header_words[d.H_VERSION] == 10 and c.verify().ok


def _old_tables(monkeypatch) -> None:
    """Segments made from here on are laid out as version 10 laid them out (no stripes) and reserve their tables
    for their own max_entries, all of them backed and the whole index in force: as versions 9 and before made them
    (see ``_as_made_by``)."""
    import shmcache.cache

    monkeypatch.setattr(shmcache.cache, "RESERVE_FACTOR", 1)
    made = layout.Geometry.for_capacity.__func__

    def as_version_10(cls, capacity_bytes, max_entries, policy=0, version=10):
        return made(cls, capacity_bytes, max_entries, policy, version)

    monkeypatch.setattr(layout.Geometry, "for_capacity", classmethod(as_version_10))


def test_layout_version_9_segment_is_used_and_resized_within_its_tables(name, monkeypatch):
    """A segment of layout version 9 (tables fixed at creation, its whole index in force) is attached and used on
    both paths, resized within its tables, refused past them, and never rewritten to version 10, not even by a
    repair."""
    from .workers import python_path

    g = _old_segment(name, monkeypatch, 9, capacity_bytes=2**20, max_capacity_bytes=2**22)
    for path in ("compiled", "python"):
        with SharedCache(name, create=False) as c:
            if path == "python":
                python_path(c)
            h = c._seg.header_words
            assert c._seg.version == 9 and c._seg.mask + 1 == g.index_slots
            assert path == "python" or c["old"] == b"kept"  # (the first handle: as the old release left it)
            for i in range(300):
                c[f"{path}{i}"] = bytes([i % 256]) * 1000
            assert c.verify().ok and len(c) == 256
            c.resize(capacity_bytes=2**21, max_entries=100)
            assert len(c) == 100 and c.verify().ok and h[d.H_INDEX_SLOTS] == g.index_slots
            c.set_limits(max_entries=256)
            with pytest.raises(ValueError, match="256 entries"):
                c.resize(max_entries=257)
            h[d.H_DIRTY] = 1
            assert c.verify(repair_damage=True) is not None
            assert (h[d.H_VERSION], h[d.H_INDEX_SLOTS]) == (9, g.index_slots) and c.verify().ok


def _old_segment(name: str, monkeypatch, version: int, **sizes):
    """A segment of 256 entries holding ``old``, made as layout ``version`` made it (``_old_tables``,
    ``_as_made_by``); its geometry."""
    _old_tables(monkeypatch)
    with SharedCache(name, max_entries=256, create=True, **sizes) as c:
        g = c._seg.geometry
        c["old"] = b"kept"
        _as_made_by(c, version)
    monkeypatch.undo()
    return g


def _as_made_by(c, version: int) -> None:
    """Rewrite ``c``'s segment (made with max_capacity_bytes equal to its capacity, and its tables as version 9
    made them: ``_old_tables``) as layout ``version`` (10, 9, 8 or 7) made it: 8 and 7 without a capacity word, their
    configuration checksums of three words; 7 also with every page backed."""
    from shmcache import config

    h = c._seg.header_words
    if version >= 9:
        h[d.H_VERSION] = version
        return
    config.write(h, h[d.H_DEFAULT_TTL], h[d.H_MAX_ENTRIES], h[d.H_MAX_RETAINED], 0)
    if version == 7:
        os.posix_fallocate(c._seg.fd, 0, c._seg.geometry.total_nbytes)
        h[d.H_ARENA_EXTENT] = 0
    h[d.H_VERSION] = version


def test_layout_version_8_segment_is_used_as_it_is_and_not_resized(name, monkeypatch):
    _old_segment(name, monkeypatch, 8, capacity_bytes=2**20, max_capacity_bytes=2**20)
    with SharedCache(name, create=False) as c:
        assert c._seg.version == 8 and c.capacity_bytes == 2**20 and c["old"] == b"kept"
        for i in range(300):
            c[f"k{i}"] = bytes([i % 256]) * 5000  # the arena grows as version 8 grows it
        assert c.verify().ok and c._seg.header_words[d.H_CAPACITY] == 0
        with pytest.raises(ValueError, match="older release"):
            c.resize(capacity_bytes=2**19)
        c._seg.header_words[d.H_DIRTY] = 1
        assert c.verify(repair_damage=True) is not None
        h = c._seg.header_words
        assert (h[d.H_VERSION], h[d.H_CAPACITY]) == (8, 0) and c.verify().ok


def test_layout_version_7_segment_is_used_as_it_is(name, monkeypatch):
    """A segment of layout version 7 (its arena all reserved at creation, ``arena_extent`` 0) is attached and used
    on both paths, its whole arena shown, and never rewritten to version 8, not even by a repair."""
    from .workers import python_path

    g = _old_segment(name, monkeypatch, 7, capacity_bytes=2 * 2**20, max_capacity_bytes=2 * 2**20)
    for path in ("compiled", "python"):
        with SharedCache(name, create=False) as c:
            if path == "python":
                python_path(c)
            assert c._seg.version == 7 and c._seg.shown[0] == g.arena_nbytes
            assert c["old"] == b"kept"
            for i in range(200):
                c[f"{path}{i}"] = bytes([i]) * 8000  # past any extent: a version-7 arena never grows
            for i in range(200):
                assert c.get(f"{path}{i}") in (None, bytes([i]) * 8000)
            c._seg.header_words[d.H_DIRTY] = 1  # a repair too
            assert c.verify(repair_damage=True) is not None
            assert c._seg.header_words[d.H_VERSION] == 7 and c._seg.header_words[d.H_ARENA_EXTENT] == 0


@pytest.mark.parametrize("version", [15, 16, 17])
def test_layout_version_16_halves_autos_sketch(name, monkeypatch, version):
    """Version 16: auto's sketch (the ghost region) has half as many words as the index has slots, one word (16
    counters) an entry of the limit at least, as Caffeine sizes its sketch, and a page at least; version 15's has
    as many, and a segment of 15 keeps it. Both paths count lookups in the sketch in force, and in no word past it."""
    from .workers import laid_out_as, python_path

    g15, g16 = (Geometry.for_capacity(2**20, 1000, d.POLICY_AUTO, v) for v in (15, 16))
    assert (g15.ghost_slots, g16.ghost_slots, g16.index_slots) == (2048, 1024, 2048)
    assert g16.ghost_for(4096) == 2048 and g15.ghost_for(4096) == 4096 and g15.ghost_for(8) == d.GHOST_WAYS
    assert g16.ghost_for(8) == g16.ghost_for(1024) == d.SKETCH_MIN_WORDS == 512  # (a small cache's: a page)
    s3 = Geometry.for_capacity(2**20, 1000, d.POLICY_S3FIFO, 16)
    assert s3.ghost_slots == s3.index_slots == 2048  # (s3fifo's ghost is as large as it was)
    g17 = Geometry.for_capacity(2**20, 1000, d.POLICY_AUTO, 17)  # (the power of two of version 16's index, halved)
    assert (g17.index_slots, g17.ghost_slots, g17.ghost_for(8)) == (1430, 1024, 512)
    if version < d.LAYOUT_VERSION:
        laid_out_as(monkeypatch, version)
    with SharedCache(name, capacity_bytes=2**20, max_entries=1000, create=True, policy="auto") as c:
        monkeypatch.undo()
        try:
            words = np.frombuffer(c._seg._ghost_all, dtype=np.int64)
            live = 2048 if version == 15 else 1024
            assert c._seg.version == version and len(c._seg.ghost_words) == live < len(words)  # (for resizes)
            for path in ("compiled", "python"):
                if path == "python":
                    python_path(c)
                before = words.copy()
                for i in range(3000):
                    if c.get(f"{path}{i % 1500}") is None:
                        c[f"{path}{i % 1500}"] = i
                touched = np.flatnonzero(words != before)
                assert len(touched) and touched.max() < live and touched.max() >= live // 2, path
        finally:
            c.unlink()
