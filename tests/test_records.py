"""The entry records' two formats (records.py): narrow (32 bytes, layout 19 where the arena is below 32 GiB) and wide
(64 bytes, every earlier layout and a larger arena). A cache of either serves on both paths, a repair finds what
a narrow record no longer keeps (its fingerprint) in the index, and the default reserve keeps a cache narrow."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shmcache import SharedCache
from shmcache.layout.geometry import narrow_reserve
from shmcache.codec import encode_key, fingerprint
from shmcache.layout import Geometry
from shmcache.layout import dtypes as d
from shmcache.records import Records, narrow_pfp

from .workers import check_value, laid_out_as, make_value, python_path

pytestmark = pytest.mark.timeout(120)
MIB, GIB = 2**20, 2**30


def _serve(c: SharedCache, other: SharedCache, keys: list, seed: int) -> dict:
    """Random puts, gets, deletes and limit changes through two handles of one cache (the second on the Python
    path), every value read checked against its key; what each key holds last."""
    rng, last = random.Random(seed), {}
    for i in range(4000):
        h = c if rng.random() < 0.5 else other
        k = rng.choice(keys)
        r = rng.random()
        if r < 0.45:
            h.put(k, make_value(k, i, rng.randrange(1, 300)))
            last[k] = i
        elif r < 0.9:
            v = h.get(k)
            if v is not None:
                check_value(k, v)
        else:
            h.delete(k)
            last.pop(k, None)
        if i % 1000 == 999:
            h.resize(max_entries=rng.choice([200, 400, 1600]))
    return last


@pytest.mark.parametrize("policy", ["lru", "auto", "s3fifo", "keep"])
def test_records_a_new_cache_is_narrow_and_serves_on_both_paths(name, policy):
    with SharedCache(name, capacity_bytes=MIB, max_entries=400, create=True, policy=policy) as c, \
            SharedCache(name) as other:
        g = c._seg.geometry
        assert (g.version, g.narrow, g.entry_nbytes, c._seg.records.nbytes) == (d.LAYOUT_VERSION, True, 32, 32)
        python_path(other)
        _serve(c, other, [f"k{i}" for i in range(600)], seed=1)
        assert c.verify(deep=True).ok and other.verify(deep=True).ok


@pytest.mark.parametrize("policy", ["lru", "auto"])
def test_records_an_arena_past_32_gib_keeps_wide_records(name, policy):
    """A reserve beyond a narrow offset's reach (32 GiB) makes wide records in the newest layout: the file is
    sparse, so the reserve costs address space only."""
    with SharedCache(name, capacity_bytes=MIB, max_capacity_bytes=40 * GIB, max_entries=400, create=True,
                     policy=policy) as c, SharedCache(name) as other:
        g = c._seg.geometry
        assert (g.version, g.narrow, g.entry_nbytes, c._seg.records.fp is not None) == (d.LAYOUT_VERSION, False, 64,
                                                                                        True)
        python_path(other)
        _serve(c, other, [f"k{i}" for i in range(600)], seed=2)
        assert c.verify(deep=True).ok and other.verify(deep=True).ok


def test_records_a_version_18_segment_is_used_as_it_is(name, monkeypatch):
    laid_out_as(monkeypatch, 18)
    with SharedCache(name, capacity_bytes=MIB, max_entries=400, create=True, policy="auto") as c:
        monkeypatch.undo()
        with SharedCache(name) as other:
            assert c._seg.version == other._seg.version == 18 and not other._seg.geometry.narrow
            python_path(other)
            _serve(c, other, [f"k{i}" for i in range(600)], seed=3)
            assert c.verify(deep=True).ok and other.verify(deep=True).ok


def test_records_the_default_reserve_keeps_the_records_narrow(name):
    """Without max_capacity_bytes, the reserve (16 times the capacity, at most 1 TiB) is lowered to what narrow
    records reach; a reserve asked for is kept, wide if need be; a capacity past their reach is wide whatever."""
    entries = 16 * 32768
    for capacity in (32 * MIB, GIB, 8 * GIB):
        reserve = narrow_reserve(capacity, min(16 * capacity, 2**40), entries, 0)
        assert Geometry.for_capacity(reserve, entries).narrow
        assert reserve == 16 * capacity if capacity <= GIB else 30 * GIB < reserve < 32 * GIB
    assert narrow_reserve(40 * GIB, 640 * GIB, entries, 0) == 640 * GIB
    with SharedCache(name, capacity_bytes=4 * GIB, create=True) as c:
        assert c._seg.geometry.narrow and 30 * GIB < c.max_capacity_bytes < 32 * GIB


@pytest.mark.parametrize("narrow", [True, False])
def test_records_a_repair_finds_entries_the_index_names_elsewhere(name, narrow):
    """A holder killed between the two copies of a reindex leaves entries whose records name slots the new index
    gave to others: the repair keeps every one (a wide record by its fingerprint, a narrow one by the tag of the
    slot that names it), and each reads back as stored."""
    keys = [f"k{i}" for i in range(300)]
    reserve = {} if narrow else {"max_capacity_bytes": 40 * GIB}
    with SharedCache(name, capacity_bytes=MIB, max_entries=400, create=True, **reserve) as c:
        rec = c._seg.records
        assert rec.narrow is narrow
        for k in keys:
            c.put(k, make_value(k, 0, 50))
        live = [e for e in range(1, c._seg.slots_shown) if rec.check[e]]
        slots = [rec.slot[e] for e in live]
        for e, s in zip(live, slots[1:] + slots[:1]):  # each names another's slot
            rec.slot[e] = s
        recoveries = c.stats().recoveries
        c._h[d.H_DIRTY] = 1  # (the next call repairs first)
        assert c.verify(deep=True).ok and c.stats().recoveries == recoveries + 1 and len(c) == len(keys)
        for k in keys:
            check_value(k, c.get(k))


def test_records_the_formats_fields():
    """Each field is its own view of the dtype's field, a narrow link keeps a damaged header word's low 32 bits as
    the compiled section's store does, and a value out of a narrow field's range is refused, never truncated."""
    for dtype, narrow in ((d.ENTRY, False), (d.ENTRY_NARROW, True)):
        mem = bytearray(4 * dtype.itemsize)
        rec = Records(memoryview(mem), narrow)
        rows = np.ndarray((4,), dtype, buffer=mem)
        rec.write(2, 1, 3, 12345, 4096, 7, 9, -1, 77)
        assert rec.links(2) == (1, 3, 4096, 7, 9, -1) and rec.check[2] == 77 and rec.column("off", 4)[2] == 4096
        assert (rows["prev"][2], rows["next"][2], rows["slot"][2], rows["check"][2]) == (1, 3, -1, 77)
        assert rows["off"][2] << rec.osh == 4096 and rec.off[2] << rec.osh == 4096
        rec.copy(2, 3)
        assert bytes(mem[3 * dtype.itemsize :]) == bytes(mem[2 * dtype.itemsize : 3 * dtype.itemsize])
        assert rec.link(2**40 + 5) == (5 if narrow else 2**40 + 5) and rec.link(-1) == -1
        if narrow:
            assert rec.fp is None
            with pytest.raises((ValueError, OverflowError)):
                rec.prev[1] = 2**31
            with pytest.raises((ValueError, OverflowError)):
                rec.vlen[1] = -1
        else:
            assert rows["fp"][2] == rec.fp[2] == 12345


def test_records_a_narrow_policy_fingerprint_is_its_tags():
    """What a narrow segment's sketch and ghost know a key by depends on its tag alone (the index slot keeps no more),
    spread over 63 bits."""
    fps = [fingerprint(encode_key(f"k{i}")) for i in range(1000)]
    spread = [narrow_pfp(fp) for fp in fps]
    assert all(narrow_pfp(fp & d.PACKED_TAG_MASK) == p for fp, p in zip(fps, spread))
    assert all(0 <= p < 2**63 for p in spread) and len({p >> 32 for p in spread}) > 990


def test_records_release_leaves_a_view_an_array_still_exports():
    """Closing a segment releases the records' views; one an array of ``rows`` still exports is left to that array
    (the mapping goes with it), never an error from close()."""
    mem = bytearray(4 * d.ENTRY_NARROW.itemsize)
    rec = Records(memoryview(mem), True)
    rows = rec.rows(4)
    rec.release()
    rows["check"][1] = 5  # (the array still reads and writes its memory)
    assert int.from_bytes(mem[32 + 24 : 32 + 32], "little") == 5
    with pytest.raises(ValueError):
        rec.check[1]  # (the field's view is released)


@pytest.mark.parametrize("narrow", [True, False])
def test_records_a_repair_cut_short_leaves_the_index_it_judged_by(name, narrow, monkeypatch):
    """A repair killed while it rebuilds the index (here: an exception after a third of the entries) leaves the
    index it judged the entries by, so that the next repair keeps every entry: a narrow record's key is judged by
    the tag of a slot that names it, which an emptied index would have lost."""
    from shmcache import index, verify

    keys = [f"k{i}" for i in range(300)]
    reserve = {} if narrow else {"max_capacity_bytes": 40 * GIB}
    with SharedCache(name, capacity_bytes=MIB, max_entries=400, create=True, **reserve) as c:
        assert c._seg.records.narrow is narrow
        for k in keys:
            c.put(k, make_value(k, 0, 50))
        xo = index.of(c._seg.geometry)
        real, calls = xo.insert, [0]

        def cut(*args):
            calls[0] += 1
            if calls[0] > 100:
                raise RuntimeError("cut short")
            real(*args)

        monkeypatch.setattr(xo, "insert", staticmethod(cut))
        with pytest.raises(RuntimeError):
            c._guard.run(verify.repair, c._seg)
        monkeypatch.undo()
        assert calls[0] == 101
        c._h[d.H_DIRTY] = 1  # (as a holder killed there leaves it: the next call repairs)
        assert c.verify(deep=True).ok and len(c) == len(keys)
        for k in keys:
            check_value(k, c.get(k))
