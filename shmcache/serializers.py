"""The value serializers a cache is created with: ``msgpack`` (codec.py's encoding, the default) and ``pickle``
(opted into at creation, recorded in the segment's ``features`` word, for what msgpack cannot carry: Django's
model instances, sessions, responses).

Invariant: a handle encodes and decodes with the serializer its segment records, and no other: ``SharedCache``
refuses (SerializerMismatch) a handle that asks for one while the segment records the other, so a default handle
never decodes with pickle, and a pickle handle never meets a segment whose writers did not opt in. Only
``PICKLE.decode`` calls ``pickle.loads``; codec.py's decoder refuses the ``P`` tag as an unknown one, so pickled
bytes planted into a default segment are treated as damage (dropped), never unpickled.

In a pickle cache, exact ``bytes`` and numpy arrays of plain numbers keep codec.py's fast tags (``B``, ``A``:
no pickling, an array copied once into the array returned); every other value is pickled (protocol 5), so it
comes back as an equal object of its own type (a namedtuple as itself, a ``bytes`` or ``ndarray`` subclass too).
Keys are never pickled: they stay codec.py's canonical bytes.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from . import codec
from .errors import SerializerMismatch, remove_hint
from .layout import FEATURE_PICKLE

TAG_PICKLE = ord("P")
PROTOCOL = 5  # out-of-band buffers aside (not used), the most compact protocol; every Python >= 3.8 reads it
_ARRAY_KINDS = "biufc"  # the dtypes codec.py stores raw (``A``); an object or structured array is pickled
_PROTO = 0x80  # pickle's PROTO opcode, the first byte of every stream of protocol >= 2
_STOP = b"."  # pickle's STOP opcode, the last byte of every stream


class Serializer:
    """How the values of a cache are encoded (``encode``: value -> (tag, body)) and decoded (``decode``: (tag,
    body) -> value), and the ``features`` bit that records it in the segment."""

    __slots__ = ("name", "feature", "encode", "decode")

    def __init__(self, name: str, feature: int, encode: Callable[[Any], tuple[int, bytes]],
                 decode: Callable[[int, Any], Any]) -> None:
        self.name = name
        self.feature = feature
        self.encode = encode
        self.decode = decode

    def __repr__(self) -> str:
        return f"<serializer {self.name}>"


def _pickle_encode(value) -> tuple[int, bytes]:
    """A value of a pickle cache as (tag, body). Raises what pickle raises for what it cannot pickle
    (``pickle.PicklingError``, ``TypeError``, ``AttributeError``...), as Django's own backends let it through."""
    t = type(value)
    # Why ints too: incr reads its counter under the cache lock, and must never unpickle there (that would run a
    # planted payload's code while every process waits for the lock).
    if t is bytes or t is int or (t is np.ndarray and value.dtype.kind in _ARRAY_KINDS):
        return codec.encode_parts(value)
    return TAG_PICKLE, pickle.dumps(value, protocol=PROTOCOL)


def _pickle_decode(tag: int, body):
    """A value of a pickle cache. An unpickling failure (a class this process cannot import, a ``__setstate__``
    that raises) is the value's own, not damage: it propagates as pickle raised it, but a ValueError (which the
    cache reads as damaged bytes) comes as ``pickle.UnpicklingError``. The checksum was checked before."""
    if tag != TAG_PICKLE:
        return codec.decode_body(tag, body)
    try:
        return pickle.loads(body)
    except ValueError as exc:
        raise pickle.UnpicklingError(f"the stored value does not unpickle: {exc}") from exc


def check_pickle(body) -> None:
    """Raise ValueError unless ``body`` has the frame of a pickle stream (PROTO of protocol 2 to 5 first, STOP
    last): what ``verify`` checks of a pickled value, which it never unpickles (that would run code under the lock)."""
    if len(body) < 3 or body[0] != _PROTO or not 2 <= body[1] <= pickle.HIGHEST_PROTOCOL or body[-1:] != _STOP:
        raise ValueError("a pickled value without a pickle stream's first and last opcodes")


MSGPACK = Serializer("msgpack", 0, codec.encode_parts, codec.decode_body)
PICKLE = Serializer("pickle", FEATURE_PICKLE, _pickle_encode, _pickle_decode)
_BY_NAME = {s.name: s for s in (MSGPACK, PICKLE)}


def named(name: str) -> Serializer:
    """The serializer called ``name``; raises ValueError for any other name (before anything is opened)."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"serializer must be one of {sorted(_BY_NAME)}, got {name!r}") from None


def recorded(features: int) -> Serializer:
    """The serializer a segment's ``features`` word records."""
    return PICKLE if features & FEATURE_PICKLE else MSGPACK


def check(name: str, features: int, asked: Serializer) -> None:
    """Refuse a handle whose serializer is not the one the segment of cache ``name`` records.

    :raises SerializerMismatch: (a ValueError) saying both, and how to open the cache as it is.
    """
    found = recorded(features)
    if found is asked:
        return
    raise SerializerMismatch(
        f"cache {name!r} was created with serializer={found.name!r}; this handle asked for {asked.name!r}",
        what="attach", asked=asked.name, found=found.name,
        hint=f"{_HINTS[found.name]}; or, to change its serializer, {remove_hint(name)} with serializer="
             f"{asked.name!r}",
    )


_HINTS = {
    "pickle": "pass serializer='pickle' only if you trust every process that can write the cache (unpickling its "
              "values can run their code), or use another name",
    "msgpack": "leave serializer= out to use it as it is, or create the pickle cache under another name",
}
