"""Canonical key bytes and their fingerprint; the value encoding. Never pickle.

Keys are encoded canonically so that equal keys built in any process give equal bytes. A ``str`` key, the common case,
is its UTF-8 bytes and nothing else, so encoding it is one ``str.encode``. Every other key is the byte ``NON_STR_KEY``
(0xC1, which valid UTF-8 never contains, so no other key can equal a ``str`` key) followed by msgpack: scalars in
msgpack's (already unique) smallest form, lists as msgpack arrays, tuples as an ext wrapping an array, dicts as maps
whose pairs are sorted by their encoded key, sets and frozensets as exts wrapping their items' encodings sorted (a
set's iteration order follows the process's hash seed; its key must not), numpy arrays as an ext of little-endian
dtype, shape and C-order bytes, and the standard library's datetime, date, time, timedelta, Decimal, UUID and
complex as their exts (stdtypes.py). Keys are typed, like ``functools.lru_cache(typed=True)``: ``1``, ``1.0`` and
``True`` are three different keys; so are ``Decimal("1.0")`` and ``Decimal("1.00")``, and an aware datetime keys by
its wall clock and offset, so that equal instants in two zones are two keys (a miss, never the other zone's value).

A value starts with a one-byte tag, and its checksum is xxh3 of the rest seeded with the tag, so a get can copy the
body alone and still have the tag covered. ``B``: raw bytes. ``A``: a numpy array, as an 8-byte prefix, a msgpack header
(dtype, shape) padded to 8 bytes, then the raw C-order data, so that a get copies the data once, straight into the
array it returns. ``T``: a torch tensor, laid out as ``A`` with a dtype code in the prefix's second byte
(``shmcache/tensors.py``; torch is imported only to store or read one). ``M``: anything else, msgpack with ext types
for arrays, tuples, big ints, tensors, sets and frozensets, and stdtypes.py's (msgpack's own Timestamp, ext -1,
round-trips as ``msgpack.Timestamp``). A set is stored in its iteration order (a value's bytes need not be canonical).
Decoding builds only plain data, stdtypes.py's standard types and tensors (no constructor named by the data is ever
called), so whoever can write the segment cannot run code in a reader; tuples, sets and arrays nest at most
``_MAX_DEPTH`` deep, so crafted bytes cannot exhaust the decoder's C stack either.

Equal keys give equal bytes: floats are canonical (``-0.0`` keys as ``0.0``, every NaN as one NaN), in arrays and
complex numbers too; long double arrays are refused as keys because their padding bytes are undefined.
"""

from __future__ import annotations

import math
import re
import struct
import threading
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np
import xxhash

from . import stdtypes, tensors
from .layout import KIND_PREFIX

_EXT_TUPLE = 1
_EXT_NDARRAY = 2
_EXT_BIGINT = 3
_EXT_TENSOR = 4  # its data: a ``T`` value without its tag byte
# 5-10 and 13: the standard library's scalar types (stdtypes.py); 11 and 12: sets and frozensets, packed here.
_EXT_SET = stdtypes.EXT_SET
_EXT_FROZENSET = stdtypes.EXT_FROZENSET
_ARRAY_KINDS = "biufc"  # bool, int, uint, float, complex: plain numbers, no object pointers
TAG_BYTES = ord("B")
TAG_ARRAY = ord("A")
TAG_MSGPACK = ord("M")
TAG_TENSOR = ord("T")
_ARRAY_PREFIX = struct.Struct("<BxHxxxx")  # tag, header length; the header is then padded to 8 bytes
_ARRAY_HLEN = struct.Struct("<H")  # the header length within that prefix, at byte 2
_TENSOR_PREFIX = struct.Struct("<BBHxxxx")  # tag, tensors.py's dtype code, header length: then as an array
_EXT_ARRAY_PREFIX = struct.Struct("<I")
_MAX_NDIM = 64
_MAX_DEPTH = 32  # nesting of tuples, arrays and (in keys) containers; each level of ext costs the decoder C stack
MASK63 = (1 << 63) - 1  # fingerprints and checksums keep 63 bits: they fit an int64 word of the segment
_MASK63 = MASK63
NON_STR_KEY = b"\xc1"  # first byte of every key that is not a str: msgpack's one unused byte, never in UTF-8
_NAN = float("nan")

# The hash of fingerprints and checksums (a value's is seeded with its tag). shmcache/_core_hash.c computes the same
# in the compiled section (tests/test_core.py holds it to this one at every length).
xxh3 = xxhash.xxh3_64_intdigest
_xxh = xxh3
# What damaged bytes make struct, msgpack, numpy and indexing raise (ValueError aside, which passes as it is).
MALFORMED = (IndexError, KeyError, TypeError, OverflowError, struct.error, msgpack.UnpackException)


class _Depth(threading.local):
    n = 0


_depth = _Depth()  # how many ext values the current thread is inside, while encoding or decoding


class _Packers(threading.local):
    """One plain msgpack Packer per thread (keys, array headers): a Packer keeps a buffer, so sharing one between
    threads would mix their output. No Python code runs inside a plain pack (it has no default hook), so nothing can
    re-enter it; the value Packers, which have one, are kept apart (``_idle_value_packers``)."""

    def __init__(self) -> None:
        self.plain = msgpack.Packer(use_bin_type=True, strict_types=True).pack


# Invariant: a value Packer serves one call at a time. Each encode_parts takes one off this list (a new one when none
# is idle) and puts it back when done. Its default hook runs Python code, so a signal handler (or a __del__) can run
# in the middle of a pack and store a value of its own: that nested call takes another Packer, never the buffer
# half-filled beneath it. list.pop and list.append are atomic, so threads share the list; it holds as many Packers as
# calls ever ran at once. Why not one per thread with a busy flag: a threading.local costs more than the list does.
_idle_value_packers: list = []


def _value_packer():
    return msgpack.Packer(use_bin_type=True, strict_types=True, default=_default).pack


def _packb(obj) -> bytes:
    return _packers.plain(obj)


def _packb_nested(obj) -> bytes:
    # Called from inside the value Packer's default hook: a fresh packer, never the one that is mid-call.
    return msgpack.packb(obj, use_bin_type=True, strict_types=True, default=_default)


def fingerprint(kb: bytes) -> int:
    """63-bit fingerprint of encoded key bytes (never Python's salted hash())."""
    return _xxh(kb) & _MASK63


def checksum(data) -> int:
    """Checksum of encoded value bytes (tag first); never 0, so 0 can mean "no entry"."""
    return (_xxh(memoryview(data)[1:], data[0]) & _MASK63) | 1


def body_checksum(tag: int, body) -> int:
    """``checksum`` of a value given as its tag and the bytes after it (what a get copies out)."""
    return (_xxh(body, tag) & _MASK63) | 1


# ---------------------------------------------------------------------------------------------------- keys


def _container_header(n: int, fix: int, b16: int, b32: int) -> bytes:
    if n < 16:
        return bytes((fix | n,))
    if n < 2**16:
        return struct.pack(">BH", b16, n)
    return struct.pack(">BI", b32, n)


def _array_bytes(arr: np.ndarray, what: str) -> tuple[str, list[int], bytes]:
    if arr.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(f"cannot encode a numpy array of dtype {arr.dtype} as a {what}: only bool, int, uint, "
                        "float and complex arrays are supported")
    return arr.dtype.str, list(arr.shape), np.ascontiguousarray(arr).tobytes()


_KEY_BASES: tuple[type[Any], ...] = (int, float, bytes, tuple)  # what a subclass keys as (see _key_part)


def _key_part(k, depth: int = 0) -> bytes:
    t = type(k)
    if t is str or t is bytes or t is bool or k is None:
        return _packb(k)
    if t is float:
        # Equal floats give equal bytes: -0.0 == 0.0, and every NaN is the same key.
        return _packb(0.0 if k == 0.0 else _NAN if k != k else k)
    if t is int:
        return _packb(k) if -(2**63) <= k < 2**64 else _bigint_ext(k)
    if depth >= _MAX_DEPTH:
        raise TypeError(f"key is nested more than {_MAX_DEPTH} levels deep")
    if t is tuple:
        return _packb(msgpack.ExtType(_EXT_TUPLE, _seq(k, depth + 1)))
    if t is list:
        return _seq(k, depth + 1)
    if t is dict:
        pairs = sorted((_key_part(a, depth + 1), _key_part(b, depth + 1)) for a, b in k.items())
        return _container_header(len(pairs), 0x80, 0xDE, 0xDF) + b"".join(a + b for a, b in pairs)
    found = stdtypes.encode(k, key=True)
    if found is not None:
        return _packb(msgpack.ExtType(*found))
    if isinstance(k, (set, frozenset)):
        # Canonical: the items' encodings sorted, so the key's bytes do not depend on the set's iteration order
        # (which hash() randomises per process).
        code = _EXT_FROZENSET if isinstance(k, frozenset) else _EXT_SET
        items = sorted(_key_part(x, depth + 1) for x in k)
        return _packb(msgpack.ExtType(code, _container_header(len(items), 0x90, 0xDC, 0xDD) + b"".join(items)))
    if isinstance(k, np.ndarray):
        return _packb(msgpack.ExtType(_EXT_NDARRAY, _array_key(k)))
    if isinstance(k, np.generic) and k.dtype.kind in _ARRAY_KINDS:
        # Why plain numbers only: a datetime64's item() is a datetime, or an int for units below a microsecond,
        # which would key as that int.
        return _key_part(k.item(), depth)
    if t is EncodedKey:
        raise TypeError("an EncodedKey is taken by SharedCache.get only")
    if isinstance(k, msgpack.ExtType):  # a namedtuple, but its own type to msgpack: it would not come back a tuple
        raise TypeError("cannot encode a msgpack.ExtType as a key: extension types are not stored")
    for base in _KEY_BASES:
        if isinstance(k, base):  # subclasses (IntEnum, namedtuple...) key as their base value
            return _key_part(base(k), depth)
    if isinstance(k, str):  # str(k) of a str enum would be its name; str.__str__ is its text
        return _key_part(str.__str__(k), depth)
    raise TypeError(f"unsupported key type {t.__name__}: use {_KEY_TYPES}, or tuples, lists, dicts, sets and "
                    "frozensets of these; convert the key to one of them (str(obj), or a tuple of its fields); "
                    "keys are never pickled")


_SCALAR_TYPES = "None, bool, int, float, complex, str, bytes, datetime, date, time, timedelta, Decimal, UUID"
_KEY_TYPES = _SCALAR_TYPES + ", numpy arrays"
_VALUE_TYPES = _SCALAR_TYPES + ", numpy arrays, torch tensors"
_VALUE_HINT = (f"store {_VALUE_TYPES}, or lists, tuples, dicts, sets and frozensets of these; convert the value to "
               "one of them (e.g. dataclasses.asdict(obj)), or create the cache with serializer='pickle' to store "
               "any picklable value (only if you trust every process that can write the cache: unpickling a "
               "value can run its code)")


def _array_key(k: np.ndarray) -> bytes:
    if k.dtype.char in "gG":
        raise TypeError("long double arrays cannot be keys: their padding bytes are undefined, so equal arrays "
                        "would give different keys")
    if k.dtype.byteorder == ">":
        k = k.astype(k.dtype.newbyteorder("<"))
    if k.dtype.kind in "fc":
        k = k + 0  # -0.0 becomes 0.0 (in both parts of a complex)
        if k.dtype.kind == "f":
            k = np.where(np.isnan(k), k.dtype.type(_NAN), k)
    dtype_str, shape, raw = _array_bytes(k, "key")
    return _packb([dtype_str, shape]) + raw


def _seq(items, depth: int) -> bytes:
    return _container_header(len(items), 0x90, 0xDC, 0xDD) + b"".join(_key_part(x, depth) for x in items)


def _bigint_ext(n: int) -> bytes:
    return _packb(msgpack.ExtType(_EXT_BIGINT, n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)))


class KindKey:
    """A key of a kind (``SharedCache.kind``): encoded as ``KIND_PREFIX``, the kind number, then the key's own
    encoding, so no key of one kind can equal a key of another kind or of none."""

    __slots__ = ("kind", "key")

    def __init__(self, kind: int, key) -> None:
        self.kind = kind
        self.key = key

    def __repr__(self) -> str:
        return repr(self.key)


class EncodedKey(bytes):
    """Key bytes already encoded (a kind's prefix included), which ``SharedCache.get`` takes in place of a key: for
    TieredCache's local hits. Refused as a key everywhere else, so that it can never be taken for a bytes key."""

    __slots__ = ()


KIND_PREFIXES = tuple(bytes((KIND_PREFIX, k)) for k in range(256))  # the first two bytes of a key of kind k


def encode_key(key) -> bytes:
    """Canonical bytes of ``key``; raises TypeError for what cannot be a key."""
    try:
        if type(key) is str:
            return key.encode()
        if type(key) is KindKey:
            inner = key.key
            return KIND_PREFIXES[key.kind] + (inner.encode() if type(inner) is str else encode_key(inner))
        if isinstance(key, str):  # a str subclass (a str enum...) keys as its text
            return str.__str__(key).encode()
        return NON_STR_KEY + _key_part(key)
    except (RecursionError, OverflowError, ValueError) as exc:  # UnicodeEncodeError (lone surrogates) included
        raise TypeError(f"cannot encode key: {exc}") from None


def encode_key_prefix(items: list, length: int) -> bytes:
    """The bytes that begin the encoding of every list key of ``length`` items whose first items are ``items``
    (so the keys of one family can be found by prefix)."""
    if not 0 < len(items) <= length:
        raise ValueError("a prefix needs at least one item and at most the list's length")
    try:
        return NON_STR_KEY + _container_header(length, 0x90, 0xDC, 0xDD) + b"".join(_key_part(x, 1) for x in items)
    except (RecursionError, OverflowError, ValueError) as exc:
        raise TypeError(f"cannot encode key: {exc}") from None


# ---------------------------------------------------------------------------------------------------- values


def _default(obj):
    t = type(obj)
    if t is tuple or isinstance(obj, tuple):  # a namedtuple is stored as a plain tuple
        if t is not tuple and isinstance(obj, msgpack.ExtType):  # a subclass (ExtType itself never gets here)
            raise TypeError("cannot encode a msgpack.ExtType value: extension types are not stored (they would "
                            "come back as something else)")
        return msgpack.ExtType(_EXT_TUPLE, _nested(obj))
    if t is int:
        return msgpack.ExtType(_EXT_BIGINT, obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True))
    if isinstance(obj, np.ndarray):
        dtype_str, shape, raw = _array_bytes(obj, "value")
        header = _packb([dtype_str, shape])
        return msgpack.ExtType(_EXT_NDARRAY, _EXT_ARRAY_PREFIX.pack(len(header)) + header + raw)
    if isinstance(obj, np.generic) and obj.dtype.kind in _ARRAY_KINDS:
        return obj.item()
    found = stdtypes.encode(obj)
    if found is not None:
        return msgpack.ExtType(*found)
    if isinstance(obj, (set, frozenset)):
        return msgpack.ExtType(_EXT_FROZENSET if isinstance(obj, frozenset) else _EXT_SET, _nested(obj))
    for base in (bool, int, float, str, bytes, list, dict):
        if isinstance(obj, base):
            return base(obj)
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if tensors.is_tensor(obj):
        return msgpack.ExtType(_EXT_TENSOR, _tensor_body(obj))
    raise TypeError(f"cannot encode a value of type {t.__name__}: {_VALUE_HINT}")


def _nested(items) -> bytes:
    """The items of a tuple or set as a msgpack array, one level deeper."""
    depth = _depth.n
    try:
        # Why set, not incremented, and restored in finally: an exception raised by a signal handler at any
        # bytecode must not leave the count off for the rest of the thread's life.
        _depth.n = depth + 1
        if depth >= _MAX_DEPTH:
            raise TypeError(f"value nests tuples and sets more than {_MAX_DEPTH} levels deep")
        return _packb_nested(list(items))
    finally:
        _depth.n = depth


_packers = _Packers()
_PLAIN_TYPES = frozenset((dict, list, str, int, float, bool, type(None), tuple))


def encode_value(value) -> bytes:
    """Encoded value bytes (tag first); raises TypeError for what cannot be stored."""
    tag, body = encode_parts(value)
    return bytes((tag,)) + body


def encode_parts(value) -> tuple[int, bytes]:
    """``encode_value`` as its tag and the bytes after it, which a put writes without joining them first."""
    t = type(value)
    if t is bytes:
        return TAG_BYTES, value
    if t not in _PLAIN_TYPES and isinstance(value, np.ndarray):  # plain types skip the isinstance check
        dtype_str, shape, raw = _array_bytes(value, "value")
        header = _packb([dtype_str, shape])
        return TAG_ARRAY, _ARRAY_PREFIX.pack(TAG_ARRAY, len(header))[1:] + header + b"\0" * (-len(header) % 8) + raw
    if t not in _PLAIN_TYPES and tensors.is_tensor(value):
        return TAG_TENSOR, _tensor_body(value)
    try:
        pack = _idle_value_packers.pop()
    except IndexError:
        pack = _value_packer()
    try:
        body = pack(value)
    except (OverflowError, ValueError, RecursionError) as exc:  # msgpack's own limits (nesting depth, sizes)
        raise TypeError(f"cannot encode value: {exc}") from None
    finally:
        _idle_value_packers.append(pack)  # a pack that raised has reset its buffer: reusable
    # Why: the packer writes a msgpack.ExtType as it is, before any default hook sees it, and it would come back as
    # a tuple, an array or an error. No ext marker byte in the output rules it out (one C pass over a small value,
    # a search that stops at the first marker for a large one); only values that hold one (our own tuples and
    # arrays, or a number's bytes) are walked.
    if (body.translate(_EXT_MARKERS_CHANGED) is not body if len(body) <= _SCAN_NBYTES else _ext_marker(body)) \
            and _holds_ext(value):
        raise TypeError("cannot encode a msgpack.ExtType value: extension types are not stored (they would come "
                        f"back as something else); {_VALUE_HINT}")
    return TAG_MSGPACK, body


def _tensor_body(t) -> bytes:
    """A ``T`` value without its tag byte (also ext 4's data). Raises TypeError for a tensor that cannot be stored."""
    code, arr = tensors.to_array(t)
    dtype_str, shape, raw = _array_bytes(arr, "value")
    header = _packb([dtype_str, shape])
    return _TENSOR_PREFIX.pack(TAG_TENSOR, code, len(header))[1:] + header + b"\0" * (-len(header) % 8) + raw


_EXT_MARKERS = bytes((0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8))  # msgpack's ext 8/16/32 and fixext 1-16
# A translation that changes the markers alone (to 0): bytes.translate returns its very input when nothing changed.
_EXT_MARKERS_CHANGED = bytes(0 if b in _EXT_MARKERS else b for b in range(256))
_ext_marker = re.compile(b"[" + re.escape(_EXT_MARKERS) + b"]").search
_SCAN_NBYTES = 4096  # up to this size, a translation (no early exit, no set-up) is cheaper than a search


def _holds_ext(value) -> bool:
    """Whether a msgpack.ExtType occurs anywhere in ``value`` (dict keys included); a value the packer took is a
    finite tree, so the walk ends."""
    stack = [value]
    while stack:
        x = stack.pop()
        parts: tuple[Iterable[Any], ...]
        if isinstance(x, dict):
            parts = (x.keys(), x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            if isinstance(x, msgpack.ExtType):
                return True
            parts = (x,)
        else:
            continue
        for part in parts:
            # Why the item types of a long container in one C pass first: a Python step per item made a put of a
            # list of 10,000 floats (whose bytes hold marker bytes) ten times slower; this makes it about twice.
            if len(part) > 16 and not any(issubclass(k, _CONTAINERS) for k in set(map(type, part))):
                continue
            stack.extend(y for y in part if isinstance(y, _CONTAINERS))  # an ExtType is a tuple: checked above
    return False


_CONTAINERS = (dict, list, tuple, set, frozenset)


# The compiled get's decoder (shmcache/_unpack.c) decodes ext 1, 5-13 as this hook does, and declines the rest.
def _ext_hook(code: int, data: bytes):
    if code == _EXT_TUPLE:
        return tuple(_items(data))
    if code in stdtypes.CODES:
        return stdtypes.decode(code, data)
    if code == _EXT_SET:
        return set(_items(data))  # an unhashable item: TypeError, so malformed
    if code == _EXT_FROZENSET:
        return frozenset(_items(data))
    if code == _EXT_NDARRAY:
        (hlen,) = _EXT_ARRAY_PREFIX.unpack_from(data)
        dtype, shape = _array_header(data[4 : 4 + hlen])
        return _array_from(memoryview(data)[4 + hlen :], dtype, shape)
    if code == _EXT_BIGINT:
        return int.from_bytes(data, "little", signed=True)
    if code == _EXT_TENSOR:
        return _decode_tensor(memoryview(data))
    raise ValueError(f"unknown msgpack ext type {code}")


def _items(data: bytes) -> list:
    """The items of a tuple or set: a msgpack array, one level deeper."""
    depth = _depth.n
    try:
        _depth.n = depth + 1  # set and restored, as in _nested
        if depth >= _MAX_DEPTH:
            raise ValueError(f"value nests tuples and sets more than {_MAX_DEPTH} levels deep")
        items = _unpackb(data)
    finally:
        _depth.n = depth
    if type(items) is not list:  # a str body would otherwise come back as a tuple of its characters
        raise ValueError(f"a tuple's or set's body is a {type(items).__name__}, not an array")
    return items


def _unpackb(data):
    return msgpack.unpackb(data, ext_hook=_ext_hook, strict_map_key=False)




_HEADERS: dict[bytes, tuple[np.dtype, tuple[int, ...]]] = {}  # parsed array headers: a workload has a few shapes
_HEADERS_MAX = 1024


def _array_header(header) -> tuple[np.dtype, tuple[int, ...]]:
    key = bytes(header)
    parsed = _HEADERS.get(key)
    if parsed is not None:
        return parsed
    dtype_str, shape = msgpack.unpackb(key, raw=False)
    dtype = np.dtype(dtype_str)
    if dtype.kind not in _ARRAY_KINDS or len(shape) > _MAX_NDIM or any(type(n) is not int or n < 0 for n in shape):
        raise ValueError("invalid array header")
    if len(_HEADERS) >= _HEADERS_MAX:
        _HEADERS.clear()
    parsed = _HEADERS[key] = dtype, tuple(shape)
    return parsed


def _array_from(data, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes != len(data):  # checked before allocating: a damaged shape must not drive a huge allocation
        raise ValueError(f"array data is {len(data)} bytes, its header says {nbytes}")
    buf = np.empty(nbytes, np.uint8)
    # Why: a memoryview assignment is one memcpy, measurably cheaper than a numpy-to-numpy copy of the same bytes.
    # The array returned views this private buffer, never the shared memory.
    memoryview(buf)[:] = data  # type: ignore[arg-type]  # (numpy's stubs declare __buffer__ from Python 3.12 on)
    return buf.view(dtype).reshape(shape)


def decode_array(view) -> np.ndarray:
    """A new, writable array from an ``A``-tagged value held in ``view`` (one copy of the data); raises ValueError
    if the bytes are not a valid encoding."""
    try:
        return _decode_array(view)
    except ValueError:
        raise
    except MALFORMED as exc:
        raise ValueError(f"malformed array value: {exc!r}") from None


def array_layout(view) -> tuple[np.dtype, tuple[int, ...], int]:
    """dtype, shape and the offset of the data within the ``A``-tagged value in ``view``; raises ValueError if the
    bytes are not a valid encoding (the data's length included)."""
    try:
        (hlen,) = _ARRAY_HLEN.unpack_from(view, 2)
        start = _ARRAY_PREFIX.size
        dtype, shape = _array_header(view[start : start + hlen])
        data0 = start + hlen + (-hlen % 8)
    except ValueError:
        raise
    except MALFORMED as exc:
        raise ValueError(f"malformed array value: {exc!r}") from None
    if math.prod(shape) * dtype.itemsize != len(view) - data0:
        raise ValueError(f"array data is {len(view) - data0} bytes, its header says otherwise")
    return dtype, shape, data0


def copy_array(view) -> tuple[np.ndarray, bytes]:
    """A new array from the ``A``-tagged value in ``view``, and the bytes between its tag and its data, which with
    the array give its checksum (``array_checksum``). Copies the data once and reads nothing else of it: a get does
    this under the lock and checks the copy afterwards, so the shared bytes are read once. Raises ValueError if the
    bytes are not a valid encoding."""
    try:
        (hlen,) = _ARRAY_HLEN.unpack_from(view, 2)
        start = _ARRAY_PREFIX.size
        dtype, shape = _array_header(view[start : start + hlen])
        data0 = start + hlen + (-hlen % 8)
        return _array_from(view[data0:], dtype, shape), bytes(view[1:data0])
    except ValueError:
        raise
    except MALFORMED as exc:
        raise ValueError(f"malformed array value: {exc!r}") from None


def array_over(buf: bytearray):
    """The array, or tensor, of the ``A`` or ``T`` value held in ``buf`` (tag first: a private copy), built over
    ``buf`` without copying it again: the compiled get's one copy. Raises ValueError if the bytes are not a valid
    encoding."""
    view = memoryview(buf)
    dtype, shape, data0 = array_layout(view)
    tag, code = view[0], view[1]
    view.release()
    arr = np.frombuffer(buf, np.uint8, offset=data0).view(dtype).reshape(shape)
    if tag == TAG_TENSOR:
        return tensors.from_array(code, arr)
    if tag != TAG_ARRAY:
        raise ValueError(f"value tag {tag} is not an array's")
    return arr


def array_checksum(head: bytes, arr: np.ndarray) -> int:
    """``checksum`` of an array value from the parts ``copy_array`` returns."""
    h = xxhash.xxh3_64(head, TAG_ARRAY)
    h.update(arr)  # type: ignore[arg-type]  # (numpy's stubs declare __buffer__ from Python 3.12 on)
    return (h.intdigest() & _MASK63) | 1


def _decode_array(view, skipped: int = 0) -> np.ndarray:
    """``skipped``: how many leading bytes of the encoding (the tag) ``view`` lacks."""
    (hlen,) = _ARRAY_HLEN.unpack_from(view, 2 - skipped)
    start = _ARRAY_PREFIX.size - skipped
    dtype, shape = _array_header(view[start : start + hlen])
    return _array_from(view[start + hlen + (-hlen % 8) :], dtype, shape)


def _decode_tensor(body):
    """The tensor in ``body``, a ``T`` value without its tag; inside ``check_body``, checked and left an array."""
    arr = _decode_array(body, 1)
    if _checking.on:
        tensors.check(body[0], arr.dtype)
        return arr
    return tensors.from_array(body[0], arr)


class _Checking(threading.local):
    on = False


_checking = _Checking()  # whether this thread is inside check_body


def check_body(tag: int, body) -> None:
    """Raise ValueError unless ``decode_body(tag, body)`` would decode, without building tensors (so without
    importing torch: ``verify`` runs this under the cache lock)."""
    on = _checking.on
    try:
        _checking.on = True  # set and restored, as _depth in _default
        decode_body(tag, body)
    finally:
        _checking.on = on


def decode_value(data: bytes):
    """The value encoded in ``data``; raises ValueError if the bytes are not a valid encoding."""
    if not data:
        raise ValueError("empty value")
    return decode_body(data[0], memoryview(data)[1:])


def decode_body(tag: int, body):
    """The value whose tag is ``tag`` and whose remaining bytes are ``body``; ``bytes`` come back as ``body``
    itself when it is a ``bytes`` object. Raises ValueError if the bytes are not a valid encoding."""
    try:
        if tag == TAG_MSGPACK:
            return _unpackb(body)
        if tag == TAG_BYTES:
            return body if type(body) is bytes else bytes(body)
        if tag == TAG_ARRAY:
            return _decode_array(memoryview(body), 1)
        if tag == TAG_TENSOR:
            return _decode_tensor(memoryview(body))
    except ValueError:
        raise
    except MALFORMED as exc:  # what malformed bytes make the parsers raise; an interrupt passes through as it is
        raise ValueError(f"malformed value: {exc!r}") from None
    raise ValueError(f"unknown value tag {tag}")
