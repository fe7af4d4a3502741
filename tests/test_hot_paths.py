"""The ways of doing one operation stay equal: get, put and the batch agree with their other compositions.

``SharedCache.get`` runs ``Store.read``, ``put`` runs ``Store.put`` (or the compiled section, whose own twin test is
tests/test_core.py); ``entries.get_many_locked`` inlines the probe and the move. The same random operations are run
on two caches of one geometry and one clock: through get, put and get_many on one, through the other compositions on
the other (``get_with_version``: find_live, body, hit; ``put_many`` of one pair: find_live, store), and the two
segments must stay byte for byte the same, with the same answers, LRU order and counters. The block helpers are
checked against the entries the segment really holds. The composed side always runs the Python path (its batches
would otherwise go through the compiled section, as the other side's get, put and get_many do when it is built).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmcache import SharedCache, TooLargeError
from shmcache import block
from shmcache.codec import encode_key
from shmcache.layout import LOCK_NBYTES, SENTINEL
from shmcache.layout.dtypes import H_CREATED_NS, H_LOCK_OFF, H_PROGRESS
from tests.conftest import unique_name
from tests.workers import python_path, versioned
from tests.profiles import examples

KEYS = [f"k{i}" for i in range(6)] + [("t", i) for i in range(3)]  # few: most gets hit, many entries move
# when each was made; the mutex's own words; how much walking was done under the lock
_IGNORED = [(H_CREATED_NS * 8, 8), (H_LOCK_OFF, LOCK_NBYTES), (H_PROGRESS * 8, 8)]


class Clock:
    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


def _image(c: SharedCache) -> bytes:
    # (up to what the mapping shows of the arena: past it, private zero pages)
    raw = bytearray(memoryview(c._seg.mm)[: c._seg.geometry.arena_off + c._seg.shown[0]])
    for off, n in _IGNORED:
        raw[off : off + n] = bytes(n)
    return bytes(raw)


def _value(i: int, size: int):
    if size % 3 == 0:
        return np.full(size, i % 251, dtype=np.uint8)  # the array path: copied out under the lock
    return {"i": i, "pad": "x" * size}


ops = st.lists(
    st.one_of(
        st.tuples(st.just("get"), st.sampled_from(KEYS)),
        st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(0, 600), st.sampled_from([None, 0, 1e-6, 5])),
        st.tuples(st.just("many"), st.lists(st.sampled_from(KEYS), max_size=5)),
        st.tuples(st.just("tick"), st.integers(0, 3_000_000_000)),
    ),
    max_size=120,
)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_hot_paths_equal_the_composed_operations(script):
    clock = Clock()
    names = unique_name("hot"), unique_name("composed")
    # lru: both read under the lock, so that their segments compare byte for byte (a read without the lock counts
    # in a reader slot and the sketch, which the Python path's locked read does not: tests/test_unlocked.py)
    hot, composed = (SharedCache(n, capacity_bytes=8192, max_entries=16, create=True, clock=clock, default_ttl=2,
                                 policy="lru") for n in names)
    python_path(composed)  # the reference: the Python path's composed operations
    for c in (hot, composed):  # (get_with_version would switch the versions column on in one of them alone)
        versioned(c)
    try:
        for step, op in enumerate(script):
            if op[0] == "get":
                got = hot.get(op[1], "absent")
                want = composed.get_with_version(op[1], "absent")[0]
                _same(got, want)
            elif op[0] == "put":
                value = _value(step, op[2])
                outcomes = []
                for _c, put in ((hot, lambda: hot.put(op[1], value, op[3])),
                                (composed, lambda: composed.put_many([(op[1], value)], op[3]))):
                    try:
                        put()
                        outcomes.append(None)
                    except TooLargeError as exc:
                        outcomes.append(type(exc))
                assert outcomes[0] == outcomes[1]
            elif op[0] == "many":
                got = hot.get_many(op[1], "absent")
                want = [composed.get_with_version(k, "absent")[0] for k in op[1]]
                for a, b in zip(got, want):
                    _same(a, b)
            else:
                clock.now += op[1]
            assert _image(hot) == _image(composed), f"segments differ after step {step}: {op[:2]}"
        assert hot.stats() == composed.stats()
        assert list(hot) == list(composed)
    finally:
        for c, n in zip((hot, composed), names):
            c.close()
            SharedCache.unlink_name(n)


def _same(a, b) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


def test_hot_paths_block_helpers_find_every_resident_key(cache):
    for i, k in enumerate(KEYS):
        cache.put(k, _value(i, 40 + i))
    seg = cache._seg
    rec, mm, base = seg.records, seg.mm, seg.geometry.arena_off
    seen = []
    e = rec.next[SENTINEL]
    while e != SENTINEL:
        kb = block.key_of(mm, rec, base, e)
        assert len(kb) == rec.klen[e]
        assert block.key_at(rec, base, e) == block.value_at(rec, base, e) + rec.vlen[e]
        nb, owner = block.split_header(seg.arena_words[(block.value_at(rec, 0, e) - block.VALUE_START) >> 3])
        assert (nb, owner) == (block.entry_nbytes(rec, e), e)
        assert block.header(nb, owner) == seg.arena_words[(block.value_at(rec, 0, e) - block.VALUE_START) >> 3]
        seen.append(kb)
        e = rec.next[e]
    assert sorted(seen) == sorted(encode_key(k) for k in cache)
    assert block.handed_out(seg.header_words, seg.geometry.entry_slots) > len(seen)
