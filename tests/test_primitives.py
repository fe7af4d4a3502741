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
    E_CHECK, E_FP, E_KEY_NBYTES, E_NEXT, E_OFF, E_PREV, E_SLOT, E_VAL_NBYTES, ENTRY_WORDS, H_ARENA_USED, H_FILL,
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


def _index_setup(slots: int, entries: int, xo=index.Wide):
    ix, ent = words((1 if xo.packed else 2) * slots), words(entries * W)
    return ix, ent, slots - 1


def _slot(xo, ix, s: int) -> tuple[int, int]:
    """(the fingerprint's bits slot ``s`` keeps, its entry), read from the raw words as the layout lays them out."""
    if xo.packed:
        return ix[s] & 0xFFFFFFFF, ix[s] >> 32
    return ix[2 * s], ix[2 * s + 1]


@pytest.mark.parametrize("xo", [index.Wide, index.Packed, index.Ranged], ids=["wide", "packed", "ranged"])
def test_index_insert_remove_with_collisions_keeps_every_key_reachable(xo):
    rng = random.Random(3)
    n = 45 if xo is index.Ranged else 64  # (version 17's index: any number of slots)
    ix, ent, mask = _index_setup(n, 40, xo)
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
            xo.remove(ix, ent, mask, ent[e * W + E_SLOT])
            del live[e]
        else:
            xo.insert(ix, ent, mask, fps[e], e)
            live[e] = fps[e]
        for le, fp in live.items():
            s = ent[le * W + E_SLOT]
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
    ix, ent, mask = _index_setup(16, 4, index.Packed)
    fp = 7 + (1 << 40)
    ent[1 * W + E_FP], ent[1 * W + E_KEY_NBYTES], ent[1 * W + E_VAL_NBYTES], ent[1 * W + E_OFF] = fp, 1, 1, 0
    mm[8 + 1] = ord("k")  # (the key after the block's header and its 1-byte value)
    index.Packed.insert(ix, ent, mask, fp, 1)
    assert index.Packed.find(ix, ent, mm, 0, mask, fp, b"k") == 1
    assert index.Packed.find(ix, ent, mm, 0, mask, 7 + (2 << 40), b"k") == EMPTY  # same tag, another fingerprint
    assert index.Packed.find(ix, ent, mm, 0, mask, fp, b"j") == EMPTY


@pytest.mark.parametrize("xo", [index.Wide, index.Packed], ids=["wide", "packed"])
def test_index_full_table_raises_instead_of_looping(xo):
    ix, ent, mask = _index_setup(8, 16, xo)
    for e in range(1, 9):
        xo.insert(ix, ent, mask, e, e)
    with pytest.raises(CorruptionError):
        xo.insert(ix, ent, mask, 99, 9)
    with pytest.raises(CorruptionError):
        xo.find(ix, ent, b"", 0, mask, 12345, b"k")


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
