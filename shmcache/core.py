"""The compiled critical section (``shmcache._core``): whether it is built, and binding it to one attached segment.

``bind(seg)`` hands the C code the segment's writable buffer and every offset, word number and constant it uses,
taken from ``shmcache/layout`` (and the mutex's kind word from ``lock.py``) here, so that the layout has one source
of truth: ``_core.c`` holds no layout number of its own. The pure-Python operations (``table.py`` and the structures
under it) stay the reference and the fallback; ``tests/test_core.py`` pins the two to byte-identical segments.

The C methods answer ``HANDOVER`` for anything unusual (see ``_core.c``): the caller then runs the Python path,
which judges, repairs and raises. A ``Core`` keeps a buffer export of the mapping: ``release()`` it before the
segment is closed, or the mapping cannot be unmapped.
"""

from __future__ import annotations

import os
from typing import Any

from . import ofd
from .arena import block_nbytes
from .codec import MASK63, TAG_ARRAY, TAG_BYTES, TAG_MSGPACK, TAG_TENSOR, array_over, xxh3
from .layout import (
    BLOCK_ALIGN, BLOCK_HEADER_NBYTES, EMPTY, ENTRY, HEADER_NBYTES, INDEX_SLOT, KIND, KIND_PREFIX, LOCK_NBYTES,
    MAX_BLOCK_NBYTES, MAX_KINDS, MAX_TTL_NS, MAX_VERSION, NEVER, NIL, SENTINEL,
)
from .layout import dtypes as d
from .lock import KIND_OFF, MUTEX_KIND_WORD

try:
    if os.environ.get("SHMCACHE_PURE_PYTHON") == "1":
        raise ImportError("SHMCACHE_PURE_PYTHON=1")
    from . import _core  # type: ignore[attr-defined]  # (the compiled extension: no stub)
except ImportError:
    _core = None

Core: Any = None if _core is None else _core.Core  # the compiled section's type; None: not built (or not wanted)
PATH = "compiled" if _core is not None else "pure Python"  # what `shmcache ls` / `stats` print as the hot path
HANDOVER = None if _core is None else _core.HANDOVER  # a call the Python path must make instead
PINNED = None if _core is None else _core.PINNED  # put, put_many: pinned entries left no room; raise PinnedError
TIMEOUT = "timeout"  # Core.reason after a call that waited the whole lock timeout in C (the Python path waits no more)
Raw = None if _core is None else _core.Raw  # get_value: a hit left to the Python side (SharedCache._finish)

_BLOCK_LEN_MASK = MAX_BLOCK_NBYTES + BLOCK_ALIGN - 1  # a block header's low bits: the block length
if block_nbytes(0) != BLOCK_HEADER_NBYTES or _BLOCK_LEN_MASK & (_BLOCK_LEN_MASK + 1):
    raise ImportError("shmcache.core: the block header is not (owner << bits) | length as _core.c reads it")

_WORDS = (
    "E_PREV", "E_NEXT", "E_FP", "E_OFF", "E_KEY_NBYTES", "E_VAL_NBYTES", "E_SLOT", "E_CHECK", "I_FP", "I_ENTRY",
    "K_ENTRIES", "K_RETAINED", "H_HITS", "H_MISSES", "H_PUTS", "H_UPDATES", "H_DELETES", "H_EVICTIONS", "H_DIRTY",
    "H_ENTRIES", "H_RETAINED", "H_MAX_ENTRIES", "H_MAX_RETAINED", "H_HEAD", "H_TAIL", "H_FILL", "H_ARENA_USED",
    "H_FREE_HEAD", "H_UNUSED_NEXT", "H_VERSION_CLOCK", "H_NEXT_EXPIRY", "H_EXPIRED", "H_DEFAULT_TTL", "H_WRITING",
    "H_PROGRESS", "H_LOCK_OFF",
)


def last_wait() -> tuple[float, int] | None:
    """How long the calling thread's last wait for the lock took in the compiled section, in seconds, and how many
    timeouts it added while the holder made progress (None: not built)."""
    return None if _core is None else _core.last_wait()


def offsets(geometry) -> dict[str, int]:
    """Every number ``_core.Core`` needs, for a segment of ``geometry`` (a ``layout.Geometry``)."""
    g = geometry
    out = {name: getattr(d, name) for name in _WORDS}
    out.update(
        header_off=0, index_off=g.index_off, entries_off=g.entries_off, expires_off=g.expires_off,
        versions_off=g.versions_off, kinds_off=g.kinds_off, pins_off=g.pins_off, kind_table_off=g.kind_table_off,
        arena_off=g.arena_off, arena_nbytes=g.arena_nbytes, entry_slots=g.entry_slots, index_slots=g.index_slots,
        HEADER_WORDS=HEADER_NBYTES // 8, WORD_NBYTES=d.EXPIRES.itemsize, INDEX_SLOT_NBYTES=INDEX_SLOT.itemsize,
        ENTRY_NBYTES=ENTRY.itemsize, KIND_ROWS=MAX_KINDS + 1, KIND_NBYTES=KIND.itemsize, LOCK_NBYTES=LOCK_NBYTES,
        MUTEX_KIND_OFF=KIND_OFF, MUTEX_KIND_WORD=MUTEX_KIND_WORD, BLOCK_HEADER_NBYTES=BLOCK_HEADER_NBYTES,
        BLOCK_ALIGN=BLOCK_ALIGN, MAX_BLOCK_NBYTES=MAX_BLOCK_NBYTES, BLOCK_LEN_MASK=_BLOCK_LEN_MASK,
        BLOCK_OWNER_SHIFT=_BLOCK_LEN_MASK.bit_length(), EMPTY=EMPTY, NIL=NIL, SENTINEL=SENTINEL, NEVER=NEVER,
        MAX_TTL_NS=MAX_TTL_NS, MAX_VERSION=MAX_VERSION, KIND_PREFIX=KIND_PREFIX, PIN_BASE=ofd.PIN_BASE,
        CHECK_MASK=MASK63, TAG_BYTES=TAG_BYTES, TAG_MSGPACK=TAG_MSGPACK, TAG_ARRAY=TAG_ARRAY, TAG_TENSOR=TAG_TENSOR,
    )
    return out


def bind(seg, lock_timeout: float):
    """A ``_core.Core`` over the open ``segment.Segment`` ``seg``, waiting at most ``lock_timeout`` seconds for a
    busy lock before handing over; None when the extension is not built (or SHMCACHE_PURE_PYTHON=1)."""
    if _core is None:
        return None
    return Core(seg.mm, offsets(seg.geometry), seg.live_fd, max(1, int(lock_timeout * 1e9)), xxh3)


def finish(raw, guard, decode):
    """The value of a hit the compiled section leaves to Python (a ``Raw``): a failed checksum
    (``guard.checksum_failed`` raises CorruptionError), an array or tensor (built over the copy made under the lock),
    or a value its decoder declines (``decode``, the serializer's; a value that does not decode raises through
    ``guard.undecodable``)."""
    if not raw.ok:
        guard.checksum_failed(raw.slot)
    try:
        if raw.tag == TAG_ARRAY or raw.tag == TAG_TENSOR:
            return array_over(raw.body)
        return decode(raw.tag, raw.body)
    except ValueError as exc:
        guard.undecodable(exc)
