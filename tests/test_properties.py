"""Hypothesis: codec round trip and canonical keys; a state machine driving SharedCache against the reference LRU,
with verify() as an invariant."""

from __future__ import annotations

import math
import struct

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shmcache import CacheLimits, SharedCache, TooLargeError
from shmcache.codec import decode_value, encode_key, encode_value, fingerprint
from tests.conftest import unique_name
from tests.reference import ReferenceLRU
from tests.test_codec import same_value

CODEC_SETTINGS = settings(max_examples=100, deadline=None)

# ---------------------------------------------------------------------------------------------------- strategies

DTYPES = (
    hnp.boolean_dtypes()
    | hnp.integer_dtypes(endianness="?")
    | hnp.unsigned_integer_dtypes(endianness="?")
    | hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64))
    | hnp.complex_number_dtypes(endianness="?")
)


def _maybe_strided(arr_and_flag) -> np.ndarray:
    arr, strided = arr_and_flag
    if strided and arr.ndim:
        return arr.T[::-1]  # a reversed, transposed view: neither C- nor F-contiguous in general
    return arr


small_arrays = st.tuples(
    hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)), st.booleans()
).map(_maybe_strided)

big_ints = st.integers(min_value=-(2**200), max_value=2**200)
scalars = st.none() | st.booleans() | st.integers() | big_ints | st.floats() | st.text(max_size=20) | st.binary(
    max_size=40
)
hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | big_ints | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)
def nested(max_dict: int):
    """Scalars and small arrays nested in lists, tuples and dicts."""
    return st.recursive(
        scalars | small_arrays,
        lambda inner: st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(hashables, inner, max_size=max_dict),
        max_leaves=20,
    )


codec_values = nested(max_dict=4)
keys = nested(max_dict=5)


# ---------------------------------------------------------------------------------------------------- codec properties


@CODEC_SETTINGS
@given(codec_values)
def test_codec_value_round_trip(value):
    assert same_value(value, decode_value(encode_value(value)))


def _rebuilt(key, rnd):
    """An equal key built differently: dicts refilled in a shuffled order, arrays in the other byte order and laid
    out non-contiguously, everything else copied."""
    if type(key) is dict:
        items = [(k, _rebuilt(v, rnd)) for k, v in key.items()]
        rnd.shuffle(items)
        return dict(items)
    if type(key) in (list, tuple):
        return type(key)(_rebuilt(x, rnd) for x in key)
    if isinstance(key, np.ndarray):
        dt = key.dtype.newbyteorder() if key.dtype.itemsize > 1 else key.dtype
        holder = np.zeros(key.shape + (2,), dt)
        holder[..., 1] = key
        return holder[..., 1]
    return key


@CODEC_SETTINGS
@given(keys, st.randoms(use_true_random=False))
def test_codec_key_canonical_under_rebuild(key, rnd):
    rebuilt = _rebuilt(key, rnd)
    kb = encode_key(key)
    assert encode_key(rebuilt) == kb
    assert 0 <= fingerprint(kb) < 2**63


@CODEC_SETTINGS
@given(st.dictionaries(hashables, codec_values, min_size=2, max_size=8), st.randoms(use_true_random=False))
def test_codec_dict_key_independent_of_insertion_order(d, rnd):
    items = list(d.items())
    rnd.shuffle(items)
    assert encode_key(dict(items)) == encode_key(d)
    assert encode_key({"outer": dict(items)}) == encode_key({"outer": d})


def _float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


@CODEC_SETTINGS
@given(st.data())
def test_codec_scalar_keys_typed_and_injective(data):
    a = data.draw(scalars, label="a")
    b = data.draw(st.just(a) | st.sampled_from([0, 1, 0.0, 1.0, True, False, "1", b"1", None, ""]) | scalars,
                  label="b")
    same_type = type(a) is type(b)
    if same_type and (type(a) is not float or _float_bits(a) == _float_bits(b)) and (a == b or a != a):
        assert encode_key(a) == encode_key(b)
    elif not same_type or not (a == b or (type(a) is float and math.isnan(a) and math.isnan(b))):
        # Different types, or values that differ. (0.0 vs -0.0 and two NaN payloads are left to test_codec.)
        assert encode_key(a) != encode_key(b)


# ---------------------------------------------------------------------------------------------------- state machine

CAPACITY = 4096
MAX_ENTRIES = 16
COUNTERS = ("hits", "misses", "puts", "updates", "deletes", "evictions", "clears")
MISSING = object()

# A small key space, so that hits, updates and evictions are frequent. Pairs of equal keys built differently (dict
# order, array byte order) must reach the same entry; 1, 1.0 and True must not.
KEYS = [
    "a", b"a", 1, 1.0, True, 2**70, (1, "a"),
    {"x": 1, "y": [2]}, {"y": [2], "x": 1},
    np.arange(3, dtype="<i8"), np.arange(3, dtype=">i8"),
]
key_choices = st.sampled_from(KEYS)


def _sized(kind: str, n: int):
    if kind == "bytes":
        return b"\x5a" * n
    if kind == "str":
        return "é" * (n // 2)
    if kind == "array":
        return np.arange(n // 8, dtype=np.int64)
    if kind == "list":
        return list(range(n // 2))
    return ("t", b"\x00" * n)


kinds = st.sampled_from(["bytes", "str", "array", "list", "tuple"])
fitting_values = st.builds(_sized, kinds, st.integers(0, 64) | st.integers(64, 1400))
machine_values = fitting_values | st.builds(_sized, kinds, st.integers(3500, 4600)) | codec_values


class SharedCacheMachine(RuleBasedStateMachine):
    """Random operations through two handles on one real cache, mirrored on the reference LRU."""

    def __init__(self) -> None:
        super().__init__()
        self.name = unique_name("sm")
        self.handles: list[SharedCache] = []
        self.model = ReferenceLRU(MAX_ENTRIES, CAPACITY)

    @initialize(max_entries=st.integers(2, MAX_ENTRIES), max_bytes=st.integers(512, CAPACITY))
    def open_cache(self, max_entries, max_bytes) -> None:
        # Starting below capacity makes both limits bite within a few steps.
        self.handles.append(SharedCache(self.name, capacity_bytes=CAPACITY, max_entries=MAX_ENTRIES, create=True))
        self.handles.append(SharedCache(self.name, create=False))
        self.set_limits(max_entries, max_bytes, other=False)

    def teardown(self) -> None:
        try:
            for h in self.handles:
                h.close()
        finally:
            if self.handles:
                SharedCache.unlink_name(self.name)

    def _handle(self, other: bool) -> SharedCache:
        return self.handles[1 if other else 0]

    @rule(key=key_choices, value=fitting_values, other=st.booleans())
    def put_fitting(self, key, value, other):
        self.put(key, value, other)

    @rule(key=key_choices, value=machine_values, other=st.booleans())
    def put(self, key, value, other):
        before = dict(self.model.counters)
        try:
            self.model.put(key, value)
        except ValueError:
            event("put: too large")
            with pytest.raises(TooLargeError):
                self._handle(other).put(key, value)
            return
        self._handle(other).put(key, value)
        for counter in ("updates", "evictions"):
            if self.model.counters[counter] > before[counter]:
                event(f"put: {counter}")

    @rule(key=key_choices, other=st.booleans())
    def get(self, key, other):
        expected = self.model.get(key, MISSING)
        got = self._handle(other).get(key, MISSING)
        event(f"get: {'miss' if expected is MISSING else 'hit'}")
        if expected is MISSING:
            assert got is MISSING
        else:
            assert same_value(expected, got)

    @precondition(lambda self: self.model.data)
    @rule(data=st.data(), other=st.booleans())
    def get_held(self, data, other):
        held = [k for k in KEYS if encode_key(k) in self.model.data]  # equal keys built differently included
        self.get(data.draw(st.sampled_from(held), label="key"), other)

    @rule(key=key_choices)
    def getitem(self, key):
        expected = self.model.get(key, MISSING)
        if expected is MISSING:
            with pytest.raises(KeyError):
                self.handles[0][key]
        else:
            assert same_value(expected, self.handles[0][key])

    @rule(key=key_choices, other=st.booleans())
    def delete(self, key, other):
        assert self._handle(other).delete(key) == self.model.delete(key)

    @rule(key=key_choices, value=machine_values, other=st.booleans(), present=st.booleans())
    def add_or_replace(self, key, value, other, present):
        op = "replace" if present else "add"
        try:
            expected = getattr(self.model, op)(key, value)
        except ValueError:
            event(f"{op}: too large")
            with pytest.raises(TooLargeError):
                getattr(self._handle(other), op)(key, value)
            return
        event(f"{op}: {expected}")
        assert getattr(self._handle(other), op)(key, value) == expected

    @rule(key=key_choices, other=st.booleans())
    def pop(self, key, other):
        expected = self.model.pop(key, MISSING)
        got = self._handle(other).pop(key, MISSING)
        event(f"pop: {'miss' if expected is MISSING else 'hit'}")
        assert got is MISSING if expected is MISSING else same_value(expected, got)

    @rule(key=key_choices, delta=st.integers(-(2**70), 2**70), other=st.booleans())
    def incr(self, key, delta, other):
        expected = self.model.incr(key, delta)
        if expected in (TypeError, ValueError):
            event(f"incr: {expected.__name__}")
            with pytest.raises(TooLargeError if expected is ValueError else TypeError):
                self._handle(other).incr(key, delta)
            return
        event("incr")
        assert self._handle(other).incr(key, delta) == expected

    @rule(key=key_choices, other=st.booleans())
    def contains(self, key, other):
        assert (key in self._handle(other)) == (encode_key(key) in self.model.data)

    @rule(max_entries=st.integers(1, MAX_ENTRIES), max_bytes=st.integers(1, CAPACITY) | st.just(CAPACITY),
          other=st.booleans())
    def set_limits(self, max_entries, max_bytes, other):
        self._handle(other).set_limits(CacheLimits(max_entries=max_entries, max_retained_bytes=max_bytes))
        self.model.set_limits(max_entries, max_bytes)

    @rule(extra_entries=st.integers(0, 3), extra_bytes=st.integers(0, 64))
    def set_limits_beyond_capacity(self, extra_entries, extra_bytes):
        limits = CacheLimits(max_entries=MAX_ENTRIES + extra_entries, max_retained_bytes=CAPACITY + extra_bytes)
        if extra_entries or extra_bytes:
            with pytest.raises(ValueError):
                self.handles[0].set_limits(limits)
        else:
            self.handles[0].set_limits(limits)
            self.model.set_limits(MAX_ENTRIES, CAPACITY)

    @rule(other=st.booleans())
    def clear(self, other):
        self._handle(other).clear()
        self.model.clear()

    @rule()
    def reattach(self):
        self.handles[1].close()
        self.handles[1] = SharedCache(self.name, create=False)

    @precondition(lambda self: self.handles)
    @invariant()
    def agrees_with_model(self):
        m = self.model
        s = self.handles[0].stats()
        assert self.handles[1].stats() == s
        assert len(self.handles[0]) == len(self.handles[1]) == len(m.data)
        assert {c: getattr(s, c) for c in COUNTERS} == m.counters
        assert (s.entries, s.retained_bytes) == (len(m.data), m.retained)
        assert s.recoveries == 0
        assert self.handles[1].limits() == CacheLimits(max_entries=m.max_entries,
                                                       max_retained_bytes=m.max_retained_bytes)
        # Membership of every key (no LRU or counter effect) pins down which entries eviction chose.
        for key in KEYS:
            assert (key in self.handles[0]) == (encode_key(key) in m.data)

    @precondition(lambda self: self.handles)
    @invariant()
    def verifies(self):
        report = self.handles[0].verify()
        assert report.ok, report.problems
        assert (report.entries, report.retained_bytes) == (len(self.model.data), self.model.retained)


TestSharedCacheMatchesReference = SharedCacheMachine.TestCase
TestSharedCacheMatchesReference.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
