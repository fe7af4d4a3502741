"""index, lru and arena on plain memory: no shared memory, no lock."""

from __future__ import annotations

import mmap
import random

import pytest

from shmcache import index, lru
from shmcache.arena import Arena, block_nbytes
from shmcache.errors import CorruptionError
from shmcache.layout import EMPTY, SENTINEL
from shmcache.layout.dtypes import (
    E_CHECK, E_KEY_NBYTES, E_NEXT, E_OFF, E_PREV, E_SLOT, E_VAL_NBYTES, ENTRY_WORDS, H_ARENA_USED, H_FILL,
    HEADER_WORDS,
)

W = ENTRY_WORDS


def words(n: int):
    return memoryview(bytearray(8 * n)).cast("q")


def lru_order(ent) -> list[int]:
    out, cur = [], ent[E_NEXT]
    while cur != SENTINEL:
        out.append(cur)
        cur = ent[cur * W + E_NEXT]
    back, cur = [], ent[E_PREV]
    while cur != SENTINEL:
        back.append(cur)
        cur = ent[cur * W + E_PREV]
    assert back == out[::-1]
    return out


def test_lru_push_move_unlink():
    ent = words(8 * W)
    for e in (1, 2, 3):
        lru.push_front(ent, e)
    assert lru_order(ent) == [3, 2, 1] and lru.tail(ent) == 1
    lru.move_to_front(ent, 1)
    assert lru_order(ent) == [1, 3, 2]
    lru.move_to_front(ent, 1)  # already first: unchanged
    assert lru_order(ent) == [1, 3, 2]
    lru.unlink(ent, 3)
    assert lru_order(ent) == [1, 2]
    lru.unlink(ent, 1)
    lru.unlink(ent, 2)
    assert lru_order(ent) == [] and lru.tail(ent) == SENTINEL


def _index_setup(slots: int, entries: int):
    ix, ent = words(2 * slots), words(entries * W)
    return ix, ent, slots - 1


def test_index_insert_remove_with_collisions_keeps_every_key_reachable():
    rng = random.Random(3)
    ix, ent, mask = _index_setup(64, 40)
    live: dict[int, int] = {}
    # Few distinct home slots: long clusters, wrap-around, and backward shifts across them.
    fps = {e: rng.choice([5, 6, 62, 63]) + 64 * rng.randrange(1000) for e in range(1, 32)}
    for _ in range(2000):
        e = rng.randrange(1, 32)
        if e in live:
            index.remove(ix, ent, mask, ent[e * W + E_SLOT])
            del live[e]
        else:
            index.insert(ix, ent, mask, fps[e], e)
            live[e] = fps[e]
        for le, fp in live.items():
            s = ent[le * W + E_SLOT]
            assert ix[2 * s] == fp and ix[2 * s + 1] == le
            # Reachable: the probe from the home slot meets it before any empty slot.
            p = fp & mask
            while p != s:
                assert ix[2 * p + 1] != EMPTY
                p = (p + 1) & mask
        assert sum(ix[2 * s + 1] != EMPTY for s in range(64)) == len(live)


def test_index_full_table_raises_instead_of_looping():
    ix, ent, mask = _index_setup(8, 16)
    for e in range(1, 9):
        index.insert(ix, ent, mask, e, e)
    with pytest.raises(CorruptionError):
        index.insert(ix, ent, mask, 99, 9)
    with pytest.raises(CorruptionError):
        index.find(ix, ent, b"", 0, mask, 12345, b"k")


def _arena(nbytes: int, slots: int):
    h, ent = words(HEADER_WORDS), words(slots * W)
    mm = mmap.mmap(-1, nbytes)
    return h, ent, mm, Arena(h, ent, mm, 0, nbytes, slots)


def test_arena_churn_compacts_and_preserves_live_blocks():
    rng = random.Random(7)
    size, slots = 4096, 64
    h, ent, mm, ar = _arena(size, slots)
    live: dict[int, bytes] = {}
    free = list(range(1, slots))
    for _ in range(5000):
        if live and (rng.random() < 0.5 or not free):
            e = rng.choice(list(live))
            ar.free(ent[e * W + E_OFF], block_nbytes(len(live[e])), e)
            ent[e * W + E_CHECK] = 0
            del live[e]
            free.append(e)
            continue
        payload = bytes([rng.randrange(256)]) * rng.randrange(1, 300)
        nb = block_nbytes(len(payload))
        while live and h[H_ARENA_USED] + nb > size:  # what eviction does for the cache
            e = next(iter(live))
            ar.free(ent[e * W + E_OFF], block_nbytes(len(live[e])), e)
            ent[e * W + E_CHECK] = 0
            del live[e]
            free.append(e)
        e = free.pop()
        off = ar.alloc(nb, e)
        ent[e * W + E_OFF], ent[e * W + E_CHECK] = off, 1
        ent[e * W + E_KEY_NBYTES], ent[e * W + E_VAL_NBYTES] = 0, len(payload)
        mm[off + 8 : off + 8 + len(payload)] = payload
        live[e] = payload
        # Every live block is intact wherever the cleaner moved it, and none overlap.
        spans = sorted((ent[x * W + E_OFF], block_nbytes(len(p))) for x, p in live.items())
        for (a, n), (b, _) in zip(spans, spans[1:]):
            assert a + n <= b
        for x, p in live.items():
            o = ent[x * W + E_OFF]
            assert mm[o + 8 : o + 8 + len(p)] == p
        assert h[H_ARENA_USED] == sum(n for _, n in spans) <= h[H_FILL] <= size
    ar.close()
    mm.close()


def test_arena_alloc_on_garbage_raises():
    h, ent, mm, ar = _arena(1024, 8)
    off = ar.alloc(512, 1)
    ent[W + E_OFF], ent[W + E_CHECK] = off, 1
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
