"""Stored key bytes back into keys: the inverse of ``codec.encode_key``, for iteration (``keys()``, ``items()``,
``popitem()``), which hands back the keys that were put.

What round-trips is what the canonical encoding keeps (codec.py): ``str``, ``bytes``, ``int``, ``bool``, ``float``,
``complex``, ``None``, ``datetime``, ``date``, ``time``, ``timedelta``, ``Decimal``, ``UUID``, ``list``, ``tuple``,
``dict``, ``set`` and ``frozenset`` come back as themselves (tuple as tuple, list as list, ``1``, ``1.0`` and
``True`` apart; an aware datetime's or time's zone as its fixed offset, stdtypes.py); subclasses come back as their
base (a namedtuple as a plain tuple, an IntEnum as an int, a str enum as its text), numpy scalars as Python scalars,
``-0.0`` as ``0.0`` and every NaN as one NaN (in a complex's parts too), and numpy arrays as new writable
little-endian C-order arrays of the same dtype and shape. A dict's items come back in the order of their encoded
keys. The bytes come from shared memory, so nothing is trusted: every length is checked, nesting is bounded,
and only plain data is built; malformed bytes raise ValueError.
"""

from __future__ import annotations

import math
import threading

import msgpack
import numpy as np

from . import stdtypes
from .codec import MALFORMED, NON_STR_KEY

# The ext codes and bounds of codec.py's key encoding (part of the segment format: they never change).
_EXT_TUPLE, _EXT_NDARRAY, _EXT_BIGINT = 1, 2, 3
_SETS = {stdtypes.EXT_SET: set, stdtypes.EXT_FROZENSET: frozenset}  # 5-10 and 13: stdtypes.CODES
_ARRAY_KINDS = "biufc"
_MAX_NDIM = 64
_MAX_DEPTH = 32


class _Depth(threading.local):
    n = 0


_depth = _Depth()


def decode_key(kb: bytes):
    """The key whose canonical encoding is ``kb``; raises ValueError if the bytes are no key's encoding."""
    try:
        if kb[:1] != NON_STR_KEY:
            return kb.decode("utf-8")  # UnicodeDecodeError is a ValueError
        return _unpack(kb[1:])
    except ValueError:
        raise
    except (RecursionError, *MALFORMED) as exc:
        raise ValueError(f"malformed key: {exc!r}") from None


def _unpack(data: bytes):
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False, ext_hook=_ext_hook)


def _ext_hook(code: int, data: bytes):
    if code == _EXT_BIGINT:
        return int.from_bytes(data, "little", signed=True)
    if code in stdtypes.CODES:
        return stdtypes.decode(code, data)
    _depth.n += 1
    try:
        if _depth.n > _MAX_DEPTH:
            raise ValueError(f"key nests more than {_MAX_DEPTH} levels deep")
        if code == _EXT_TUPLE:
            items = _unpack(data)
            if type(items) is not list:
                raise ValueError("a tuple key's body is not an array")
            return tuple(items)
        if code == _EXT_NDARRAY:
            return _array(data)
        if code in _SETS:
            items = _unpack(data)
            if type(items) is not list:
                raise ValueError("a set key's body is not an array")
            return _SETS[code](items)  # an unhashable item: TypeError, so malformed
    finally:
        _depth.n -= 1
    raise ValueError(f"unknown key ext type {code}")


def _array(data: bytes) -> np.ndarray:
    """An array key's ext body: msgpack ``[dtype, shape]`` then the raw little-endian C-order bytes."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data) or 1)
    unpacker.feed(data)
    header = unpacker.unpack()
    start = unpacker.tell()
    if type(header) is not list or len(header) != 2 or type(header[0]) is not str or type(header[1]) is not list:
        raise ValueError("invalid array key header")
    dtype, shape = np.dtype(header[0]), header[1]
    if dtype.kind not in _ARRAY_KINDS or len(shape) > _MAX_NDIM or any(type(n) is not int or n < 0 for n in shape):
        raise ValueError("invalid array key header")
    if math.prod(shape) * dtype.itemsize != len(data) - start:  # checked before anything is allocated
        raise ValueError("array key data does not match its header")
    return np.frombuffer(data, dtype=dtype, offset=start).reshape(shape).copy()
