"""codec on plain bytes: canonical keys, fingerprints, value round trips and malformed input. No shared memory."""

from __future__ import annotations

import contextlib
import copy
import datetime
import decimal
import enum
import io
import json
import math
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import threading
import uuid

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmcache.codec import NON_STR_KEY, decode_array, decode_value, encode_key, encode_value, fingerprint

# Every dtype the codec stores: bool, int, uint, float and complex of each size numpy has on this platform.
NUMERIC_DTYPES = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "g", "c8", "c16", "G"]
MULTIBYTE_DTYPES = [d for d in NUMERIC_DTYPES if np.dtype(d).itemsize > 1]
SHAPES = [(), (0,), (3, 0), (5,), (2, 3), (2, 1, 3)]
PLAIN_TYPES = (type(None), bool, int, float, str, bytes, complex, datetime.datetime, datetime.date, datetime.time,
               datetime.timedelta, decimal.Decimal, uuid.UUID)  # the standard types a value may hold (stdtypes.py)


def same_value(a, b) -> bool:
    """``b`` is ``a`` after a round trip: same types all the way down, arrays bit for bit, NaN equal to NaN."""
    if isinstance(a, np.ndarray):
        return (
            type(b) is np.ndarray and a.dtype.str == b.dtype.str and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, complex):
        return same_value(a.real, b.real) and same_value(a.imag, b.imag)
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)  # exact: 1.0 is not 1.00, -0 is not 0, NaN payloads kept
    if isinstance(a, (datetime.datetime, datetime.time)):  # the wall clock, fold, offset and zone name
        return (a.replace(tzinfo=None) == b.replace(tzinfo=None) and a.fold == b.fold
                and a.utcoffset() == b.utcoffset() and a.tzname() == b.tzname())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):  # decoding keeps the encoder's pair order, so compare pairs in order
        return len(a) == len(b) and all(
            same_value(ka, kb) and same_value(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items())
        )
    if isinstance(a, (set, frozenset)):  # NaN items are equal to nothing: matched by same_value instead
        return len(a) == len(b) and all(any(same_value(x, y) for y in b) for x in a)
    return a == b


def is_plain(obj) -> bool:
    """Only data the codec documents: no object of a class named by the input."""
    if type(obj) in PLAIN_TYPES:
        return True
    if type(obj) in (list, tuple, set, frozenset):
        return all(is_plain(x) for x in obj)
    if type(obj) is dict:
        return all(is_plain(k) and is_plain(v) for k, v in obj.items())
    return type(obj) is np.ndarray and obj.dtype.kind in "biufc"


def sample_array(dtype, shape=(2, 3)) -> np.ndarray:
    dt = np.dtype(dtype)
    n = math.prod(shape)
    base = np.arange(n) % 2 if dt.kind == "b" else np.arange(n) * 3 - (n if dt.kind in "ifc" else 0)
    if dt.kind == "c":
        base = base + 1j * np.arange(n)
    return np.asarray(base).astype(dt).reshape(shape)


def a_tagged(header, data: bytes) -> bytes:
    """An ``A``-tagged value laid out as codec.py documents it, with any header and data."""
    hb = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<BxHxxxx", ord("A"), len(hb)) + hb + b"\0" * (-len(hb) % 8) + data


def ext_array(header, data: bytes, hlen: int | None = None) -> bytes:
    """An ``M``-tagged value holding one array ext (code 2) with any header and data."""
    hb = msgpack.packb(header, use_bin_type=True)
    payload = struct.pack("<I", len(hb) if hlen is None else hlen) + hb + data
    return b"M" + msgpack.packb(msgpack.ExtType(2, payload), use_bin_type=True)


def t_tagged(code: int, header, data: bytes) -> bytes:
    """A ``T``-tagged value (a tensor) laid out as the layout spec says, with any dtype code, header and data."""
    hb = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<BBHxxxx", ord("T"), code, len(hb)) + hb + b"\0" * (-len(hb) % 8) + data


def ext_raw(code: int, payload: bytes) -> bytes:
    """A msgpack ext object of any code, negative (reserved) ones included, which msgpack.ExtType refuses."""
    return struct.pack(">BIb", 0xC9, len(payload), code) + payload


def ext(code: int, payload: bytes) -> bytes:
    return b"M" + ext_raw(code, payload)


# ---------------------------------------------------------------------------------------------------- keys


def test_key_dict_insertion_order_irrelevant():
    assert encode_key({"a": 1, "b": 2, "c": 3}) == encode_key({"c": 3, "a": 1, "b": 2})


def test_key_nested_dict_insertion_order_irrelevant():
    one = {"x": {"p": 1, "q": [1, {"m": None, "n": b"n"}]}, "y": ({"s": 1.5, "t": True},), "z": 0}
    two = {"z": 0, "y": ({"t": True, "s": 1.5},), "x": {"q": [1, {"n": b"n", "m": None}], "p": 1}}
    assert encode_key(one) == encode_key(two)
    assert encode_key([one, (two,)]) == encode_key([two, (one,)])


def test_key_dict_with_mixed_key_types_order_irrelevant():
    pairs = [(1, "int"), ("1", "str"), (b"1", "bytes"), (1.5, "float"), ((1, "t"), "tuple"), (None, "none"),
             (2**70, "bigint"), (False, "bool")]
    assert encode_key(dict(pairs)) == encode_key(dict(reversed(pairs)))


def test_key_dict_large_order_irrelevant():
    # 300 pairs: past the 15 a fixmap holds, so the map16 header is used.
    items = [(f"k{i}", i) for i in range(300)]
    assert encode_key(dict(items)) == encode_key(dict(reversed(items)))


EQUAL_KEY_PAIRS = [
    ("ab", "".join(["a", "b"])),
    (b"ab", bytes([97, 98])),
    (12345678901234567890, int("12345678901234567890")),
    (2**100, int("1" + "0" * 30, 16) // 2**20),
    (0.1, float("0.1")),
    ((1, "a", (2.5, None)), tuple([1, "a", tuple([2.5, None])])),
    ([1, [2, [3]]], list((1, [2, [3]]))),
    ({"a": [1, 2]}, dict(a=[1, 2])),
    (np.arange(6, dtype="i4").reshape(2, 3), np.array([[0, 1, 2], [3, 4, 5]], dtype="i4")),
]


@pytest.mark.parametrize("a, b", EQUAL_KEY_PAIRS, ids=[type(a).__name__ for a, _ in EQUAL_KEY_PAIRS])
def test_key_equal_keys_equal_bytes(a, b):
    assert a is not b
    assert encode_key(a) == encode_key(b) == encode_key(copy.deepcopy(a))


def test_key_typed_scalars_distinct():
    keys = [1, 1.0, True, "1", b"1", 0, 0.0, False, "", b"", None, "None", [], (), {}]
    encoded = [encode_key(k) for k in keys]
    assert len(set(encoded)) == len(keys)


@pytest.mark.parametrize("as_tuple, as_list", [((1, 2), [1, 2]), ((), []), (((1,),), ([1],)), (("a", [1]), ["a", [1]])])
def test_key_tuple_and_list_distinct(as_tuple, as_list):
    assert encode_key(as_tuple) != encode_key(as_list)


def test_key_str_is_its_utf8_and_other_keys_are_marked():
    for k in ("", "abc", "é" * 40, "\U0001f600", "\x00" * 300):
        assert encode_key(k) == k.encode("utf-8")
    for k in (b"", b"abc", b"\xc1", 0, None, ("abc",), ["abc"], {"abc": 1}, np.arange(3)):
        assert encode_key(k)[:1] == NON_STR_KEY


@given(st.text(), st.one_of(st.binary(), st.integers(), st.floats(), st.lists(st.text(), max_size=3)))
def test_key_str_never_equals_another_type(text, other):
    assert encode_key(text) != encode_key(other)


def test_key_str_subclass_keys_as_its_text():
    class Colour(str, enum.Enum):
        RED = "red"

    assert encode_key(Colour.RED) == encode_key("red")
    assert encode_key([Colour.RED]) == encode_key(["red"])


def test_key_lone_surrogate_is_a_type_error():
    with pytest.raises(TypeError, match="cannot encode key"):
        encode_key("\ud800")


@pytest.mark.parametrize("n", [2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, 2**200, -(2**63), -(2**63) - 1,
                               -(2**64), -(2**200)])
def test_key_bigint(n):
    kb = encode_key(n)
    assert kb == encode_key(int(str(n)))
    others = {encode_key(m) for m in (n - 1, n + 1, -n, float(n), str(n))}
    assert kb not in others
    assert encode_key((n, 1)) != encode_key((n + 1, 1))


def test_key_bigints_all_distinct():
    ns = [s * (2**k + d) for k in range(60, 140, 4) for d in (-1, 0, 1) for s in (1, -1)]
    assert len({encode_key(n) for n in ns}) == len(set(ns))


def test_key_ndarray_dtype_matters():
    values = [0, 1, 1, 0]
    dtypes = ["?", "u1", "i1", "i2", "i4", "i8", "u8", "f4", "f8", "c16"]
    encoded = {encode_key(np.array(values, dtype=d)) for d in dtypes}
    assert len(encoded) == len(dtypes)


def test_key_ndarray_shape_matters():
    a = np.arange(6, dtype="i8")
    shapes = [(6,), (2, 3), (3, 2), (1, 6), (6, 1), (1, 2, 3)]
    assert len({encode_key(a.reshape(s)) for s in shapes}) == len(shapes)
    assert encode_key(np.zeros((0,), "i4")) != encode_key(np.zeros((0, 3), "i4"))
    assert encode_key(np.array(5, "i4")) != encode_key(np.array([5], "i4"))


def test_key_ndarray_values_matter():
    a = np.arange(10, dtype="f8")
    b = a.copy()
    b[7] = 7.5
    assert encode_key(a) != encode_key(b)


@pytest.mark.parametrize("dtype", MULTIBYTE_DTYPES)
def test_key_ndarray_byte_order_irrelevant(dtype):
    if np.dtype(dtype).char in "gG":
        pytest.skip("long double arrays are refused as keys (see test_key_longdouble_array_refused)")
    little = sample_array(np.dtype(dtype).newbyteorder("<"))
    big = little.astype(little.dtype.newbyteorder(">"))
    assert big.dtype.byteorder == ">" and np.array_equal(little, big)
    assert encode_key(little) == encode_key(big)
    assert encode_key((big, 1)) == encode_key((little, 1))


@pytest.mark.parametrize("make", [
    lambda a: a[:, ::2],
    lambda a: a.T,
    lambda a: a[::-1],
    lambda a: np.asfortranarray(a),
    lambda a: a.astype(">i8")[1:, 1:3],
], ids=["strided", "transposed", "reversed", "fortran", "big-endian-slice"])
def test_key_ndarray_non_contiguous(make):
    base = np.arange(24, dtype="<i8").reshape(4, 6)
    view = make(base)
    assert encode_key(view) == encode_key(np.ascontiguousarray(view).astype("<i8"))


def test_key_ndarray_distinct_from_list_and_bytes():
    a = np.array([1, 2], dtype="i8")
    assert len({encode_key(a), encode_key([1, 2]), encode_key((1, 2)), encode_key(a.tobytes())}) == 4


@pytest.mark.parametrize("scalar, value", [
    (np.int8(-5), -5), (np.int64(7), 7), (np.uint8(200), 200), (np.uint64(2**64 - 1), 2**64 - 1),
    (np.float16(0.1), float(np.float16(0.1))), (np.float32(0.1), float(np.float32(0.1))), (np.float64(0.1), 0.1),
    (np.bool_(True), True), (np.bool_(False), False), (np.str_("key"), "key"), (np.bytes_(b"key"), b"key"),
], ids=lambda x: type(x).__name__)
def test_key_numpy_scalar_equals_python_value(scalar, value):
    assert scalar == value
    assert encode_key(scalar) == encode_key(value)
    assert encode_key([scalar, {"k": scalar}]) == encode_key([value, {"k": value}])


def test_key_numpy_bool_is_not_int():
    assert encode_key(np.bool_(True)) != encode_key(1)
    assert encode_key(np.int64(1)) != encode_key(True)


@pytest.mark.parametrize("key", [
    object(), bytearray(b"x"), len, np.datetime64(1, "s"), np.datetime64(1, "ns"), np.timedelta64(1, "s"),
    np.array(["a"]), np.array([object()]), np.zeros(2, dtype=[("a", "i4")]), np.array([1], dtype="M8[s]"),
    (1, object()), [{1: object()}], {"a": object()}, {frozenset({object()}): 1}, {1, object()},
], ids=lambda k: type(k).__name__)
def test_key_unsupported_type_raises_type_error(key):
    with pytest.raises(TypeError):
        encode_key(key)


def test_key_nan_is_accepted_and_stable():
    assert encode_key(float("nan")) == encode_key(math.nan) == encode_key(np.nan) == encode_key(np.float64("nan"))
    assert encode_key(float("nan")) not in {encode_key(math.inf), encode_key(-math.inf), encode_key(0.0)}
    assert encode_key((math.nan, "x")) == encode_key((float("nan"), "x"))


def test_key_negative_zero_same_as_zero():
    assert -0.0 == 0.0
    assert encode_key(-0.0) == encode_key(0.0)
    assert encode_key(np.array([-0.0, 1.0])) == encode_key(np.array([0.0, 1.0]))
    assert encode_key(np.array([complex(-0.0, -0.0)])) == encode_key(np.array([0j]))


def test_key_nan_arrays_with_other_payloads_are_equal_keys():
    a = np.array([np.nan, 1.0])
    b = a.copy()
    b.view(np.uint64)[0] |= 1  # another NaN payload
    assert np.isnan(b[0]) and a.tobytes() != b.tobytes()
    assert encode_key(a) == encode_key(b)


@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
def test_key_longdouble_array_refused(dtype):
    """Long double padding bytes are undefined (x87: 6 of 16 bytes), so equal arrays could give different keys."""
    with pytest.raises(TypeError, match="long double"):
        encode_key(np.array([1.5], dtype=dtype))


# ---------------------------------------------------------------------------------------------------- fingerprint

_FINGERPRINT_SCRIPT = textwrap.dedent("""
    import json
    from shmcache.codec import encode_key, fingerprint
    words = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"}
    keys = [
        dict.fromkeys(words, 1),  # insertion order follows the set's, which follows PYTHONHASHSEED
        {w: {v: len(v) for v in words} for w in words},
        ("user", 42, 2**70, -1.5, None, True),
        "plain", b"raw", 12345, [1, {"x": (b"y", None)}],
    ]
    print(json.dumps({"order": list(words), "fps": [fingerprint(encode_key(k)) for k in keys]}))
""")


def _fingerprints_in_child(hashseed: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    out = subprocess.run([sys.executable, "-c", _FINGERPRINT_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_fingerprint_same_across_processes_and_hash_seeds():
    one, two = _fingerprints_in_child("1"), _fingerprints_in_child("2")
    assert one["order"] != two["order"], "the two hash seeds should build the dicts in different orders"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_FINGERPRINT_SCRIPT, {})
    assert one["fps"] == two["fps"] == json.loads(out.getvalue())["fps"]


def test_fingerprint_is_63_bit_non_negative():
    keys = ["", "a", b"\xff" * 100, 0, -1, 2**64, 2**200, 1.5, math.nan, None, True, (1, 2), [1], {"a": 1},
            np.arange(10), np.zeros((0,)), *range(1000)]
    fps = [fingerprint(encode_key(k)) for k in keys]
    assert all(type(fp) is int and 0 <= fp < 2**63 for fp in fps)
    assert len(set(fps)) == len({encode_key(k) for k in keys})
    assert max(fps) >= 2**62, "a 63-bit hash of 1000+ keys should use the top bit"


def test_fingerprint_deterministic_for_equal_bytes():
    kb = encode_key(("a", 1))
    assert fingerprint(kb) == fingerprint(bytes(kb)) == fingerprint(encode_key(("a", 1)))


# ---------------------------------------------------------------------------------------------------- values

ROUND_TRIP_VALUES = [
    None, True, False, 0, -1, 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 2**300, -(2**300),
    0.0, -0.0, 1.5, -1e300, 5e-324, math.inf, -math.inf, "", "héllo ✓ \x00", "x" * 70000, b"", b"\x00\xff",
    b"y" * 70000, [], [1, "a", None, b"b"], (), (1,), (1, (2, (3, ()))), [(1, 2), [3, (4,)]], {},
    {"a": 1, "b": [1, 2]}, {1: "one", b"k": 2, (1, 2): [3], None: 0, 2.5: "f", 2**70: "big", (1, (2,)): ()},
    {"t": (1, {"inner": (b"x", [None])})}, [[[[[]]]]], {"z": {"y": {"x": {}}}},
]


@pytest.mark.parametrize("value", ROUND_TRIP_VALUES, ids=lambda v: type(v).__name__)
def test_value_round_trip(value):
    assert same_value(value, decode_value(encode_value(value)))


def test_value_nan_round_trip():
    out = decode_value(encode_value([math.nan, (math.nan,), {"n": math.nan}]))
    assert math.isnan(out[0]) and math.isnan(out[1][0]) and math.isnan(out[2]["n"])


def test_value_bytes_fast_path():
    assert encode_value(b"abc") == b"Babc"
    assert decode_value(b"Babc") == b"abc"


@pytest.mark.parametrize("value", [bytearray(b"ab"), memoryview(b"ab")], ids=lambda v: type(v).__name__)
def test_value_bytes_like_decode_as_bytes(value):
    assert decode_value(encode_value(value)) == b"ab"
    assert decode_value(encode_value([value])) == [b"ab"]


def test_value_numpy_scalars_decode_as_python_scalars():
    out = decode_value(encode_value([np.int32(-3), np.uint64(2**64 - 1), np.float32(0.5), np.bool_(True)]))
    assert same_value(out, [-3, 2**64 - 1, 0.5, True])


def _check_decoded_array(original: np.ndarray, encoded: bytes, decoded) -> None:
    assert same_value(original, decoded)
    assert decoded.flags.writeable
    assert decoded.flags.owndata or not np.shares_memory(decoded, np.frombuffer(encoded, np.uint8))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_value_array_round_trip(dtype, shape):
    arr = sample_array(dtype, shape)
    encoded = encode_value(arr)
    _check_decoded_array(arr, encoded, decode_value(encoded))


@pytest.mark.parametrize("dtype", MULTIBYTE_DTYPES)
def test_value_array_big_endian_round_trip(dtype):
    arr = sample_array(np.dtype(dtype).newbyteorder(">"))
    assert arr.dtype.byteorder == ">"
    encoded = encode_value(arr)
    out = decode_value(encoded)
    _check_decoded_array(arr, encoded, out)
    assert np.array_equal(out, sample_array(dtype))


@pytest.mark.parametrize("make", [
    lambda a: a[:, ::2],
    lambda a: a.T,
    lambda a: a[::-1, ::-1],
    lambda a: np.asfortranarray(a),
    lambda a: a[1:3, 2],
    lambda a: np.broadcast_to(a[0], (3, 6)),
    lambda a: a.astype(">f8")[::2].T,
], ids=["strided", "transposed", "reversed", "fortran", "column", "broadcast", "big-endian-strided"])
def test_value_array_non_contiguous_round_trip(make):
    view = make(np.arange(24, dtype="f8").reshape(4, 6))
    assert not view.flags.c_contiguous or view.base is not None
    encoded = encode_value(view)
    _check_decoded_array(view, encoded, decode_value(encoded))


def test_value_arrays_nested_in_containers_round_trip():
    value = {
        "a": np.arange(5, dtype="i2"),
        "b": [np.zeros((2, 0), "f4"), (np.array(3.5, ">f8"), np.eye(3, dtype="c8")[:, ::2])],
        7: {"deep": [np.array([True, False]), np.arange(6, dtype=">u4").reshape(2, 3).T]},
    }
    encoded = encode_value(value)
    assert same_value(value, decode_value(encoded))


def test_value_decoded_array_independent_of_input_buffer():
    arr = np.arange(64, dtype="i8").reshape(8, 8)
    buf = bytearray(encode_value(arr))
    out = decode_value(buf)
    buf[:] = b"\xaa" * len(buf)
    assert np.array_equal(out, arr)
    out[0, 0] = -1  # writable, and writing does not need the input
    assert out[0, 0] == -1


def test_value_decode_array_from_memoryview_copies():
    # SharedCache.get decodes arrays straight from a view of the shared arena, which then gets reused.
    arr = np.arange(20, dtype=">f4")
    buf = bytearray(encode_value(arr))
    out = decode_array(memoryview(buf))
    buf[:] = bytes(len(buf))
    assert same_value(arr, out) and out.flags.writeable


def test_value_nested_arrays_independent_of_input_buffer():
    value = [np.arange(10, dtype="u2"), {"x": np.ones((2, 2), "c16")}]
    buf = bytearray(encode_value(value))
    out = decode_value(buf)
    buf[:] = b"\x55" * len(buf)
    assert same_value(value, out)
    for arr in (out[0], out[1]["x"]):
        assert arr.flags.writeable
        arr[...] = 0


@pytest.mark.parametrize("arr", [
    np.array(["a", "b"]), np.array([b"a"]), np.array([1, "x"], dtype=object), np.zeros(2, dtype=[("a", "i4")]),
    np.array([1], dtype="M8[s]"), np.array([1], dtype="m8[s]"), np.zeros(2, dtype="V4"),
], ids=lambda a: a.dtype.str)
def test_value_array_unsupported_dtype_raises_type_error(arr):
    for value in (arr, [arr], {"k": (arr,)}):
        with pytest.raises(TypeError):
            encode_value(value)


def _function():
    pass


@pytest.mark.parametrize("value", [
    object(), {1, object()}, frozenset({len}), _function, lambda: 0, len, int, [1, object()],
    {"a": {object()}}, {frozenset({int}): 1}, (1, (2, object())), Ellipsis, range(3),
], ids=lambda v: type(v).__name__)
def test_value_unencodable_raises_type_error(value):
    with pytest.raises(TypeError):
        encode_value(value)


def test_value_encoder_usable_after_error():
    for bad in ([1, object()], (1, (2, {3: len})), {"a": [np.array(["s"])]}):
        with pytest.raises(TypeError):
            encode_value(bad)
        good = [1, (2, 3), {"a": np.arange(3)}]
        assert same_value(good, decode_value(encode_value(good)))


@pytest.mark.parametrize("encode, nested", [
    (encode_value, tuple), (encode_key, list), (encode_key, tuple),
], ids=["value-tuple", "key-list", "key-tuple"])
def test_encode_too_deep_raises_type_error(encode, nested):
    obj = nested()
    for _ in range(5000):
        obj = nested([obj])
    with pytest.raises(TypeError):
        encode(obj)


def test_encode_too_deep_list_value_raises_type_error():
    obj: list = []
    for _ in range(5000):
        obj = [obj]
    with pytest.raises(TypeError):
        encode_value(obj)


# ---------------------------------------------------------------------------------------------------- malformed input


def test_malformed_helpers_match_the_encoder():
    arr = np.arange(3, dtype="<i4")
    assert a_tagged(["<i4", [3]], arr.tobytes()) == encode_value(arr)
    assert same_value([arr], decode_value(b"M\x91" + ext_array(["<i4", [3]], arr.tobytes())[1:]))


MALFORMED = {
    "unknown-tag": b"Z\x00\x00\x00\x00\x00\x00\x00\x00",
    "zero-tag": b"\x00",
    "pickle-stream": pickle.dumps([1, 2]),
    "msgpack-truncated": b"M\x92\x01",
    "msgpack-trailing-bytes": b"M\x01\x02",
    "msgpack-reserved-byte": b"M\xc1",
    "msgpack-tag-only": b"M",
    "msgpack-bad-utf8": b"M\xa2\xff\xfe",
    "msgpack-huge-array-count": b"M\xdd\xff\xff\xff\xff",
    "ext-array-data-short": ext_array(["<i4", [3]], bytes(11)),
    "ext-array-data-long": ext_array(["<i4", [3]], bytes(13)),
    "ext-array-object-dtype": ext_array(["|O", [1]], bytes(8)),
    "ext-array-structured-dtype": ext_array(["<i4,<i4", [1]], bytes(8)),
    "ext-array-unicode-dtype": ext_array(["<U1", [1]], bytes(4)),
    "ext-array-datetime-dtype": ext_array(["<M8[s]", [1]], bytes(8)),
    "ext-array-unknown-dtype": ext_array(["nope", [1]], bytes(1)),
    "ext-array-negative-dim": ext_array(["<i4", [-1]], b""),
    "ext-array-float-dim": ext_array(["<i4", [1.0]], bytes(4)),
    "ext-array-too-many-dims": ext_array(["<i1", [1] * 65], bytes(1)),
    "ext-array-shape-not-list": ext_array(["<i4", 5], b""),
    "ext-array-header-not-pair": ext_array(5, b""),
    "ext-array-header-length-past-end": ext_array(["<i4", [1]], bytes(4), hlen=1000),
    "ext-array-empty-payload": ext(2, b""),
    "ext-array-huge-shape": ext_array(["<i1", [2**62]], bytes(1)),
    "ext-tuple-garbage": ext(1, b"\xc1"),
    "ext-tuple-truncated": ext(1, b"\x92\x01"),
    "array-data-short": a_tagged(["<i4", [3]], bytes(11)),
    "array-data-long": a_tagged(["<i4", [3]], bytes(13)),
    "array-object-dtype": a_tagged(["|O", [1]], bytes(8)),
    "array-datetime-dtype": a_tagged(["<M8[s]", [1]], bytes(8)),
    "array-negative-dim": a_tagged(["<i4", [-1]], b""),
    "array-too-many-dims": a_tagged(["<i1", [1] * 65], bytes(1)),
    "array-huge-shape": a_tagged(["<i1", [2**62]], bytes(1)),
    "array-huge-2d-shape": a_tagged(["<i8", [2**40, 2**40]], b""),
    "array-header-length-past-end": struct.pack("<BxHxxxx", ord("A"), 1000) + msgpack.packb(["<i4", [1]]) + bytes(4),
    "array-header-garbage": struct.pack("<BxHxxxx", ord("A"), 1) + b"\xc1" + bytes(7),
    "array-header-length-zero": struct.pack("<BxHxxxx", ord("A"), 0) + bytes(8),
    "tensor-unknown-dtype-code": t_tagged(2, ["<f4", [1]], bytes(4)),
    "tensor-code-255": t_tagged(255, ["<f4", [1]], bytes(4)),
    "tensor-big-endian-dtype": t_tagged(0, [">f4", [1]], bytes(4)),
    "tensor-long-double-dtype": t_tagged(0, [np.dtype("g").str, [1]], bytes(np.dtype("g").itemsize)),
    "tensor-bfloat16-not-u2": t_tagged(1, ["<f2", [1]], bytes(2)),
    "tensor-bfloat16-signed-bits": t_tagged(1, ["<i2", [1]], bytes(2)),
    "tensor-object-dtype": t_tagged(0, ["|O", [1]], bytes(8)),
    "tensor-data-short": t_tagged(0, ["<i4", [3]], bytes(11)),
    "tensor-data-long": t_tagged(0, ["<i4", [3]], bytes(13)),
    "tensor-huge-shape": t_tagged(0, ["<i1", [2**62]], bytes(1)),
    "tensor-tag-only": b"T",
    "tensor-prefix-truncated": b"T\x00\x10\x00",
    "ext-tensor-empty-payload": ext(4, b""),
    "ext-tensor-unknown-code": ext(4, t_tagged(7, ["<f4", [1]], bytes(4))[1:]),
    "ext-tensor-data-short": ext(4, t_tagged(0, ["<f4", [2]], bytes(4))[1:]),
}
MALFORMED_ARRAY_PATH = {
    "empty": b"",
    "array-tag-only": b"A",
    "array-prefix-truncated": b"A\x00\x10\x00",
    "array-unknown-dtype": a_tagged(["nope", [1]], b""),
    "array-header-not-pair": a_tagged(5, b""),
    "array-shape-not-list": a_tagged(["<i4", 5], b""),
}


@pytest.mark.parametrize("data", [
    *(pytest.param(v, id=k) for k, v in MALFORMED.items()),
    *(pytest.param(v, id=k) for k, v in MALFORMED_ARRAY_PATH.items()),
])
def test_decode_malformed_raises_value_error(data):
    with pytest.raises(ValueError):
        decode_value(data)


def test_decode_truncated_msgpack_value_raises_value_error():
    encoded = encode_value({"k": [1, (2, 3)], "arr": np.arange(5.0), "big": 2**80, "s": "text"})
    for cut in range(1, len(encoded)):
        with pytest.raises(ValueError):
            decode_value(encoded[:cut])


def test_decode_truncated_array_value_raises_value_error():
    encoded = encode_value(np.arange(5.0))
    for cut in range(8, len(encoded)):  # shorter cuts are in MALFORMED_ARRAY_PATH
        with pytest.raises(ValueError):
            decode_value(encoded[:cut])


def test_decode_correct_after_malformed_input():
    good = {"k": [1, (2, 3)], "arr": np.arange(4, dtype="u2"), "s": "text"}
    encoded = encode_value(good)
    for bad in (encoded[:-3], encoded + b"\x01", b"M\xc1", ext(9, b"x"), encoded[:5]):
        with pytest.raises(ValueError):
            decode_value(bad)
        assert same_value(good, decode_value(encoded))


def _value_of_encoded_length(nbytes: int, i: int) -> list:
    for header in (5, 6, 8):  # tag, fixarray, fixint, then a bin8, bin16 or bin32 header
        value = [i, b"v" * (nbytes - header)]
        if len(encode_value(value)) == nbytes:
            return value
    raise AssertionError(nbytes)


@pytest.mark.parametrize("nbytes", [100, 65_000, 65_535, 65_536, 65_537, 65_541, 65_544, 200_000])
def test_decode_many_values_in_sequence(nbytes):
    # Encoded sizes around 64 KiB; repeated decodes feed far more bytes in total than any one value holds.
    values = [_value_of_encoded_length(nbytes, i) for i in range(8)]
    encoded = [encode_value(v) for v in values]
    for _ in range(3):
        for v, e in zip(values, encoded):
            assert same_value(v, decode_value(e))


def test_decode_concurrent_threads():
    values = [{"t": t, "data": [t] * 50, "arr": np.full(30, t, "i4")} for t in range(8)]
    encoded = [encode_value(v) for v in values]
    errors: list = []

    def work(t: int) -> None:
        try:
            for _ in range(300):
                if not same_value(values[t], decode_value(encoded[t])):
                    errors.append(t)
                    return
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


@pytest.mark.parametrize("code", [0, 14, 42, 127, -2, -100, -128])
def test_decode_unknown_ext_code_raises_value_error(code):
    in_map = b"M\x92\x01\x81\xa1k" + ext_raw(code, b"")  # [1, {"k": ext}]
    in_tuple = ext(1, b"\x91" + ext_raw(code, b"x"))
    for data in (ext(code, b"payload"), in_map, in_tuple):
        with pytest.raises(ValueError):
            decode_value(data)


def test_decode_timestamp_ext_is_msgpack_timestamp():
    """msgpack reserves ext code -1 for its own Timestamp, which it decodes itself: plain data, documented."""
    assert decode_value(ext(-1, bytes(8))) == msgpack.Timestamp(0, 0)
    assert decode_value(encode_value(msgpack.Timestamp(5, 6))) == msgpack.Timestamp(5, 6)


_DETONATIONS: list = []


def _detonate():
    _DETONATIONS.append(True)


class _Detonator:
    def __reduce__(self):
        return (_detonate, ())


def test_decode_never_executes_code(monkeypatch):
    payload = pickle.dumps(_Detonator())

    def refuse(*args, **kwargs):
        raise AssertionError("decoding reached pickle")

    for attr in ("loads", "load", "Unpickler"):
        monkeypatch.setattr(pickle, attr, refuse)
    candidates = [payload, b"M" + payload, b"A" + payload, b"M" + msgpack.packb(payload)]
    candidates += [ext(code, payload) for code in range(-128, 128)]
    candidates += [ext(2, struct.pack("<I", len(payload)) + payload)]
    for data in candidates:
        try:
            result = decode_value(data)
        except Exception:  # ValueError, or an escape test_decode_malformed_raises_value_error covers: not code
            continue
        assert is_plain(result), f"{data[:20]!r} decoded to {type(result).__name__}"
    assert decode_value(b"B" + payload) == payload  # raw bytes stay bytes
    assert not _DETONATIONS


# Decoding runs in a thread with an 8 MiB stack (the Linux default for the main thread), so the outcome does not
# depend on the ulimit of the machine running the tests.
_DEEP_SCRIPT = textwrap.dedent("""
    import sys, threading, msgpack
    from shmcache.codec import decode_value, encode_value
    mode, depth = sys.argv[1], int(sys.argv[2])
    outcome = []

    def run():
        if mode == "crafted":
            data = msgpack.packb([])
            for _ in range(depth):
                data = msgpack.packb(msgpack.ExtType(1, b"\\x91" + data))
            data = b"M" + data
        else:
            value = ()
            for _ in range(depth):
                value = (value,)
            try:
                data = encode_value(value)
            except TypeError:
                outcome.append("refused")
                return
        try:
            out = decode_value(data)
        except ValueError:
            outcome.append("ValueError")
            return
        outcome.append("decoded" if mode == "crafted" or out == value else "wrong")

    threading.stack_size(8 << 20)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    print(outcome[0])
""")


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode, depth, allowed", [
    ("crafted", 1000, {"ValueError", "decoded"}),
    ("encoded", 250, {"refused", "decoded"}),
])
def test_decode_deeply_nested_tuples_does_not_crash(mode, depth, allowed):
    proc = subprocess.run([sys.executable, "-c", _DEEP_SCRIPT, mode, str(depth)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"decoder process died with status {proc.returncode}"
    assert proc.stdout.strip() in allowed


_PUT_FROM_HANDLER = r"""
import json, signal, sys, time
from shmcache import SharedCache
from shmcache.lock import Reentered
from tests.workers import check_varied_value, make_varied_value

c = SharedCache(sys.argv[1], capacity_bytes=8 << 20, max_entries=2048)
last = {}  # key -> seq of the last put that returned
nested = refused = 0
busy = False  # a signal arriving while the handler runs is skipped: handlers nest, and would nest without end

def handler(signum, frame):
    global nested, refused, busy
    if busy:
        return
    busy = True
    try:
        nested += 1
        key = f"s{nested % 97}"
        try:
            c.put(key, make_varied_value(key, nested))
        except Reentered:  # it landed while the main thread held the lock: refused, and nothing written
            refused += 1
            return
        last[key] = nested
    finally:
        busy = False

signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.00007)
deadline = time.monotonic() + 40  # a bound for a machine under load; the loop ends on its counts
i = 0
while (i < 3000 or nested < 200) and time.monotonic() < deadline:
    i += 1
    key = f"m{i % 301}"
    c.put(key, make_varied_value(key, i))
    last[key] = i
signal.setitimer(signal.ITIMER_REAL, 0)
bad = []
for key, seq in sorted(last.items()):
    try:
        check_varied_value(key, c.get(key), seq)
    except Exception as exc:
        bad.append(f"{key}: {exc!r:.300}")
print(json.dumps({"recoveries": c.stats().recoveries, "puts": i, "nested": nested, "refused": refused,
                  "bad": len(bad), "first": bad[:5],
                  "verify": list(c.verify(deep=True).problems)[:5]}))
c.close()
"""


@pytest.mark.timeout(60)
def test_codec_put_from_signal_handler_never_corrupts_a_value(name):
    """A signal handler that puts while the main thread is encoding a value re-enters the value encoder: each of the
    two values must still be stored whole, and every key must read back the value last put under it."""
    import json

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run([sys.executable, "-c", _PUT_FROM_HANDLER, name], cwd=root, capture_output=True,
                             text=True, timeout=50)
        assert out.returncode == 0, out.stderr[-3000:]
        r = json.loads(out.stdout)
    finally:
        with contextlib.suppress(FileNotFoundError):
            from shmcache import SharedCache

            SharedCache.unlink_name(name)
    assert r["bad"] == 0 and r["verify"] == [], r
    assert r["recoveries"] == 0, r  # a call from a handler never shares the lock with the call it interrupted
    assert r["nested"] > 0, r  # handlers did put in the middle of the main thread's puts (their count: no criterion)


@pytest.mark.parametrize("value", [
    msgpack.ExtType(1, b"\x90"),  # our own tuple code: would come back as ()
    msgpack.ExtType(5, b"x"),
    [1, msgpack.ExtType(2, b"")],
    {"a": {"b": [msgpack.ExtType(3, b"\x01")]}},
    {msgpack.ExtType(5, b"k"): 1},
    (1, (msgpack.ExtType(1, b"\x90"),)),
    {"arr": np.arange(3), "x": [msgpack.ExtType(127, b"\0" * 4)]},
    [0.5] * 100 + [[1.5] * 40 + [{"deep": msgpack.ExtType(4, b"")}]],  # long containers: the C pass over types
    [type("Sub", (msgpack.ExtType,), {})(6, b"")],  # a subclass reaches the default hook
])
def test_value_ext_type_refused(value):
    with pytest.raises(TypeError, match="ExtType"):
        encode_value(value)


@pytest.mark.parametrize("key", [msgpack.ExtType(1, b"\x90"), [msgpack.ExtType(5, b"x")],
                                 {"a": msgpack.ExtType(5, b"")}])
def test_key_ext_type_refused(key):
    with pytest.raises(TypeError):
        encode_key(key)


def test_value_ext_marker_bytes_in_plain_data_still_encode():
    """Bytes that look like ext markers inside numbers, strings and arrays are data, not refused."""
    value = {"f": struct.unpack("<d", bytes([0xC7, 0xD4, 0xD8, 0xC9, 0, 0, 0, 0x40]))[0], "b": bytes(range(256)),
             "t": (1, 2), "a": np.arange(300, dtype=np.uint16)}
    assert same_value(value, decode_value(encode_value(value)))


# ---------------------------------------------------------------------------------------------------- tensors
# (Round trips of every dtype and shape, refusals and the import rule are in test_torch.py; here, the bytes.)

TENSOR_GOLDEN = [  # (what, make the tensor, its encoding as the layout spec gives it)
    ("float32", lambda torch: torch.tensor([1.5]),
     "54 00 07 00 00 00 00 00 92 a3 3c 66 34 91 01 00 00 00 c0 3f"),
    ("bfloat16-0d", lambda torch: torch.tensor(-2.0, dtype=torch.bfloat16),
     "54 01 06 00 00 00 00 00 92 a3 3c 75 32 90 00 00 00 c0"),
    ("bool-empty-2d", lambda torch: torch.zeros((2, 0), dtype=torch.bool),
     "54 00 08 00 00 00 00 00 92 a3 7c 62 31 92 02 00"),
    ("int64-transposed", lambda torch: torch.tensor([[1, 2], [3, 4]]).T,
     "54 00 08 00 00 00 00 00 92 a3 3c 69 38 92 02 02"
     " 01 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 04 00 00 00 00 00 00 00"),
]


@pytest.mark.parametrize("what, make, golden", TENSOR_GOLDEN, ids=[g[0] for g in TENSOR_GOLDEN])
def test_value_tensor_golden_bytes(what, make, golden):
    torch = pytest.importorskip("torch", reason="torch is optional (pip install torch); CI installs the CPU build")
    tensor = make(torch)
    encoded = encode_value(tensor)
    assert encoded == bytes.fromhex(golden)
    out = decode_value(encoded)
    assert type(out) is torch.Tensor and out.dtype == tensor.dtype and out.shape == tensor.shape
    assert torch.equal(out, tensor)


def test_value_tensor_nested_golden_bytes():
    torch = pytest.importorskip("torch", reason="torch is optional (pip install torch); CI installs the CPU build")
    value = (torch.tensor([1.5]), 7)
    tensor_body = bytes.fromhex(TENSOR_GOLDEN[0][2])[1:]  # ext 4 holds a T value without its tag
    items = b"\x92" + msgpack.packb(msgpack.ExtType(4, tensor_body)) + b"\x07"  # [tensor, 7]
    expected = b"M" + msgpack.packb(msgpack.ExtType(1, items))
    assert encode_value(value) == expected
    out = decode_value(expected)
    assert type(out) is tuple and out[1] == 7 and torch.equal(out[0], value[0])


def test_value_tensor_malformed_never_imports_torch():
    """A malformed tensor value is refused before torch is imported (verify checks tensors without torch)."""
    code = textwrap.dedent("""
        import sys
        from shmcache.codec import check_body, decode_value
        for data in (BAD):
            try:
                decode_value(data)
            except ValueError:
                pass
            else:
                raise SystemExit(f"decoded {data!r}")
        check_body(ord("T"), GOOD[1:])
        print("torch" in sys.modules)
    """).replace("BAD", repr(tuple(v for k, v in MALFORMED.items() if "tensor" in k))).replace(
        "GOOD", repr(t_tagged(1, ["<u2", [2]], bytes(4))))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
