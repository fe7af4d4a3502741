"""index, lru and arena on plain memory: no shared memory, no lock."""

from __future__ import annotations

import mmap
import random

import pytest

from shmcache import index, lru
from shmcache.arena import Arena, block_nbytes
from shmcache.errors import CorruptionError
from shmcache.layout import EMPTY, SENTINEL
from shmcache.layout.dtypes import ENTRY, ENTRY_NARROW, H_ARENA_USED, H_FILL, HEADER_WORDS
from shmcache.records import Records


def words(n: int):
    return memoryview(bytearray(8 * n)).cast("q")


def table(n: int, narrow: bool = False) -> Records:
    """An entry table of ``n`` records (wide, or narrow) on plain memory."""
    return Records(memoryview(bytearray((ENTRY_NARROW if narrow else ENTRY).itemsize * n)), narrow)


def lru_order(rec: Records) -> list[int]:
    out, cur = [], rec.next[SENTINEL]
    while cur != SENTINEL:
        out.append(cur)
        cur = rec.next[cur]
    back, cur = [], rec.prev[SENTINEL]
    while cur != SENTINEL:
        back.append(cur)
        cur = rec.prev[cur]
    assert back == out[::-1]
    return out


@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
def test_lru_push_move_unlink(narrow):
    rec = table(8, narrow)
    for e in (1, 2, 3):
        lru.push_front(rec, e)
    assert lru_order(rec) == [3, 2, 1] and lru.tail(rec) == 1
    lru.move_to_front(rec, 1)
    assert lru_order(rec) == [1, 3, 2]
    lru.move_to_front(rec, 1)  # already first: unchanged
    assert lru_order(rec) == [1, 3, 2]
    lru.unlink(rec, 3)
    assert lru_order(rec) == [1, 2]
    lru.unlink(rec, 1)
    lru.unlink(rec, 2)
    assert lru_order(rec) == [] and lru.tail(rec) == SENTINEL


def _index_setup(slots: int, entries: int, xo=index.Wide):
    return words((1 if xo.packed else 2) * slots), table(entries), slots - 1


def _slot(xo, ix, s: int) -> tuple[int, int]:
    """(the fingerprint's bits slot ``s`` keeps, its entry), read from the raw words as the layout lays them out."""
    if xo.packed:
        return ix[s] & 0xFFFFFFFF, ix[s] >> 32
    return ix[2 * s], ix[2 * s + 1]


@pytest.mark.parametrize("xo", [index.Wide, index.Packed, index.Ranged], ids=["wide", "packed", "ranged"])
def test_index_insert_remove_with_collisions_keeps_every_key_reachable(xo):
    rng = random.Random(3)
    n = 45 if xo is index.Ranged else 64  # (version 17's index: any number of slots)
    ix, rec, mask = _index_setup(n, 40, xo)
    live: dict[int, int] = {}
    # Few distinct home slots: long clusters, wrap-around, and backward shifts across them. (Fingerprints above 2**32
    # too: a one-word slot keeps their low 32 bits, which must still say the home slot.)
    if xo is index.Ranged:  # a tag whose home, scaled to the slots, is one of the four
        homes = {e: rng.choice([5, 6, n - 2, n - 1]) for e in range(1, 32)}
        fps = {e: -(-(h << 32) // n) + rng.randrange((1 << 32) // n - 1) + (rng.randrange(2**30) << 32)
               for e, h in homes.items()}
        assert all(xo.home(fps[e], mask) == h for e, h in homes.items())
    else:
        fps = {e: rng.choice([5, 6, 62, 63]) + 64 * rng.randrange(2**30) for e in range(1, 32)}
    for _ in range(2000):
        e = rng.randrange(1, 32)
        if e in live:
            xo.remove(ix, rec, mask, rec.slot[e])
            del live[e]
        else:
            xo.insert(ix, rec, mask, fps[e], e)
            live[e] = fps[e]
        for le, fp in live.items():
            s = rec.slot[le]
            assert _slot(xo, ix, s) == ((fp & 0xFFFFFFFF) if xo.packed else fp, le)
            assert xo.entry(ix, s) == le and xo.names(ix, s, le, fp) and not xo.names(ix, s, le, fp + 1)
            # Reachable: the probe from the home slot meets it before any empty slot.
            p = xo.home(fp, mask)
            while p != s:
                assert _slot(xo, ix, p)[1] != EMPTY
                p = p + 1 if p < mask else 0
        assert sum(_slot(xo, ix, s)[1] != EMPTY for s in range(n)) == len(live)


def test_index_packed_slot_tells_keys_apart_by_the_entry_fingerprint():
    """A one-word slot keeps 32 bits of the fingerprint: a key whose fingerprint has the same low bits is told apart
    by its entry's whole fingerprint, before its bytes are compared."""
    mm = bytearray(4096)
    ix, rec, mask = _index_setup(16, 4, index.Packed)
    fp = 7 + (1 << 40)
    rec.fp[1], rec.klen[1], rec.vlen[1], rec.off[1] = fp, 1, 1, 0
    mm[8 + 1] = ord("k")  # (the key after the block's header and its 1-byte value)
    index.Packed.insert(ix, rec, mask, fp, 1)
    assert index.Packed.find(ix, rec, mm, 0, mask, fp, b"k") == 1
    assert index.Packed.find(ix, rec, mm, 0, mask, 7 + (2 << 40), b"k") == EMPTY  # same tag, another fingerprint
    assert index.Packed.find(ix, rec, mm, 0, mask, fp, b"j") == EMPTY


@pytest.mark.parametrize("xo", [index.Wide, index.Packed], ids=["wide", "packed"])
def test_index_full_table_raises_instead_of_looping(xo):
    ix, rec, mask = _index_setup(8, 16, xo)
    for e in range(1, 9):
        xo.insert(ix, rec, mask, e, e)
    with pytest.raises(CorruptionError):
        xo.insert(ix, rec, mask, 99, 9)
    with pytest.raises(CorruptionError):
        xo.find(ix, rec, b"", 0, mask, 12345, b"k")


def _arena(nbytes: int, slots: int, narrow: bool = False):
    h, rec = words(HEADER_WORDS), table(slots, narrow)
    mm = mmap.mmap(-1, nbytes)
    return h, rec, mm, Arena(h, rec, mm, 0, nbytes, slots)


def _free(ar, rec, live: dict, free: list, e: int) -> None:
    """Entry ``e``'s block freed in the arena ``ar`` and the entry dropped, as a remove does for the cache."""
    ar.free(rec.off[e] << rec.osh, block_nbytes(len(live[e])), e)
    rec.check[e] = 0
    del live[e]
    free.append(e)


@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
def test_arena_churn_compacts_and_preserves_live_blocks(narrow):
    rng = random.Random(7)
    size, slots = 4096, 64
    h, rec, mm, ar = _arena(size, slots, narrow)
    live: dict[int, bytes] = {}
    free = list(range(1, slots))
    for _ in range(5000):
        if live and (rng.random() < 0.5 or not free):
            _free(ar, rec, live, free, rng.choice(list(live)))
            continue
        payload = bytes([rng.randrange(256)]) * rng.randrange(1, 300)
        nb = block_nbytes(len(payload))
        while live and h[H_ARENA_USED] + nb > size:  # what eviction does for the cache
            _free(ar, rec, live, free, next(iter(live)))
        e = free.pop()
        off = ar.alloc(nb, e)
        rec.off[e], rec.check[e] = off >> rec.osh, 1
        rec.klen[e], rec.vlen[e] = 0, len(payload)
        mm[off + 8 : off + 8 + len(payload)] = payload
        live[e] = payload
        # Every live block is intact wherever the cleaner moved it, and none overlap.
        spans = sorted((rec.off[x] << rec.osh, block_nbytes(len(p))) for x, p in live.items())
        for (a, n), (b, _) in zip(spans, spans[1:]):
            assert a + n <= b
        for x, p in live.items():
            o = rec.off[x] << rec.osh
            assert mm[o + 8 : o + 8 + len(p)] == p
        assert h[H_ARENA_USED] == sum(n for _, n in spans) <= h[H_FILL] <= size
    ar.close()
    mm.close()


@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
def test_arena_compact_slides_runs_down_around_pinned_blocks(narrow):
    """Arena.compact after random churn, some blocks pinned: every live block keeps its bytes, in address order,
    the unpinned ones slid down end to end (a run of adjacent blocks moved in one piece) and each pinned one where it
    was, a dead block over the gap before it; the ring is [0, end), and every entry's offset names its block."""
    from shmcache.layout.dtypes import H_HEAD, H_TAIL

    for seed in range(40):
        rng = random.Random(seed)
        size, slots = 8192, 96
        pins = bytearray(slots)
        h, rec, mm = words(HEADER_WORDS), table(slots, narrow), mmap.mmap(-1, size)
        ar = Arena(h, rec, mm, 0, size, slots, pins=pins, pinned=lambda e: bool(pins[e]))
        live: dict[int, bytes] = {}
        free = list(range(slots - 1, 0, -1))
        for _ in range(rng.randrange(20, 200)):
            if live and rng.random() < 0.4:
                _free(ar, rec, live, free, rng.choice(list(live)))
                continue
            payload = bytes([rng.randrange(1, 256)]) * rng.randrange(1, 120)
            nb = block_nbytes(len(payload))
            if not free or h[H_ARENA_USED] + nb > size // 2:
                continue
            e = free.pop()
            off = ar.alloc(nb, e)
            rec.off[e], rec.check[e], rec.klen[e], rec.vlen[e] = off >> rec.osh, 1, 0, len(payload)
            mm[off + 8 : off + 8 + len(payload)] = payload
            live[e] = payload
        for e in live:
            pins[e] = rng.random() < 0.15
        was = {e: rec.off[e] << rec.osh for e in live}
        # The reference: each block in address order lands where the one before it ended, a pinned one stays.
        expected, pos = {}, 0
        for e in sorted(live, key=was.get):
            expected[e] = was[e] if pins[e] else pos
            pos = expected[e] + block_nbytes(len(live[e]))
        end = ar.compact(size, slots)
        assert end == pos and (h[H_TAIL], h[H_FILL]) == (0, pos) and h[H_HEAD] == (0 if pos == size else pos)
        for e, payload in live.items():
            o = rec.off[e] << rec.osh
            assert o == expected[e], (seed, e)
            assert mm[o + 8 : o + 8 + len(payload)] == payload and ar.words[o >> 3] == block_nbytes(len(payload)) | (
                e << 32)
        ar.close()
        mm.close()


def test_arena_alloc_on_garbage_raises():
    h, rec, mm, ar = _arena(1024, 8)
    off = ar.alloc(512, 1)
    rec.off[1], rec.check[1] = off >> rec.osh, 1
    ar.words[off >> 3] = 3  # an impossible block length where the cleaner will look
    with pytest.raises(CorruptionError):
        ar.alloc(1000, 2)
    ar.close()
    mm.close()


def test_arena_dead_span_beyond_4_gib_is_split_into_headers_that_fit():
    from shmcache.arena import write_dead
    from shmcache.layout import MAX_BLOCK_NBYTES

    nbytes = 5 * 2**30  # virtual only: the pages written are the two headers
    mm = mmap.mmap(-1, nbytes + 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
    words = memoryview(mm).cast("q")
    try:
        write_dead(words, 0, nbytes)
        first = words[0]
        assert first == MAX_BLOCK_NBYTES and first >> 32 == 0
        assert words[MAX_BLOCK_NBYTES >> 3] == nbytes - MAX_BLOCK_NBYTES
    finally:
        words.release()
        mm.close()
