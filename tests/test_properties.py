"""Hypothesis: codec round trip and canonical keys; a state machine driving SharedCache against the reference LRU,
with verify() as an invariant."""

from __future__ import annotations

import datetime as dt
import math
import os
import struct

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shmcache import CacheLimits, SharedCache, TooLargeError
from shmcache.codec import NON_STR_KEY, decode_value, encode_key, encode_value, fingerprint
from shmcache.keys import decode_key
from shmcache.layout import BLOCK_HEADER_NBYTES, SENTINEL
from tests.conftest import unique_name
from tests.reference import COUNTERS, MISSING, ReferenceLRU, TooLarge, key_bytes
from tests.test_codec import same_value
from tests.workers import versioned
from tests.profiles import examples

# The machine stores values too large on purpose, and holds their count (too_large) to the model; the warning they
# raise is test_too_large.py's concern.
pytestmark = pytest.mark.filterwarnings("ignore::shmcache.TooLargeWarning")

CODEC_SETTINGS = settings(max_examples=examples(100), deadline=None)

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
_offsets = st.timedeltas(-dt.timedelta(hours=23, minutes=59), dt.timedelta(hours=23, minutes=59))
_zones = st.none() | st.builds(dt.timezone, _offsets) | st.builds(dt.timezone, _offsets, st.text("ABCZ+", min_size=1))
# The standard library's types (stdtypes.py): an aware datetime or time keeps its offset and zone name.
std_types = (st.datetimes(timezones=_zones) | st.dates() | st.times(timezones=_zones) | st.timedeltas()
             | st.decimals(allow_nan=False) | st.uuids() | st.complex_numbers(allow_nan=False))
plain_scalars = st.none() | st.booleans() | st.integers() | big_ints | st.floats() | st.text(max_size=20) \
    | st.binary(max_size=40)
scalars = plain_scalars | std_types | st.decimals(allow_nan=True) | st.complex_numbers()
hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | big_ints | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8) | std_types,
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
def nested(max_dict: int):
    """Scalars and small arrays nested in lists, tuples, dicts and sets."""
    return st.recursive(
        scalars | small_arrays,
        lambda inner: st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(hashables, inner, max_size=max_dict)
        | st.sets(hashables, max_size=4),
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
    if type(key) in (set, frozenset):  # refilled in a shuffled order: (often) another iteration order
        items = [_rebuilt(x, rnd) for x in key]
        rnd.shuffle(items)
        return type(key)(items)
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
@given(keys)
def test_codec_decode_key_inverts_encode_key(key):
    """Iteration hands back decode_key's result: it must be the same key (same bytes, so the same entry)."""
    kb = encode_key(key)
    assert encode_key(decode_key(kb)) == kb


@CODEC_SETTINGS
@given(st.binary(max_size=64))
def test_codec_decode_key_of_garbage_is_a_value_error(data):
    for kb in (data, NON_STR_KEY + data):
        try:
            key = decode_key(kb)
        except ValueError:
            continue
        encode_key(key)  # whatever decodes is a key again


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
    # Plain scalars: keys equal exactly when Python's values are (the standard types key more finely than ==, as
    # tests/test_stdtypes.py checks: Decimal("1.0") and Decimal("1.00"), one instant in two zones).
    a = data.draw(plain_scalars, label="a")
    b = data.draw(st.just(a) | st.sampled_from([0, 1, 0.0, 1.0, True, False, "1", b"1", None, ""]) | plain_scalars,
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
START_NS = 10**12  # the fake clock's first reading
KINDS = ("jvp", "pic")
RAISED = object()
# What the cache raises for each error of the model.
ERRORS = {TooLarge: TooLargeError, KeyError: KeyError, TypeError: TypeError,
          ValueError: ValueError}

# A small key space, so that hits, updates and evictions are frequent. Pairs of equal keys built differently (dict
# order, array byte order) must reach the same entry; 1, 1.0 and True must not.
KEYS = [
    "a", b"a", 1, 1.0, True, 2**70, (1, "a"),
    {"x": 1, "y": [2]}, {"y": [2], "x": 1},
    np.arange(3, dtype="<i8"), np.arange(3, dtype=">i8"),
]
key_choices = st.sampled_from(KEYS)
namespaces = st.sampled_from((None, None) + KINDS)  # None: the cache's own keys; else a kind's
# Times to live short against the clock's steps, so that entries expire within a few steps (None: the default).
ttls = st.sampled_from([None, None, 0, 1e-9, 0.5, 1, 2])
bad_ttls = st.sampled_from([-1, -1e-9, math.nan, math.inf, True, "1"])
cas_picks = st.sampled_from(["current", "older", "newer"])  # the version passed: the resident entry's, or one off
view_thens = st.sampled_from(["put", "put_other", "delete", "pop", "get", "clear", "clear_kind", "set_limits"])
max_bytes_choices = st.integers(1, CAPACITY) | st.integers(1024, CAPACITY) | st.just(CAPACITY)


def _sized(kind: str, n: int):
    if kind == "bytes":
        return b"\x5a" * n
    if kind == "str":
        return "é" * (n // 2)
    if kind == "array":
        return np.arange(n // 8, dtype=np.int64)
    if kind == "list":
        return list(range(n // 2))
    if kind == "int":
        return n  # a counter for incr
    return ("t", b"\x00" * n)


value_kinds = st.sampled_from(["bytes", "str", "array", "list", "tuple", "int"])
# Mostly small, so that several entries are resident at once; sometimes large, so that the byte limit bites.
fitting_values = st.builds(_sized, value_kinds, st.integers(0, 64) | st.integers(0, 300) | st.integers(64, 1400))
machine_values = fitting_values | st.builds(_sized, value_kinds, st.integers(3500, 4600)) | codec_values
# Stored while a view pins an entry. A pinned block splits the arena's free space, so a large value may find no
# contiguous room even within the limits (not admitted), which depends on a block layout the model does not track.
pinned_time_values = st.builds(_sized, value_kinds, st.integers(0, 64))


def resident_entries(cache: SharedCache) -> list[tuple[bytes, int, int]]:
    """(encoded key, version, expiry) of every resident entry, least recently used first, read from the segment
    with no side effect (no lookup, no expiry): what the public API can only show by changing it."""
    seg = cache._seg
    rec, mm, base = seg.records, seg.mm, seg.geometry.arena_off
    found, e = [], rec.prev[SENTINEL]
    for _ in range(seg.geometry.entry_slots):
        if e == SENTINEL:
            break
        k0 = base + (rec.off[e] << rec.osh) + BLOCK_HEADER_NBYTES + rec.vlen[e]
        found.append((bytes(mm[k0 : k0 + rec.klen[e]]), seg.versions_words[e], seg.expires_words[e]))
        e = rec.prev[e]
    return found


def _keys_for(machine, viewable: bool = False) -> st.SearchStrategy:
    """``(key, kind name)`` pairs (None: the cache's own keys): half the time a resident entry's, expired or not,
    so that hits, updates, versions, expiry and pins meet often. ``viewable``: three times in four a resident
    entry's whose value is bytes or an array, which a view can pin."""
    anywhere = st.tuples(key_choices, namespaces)
    resident = machine._resident(viewable)
    if not resident:
        return anywhere
    return st.one_of(*[st.sampled_from(resident)] * (3 if viewable else 1), anywhere)


keyed = st.runner().flatmap(_keys_for)
viewable_keyed = st.runner().flatmap(lambda machine: _keys_for(machine, viewable=True))


class SharedCacheMachine(RuleBasedStateMachine):
    """Random operations through two handles on one real cache, mirrored on the reference model. Both handles and
    the model read one fake clock, which only the advance rules move, so expiry is exact and the run deterministic."""

    def __init__(self) -> None:
        super().__init__()
        self.name = unique_name("sm")
        self.handles: list[SharedCache] = []
        self.now = START_NS
        self.model: ReferenceLRU | None = None

    def clock(self) -> int:
        return self.now

    @initialize(max_entries=st.integers(2, MAX_ENTRIES), max_bytes=st.integers(512, CAPACITY),
                default_ttl=st.sampled_from([None, 0, 1, 2.5]))
    def open_cache(self, max_entries, max_bytes, default_ttl) -> None:
        # Starting below capacity makes both limits bite within a few steps.
        self.model = ReferenceLRU(MAX_ENTRIES, CAPACITY, default_ttl=default_ttl, clock=self.clock)
        # (max_capacity_bytes: the capacity fixed, as the model's; tests/test_resize.py resizes)
        self.handles.append(SharedCache(self.name, capacity_bytes=CAPACITY, max_capacity_bytes=CAPACITY,
                                        max_entries=MAX_ENTRIES, create=True, default_ttl=default_ttl,
                                        clock=self.clock, policy="lru"))  # the model's policy
        # (the versions column in use from the start, as the model keeps a version for every entry: layout 16 gives
        # versions afresh when the first is asked for, tests/test_atomic.py)
        versioned(self.handles[0])
        self.handles.append(SharedCache(self.name, create=False, clock=self.clock))
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

    def _target(self, key, other: bool):
        """For a ``(key, kind name)`` pair: the handle, or its view of the kind (registered on first use, in the
        cache and the model alike), the key, and the kind's number for the model (0: none)."""
        key, ns = key
        h = self._handle(other)
        if ns is None:
            return h, key, 0
        return h.kind(ns), key, self.model.register(ns)

    def _run(self, label: str, model_call, real_call):
        """The model's result and the cache's; (RAISED, RAISED) once the cache has raised what the model did."""
        before = dict(self.model.counters, expired_for_room=self.model.expired_for_room)
        try:
            expected = model_call()
        except tuple(ERRORS) as exc:
            event(f"{label}: {type(exc).__name__}")
            with pytest.raises(ERRORS[type(exc)]) as raised:
                real_call()
            assert type(raised.value) is ERRORS[type(exc)]
            return RAISED, RAISED
        got = real_call()
        after = dict(self.model.counters, expired_for_room=self.model.expired_for_room)
        for counter in ("updates", "evictions", "expired", "expired_for_room"):
            if after[counter] > before[counter]:
                event(f"{label}: {counter}")
        return expected, got

    # ------------------------------------------------------------------------------------------- the dict-like API

    @rule(key=keyed, value=fitting_values, ttl=ttls, other=st.booleans())
    def put_fitting(self, key, value, ttl, other):
        self.put(key, value, ttl, other)

    @rule(key=keyed, value=machine_values, ttl=ttls, other=st.booleans())
    def put(self, key, value, ttl, other):
        target, key, k = self._target(key, other)
        expected, got = self._run("put", lambda: self.model.put(key, value, ttl, k),
                                  lambda: target.put(key, value, ttl))
        assert got is expected  # (False: not admitted, its room pinned or held)

    @rule(key=keyed, other=st.booleans())
    def get(self, key, other):
        target, key, k = self._target(key, other)
        expected, got = self._run("get", lambda: self.model.get(key, MISSING, k), lambda: target.get(key, MISSING))
        event(f"get: {'miss' if expected is MISSING else 'hit'}")
        assert got is MISSING if expected is MISSING else same_value(expected, got)

    @rule(key=keyed)
    def getitem(self, key):
        target, key, k = self._target(key, False)
        expected = self.model.get(key, MISSING, k)
        if expected is MISSING:
            with pytest.raises(KeyError):
                target[key]
        else:
            assert same_value(expected, target[key])

    @rule(key=keyed, other=st.booleans())
    def delete(self, key, other):
        target, key, k = self._target(key, other)
        expected, got = self._run("delete", lambda: self.model.delete(key, k), lambda: target.delete(key))
        assert got == expected

    @rule(key=keyed, value=machine_values, ttl=ttls, other=st.booleans(), present=st.booleans())
    def add_or_replace(self, key, value, ttl, other, present):
        target, key, k = self._target(key, other)
        op = "replace" if present else "add"
        expected, got = self._run(op, lambda: getattr(self.model, op)(key, value, ttl, k),
                                  lambda: getattr(target, op)(key, value, ttl))
        event(f"{op}: {expected if expected is not RAISED else 'raised'}")
        assert got == expected

    @rule(key=keyed, other=st.booleans())
    def pop(self, key, other):
        target, key, k = self._target(key, other)
        expected, got = self._run("pop", lambda: self.model.pop(key, MISSING, k), lambda: target.pop(key, MISSING))
        event(f"pop: {'miss' if expected is MISSING else 'hit'}")
        assert got is expected if expected is MISSING or expected is RAISED else same_value(expected, got)

    @rule(key=keyed, delta=st.integers(-(2**70), 2**70),
          initial=st.sampled_from([0, 0, 1, -2, None]), decr=st.booleans(), other=st.booleans())
    def incr(self, key, delta, initial, decr, other):
        """``initial`` None: an absent key raises KeyError."""
        target, key, k = self._target(key, other)
        op = "decr" if decr else "incr"
        expected, got = self._run(op, lambda: self.model.incr(key, -delta if decr else delta, initial, k),
                                  lambda: getattr(target, op)(key, delta, initial))
        assert got == expected

    @rule(key=keyed, other=st.booleans())
    def contains(self, key, other):
        target, key, k = self._target(key, other)
        expected, got = self._run("in", lambda: self.model.contains(key, k), lambda: key in target)
        assert got == expected

    def _resident(self, viewable: bool = False) -> list[tuple]:
        """(key, kind name) of every resident entry, expired or not, equal keys built differently included;
        ``viewable``: of those whose value is bytes or an array."""
        m = self.model
        if m is None:
            return []
        found = [(key, ns) for ns in (None, *m.kinds) for key in KEYS if key_bytes(key, m.kinds.get(ns, 0)) in m.data]
        if viewable:
            found = [(key, ns) for key, ns in found
                     if isinstance(m.data[key_bytes(key, m.kinds.get(ns, 0))].value, (bytes, np.ndarray))]
        return found

    # ------------------------------------------------------------------------------------------- time to live

    @rule(seconds=st.sampled_from([1e-9, 0.5, 1, 2]))
    def advance(self, seconds):
        """Move the clock; expired entries stay resident until a lookup or a need for room finds them."""
        self.now += round(seconds * 1e9)

    def _expiries(self) -> list[int]:
        return sorted({e.expires for e in self.model.data.values() if e.expires > self.now}) if self.model else []

    @precondition(lambda self: self._expiries())
    @rule(data=st.data())
    def advance_to_expiry(self, data):
        """Move the clock exactly to a resident entry's expiry: from then on it has expired."""
        self.now = data.draw(st.sampled_from(self._expiries()), label="now")

    @rule(key=keyed, ttl=ttls, other=st.booleans())
    def touch(self, key, ttl, other):
        target, key, k = self._target(key, other)
        expected, got = self._run("touch", lambda: self.model.touch(key, ttl, k), lambda: target.touch(key, ttl))
        event(f"touch: {expected if expected is not RAISED else 'raised'}")
        assert got == expected

    @rule(other=st.booleans())
    def expire(self, other):
        expected, got = self._run("expire", self.model.expire, self._handle(other).expire)
        event(f"expire: {'some' if expected else 'none'}")
        assert got == expected

    @rule(key=keyed, op=st.sampled_from(["put", "add", "replace", "cas", "touch", "compute"]),
          ttl=bad_ttls, other=st.booleans())
    def bad_ttl(self, key, op, ttl, other):
        """An invalid ttl raises ValueError or TypeError before anything changes."""
        if op == "put":
            self.put(key, b"v", ttl, other)
        elif op in ("add", "replace"):
            self.add_or_replace(key, b"v", ttl, other, op == "replace")
        elif op == "cas":
            self.cas(key, b"v", "current", ttl, other)
        elif op == "touch":
            self.touch(key, ttl, other)
        else:
            self.get_or_compute(key, b"v", ttl, other)

    # ------------------------------------------------------------------------------------------- versions

    @rule(key=keyed, other=st.booleans())
    def get_with_version(self, key, other):
        target, key, k = self._target(key, other)
        (expected, version), (got, got_version) = self._run(
            "get_with_version", lambda: self.model.get_with_version(key, MISSING, k),
            lambda: target.get_with_version(key, MISSING))
        assert got_version == version
        assert got is MISSING if expected is MISSING else same_value(expected, got)

    @rule(key=keyed, value=machine_values, pick=cas_picks, ttl=ttls, other=st.booleans())
    def cas(self, key, value, pick, ttl, other):
        """A cas with the resident entry's version (expired or not), or one just off it."""
        target, key, k = self._target(key, other)
        e = self.model.data.get(key_bytes(key, k))
        current = e.version if e else self.model.version_clock
        version = max(1, current + {"current": 0, "older": -1, "newer": 1}[pick])
        expected, got = self._run("cas", lambda: self.model.cas(key, value, version, ttl, k),
                                  lambda: target.cas(key, value, version, ttl))
        event(f"cas {pick}: {expected if expected is not RAISED else 'raised'}")
        assert got == expected

    @rule(key=keyed, value=machine_values, ttl=ttls, other=st.booleans())
    def get_or_compute(self, key, value, ttl, other):
        target, key, k = self._target(key, other)
        calls = []

        def compute():
            calls.append(1)
            return value

        expected, got = self._run("get_or_compute", lambda: self.model.get_or_compute(key, lambda: value, ttl, k),
                                  lambda: target.get_or_compute(key, compute, ttl=ttl))
        if expected is not RAISED:
            expected_value, computed = expected
            event(f"get_or_compute: {'computed' if computed else 'hit'}")
            assert bool(calls) == computed
            assert same_value(expected_value, got)

    # ------------------------------------------------------------------------------------------- kinds and views

    @rule(ns=st.sampled_from(KINDS), other=st.booleans())
    def clear_kind(self, ns, other):
        target, _, k = self._target((None, ns), other)
        expected, got = self._run("clear_kind", lambda: self.model.clear_kind(k), target.clear)
        assert got == expected

    @rule(key=viewable_keyed, other=st.booleans(), then=view_thens, key2=keyed, value=pinned_time_values,
          max_entries=st.integers(1, MAX_ENTRIES), max_bytes=max_bytes_choices, other2=st.booleans())
    def view(self, key, other, then, key2, value, max_entries, max_bytes, other2):
        """A zero-copy view shows the stored value, counts a hit, and pins the entry while open: eviction passes it
        by; a put, delete or pop of its key, clear() and a kind's clear() succeed, the entry held aside for the view
        (counted against the limits until it ends); a put that finds only pinned or held entries left to evict
        is not admitted (``not_admitted``), the evictions made standing and the put key's old entry removed; a
        set_limits below what is pinned holds the pinned entries over the new limits aside."""
        target, raw, k = self._target(key, other)
        try:
            expected = self.model.view(raw, k)
        except (KeyError, TypeError) as exc:
            event(f"view: {type(exc).__name__}")
            with pytest.raises(type(exc)):
                target.view(raw)
            return
        kb = key_bytes(raw, k)
        with target.view(raw) as got:
            if type(expected) is bytes:
                assert type(got) is memoryview and got.readonly and bytes(got) == expected
            else:
                assert not got.flags.writeable and same_value(expected, got)
            self.model.pinned.add(kb)
            try:
                if then == "put":
                    self.put(key, value, None, other2)
                elif then == "put_other":
                    self.put(key2, value, None, other2)
                elif then == "delete":
                    self.delete(key, other2)
                elif then == "pop":
                    self.pop(key, other2)
                elif then == "get":
                    self.get(key, other2)
                elif then == "clear":
                    self.clear(other2)
                elif then == "clear_kind":
                    self.clear_kind(key[1] or KINDS[0], other2)
                else:
                    self.set_limits(max_entries, max_bytes, other2)
            finally:
                self.model.pinned.discard(kb)
        self.model.release()  # (the view has ended: what it held goes back)
        event(f"view then {then}")

    # ------------------------------------------------------------------------------------------- whole cache

    @rule(max_entries=st.integers(1, MAX_ENTRIES), max_bytes=max_bytes_choices, other=st.booleans())
    def set_limits(self, max_entries, max_bytes, other):
        limits = CacheLimits(max_entries=max_entries, max_retained_bytes=max_bytes)
        self._run("set_limits", lambda: self.model.set_limits(max_entries, max_bytes),
                  lambda: self._handle(other).set_limits(limits))

    @rule(extra_entries=st.integers(0, 3), extra_bytes=st.integers(0, 64))
    def set_limits_beyond_capacity(self, extra_entries, extra_bytes):
        # (the entry limit reaches 16 times that of creation, the tables' reserve: past it, a refusal)
        entries = 16 * MAX_ENTRIES + extra_entries if extra_entries else MAX_ENTRIES
        limits = CacheLimits(max_entries=entries, max_retained_bytes=CAPACITY + extra_bytes)
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
        self.handles[1] = SharedCache(self.name, create=False, clock=self.clock)

    @precondition(lambda self: self.handles)
    @invariant()
    def agrees_with_model(self):
        m = self.model
        s = self.handles[0].stats()
        assert self.handles[1].stats() == s
        # len(): the live entries of no kind, what iteration yields (stats().entries: every resident entry)
        assert len(self.handles[0]) == len(self.handles[1]) == sum(
            1 for e in m.data.values() if not e.kind and not m._expired(e))
        # Iteration: the live keys of no kind, most recent first; it changes nothing the checks below look at.
        assert [encode_key(k) for k in self.handles[1]] == [
            kb for kb, e in reversed(m.data.items()) if not e.kind and not m._expired(e)]
        assert {c: getattr(s, c) for c in COUNTERS} == m.counters
        assert (s.entries, s.retained_bytes) == (len(m.data), m.retained)
        assert s.kinds == m.kind_stats()
        assert s.recoveries == 0
        assert self.handles[1].limits() == CacheLimits(max_entries=m.max_entries,
                                                       max_retained_bytes=m.max_retained_bytes)
        # The LRU order, versions and expiry times, which lookups would change.
        assert resident_entries(self.handles[1]) == [(kb, e.version, e.expires) for kb, e in m.data.items()]
        for ns, k in [(None, 0), *m.kinds.items()]:
            target = self.handles[0] if ns is None else self.handles[0].kind(ns)
            if ns is not None:
                assert len(target) == sum(1 for e in m.data.values() if e.kind == k and not m._expired(e))
                assert target.stats() == s.kinds[ns]
            # ``in`` of every key, equal keys built differently included; it would drop an expired entry, so those
            # are left to the check above.
            for key in KEYS:
                state = m.state(key, k)
                if state != "expired":
                    assert (key in target) == (state == "live")

    @precondition(lambda self: self.handles)
    @invariant()
    def verifies(self):
        report = self.handles[0].verify()
        assert report.ok, report.problems
        assert (report.entries, report.retained_bytes) == (len(self.model.data), self.model.retained)


TestSharedCacheMatchesReference = SharedCacheMachine.TestCase
# SHMCACHE_MACHINE_EXAMPLES=3000 (with -o timeout=0) for a longer hunt than the suite can afford.
TestSharedCacheMatchesReference.settings = settings(
    max_examples=int(os.environ.get("SHMCACHE_MACHINE_EXAMPLES", examples(100))), stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
