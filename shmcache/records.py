"""The entry table's records, one view per field indexed by entry slot: ``rec.prev[e]``, ``rec.check[e] = 0``.

A segment's records have one of two formats (layout/dtypes.py ENTRY, ENTRY_NARROW). Wide records (every layout
before 19, and a layout-19 segment too large for narrow ones: Geometry.narrow) are eight words. Narrow records are
32 bytes: the links, the index slot and the lengths as 32-bit fields, the block's offset in units of BLOCK_ALIGN,
the checksum a word, and no fingerprint (the index slot's tag is its low 32 bits: ``tag``). The Python path reads
and writes them through ``Records``, so that no caller asks which format it has; the compiled section does the same
through ``_core.h`` ER/EW.

Every view is a strided memoryview: an index is an entry slot, a read returns a Python int, and a write checks its
range (an out-of-range value is a bug, raised as ValueError or OverflowError by the view, never truncated). The one
difference a caller sees is ``off``: a narrow record holds the block offset shifted right by ``osh`` (3), so a read
is ``rec.off[e] << rec.osh`` and a write ``rec.off[e] = off >> rec.osh`` (an offset is a multiple of BLOCK_ALIGN).
"""

from __future__ import annotations

import struct

import numpy as np

from .layout.dtypes import ENTRY, ENTRY_NARROW

_WIDE = struct.Struct("<8q")          # prev, next, fp, off, key_nbytes, val_nbytes, slot, check
_NARROW = struct.Struct("<iiiIIIq")   # prev, next, slot, key_nbytes, val_nbytes, off >> 3, check
if (_WIDE.size, _NARROW.size) != (ENTRY.itemsize, ENTRY_NARROW.itemsize):
    raise ImportError("shmcache.records: the record structs disagree with the ENTRY dtypes")


_PFP_MUL = 0x9E3779B97F4A7C15  # 2**64 / the golden ratio: a multiply that spreads 32 bits over 64 (Fibonacci hashing)


def narrow_pfp(fp: int) -> int:
    """The fingerprint a narrow segment's policy (sketch, ghost) knows a key by: its fingerprint's low 32 bits,
    which are all an entry's index slot keeps of it (its tag), spread over 63 (``fp`` may be an index word: its low
    bits are the tag). (twin: _core.h narrow_pfp)"""
    return ((fp & 0xFFFFFFFF) * _PFP_MUL & 0xFFFFFFFFFFFFFFFF) >> 1


class Records:
    """The records of one mapping's entry table (``mv``: its bytes, every slot reserved)."""

    __slots__ = ("narrow", "nbytes", "osh", "dtype", "prev", "next", "fp", "off", "klen", "vlen", "slot", "check",
                 "_mv", "_raw", "_views")

    def __init__(self, mv: memoryview, narrow: bool) -> None:
        self._views: tuple[memoryview, ...]
        self.fp: memoryview | None
        self.narrow = narrow
        self._mv = mv
        self._raw = mv.cast("B")
        if narrow:
            self.nbytes, self.osh, self.dtype = ENTRY_NARROW.itemsize, 3, ENTRY_NARROW
            i32, u32, q = mv.cast("i"), mv.cast("I"), mv.cast("q")
            self.prev, self.next, self.slot = i32[0::8], i32[1::8], i32[2::8]
            self.klen, self.vlen, self.off = u32[3::8], u32[4::8], u32[5::8]
            self.check = q[3::4]
            self.fp = None
            self._views = (i32, u32, q)
        else:
            self.nbytes, self.osh, self.dtype = ENTRY.itemsize, 0, ENTRY
            q = mv.cast("q")
            (self.prev, self.next, self.fp, self.off, self.klen, self.vlen, self.slot,
             self.check) = (q[i::8] for i in range(8))
            self._views = (q,)

    def link(self, word: int) -> int:
        """A link field's value for header word ``word``, which damage may have put out of any link's range: the word
        itself in a wide record, its low 32 bits as a signed number in a narrow one (as the compiled section's
        store truncates it); whoever follows the link checks it."""
        if self.narrow:
            return ((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
        return word

    def write(self, e: int, prev: int, nxt: int, fp: int, off: int, klen: int, vlen: int, slot: int,
              check: int) -> None:
        """Write entry ``e``'s whole record in one call (``fp`` is not kept in a narrow record)."""
        if self.narrow:
            _NARROW.pack_into(self._raw, e * _NARROW.size, prev, nxt, slot, klen, vlen, off >> 3, check)
        else:
            _WIDE.pack_into(self._raw, e * _WIDE.size, prev, nxt, fp, off, klen, vlen, slot, check)

    def links(self, e: int) -> tuple[int, int, int, int, int, int]:
        """Entry ``e``'s ``(prev, next, off, klen, vlen, slot)`` in one call (the block offset in bytes)."""
        if self.narrow:
            p, n, s, klen, vlen, off, _ = _NARROW.unpack_from(self._raw, e * _NARROW.size)
            return p, n, off << 3, klen, vlen, s
        p, n, _, off, klen, vlen, s, _ = _WIDE.unpack_from(self._raw, e * _WIDE.size)
        return p, n, off, klen, vlen, s

    def copy(self, src: int, dst: int) -> None:
        """Make entry ``dst``'s record a copy of entry ``src``'s."""
        n = self.nbytes
        self._raw[dst * n : dst * n + n] = self._raw[src * n : src * n + n]

    def rows(self, count: int) -> np.ndarray:
        """The first ``count`` records as a structured array over the segment (``dtype``'s fields; a narrow
        ``off`` in units of 1 << ``osh``)."""
        return np.ndarray((count,), self.dtype, buffer=self._mv)

    def column(self, name: str, count: int) -> np.ndarray:
        """Field ``name`` of the first ``count`` records, as int64 (a view where the field is a word, else a
        copy; ``off`` in bytes in both formats)."""
        out = self.rows(count)[name]
        if out.dtype != np.int64:
            out = out.astype(np.int64)
        if name == "off" and self.osh:
            out = out << self.osh
        return out

    def release(self) -> None:
        """Release every view (before the mapping closes). One that an array of ``rows`` or ``column`` still
        exports (a traceback's frame may hold one) stays until that array goes, as the mapping does then."""
        for v in (self.prev, self.next, self.fp, self.off, self.klen, self.vlen, self.slot, self.check,
                  *self._views, self._raw, self._mv):
            if v is not None:
                try:
                    v.release()
                except BufferError:
                    pass
