"""The opt-in pickle serializer: what it pickles and what keeps its raw encoding, the segment's record of it and the
refusal of a handle that asked for the other, and the default's promise: pickled bytes planted into a default
segment are never unpickled, whatever else in them is right."""

from __future__ import annotations

import collections
import datetime
import decimal
import os
import pickle
import threading

import numpy as np
import pytest

from shmcache import CorruptionError, SerializerMismatch, SharedCache, ShmCacheError
from shmcache.codec import TAG_ARRAY, TAG_BYTES, TAG_MSGPACK, checksum, fingerprint
from shmcache.layout import BLOCK_HEADER_NBYTES, FEATURE_PICKLE
from shmcache.layout.dtypes import H_FEATURES
from shmcache.serializers import MSGPACK, PICKLE, TAG_PICKLE, named

Point = collections.namedtuple("Point", "x y")
_DETONATIONS: list = []


def _detonate(marker: str) -> str:
    _DETONATIONS.append(marker)
    with open(marker, "w"):
        pass
    return "detonated"


class _Detonator:
    """Unpickling it calls ``_detonate``: it stands for any code a pickle stream can run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (_detonate, (self.marker,))


def _refuse():
    raise ValueError("this object cannot be rebuilt here")


class _Unrebuildable:
    def __reduce__(self):
        return (_refuse, ())


class _Bytes(bytes):
    pass


@pytest.fixture
def pcache(name):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=128, create=True, serializer="pickle") as c:
        yield c


def _entry(c: SharedCache, key: str) -> int:
    e = c._guard.run(c._store.find_live, key.encode(), fingerprint(key.encode()))
    assert e
    return e


def _plant(c: SharedCache, key: str, data: bytes) -> None:
    """Overwrite the value bytes of ``key``'s entry (same length) with ``data`` (tag first) and give the entry the
    checksum of ``data``: only the tag stands between ``data`` and a decoder."""
    e, rec = _entry(c, key), c._seg.records
    v0 = c._base + (rec.off[e] << rec.osh) + BLOCK_HEADER_NBYTES
    assert rec.vlen[e] == len(data)
    c._mm[v0 : v0 + len(data)] = data
    rec.check[e] = checksum(data)


def test_serializers_pickle_round_trips_values_msgpack_cannot(pcache):
    values = {
        "point": Point(1, 2), "date": datetime.date(2024, 5, 1), "decimal": decimal.Decimal("1.10"),
        "set": {1, 2, 3}, "nested": {"a": [Point(3, 4), {5, 6}], "b": (datetime.timedelta(seconds=3),)},
        "int": 10**30, "none": None, "str": "é", "bytes-subclass": _Bytes(b"ab"),
        "object-array": np.array([{"x": 1}, None], dtype=object),
    }
    for k, v in values.items():
        pcache.put(k, v)
    for k, v in values.items():
        got = pcache.get(k)
        assert type(got) is type(v), k
        if k == "object-array":
            assert got.tolist() == v.tolist()
        else:
            assert got == v, k
    assert pcache.verify().ok


def test_serializers_pickle_keeps_raw_tags_for_bytes_and_numeric_arrays():
    assert PICKLE.encode(b"abc") == (TAG_BYTES, b"abc")
    tag, _ = PICKLE.encode(np.arange(5, dtype=np.int32))
    assert tag == TAG_ARRAY
    assert PICKLE.encode(5) == MSGPACK.encode(5) and PICKLE.encode(5)[0] == TAG_MSGPACK  # incr reads it unpickled
    for value in (_Bytes(b"x"), np.array([None]), "text", True, 5.0, [1], np.ma.masked_array([1, 2])):
        tag, body = PICKLE.encode(value)
        assert tag == TAG_PICKLE and body[:2] == b"\x80\x05", type(value)
    assert MSGPACK.encode("text")[0] == TAG_MSGPACK


def test_serializers_pickle_cache_keeps_array_and_bytes_fast_paths(pcache):
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    pcache.put("a", arr)
    pcache.put("b", b"raw")
    got = pcache.get("a")
    assert type(got) is np.ndarray and np.array_equal(got, arr)
    with pcache.view("a") as v:  # an array kept raw can still be viewed without a copy
        assert np.array_equal(v, arr)
    assert pcache.get("b") == b"raw"


def test_serializers_pickle_cache_batches_and_atomics(pcache):
    pcache.put_many({"p": Point(1, 1), "q": Point(2, 2)})
    assert pcache.get_many(["p", "q", "r"]) == [Point(1, 1), Point(2, 2), None]
    assert pcache.add("p", 0) is False and pcache.add("s", {1}) is True and pcache.get("s") == {1}
    pcache.put("n", 41)
    assert pcache.incr("n") == 42 and pcache.get("n") == 42
    pcache.put("none", None)
    with pytest.raises(TypeError):
        pcache.incr("none")
    value, version = pcache.get_with_version("p")
    assert value == Point(1, 1) and pcache.cas("p", Point(9, 9), version) and pcache["p"] == Point(9, 9)
    assert pcache.setdefault("p", None) == Point(9, 9)
    assert dict(pcache.items())["q"] == Point(2, 2)
    assert pcache.pop("q") == Point(2, 2)
    assert pcache.kind("k").get("x") is None
    pcache.kind("k")["x"] = Point(5, 5)
    assert pcache.kind("k")["x"] == Point(5, 5)


def test_serializers_pickle_errors_are_pickles_own(pcache):
    with pytest.raises((pickle.PicklingError, TypeError, AttributeError)):
        pcache.put("lock", threading.Lock())
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pcache.put("lambda", lambda: 1)
    assert "lock" not in pcache and "lambda" not in pcache


def test_serializers_unpickling_failure_is_the_values_own_and_keeps_the_entry(pcache):
    pcache.put("u", _Unrebuildable())
    with pytest.raises(pickle.UnpicklingError) as info:
        pcache.get("u")
    assert not isinstance(info.value, ShmCacheError)  # not taken for damage: the bytes are what was stored
    assert "u" in pcache and pcache.stats().recoveries == 0


def test_serializers_segment_records_the_serializer(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True, serializer="pickle") as c:
        assert c._seg.header_words[H_FEATURES] == FEATURE_PICKLE == 1
    SharedCache.unlink_name(name)
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True) as c:
        assert c._seg.header_words[H_FEATURES] == 0


def test_serializers_default_handle_refuses_a_pickle_segment(pcache, name):
    pcache.put("k", Point(1, 2))
    with pytest.raises(SerializerMismatch) as info:
        SharedCache(name)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, ShmCacheError)
    assert (err.asked, err.found, err.what) == ("msgpack", "pickle", "attach")
    assert "serializer='pickle'" in str(err) and "trust" in err.hint
    with pytest.raises(SerializerMismatch):
        SharedCache(name, create=False, serializer="msgpack")
    assert pcache.get("k") == Point(1, 2)  # the refused attach changed nothing


def test_serializers_pickle_handle_refuses_a_default_segment(cache, name):
    with pytest.raises(SerializerMismatch) as info:
        SharedCache(name, serializer="pickle")
    assert (info.value.asked, info.value.found) == ("pickle", "msgpack")


def test_serializers_unknown_name_is_refused_before_anything_is_made(name):
    for bad in ("json", None, "PICKLE"):
        with pytest.raises(ValueError, match="serializer must be one of"):
            SharedCache(name, serializer=bad)
    assert not os.path.exists(f"/dev/shm/shmcache.{name}")
    assert named("pickle") is PICKLE and named("msgpack") is MSGPACK


def test_serializers_pickled_handle_keeps_its_serializer(pcache):
    pcache.put("p", Point(1, 2))
    with pickle.loads(pickle.dumps(pcache)) as copy:
        assert copy.get("p") == Point(1, 2)


def test_serializers_default_never_unpickles_a_planted_payload(cache, tmp_path):
    """A pickle stream that runs code, planted as a value of a default cache with its checksum made right: get()
    refuses it as damage and the code never runs."""
    marker = str(tmp_path / "ran")
    payload = pickle.dumps(_Detonator(marker), protocol=5)
    cache.put("k", b"x" * len(payload))
    _plant(cache, "k", bytes((TAG_PICKLE,)) + payload)
    with pytest.raises(CorruptionError):
        cache.get("k")
    assert not _DETONATIONS and not os.path.exists(marker)
    assert cache.get("k") is None  # dropped by the repair
    # The same bytes planted again are refused by every read path and by verify(), still without running.
    cache.put("k", b"x" * len(payload))
    _plant(cache, "k", bytes((TAG_PICKLE,)) + payload)
    assert not cache.verify().ok
    for read in (lambda: cache.get_many(["k"]), lambda: dict(cache.items()), lambda: cache.pop("k")):
        cache.put("k", b"x" * len(payload))
        _plant(cache, "k", bytes((TAG_PICKLE,)) + payload)
        with pytest.raises(CorruptionError):
            read()
    assert not _DETONATIONS and not os.path.exists(marker)
    # And the payload is live: unpickled, it does run (so the test above proves something).
    assert pickle.loads(payload) == "detonated" and os.path.exists(marker)
    _DETONATIONS.clear()


def test_serializers_incr_never_unpickles_under_the_lock(pcache, tmp_path):
    """incr reads its counter while holding the cache lock: in a pickle cache ints are stored as msgpack, and a
    pickled value at a counter's key is refused (TypeError) without being unpickled."""
    pcache.put("n", 41)
    assert pcache.incr("n") == 42 and pcache.get("n") == 42
    marker = str(tmp_path / "ran")
    pcache.put("k", ["a pickled list"])
    with pytest.raises(TypeError, match="only int values"):
        pcache.incr("k")
    payload = pickle.dumps(_Detonator(marker), protocol=5)
    pcache.put("k", b"x" * len(payload))
    _plant(pcache, "k", bytes((TAG_PICKLE,)) + payload)
    with pytest.raises(TypeError, match="only int values"):
        pcache.incr("k")
    assert not _DETONATIONS and not os.path.exists(marker)


def test_serializers_verify_never_unpickles(pcache, tmp_path):
    """verify() and its repair check a pickled value's frame, never unpickle it (that would run code under the
    lock); a get from a handle that opted in does unpickle it: the trust the option asks for."""
    marker = str(tmp_path / "ran")
    pcache.put("d", _Detonator(marker))
    assert not os.path.exists(marker)  # pickling ran nothing
    assert pcache.verify(deep=True).ok
    pcache.verify(deep=True, repair_damage=True)
    assert not _DETONATIONS and not os.path.exists(marker)
    assert pcache.get("d") == "detonated" and os.path.exists(marker)
    _DETONATIONS.clear()


def test_serializers_verify_drops_a_pickled_value_without_a_pickle_frame(pcache):
    pcache.put("k", Point(1, 2))
    n = pcache._seg.records.vlen[_entry(pcache, "k")]
    _plant(pcache, "k", bytes((TAG_PICKLE,)) + b"\0" * (n - 1))  # checksum right, not a pickle stream
    report = pcache.verify()
    assert not report.ok and any("does not decode" in p for p in report.problems)
    pcache.verify(repair_damage=True)
    assert "k" not in pcache and pcache.verify().ok
