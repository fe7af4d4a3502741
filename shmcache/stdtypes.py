"""The standard library's scalar value types as msgpack ext types: their codes, byte formats, encoders and decoders.

``codec.py`` stores values (and keys) of these types through this module; ``keys.py`` decodes stored keys through
it. Its twin in C is ``shmcache/_unpack.c`` (the compiled get's decoder), which decodes the same formats and
declines whatever this module would call malformed (``tests/test_unpack.py`` holds the two together).

Every format is fixed-width little-endian, or text that is checked to be the one canonical form, so the bytes of a
value are the same in every process (what a key needs), and a decoder builds only the type its code names
(``datetime``'s, ``decimal``'s and ``uuid``'s own constructors, with numbers read from the bytes): whoever can write
the segment cannot make a reader run code. Every field is bounded by its constructor or checked here; damaged bytes
raise ValueError (an OverflowError for a timedelta's days, which codec.py's callers turn into one).

    ext 5, ``datetime``: ``<HBBBBBBI`` year, month, day, hour, minute, second, fold, microsecond (12 bytes), then
           the zone: nothing (naive), or ``<q`` the UTC offset in microseconds (strictly within a day), then,
           optionally, the zone's name in UTF-8 (present only when it differs from ``datetime.timezone``'s
           default name for that offset, e.g. ``CET``; never empty).
    ext 6, ``date``: ``<HBB`` year, month, day (4 bytes).
    ext 7, ``time``: ``<BBBBI`` hour, minute, second, fold, microsecond (8 bytes), then the zone as for ext 5.
    ext 8, ``timedelta``: ``<iII`` days, seconds (below 86400), microseconds (below 1,000,000): its own
           normalised fields (12 bytes).
    ext 9, ``Decimal``: ``str(d)`` in ASCII: exact, signs, exponent, ``-0``, ``Infinity``, ``NaN``, ``sNaN`` and
           NaN payloads included; a body that is not ``str`` of the Decimal it parses to is malformed.
    ext 10, ``UUID``: its 16 bytes (``UUID.bytes``, big-endian as RFC 4122 writes them).
    ext 13, ``complex``: ``<dd`` real and imaginary parts (16 bytes), bit for bit (as keys: -0.0 as 0.0 and every
           NaN as one NaN, as for floats).

(Ext 11 and 12, ``set`` and ``frozenset``, hold other values, so codec.py packs them, as it packs tuples.)

A zone is stored as its UTC offset: an aware value comes back with ``datetime.timezone(offset)`` (or
``timezone(offset, name)``), so its ``utcoffset()``, ``tzname()``, wall clock and instant are the original's. Why
not a ``zoneinfo`` key: decoding would then depend on the reader's time zone database (another container may lack
it, or hold other rules) and read files named by shared bytes. Subclasses (a pandas ``Timestamp``) are stored as
their base type, as a namedtuple is stored as a tuple.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
import struct
import uuid
from typing import Any

EXT_DATETIME = 5
EXT_DATE = 6
EXT_TIME = 7
EXT_TIMEDELTA = 8
EXT_DECIMAL = 9
EXT_UUID = 10
EXT_SET = 11  # codec.py's: its items as a msgpack array
EXT_FROZENSET = 12  # codec.py's: as EXT_SET
EXT_COMPLEX = 13

_DATE = struct.Struct("<HBB")
_TIME = struct.Struct("<BBBBI")
_DATETIME = struct.Struct("<HBBBBBBI")
_OFFSET = struct.Struct("<q")
_TIMEDELTA = struct.Struct("<iII")
_COMPLEX = struct.Struct("<dd")
_NAN = float("nan")
_US_PER_DAY = 86_400_000_000


def _zone(obj, offset: _dt.timedelta | None) -> bytes:
    """The zone part of a datetime or time whose ``utcoffset()`` is ``offset``."""
    if obj.tzinfo is None:
        return b""
    if offset is None:
        raise TypeError(f"cannot encode a {type(obj).__name__} whose tzinfo gives no UTC offset: it could not come "
                        "back exactly; attach a datetime.timezone, or drop the tzinfo")
    us = (offset.days * 86_400 + offset.seconds) * 1_000_000 + offset.microseconds
    name = obj.tzname()
    if name is None or name == "" or name == _dt.timezone(offset).tzname(None):
        return _OFFSET.pack(us)
    return _OFFSET.pack(us) + name.encode()


def _tzinfo(zone: memoryview | bytes) -> _dt.timezone | None:
    if not zone:
        return None
    (us,) = _OFFSET.unpack_from(zone)
    if not -_US_PER_DAY < us < _US_PER_DAY:
        raise ValueError(f"UTC offset of {us} microseconds is not within a day")
    offset = _dt.timedelta(microseconds=us)
    if len(zone) == _OFFSET.size:
        return _dt.timezone(offset)
    name = bytes(zone[_OFFSET.size:]).decode()
    if name == _dt.timezone(offset).tzname(None):
        raise ValueError("a zone name that is its offset's default name is not stored")
    return _dt.timezone(offset, name)


def _enc_datetime(d: _dt.datetime) -> bytes:
    nanosecond: Any = getattr(d, "nanosecond", None)  # a pandas Timestamp's: not silently truncated
    if type(d) is not _dt.datetime and nanosecond:
        raise TypeError(f"cannot encode {d!r} exactly: a datetime holds microseconds, and it has nanoseconds; round "
                        "it (ts.floor('us')) or store its integer nanoseconds (ts.value)")
    return _DATETIME.pack(d.year, d.month, d.day, d.hour, d.minute, d.second, d.fold, d.microsecond) \
        + _zone(d, d.utcoffset())


def _enc_time(t: _dt.time) -> bytes:
    return _TIME.pack(t.hour, t.minute, t.second, t.fold, t.microsecond) + _zone(t, t.utcoffset())


def _enc_timedelta(t: _dt.timedelta) -> bytes:
    return _TIMEDELTA.pack(t.days, t.seconds, t.microseconds)


def _enc_date(d: _dt.date) -> bytes:
    return _DATE.pack(d.year, d.month, d.day)


def _enc_decimal(d: decimal.Decimal) -> bytes:
    return str(d).encode("ascii")


def _enc_complex(z: complex) -> bytes:
    return _COMPLEX.pack(z.real, z.imag)


def _canonical(x: float) -> float:
    return 0.0 if x == 0.0 else _NAN if math.isnan(x) else x


def _key_complex(z: complex) -> bytes:
    # Equal complex numbers give equal bytes: -0.0 parts as 0.0, every NaN part as one NaN (as float keys).
    return _COMPLEX.pack(_canonical(z.real), _canonical(z.imag))


# Why datetime before date: a datetime is a date (subclass), and the first isinstance match decides.
_TYPES: tuple[tuple[type, int, Any], ...] = (
    (_dt.datetime, EXT_DATETIME, _enc_datetime),
    (_dt.date, EXT_DATE, _enc_date),
    (_dt.time, EXT_TIME, _enc_time),
    (_dt.timedelta, EXT_TIMEDELTA, _enc_timedelta),
    (decimal.Decimal, EXT_DECIMAL, _enc_decimal),
    (uuid.UUID, EXT_UUID, lambda u: u.bytes),
    (complex, EXT_COMPLEX, _enc_complex),
)
_BY_TYPE = {t: (code, enc) for t, code, enc in _TYPES}
_KEY_BY_TYPE = {**_BY_TYPE, complex: (EXT_COMPLEX, _key_complex)}


def encode(obj, key: bool = False) -> tuple[int, bytes] | None:
    """The ext code and body of ``obj`` if it is of one of these types (a subclass as its base), else None;
    ``key``: the canonical form keys take (complex). Raises TypeError for a value that cannot come back exactly
    (an aware time or datetime whose tzinfo gives no offset) or ValueError (a zone name with lone surrogates)."""
    table = _KEY_BY_TYPE if key else _BY_TYPE
    found = table.get(type(obj))
    if found is None:
        for t, _, _ in _TYPES:
            if isinstance(obj, t):
                found = table[t]
                break
        else:
            return None
    code, enc = found
    return code, enc(obj)


def _dec_datetime(data: bytes) -> _dt.datetime:
    y, mo, d, h, mi, s, fold, us = _DATETIME.unpack_from(data)
    return _dt.datetime(y, mo, d, h, mi, s, us, _tzinfo(memoryview(data)[_DATETIME.size:]), fold=fold)


def _dec_date(data: bytes) -> _dt.date:
    if len(data) != _DATE.size:
        raise ValueError(f"a date is {_DATE.size} bytes, not {len(data)}")
    return _dt.date(*_DATE.unpack(data))


def _dec_time(data: bytes) -> _dt.time:
    h, mi, s, fold, us = _TIME.unpack_from(data)
    return _dt.time(h, mi, s, us, _tzinfo(memoryview(data)[_TIME.size:]), fold=fold)


def _dec_timedelta(data: bytes) -> _dt.timedelta:
    days, seconds, us = _TIMEDELTA.unpack(data)
    if seconds >= 86_400 or us >= 1_000_000:
        raise ValueError(f"timedelta fields out of range: {seconds} s, {us} us")
    return _dt.timedelta(days, seconds, us)  # OverflowError beyond +-999,999,999 days


def _dec_decimal(data: bytes) -> decimal.Decimal:
    text = data.decode("ascii")
    try:
        d = decimal.Decimal(text)  # exact whatever the context's precision; a syntax error may trap or give NaN
    except decimal.DecimalException:
        d = None
    if d is None or str(d) != text:
        raise ValueError(f"Decimal body {text[:40]!r} is not a Decimal's canonical text")
    return d


def _dec_complex(data: bytes) -> complex:
    return complex(*_COMPLEX.unpack(data))


_DECODERS: dict[int, Any] = {
    EXT_DATETIME: _dec_datetime,
    EXT_DATE: _dec_date,
    EXT_TIME: _dec_time,
    EXT_TIMEDELTA: _dec_timedelta,
    EXT_DECIMAL: _dec_decimal,
    EXT_UUID: lambda data: uuid.UUID(bytes=bytes(data)),  # ValueError unless 16 bytes
    EXT_COMPLEX: _dec_complex,
}
CODES = frozenset(_DECODERS)


def decode(code: int, data: bytes):
    """The value of ext ``code`` (one of ``CODES``) whose body is ``data``. Raises ValueError (struct.error,
    OverflowError) if the bytes are no such value's encoding."""
    return _DECODERS[code](data)
