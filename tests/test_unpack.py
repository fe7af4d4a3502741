"""The compiled decoder of plain msgpack values (shmcache/_unpack.c) against msgpack itself, as codec.py calls it.

Whatever it decodes must equal msgpack's result exactly (types included: True is not 1, 1.0 is not 1, a float32's
value widened as msgpack widens it); whatever it cannot decode so it must decline (HANDOVER), never guess: ext types,
damaged, truncated or trailing bytes, deep nesting, unhashable map keys.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmcache import core
from shmcache.codec import decode_value, encode_value
from tests.test_codec import same_value
from tests.test_stdtypes import MALFORMED_EXT as MALFORMED
from tests.test_stdtypes import EDGES, stable_id
from tests.test_stdtypes import std_values

if core.Core is None:
    if os.environ.get("SHMCACHE_PURE_PYTHON") == "1":
        pytest.skip("SHMCACHE_PURE_PYTHON=1: the compiled section is not loaded", allow_module_level=True)
    if os.environ.get("SHMCACHE_REQUIRE_CORE") == "1":
        pytest.fail("SHMCACHE_REQUIRE_CORE=1: shmcache._core is not built", pytrace=False)
    pytest.skip("shmcache._core is not built (python setup.py build_ext --inplace)", allow_module_level=True)

from shmcache import _core
from tests.profiles import examples

DECLINED = core.HANDOVER


def _codec(data: bytes):
    """What codec.py's decoder gives for the body of an ``M`` value: msgpack's value, with codec.py's ext types."""
    return decode_value(b"M" + data)


def check(data: bytes) -> object:
    """The compiled decoder's answer for ``data``, checked against codec.py's: the same value of the same types all
    the way down (dict pairs and set items in the same order; NaN equals NaN, -0.0 not 0.0), or declined."""
    got = _core.unpack(data)
    try:
        want = _codec(data)
    except ValueError:  # codec.py refuses it: so must the compiled decoder
        assert got is DECLINED, (data, got)
        return got
    assert got is DECLINED or (same_value(got, want) and _order(got) == _order(want)), (data, got, want)
    return got


def _order(v) -> list:
    """The iteration order of every set and dict in ``v``, which both decoders must build alike: items inserted in
    the same order give the same order, except where a NaN is hashed (by its identity, since Python 3.10)."""
    if isinstance(v, (set, frozenset)):
        items = [_order(x) for x in v]
        return [type(v).__name__, *(sorted(items) if "nan" in repr(v).lower() else items)]
    if isinstance(v, (list, tuple)):
        return [type(v).__name__, *(_order(x) for x in v)]
    if isinstance(v, dict):
        return ["dict", *(_order(x) for x in v.items())]
    return [repr(v)]


scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=True)
           | st.text(max_size=40) | st.binary(max_size=40))
keys = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=40) \
    | st.binary(max_size=10)
plain = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(keys, inner, max_size=6),
                     max_leaves=40)


@settings(max_examples=examples(800), deadline=None)
@given(plain, st.booleans())
def test_unpack_decodes_plain_values_as_msgpack_does(value, single_float):
    try:
        data = msgpack.packb(value, use_bin_type=True, use_single_float=single_float)
    except OverflowError:  # a float beyond float32's range
        data = msgpack.packb(value, use_bin_type=True)
    got = check(data)
    assert got is not DECLINED, data  # every plain value is decoded, not handed back


@settings(max_examples=examples(400), deadline=None)
@given(plain, st.data())
def test_unpack_damaged_bytes_decode_as_msgpack_or_decline(value, data):
    raw = bytearray(msgpack.packb(value, use_bin_type=True))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    check(bytes(raw))
    cut = data.draw(st.integers(0, len(raw)))
    check(bytes(raw[:cut]))  # truncated
    check(bytes(raw) + b"\x00")  # trailing bytes: msgpack's ExtraData


def test_unpack_random_bytes_never_read_past_the_end():
    rng = random.Random(1)
    for _ in range(20_000):
        check(rng.randbytes(rng.randrange(0, 24)))


@pytest.mark.parametrize("data", [
    msgpack.packb([1, msgpack.ExtType(2, b"")]),  # an array ext inside a list
    msgpack.packb(msgpack.ExtType(3, b"\x01")),  # a big int
    msgpack.packb(msgpack.ExtType(14, b"")),  # a code no version has used
    msgpack.packb(msgpack.Timestamp(1, 2)),
    b"\xc1",  # never used by msgpack
    b"\x91" * 40 + b"\xc0",  # nested deeper than codec._MAX_DEPTH
    b"\x81\x90\x01",  # a list as a map key: unhashable
    b"\xa2\xff\xfe",  # invalid UTF-8
    b"\xdd\xff\xff\xff\xff",  # a 4 G-item array in 5 bytes: declined before allocating
    b"\xdf\xff\xff\xff\xff",
    b"\xdb\xff\xff\xff\xff",
    b"",
])
def test_unpack_declines_what_codec_decodes_or_refuses(data):
    assert _core.unpack(data) is DECLINED
    check(data)


@pytest.mark.parametrize("value", EDGES + [
    (), (1, (2, [3])), [1, {"k": dt.date.max, (1, "t"): {frozenset({2})}}],
    dt.time(1, tzinfo=dt.timezone.utc), dt.datetime(2024, 7, 1, tzinfo=dt.timezone(dt.timedelta(hours=2), "CEST")),
], ids=stable_id)
def test_unpack_decodes_tuples_sets_and_standard_types_as_codec_does(value):
    body = encode_value(value)[1:]
    got = check(body)
    assert got is not DECLINED and same_value(value, got)


@settings(max_examples=300, deadline=None)
@given(std_values, st.data())
def test_unpack_standard_types_valid_and_damaged_as_codec(value, data):
    raw = bytearray(encode_value(value)[1:])
    assert check(bytes(raw)) is not DECLINED or _has_big_int(value)  # a big int's ext (3) is codec.py's
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    check(bytes(raw))
    check(bytes(raw[: data.draw(st.integers(0, len(raw)))]))
    check(bytes(raw) + b"\x00")


def _has_big_int(v) -> bool:
    if type(v) is int:
        return not -(2**63) <= v < 2**64
    if isinstance(v, dict):
        return any(_has_big_int(x) for x in (*v.keys(), *v.values()))
    return isinstance(v, (list, tuple, set, frozenset)) and any(_has_big_int(x) for x in v)


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_unpack_declines_malformed_standard_types(body):
    assert _core.unpack(body[1:]) is DECLINED
    check(body[1:])


def test_unpack_random_ext_bytes_never_read_past_the_end():
    """Random bytes behind each ext header and code this file decodes: decoded as codec.py does, or declined."""
    rng = random.Random(3)
    for _ in range(20_000):
        code = rng.choice([1, 5, 6, 7, 8, 9, 10, 11, 12, 13])
        n = rng.choice([0, 1, 2, 3, 4, 7, 8, 11, 12, 13, 15, 16, 17, 20, 23, rng.randrange(0, 40)])
        head = bytes((0xD4 + (1, 2, 4, 8, 16).index(n), code)) if n in (1, 2, 4, 8, 16) else bytes((0xC7, n, code))
        body = bytearray(rng.randbytes(n))
        if code in (5, 6) and n >= 4 and rng.random() < 0.7:  # a plausible date, so the deeper fields are reached
            body[0:4] = struct.pack("<HBB", rng.randrange(1, 10000), rng.randrange(1, 13), rng.randrange(1, 29))
        check(head + bytes(body))


def test_unpack_map_keys_cached_are_the_right_keys():
    """The map key cache never answers a key with another of the same hash slot or length."""
    rng = random.Random(2)
    names = ["".join(rng.choice("abcdefgh") for _ in range(rng.randrange(0, 6))) for _ in range(3000)]
    for i in range(0, len(names), 3):
        record = {names[i]: 1, names[i + 1]: [names[i + 2]], "x" * 33: 2, "é": 3}
        got = check(msgpack.packb(record))
        assert got is not DECLINED and same_value(got, record)


def test_unpack_takes_bytes_only():
    with pytest.raises(TypeError):
        _core.unpack(bytearray(b"\xc0"))
