"""The standard library's value types (stdtypes.py) as values and keys: exact round trips of type and value, nested
and through a cache, canonical key bytes in every process, and malformed ext bytes refused as ValueError."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import random
import struct
import subprocess
import sys
import textwrap
import uuid
import zoneinfo
from decimal import Decimal, localcontext

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmcache import SharedCache, core
from shmcache.codec import decode_value, encode_key, encode_value
from shmcache.keys import decode_key
from tests.test_codec import same_value

try:
    PARIS, NEW_YORK = zoneinfo.ZoneInfo("Europe/Paris"), zoneinfo.ZoneInfo("America/New_York")
except zoneinfo.ZoneInfoNotFoundError:  # a system without a time zone database (pip install tzdata)
    PARIS = NEW_YORK = None
needs_zones = pytest.mark.skipif(PARIS is None, reason="no time zone database (pip install tzdata)")
UTC = dt.timezone.utc
PLUS_0530 = dt.timezone(dt.timedelta(hours=5, minutes=30))
ODD = dt.timezone(-dt.timedelta(hours=23, minutes=59, seconds=59, microseconds=999_999), "odd")  # the extremes


EDGES = [
    dt.datetime.min, dt.datetime.max, dt.datetime(2024, 2, 29, 23, 59, 59, 999_999),
    dt.datetime(2024, 1, 1, 12, tzinfo=UTC), dt.datetime.max.replace(tzinfo=ODD),
    dt.datetime.min.replace(tzinfo=PLUS_0530), dt.datetime(2021, 10, 31, 2, 30, fold=1),
    dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(microseconds=1))),
    dt.date.min, dt.date.max, dt.date(2000, 2, 29),
    dt.time.min, dt.time.max, dt.time(12, 0, tzinfo=dt.timezone(dt.timedelta(hours=1), "CET")),
    dt.time(0, 0, 0, 1, tzinfo=ODD), dt.time(1, 2, 3, fold=1),
    dt.timedelta.min, dt.timedelta.max, dt.timedelta(0), dt.timedelta(microseconds=-1), dt.timedelta(days=-1),
    Decimal("0"), Decimal("-0"), Decimal("1.0"), Decimal("1.00"), Decimal("-1E-1000000"), Decimal("1E+999999"),
    Decimal("NaN"), Decimal("-NaN"), Decimal("sNaN"), Decimal("NaN123"), Decimal("Infinity"), Decimal("-Infinity"),
    Decimal("3.14159265358979323846264338327950288419716939937510582097494459"),
    uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), uuid.UUID("3e9e8c6a-a9ba-40de-87fb-b96a1c311891"),
    uuid.uuid5(uuid.NAMESPACE_DNS, "example.org"),
    set(), frozenset(), {1, "a", b"b", None, 2.5, (1, 2), frozenset({3})}, frozenset({dt.date(2020, 1, 1)}),
    complex(0, 0), complex(-0.0, -0.0), complex(math.inf, -math.inf), complex(math.nan, 1), 1e308j,
] + ([] if PARIS is None else [
    dt.datetime(2021, 10, 31, 2, 30, fold=1, tzinfo=PARIS),  # the second 02:30 of that night: CET
    dt.datetime(2021, 7, 1, tzinfo=NEW_YORK),
])


def stable_id(value) -> str:
    """A test's id that is the same in every process (pytest-xdist's workers must collect the same ids): a set's
    repr follows its elements' hash order, which a process's hash seed decides."""
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({', '.join(sorted(map(repr, value)))})"
    return repr(value)


@pytest.mark.parametrize("value", EDGES, ids=stable_id)
def test_stdtypes_value_round_trip(value):
    got = decode_value(encode_value(value))
    assert same_value(value, got), (value, got)


@pytest.mark.parametrize("value", EDGES, ids=stable_id)
def test_stdtypes_value_round_trip_nested(value):
    nested = {"v": [value, (value,)], "d": {"k": value}}
    got = decode_value(encode_value(nested))
    assert same_value(nested, got)


def test_stdtypes_as_dict_keys_of_a_value():
    value = {dt.date(2024, 1, 1): 1, frozenset({"x"}): [2], uuid.UUID(int=7): {3}, Decimal("1.5"): 4j,
             (dt.time(1), dt.timedelta(2)): None}
    assert same_value(value, decode_value(encode_value(value)))


@needs_zones
def test_stdtypes_named_zone_comes_back_as_its_fixed_offset():
    paris = dt.datetime(2024, 7, 14, 12, tzinfo=PARIS)
    got = decode_value(encode_value(paris))
    assert got == paris and got.tzinfo == dt.timezone(dt.timedelta(hours=2), "CEST") and got.tzname() == "CEST"
    assert type(got.tzinfo) is dt.timezone


def test_stdtypes_subclasses_are_stored_as_their_base():
    class Stamp(dt.datetime):
        pass

    class Id(uuid.UUID):
        pass

    got = decode_value(encode_value([Stamp(2020, 1, 2), Id(int=5), type("S", (set,), {})({1})]))
    assert same_value([dt.datetime(2020, 1, 2), uuid.UUID(int=5), {1}], got)


class _Stamp(dt.datetime):
    """A datetime with nanoseconds, as pandas' Timestamp is."""

    nanosecond = 1


def test_stdtypes_nanoseconds_are_refused_not_dropped():
    with pytest.raises(TypeError, match="nanoseconds"):
        encode_value({"t": _Stamp(2024, 1, 1)})
    with pytest.raises(TypeError, match="nanoseconds"):
        encode_key(_Stamp(2024, 1, 1))


class _NoOffset(dt.tzinfo):
    def utcoffset(self, d):
        return None


@pytest.mark.parametrize("value", [dt.time(1, tzinfo=_NoOffset()), dt.datetime(2020, 1, 1, tzinfo=_NoOffset())]
                         + ([] if PARIS is None else [dt.time(1, tzinfo=PARIS)]))
def test_stdtypes_tzinfo_without_an_offset_is_refused(value):
    with pytest.raises(TypeError, match="no UTC offset"):
        encode_value(value)
    with pytest.raises(TypeError, match="no UTC offset"):
        encode_key(value)


def test_stdtypes_golden_bytes():
    """The byte formats the layout spec documents."""
    assert encode_value(dt.date(2024, 3, 9)) == b"M\xd6\x06\xe8\x07\x03\x09"
    assert encode_value(dt.datetime(2024, 3, 9, 1, 2, 3, 4, tzinfo=UTC)) == (
        b"M\xc7\x14\x05\xe8\x07\x03\x09\x01\x02\x03\x00\x04\x00\x00\x00" + bytes(8))
    assert encode_value(dt.time(1, 2, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=1), "CET"))) == (
        b"M\xc7\x13\x07\x01\x02\x03\x00\x04\x00\x00\x00" + struct.pack("<q", 3_600_000_000) + b"CET")
    assert encode_value(dt.timedelta(-1, 2, 3)) == b"M\xc7\x0c\x08" + struct.pack("<iII", -1, 2, 3)
    assert encode_value(Decimal("-1.50E+30")) == b"M\xc7\x09\x09-1.50E+30"
    assert encode_value(uuid.UUID(int=1)) == b"M\xd8\x0a" + bytes(15) + b"\x01"
    assert encode_value(1 - 2j) == b"M\xd8\x0d" + struct.pack("<dd", 1, -2)
    assert encode_value(frozenset({7})) == b"M\xd5\x0c\x91\x07"
    assert encode_value({7}) == b"M\xd5\x0b\x91\x07"


# ------------------------------------------------------------------------------------------------------------ keys


@pytest.mark.parametrize("key", EDGES, ids=stable_id)
def test_stdtypes_key_round_trip_and_canonical(key):
    kb = encode_key(key)
    back = decode_key(kb)
    assert encode_key(back) == kb
    if not isinstance(key, complex):  # complex keys canonicalise -0.0 and NaN, as float keys do
        assert same_value(key, back)


def test_stdtypes_keys_typed_and_distinct():
    keys = [dt.date(2020, 1, 1), dt.datetime(2020, 1, 1), "2020-01-01", dt.timedelta(0), 0, 0j, Decimal(0),
            Decimal("0.0"), Decimal("-0"), frozenset(), set(), (), [], uuid.UUID(int=0), bytes(16), 1j, (0.0, 1.0)]
    assert len({encode_key(k) for k in keys}) == len(keys)


@needs_zones
def test_stdtypes_aware_datetimes_key_by_wall_clock_and_offset():
    """Equal instants in different zones are equal datetimes, but different keys (their str, tzname and the result
    of any computation that formats them differ): a miss, never another zone's value."""
    utc = dt.datetime(2024, 1, 1, 12, tzinfo=UTC)
    paris = dt.datetime(2024, 1, 1, 13, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    named = dt.datetime(2024, 1, 1, 13, tzinfo=PARIS)
    assert utc == paris == named
    assert len({encode_key(utc), encode_key(paris), encode_key(named), encode_key(utc.replace(tzinfo=None))}) == 4
    assert encode_key(named) == encode_key(named.replace(tzinfo=dt.timezone(dt.timedelta(hours=1), "CET")))


def test_stdtypes_complex_keys_canonical():
    assert encode_key(complex(-0.0, 0.0)) == encode_key(0j)
    assert encode_key(complex(math.nan, 1)) == encode_key(complex(-math.nan, 1))
    assert encode_key(1j) != encode_key(1.0) and encode_key(1 + 0j) != encode_key(1)


_SET_KEY_SCRIPT = textwrap.dedent("""
    import sys
    from shmcache.codec import encode_key
    words = [f"w{i}" for i in range(200)]
    print(encode_key([set(words), frozenset(words[:50]), {"a": frozenset(map(str, range(30)))}]).hex())
""")


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_stdtypes_set_keys_same_bytes_under_every_hash_seed():
    """A set's iteration order depends on the process's hash seed; its key bytes must not."""
    out = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", _SET_KEY_SCRIPT], capture_output=True, text=True, env=env,
                              timeout=30)
        assert proc.returncode == 0, proc.stderr
        out.add(proc.stdout.strip())
    assert len(out) == 1


# ------------------------------------------------------------------------------------------------ malformed bytes


def ext(code: int, body: bytes) -> bytes:
    return b"M" + msgpack.packb(msgpack.ExtType(code, body))


_DT = struct.Struct("<HBBBBBBI")
_T = struct.Struct("<BBBBI")
MALFORMED_EXT = {
    "datetime-empty": ext(5, b""),
    "datetime-truncated": ext(5, _DT.pack(2020, 1, 1, 0, 0, 0, 0, 0)[:11]),
    "datetime-month-13": ext(5, _DT.pack(2020, 13, 1, 0, 0, 0, 0, 0)),
    "datetime-day-0": ext(5, _DT.pack(2020, 1, 0, 0, 0, 0, 0, 0)),
    "datetime-feb-30": ext(5, _DT.pack(2021, 2, 29, 0, 0, 0, 0, 0)),
    "datetime-year-0": ext(5, _DT.pack(0, 1, 1, 0, 0, 0, 0, 0)),
    "datetime-year-10000": ext(5, _DT.pack(10000, 1, 1, 0, 0, 0, 0, 0)),
    "datetime-hour-24": ext(5, _DT.pack(2020, 1, 1, 24, 0, 0, 0, 0)),
    "datetime-second-60": ext(5, _DT.pack(2020, 1, 1, 0, 0, 60, 0, 0)),
    "datetime-fold-2": ext(5, _DT.pack(2020, 1, 1, 0, 0, 0, 2, 0)),
    "datetime-microsecond-1e6": ext(5, _DT.pack(2020, 1, 1, 0, 0, 0, 0, 1_000_000)),
    "datetime-offset-short": ext(5, _DT.pack(2020, 1, 1, 0, 0, 0, 0, 0) + bytes(7)),
    "datetime-offset-a-day": ext(5, _DT.pack(2020, 1, 1, 0, 0, 0, 0, 0) + struct.pack("<q", 86_400_000_000)),
    "datetime-offset-min": ext(5, _DT.pack(2020, 1, 1, 0, 0, 0, 0, 0) + struct.pack("<q", -2**63)),
    "datetime-zone-name-bad-utf8": ext(5, _DT.pack(2020, 1, 1, 0, 0, 0, 0, 0) + bytes(8) + b"\xff"),
    "datetime-zone-name-default": ext(5, _DT.pack(2020, 1, 1, 0, 0, 0, 0, 0) + bytes(8) + b"UTC"),
    "date-short": ext(6, b"\xe8\x07\x01"),
    "date-long": ext(6, b"\xe8\x07\x01\x01\x00"),
    "date-month-0": ext(6, struct.pack("<HBB", 2020, 0, 1)),
    "date-day-32": ext(6, struct.pack("<HBB", 2020, 1, 32)),
    "time-truncated": ext(7, _T.pack(0, 0, 0, 0, 0)[:7]),
    "time-minute-60": ext(7, _T.pack(0, 60, 0, 0, 0)),
    "time-fold-255": ext(7, _T.pack(0, 0, 0, 255, 0)),
    "time-offset-a-day-negative": ext(7, _T.pack(0, 0, 0, 0, 0) + struct.pack("<q", -86_400_000_000)),
    "timedelta-short": ext(8, bytes(11)),
    "timedelta-long": ext(8, bytes(13)),
    "timedelta-seconds-a-day": ext(8, struct.pack("<iII", 0, 86_400, 0)),
    "timedelta-microseconds-1e6": ext(8, struct.pack("<iII", 0, 0, 1_000_000)),
    "timedelta-days-past-max": ext(8, struct.pack("<iII", 1_000_000_000, 0, 0)),
    "timedelta-days-past-min": ext(8, struct.pack("<iII", -1_000_000_000, 0, 0)),
    "decimal-empty": ext(9, b""),
    "decimal-garbage": ext(9, b"1.2.3"),
    "decimal-not-ascii": ext(9, "١".encode()),
    "decimal-not-canonical-exponent": ext(9, b"1.0e5"),
    "decimal-not-canonical-underscore": ext(9, b"1_0"),
    "decimal-not-canonical-space": ext(9, b" 1"),
    "decimal-not-canonical-plus": ext(9, b"+1"),
    "decimal-not-canonical-inf": ext(9, b"inf"),
    "uuid-short": ext(10, bytes(15)),
    "uuid-long": ext(10, bytes(17)),
    "set-not-array": ext(11, msgpack.packb("abc")),
    "set-unhashable-item": ext(11, msgpack.packb([[1]])),
    "set-garbage": ext(11, b"\xc1"),
    "set-trailing": ext(11, b"\x90\x01"),
    "frozenset-truncated": ext(12, b"\x92\x01"),
    "frozenset-unhashable-map": ext(12, msgpack.packb([{}])),
    "tuple-not-array": ext(1, msgpack.packb("abc")),
    "complex-short": ext(13, bytes(15)),
    "complex-long": ext(13, bytes(17)),
    "set-as-map-key": b"M\x81" + msgpack.packb(msgpack.ExtType(11, b"\x90")) + b"\x01",
}


@pytest.mark.parametrize("data", MALFORMED_EXT.values(), ids=MALFORMED_EXT.keys())
def test_stdtypes_malformed_ext_is_a_value_error(data):
    with pytest.raises(ValueError):
        decode_value(data)
    with pytest.raises(ValueError):
        decode_key(b"\xc1" + data[1:])
    if core.Core is not None:
        from shmcache import _core
        assert _core.unpack(data[1:]) is core.HANDOVER  # the compiled decoder declines: codec.py raises


def test_stdtypes_decimal_under_a_context_that_traps_nothing():
    """A syntax error gives NaN where InvalidOperation is not trapped: still malformed."""
    with localcontext() as ctx:
        ctx.traps = dict.fromkeys(ctx.traps, False)
        with pytest.raises(ValueError):
            decode_value(ext(9, b"abc"))
        assert same_value(Decimal("1.000"), decode_value(encode_value(Decimal("1.000"))))


def test_stdtypes_mutated_bytes_decode_or_raise_value_error():
    """Every byte of every edge value's encoding, changed: a value of some type, or ValueError; never another
    exception, never a crash. The compiled decoder returns the same value, or declines."""
    rng = random.Random(39)
    unpack = None
    if core.Core is not None:
        from shmcache import _core
        unpack = _core.unpack
    for value in EDGES:
        good = encode_value([value])
        for _ in range(60):
            raw = bytearray(good)
            for _ in range(rng.randrange(1, 3)):
                raw[rng.randrange(1, len(raw))] = rng.randrange(256)
            cut = bytes(raw[: rng.randrange(1, len(raw) + 1)])
            for data in (bytes(raw), cut):
                try:
                    want = decode_value(data)
                except ValueError:
                    want = core.HANDOVER  # refused: the compiled decoder must decline it
                if unpack is not None:
                    got = unpack(data[1:])
                    assert got is core.HANDOVER or same_value(want, got), (data, got, want)


# ----------------------------------------------------------------------------------------------- hypothesis


_zones = st.none() | (st.nothing() if PARIS is None else st.timezones()) | st.builds(
    dt.timezone, st.timedeltas(-dt.timedelta(hours=23, minutes=59), dt.timedelta(hours=23, minutes=59)))
_scalars = (st.datetimes(timezones=_zones, allow_imaginary=False) | st.dates()
            | st.times(timezones=st.none() | st.builds(dt.timezone, st.timedeltas(-dt.timedelta(hours=23),
                                                                                  dt.timedelta(hours=23))))
            | st.timedeltas() | st.decimals(allow_nan=True, allow_infinity=True) | st.uuids()
            | st.complex_numbers(allow_nan=True, allow_infinity=True)
            | st.integers() | st.text(max_size=8) | st.floats(allow_nan=False))
_hashable = st.recursive(_scalars.filter(lambda x: not (isinstance(x, Decimal) and x.is_snan())),
                         lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=4), max_leaves=8)
std_values = st.recursive(_scalars | st.sets(_hashable, max_size=5) | st.frozensets(_hashable, max_size=5),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                  max_size=4),
                       max_leaves=16)
SETTINGS = settings(max_examples=200, deadline=None)


@SETTINGS
@given(std_values)
def test_stdtypes_property_value_round_trip(value):
    assert same_value(value, decode_value(encode_value(value)))


@SETTINGS
@given(std_values)
def test_stdtypes_property_key_canonical(key):
    kb = encode_key(key)
    assert encode_key(decode_key(kb)) == kb


@SETTINGS
@given(st.sets(st.text(max_size=6) | st.integers() | st.uuids() | st.dates(), max_size=12),
       st.randoms(use_true_random=False))
def test_stdtypes_property_set_key_independent_of_order(items, rnd):
    order = list(items)
    rnd.shuffle(order)
    rebuilt = set()
    for x in order:  # another insertion order, so (often) another iteration order
        rebuilt.add(x)
    assert encode_key(rebuilt) == encode_key(items)
    assert encode_key(frozenset(order)) == encode_key(frozenset(items))


# ------------------------------------------------------------------------------------------------ through a cache


VALUE = {"when": dt.datetime(2024, 5, 6, 7, 8, 9, 10, tzinfo=PLUS_0530), "day": dt.date(2024, 5, 6),
         "at": dt.time(23, 59, 59, 999_999), "took": dt.timedelta(days=-2, microseconds=3),
         "price": Decimal("19.990"), "id": uuid.UUID(int=12345), "tags": {"a", "b"}, "frozen": frozenset({1, 2}),
         "z": 3 - 4j, "nested": [(Decimal("NaN"), {frozenset({dt.date.min})})]}


def test_stdtypes_through_put_get_and_get_many(cache):
    keys = [dt.date(2024, 1, 1), frozenset({"x", "y"}), (uuid.UUID(int=1), Decimal("2.50")), 1j,
            dt.datetime(2024, 1, 1, tzinfo=UTC), dt.timedelta(seconds=5), dt.time(3)]
    for i, k in enumerate(keys):
        cache.put(k, [i, VALUE])
    for i, k in enumerate(keys):
        assert same_value([i, VALUE], cache.get(k))
    assert all(same_value([i, VALUE], got) for i, got in enumerate(cache.get_many(keys)))
    assert same_value(VALUE, cache.get_many([dt.date(2024, 1, 1)])[0][1])
    assert cache.get(dt.datetime(2024, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))) is None  # other zone
    assert cache.get(Decimal("2.5")) is None and cache.get(set()) is None
    assert sorted(map(repr, cache.keys())) == sorted(map(repr, keys))
    assert cache.verify().ok


def test_stdtypes_memoize_takes_them_as_arguments(cache):
    calls = []

    @cache.memoize()
    def total(day: dt.date, amounts: frozenset, rate: Decimal) -> Decimal:
        calls.append(day)
        return sum(amounts, Decimal(0)) * rate

    args = (dt.date(2024, 1, 1), frozenset({Decimal("1.10"), Decimal("2.20")}), Decimal("1.5"))
    assert total(*args) == Decimal("4.950") and total(*args) == Decimal("4.950") and len(calls) == 1


def test_stdtypes_unsupported_value_error_says_what_to_do(cache):
    class Point:
        pass

    with pytest.raises(TypeError) as info:
        cache.put("k", {"p": Point()})
    message = str(info.value)
    assert "Point" in message and "datetime" in message and "Decimal" in message
    assert "serializer='pickle'" in message and "trust" in message and "dataclasses.asdict" in message
    with pytest.raises(TypeError) as info:
        cache.put(Point(), 1)
    assert "Point" in str(info.value) and "UUID" in str(info.value) and "never pickled" in str(info.value)


_READER = textwrap.dedent("""
    import datetime as dt, json, sys, uuid
    from shmcache import SharedCache
    from shmcache.codec import encode_key
    with SharedCache(sys.argv[1]) as c:
        got = c.get(frozenset(f"w{i}" for i in range(40)))
        day = c.get(dt.date(2024, 5, 6))
        c.put({"set", "from", "child"}, {uuid.UUID(int=9): dt.timedelta(days=1, microseconds=-1)})
    # A key's encoding is canonical and typed all the way down: equal bytes, equal values of equal types.
    print(json.dumps({"value": encode_key(got).hex(), "day": encode_key(day).hex()}))
""")


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_stdtypes_read_by_another_process(name):
    """Another process, with another hash seed, finds set and date keys and decodes the values exactly."""
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True) as c:
        c.put(frozenset(f"w{i}" for i in range(40)), VALUE)
        c.put(dt.date(2024, 5, 6), [dt.datetime.max, Decimal("-0")])
        env = {**os.environ, "PYTHONHASHSEED": "777"}
        proc = subprocess.run([sys.executable, "-c", _READER, name], capture_output=True, text=True, env=env,
                              timeout=50)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout)
        assert seen == {"value": encode_key(VALUE).hex(), "day": encode_key([dt.datetime.max, Decimal("-0")]).hex()}
        assert same_value({uuid.UUID(int=9): dt.timedelta(days=1, microseconds=-1)}, c.get({"from", "child", "set"}))
