"""The compiled decoder of plain msgpack values (shmcache/_unpack.c) against msgpack itself, as codec.py calls it.

Whatever it decodes must equal msgpack's result exactly (types included: True is not 1, 1.0 is not 1, a float32's
value widened as msgpack widens it); whatever it cannot decode so it must decline (HANDOVER), never guess: ext types,
damaged, truncated or trailing bytes, deep nesting, unhashable map keys.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import uuid
from decimal import Decimal

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmcache import core
from shmcache.codec import decode_value, encode_value

if core.Core is None:
    if os.environ.get("SHMCACHE_PURE_PYTHON") == "1":
        pytest.skip("SHMCACHE_PURE_PYTHON=1: the compiled section is not loaded", allow_module_level=True)
    if os.environ.get("SHMCACHE_REQUIRE_CORE") == "1":
        pytest.fail("SHMCACHE_REQUIRE_CORE=1: shmcache._core is not built", pytrace=False)
    pytest.skip("shmcache._core is not built (python setup.py build_ext --inplace)", allow_module_level=True)

from shmcache import _core
from tests.profiles import examples

DECLINED = core.HANDOVER


def _msgpack(data: bytes):
    """What codec.py's decoder gives for plain data (its ext hook is never reached by what _unpack.c decodes)."""
    return msgpack.unpackb(data, strict_map_key=False)


def same(a, b) -> bool:
    """Equal, and of the same types all the way down (dict pairs in the same order; NaN equals NaN, -0.0 not 0.0)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return len(a) == len(b) and all(same(ka, kb) and same(va, vb)
                                        for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    return a == b


def check(data: bytes) -> object:
    """The compiled decoder's answer for ``data``, checked against msgpack's: equal, or declined."""
    got = _core.unpack(data)
    try:
        want = _msgpack(data)
    except Exception:  # msgpack refuses it: so must the compiled decoder (codec.py then raises)
        assert got is DECLINED, (data, got)
        return got
    assert got is DECLINED or same(got, want), (data, got, want)
    return got


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
    msgpack.packb(msgpack.ExtType(1, b"\x90")),  # a tuple, as codec.py stores one
    msgpack.packb([1, msgpack.ExtType(2, b"")]),  # an ext inside a list
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


@pytest.mark.parametrize("value", [
    dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc), dt.date(2024, 1, 2), dt.time(1), dt.timedelta(-1),
    Decimal("-0"), uuid.UUID(int=1), {1}, frozenset({"a"}), 1j, [1, {"k": dt.date.max}],
], ids=repr)
def test_unpack_declines_standard_types_and_codec_decodes_them(value):
    """The standard types are ext types: the compiled get hands them to codec.py, which returns them exactly."""
    body = encode_value(value)[1:]
    assert _core.unpack(body) is DECLINED
    assert decode_value(b"M" + body) == value


def test_unpack_map_keys_cached_are_the_right_keys():
    """The map key cache never answers a key with another of the same hash slot or length."""
    rng = random.Random(2)
    names = ["".join(rng.choice("abcdefgh") for _ in range(rng.randrange(0, 6))) for _ in range(3000)]
    for i in range(0, len(names), 3):
        record = {names[i]: 1, names[i + 1]: [names[i + 2]], "x" * 33: 2, "é": 3}
        got = check(msgpack.packb(record))
        assert got is not DECLINED and same(got, record)


def test_unpack_takes_bytes_only():
    with pytest.raises(TypeError):
        _core.unpack(bytearray(b"\xc0"))
