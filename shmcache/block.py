"""Where an entry's bytes are: the block layout ``[header][value][key]`` and the entry slots handed out.

The one home of these computations (the bytes themselves are specified in ``layout/__init__.py``): slow paths call
these functions; the hot paths (``SharedCache.get``, ``entries.get_many_locked``, ``index.find``/``find_rest``,
``Table.insert``/``overwrite``) write the same arithmetic inline, each citing the function it copies, and
``tests/test_hot_paths.py`` pins them to these by running the same operations both ways.

A block starts with one header word, ``nb | e << BLOCK_OWNER_SHIFT`` (32): its size in bytes (header and padding
included, a multiple of BLOCK_ALIGN, below 2**32) and the entry slot that owns it (0 for a dead block). The value (its
tag byte, then its body) follows the header and the key bytes follow the value, so a key is found from the entry's
``off`` and ``val_nbytes`` words alone.
"""

from __future__ import annotations

from .layout import BLOCK_ALIGN, BLOCK_HEADER_NBYTES
from .layout.dtypes import (
    BLOCK_LEN_MASK, BLOCK_OWNER_SHIFT, H_UNUSED_NEXT,
)

VALUE_START = BLOCK_HEADER_NBYTES  # a block's value (tag byte first) starts after its header word
PAD = BLOCK_HEADER_NBYTES + BLOCK_ALIGN - 1  # nbytes(n) is (n + PAD) & -BLOCK_ALIGN, for the inlined copies


def nbytes(payload_nbytes: int) -> int:
    """Bytes a block takes for a payload (key + value) of ``payload_nbytes``: header and padding included."""
    return (payload_nbytes + PAD) & -BLOCK_ALIGN


def header(nb: int, e: int) -> int:
    """The header word of a block of ``nb`` bytes owned by entry slot ``e`` (0: a dead block)."""
    return nb | (e << BLOCK_OWNER_SHIFT)


def split_header(word: int) -> tuple[int, int]:
    """``(nb, e)`` of a block header word."""
    return word & BLOCK_LEN_MASK, word >> BLOCK_OWNER_SHIFT


def value_at(rec, base: int, e: int) -> int:
    """Offset (from ``base``: the arena's offset in the mapping, or 0 for arena offsets) of entry ``e``'s value,
    its tag byte first (``rec``: the segment's records.Records)."""
    return base + (rec.off[e] << rec.osh) + VALUE_START


def key_at(rec, base: int, e: int) -> int:
    """Offset (as ``value_at``) of entry ``e``'s key bytes: they follow the value."""
    return base + (rec.off[e] << rec.osh) + VALUE_START + rec.vlen[e]


def key_of(mm, rec, base: int, e: int) -> bytes:
    """Entry ``e``'s stored key bytes, copied (``base``: the arena's offset in ``mm``)."""
    k0 = key_at(rec, base, e)
    return mm[k0 : k0 + rec.klen[e]]


def entry_nbytes(rec, e: int) -> int:
    """The block size of resident entry ``e``, from its key and value lengths."""
    return nbytes(rec.klen[e] + rec.vlen[e])


def handed_out(h, slots: int) -> int:
    """How many entry slots have ever been handed out (``unused_next``), clamped to the table: every resident
    entry, and every slot of the free list, lies below it. A damaged word is taken as the whole table, so a scan
    bounded by it is never too short."""
    n = h[H_UNUSED_NEXT]
    return n if 0 < n <= slots else slots
