"""Open-addressing table from key fingerprint to entry slot, over the index words: find, insert, remove.

Linear probing; the table has at least twice as many slots as there are entries, so probes stay short. ``remove``
shifts the rest of the cluster back instead of leaving tombstones, which keeps every lookup's probe sequence ending
at an empty slot and lets each entry record the slot that points at it (its record's ``slot``) for O(1) removal.

A slot is two words, ``(fp, entry)``, before layout version 15, and one word after, ``(entry << 32) | tag``, the tag
the fingerprint's low 32 bits (layout/dtypes.py INDEX_SLOT_PACKED). The module-level functions are the two-word
index's; ``Packed`` has the one-word index's, and ``Wide`` names the two-word ones the same way, so that a caller
takes its segment's (``of``) and calls it without asking which.

Until layout version 17 the index has a power of two of slots, and a key's home slot is ``fp & mask``. From 17
(``Ranged``) it has any number of slots (layout/geometry.py index_for: load 0.7 at most, not 0.25 to 0.5), and the
home slot is the tag scaled to them, ``(tag * slots) >> 32`` (Lemire's multiply-shift range reduction). Every
function takes ``mask``, the index's last slot (``slots - 1``, the mask itself under a power of two), and ``home``
gives a key's home slot under its layout.

All functions assume the cache lock is held. Probe loops are bounded by the table size, so a corrupted table (no
empty slot anywhere) raises CorruptionError instead of looping forever.
"""

from __future__ import annotations

import numpy as np

from .errors import CorruptionError
from .layout import BLOCK_HEADER_NBYTES, EMPTY
from .layout.dtypes import I_ENTRY, I_FP, INDEX_SHIFT, PACKED_ENTRY_SHIFT, PACKED_TAG_MASK


def _full() -> CorruptionError:
    return CorruptionError("the index table has no empty slot", what="index")


def find(ix, rec, mm, base: int, mask: int, fp: int, kb: bytes) -> int:
    """Entry slot holding key bytes ``kb`` (fingerprint ``fp``), or EMPTY. ``rec`` is the segment's records
    (records.py), ``mm`` the mapping and ``base`` the arena's offset in it: keys are compared as bytes copied out of
    the mapping, which beats a memoryview compare."""
    # Why: the first probe is unrolled because it is almost always the last; a loop costs more to set up than it.
    w = (fp & mask) << INDEX_SHIFT
    e = ix[w + I_ENTRY]
    if e == EMPTY:
        return EMPTY
    if ix[w + I_FP] == fp:
        klen = len(kb)
        if rec.klen[e] == klen:
            k0 = base + rec.off[e] + BLOCK_HEADER_NBYTES + rec.vlen[e]  # block.key_at, inlined (wide: osh 0)
            if mm[k0 : k0 + klen] == kb:
                return e
    return find_rest(ix, rec, mm, base, mask, fp, kb)


def find_rest(ix, rec, mm, base: int, mask: int, fp: int, kb: bytes) -> int:
    """``find`` past the key's home slot (the caller probed that one)."""
    s = fp & mask
    klen = len(kb)
    for _ in range(mask):
        s = (s + 1) & mask
        w = s << INDEX_SHIFT
        e = ix[w + I_ENTRY]
        if e == EMPTY:
            return EMPTY
        if ix[w + I_FP] == fp:
            if rec.klen[e] == klen:
                k0 = base + rec.off[e] + BLOCK_HEADER_NBYTES + rec.vlen[e]  # block.key_at, inlined (wide: osh 0)
                if mm[k0 : k0 + klen] == kb:
                    return e
    raise _full()


def free_slot(ix, mask: int, fp: int) -> int:
    """The first empty slot of ``fp``'s probe sequence (the caller fills it)."""
    s = fp & mask
    for _ in range(mask + 1):
        if ix[(s << INDEX_SHIFT) + I_ENTRY] == EMPTY:
            return s
        s = (s + 1) & mask
    raise _full()


def insert(ix, rec, mask: int, fp: int, e: int) -> None:
    """Point the first free slot of ``fp``'s probe sequence at entry ``e`` (the key must not be present)."""
    s = free_slot(ix, mask, fp)
    ix[(s << INDEX_SHIFT) + I_FP] = fp
    ix[(s << INDEX_SHIFT) + I_ENTRY] = e
    rec.slot[e] = s


def remove(ix, rec, mask: int, s: int, opening=None) -> None:
    """Empty slot ``s`` and shift back the entries after it that would otherwise become unreachable. ``opening``:
    called with each slot before an entry is moved out of it (its stripe opened; the caller opened ``s``'s)."""
    ix[(s << INDEX_SHIFT) + I_ENTRY] = EMPTY
    j = s
    for _ in range(mask + 1):
        j = (j + 1) & mask
        w = j << INDEX_SHIFT
        e = ix[w + I_ENTRY]
        if e == EMPTY:
            return
        # The entry at j may fill the hole at s only if its home slot is not cyclically within (s, j].
        if (j - ix[w + I_FP]) & mask >= (j - s) & mask:
            if opening is not None:
                opening(j)
            ws = s << INDEX_SHIFT
            ix[ws + I_FP] = ix[w + I_FP]
            ix[ws + I_ENTRY] = e
            rec.slot[e] = s
            ix[w + I_ENTRY] = EMPTY
            s = j
    raise _full()


def _entry(ix, s: int) -> int:
    return ix[(s << INDEX_SHIFT) + I_ENTRY]


def _names(ix, s: int, e: int, fp: int) -> bool:
    w = s << INDEX_SHIFT
    return ix[w + I_ENTRY] == e and ix[w + I_FP] == fp


def _put(ix, s: int, fp: int, e: int) -> None:
    w = s << INDEX_SHIFT
    ix[w + I_FP] = fp
    ix[w + I_ENTRY] = e


def _repoint(ix, s: int, e: int) -> None:
    ix[(s << INDEX_SHIFT) + I_ENTRY] = e


def _home(fp: int, mask: int) -> int:
    return fp & mask


def _homes(fps, slots: int):
    """The home slots of the fingerprints (or tags) ``fps``, a numpy array, in an index of ``slots`` slots."""
    return fps & (slots - 1)


class Wide:
    """The index of two words a slot, ``(fp, entry)`` (layout versions 7 to 14): this module's functions."""

    packed = False
    home = staticmethod(_home)  # the home slot of fingerprint ``fp`` in an index whose last slot is ``mask``
    homes = staticmethod(_homes)  # the same of an array of them, in an index of ``slots`` slots (vectorised)
    find = staticmethod(find)
    find_rest = staticmethod(find_rest)
    free_slot = staticmethod(free_slot)
    insert = staticmethod(insert)
    remove = staticmethod(remove)
    entry = staticmethod(_entry)  # the entry slot ``s`` holds (EMPTY: none)
    names = staticmethod(_names)  # whether slot ``s`` holds entry ``e`` under fingerprint ``fp``
    put = staticmethod(_put)  # slot ``s`` made to hold entry ``e`` of fingerprint ``fp``
    repoint = staticmethod(_repoint)  # slot ``s`` made to hold entry ``e`` (the same key, moved: Table.pack)


_SHIFT, _TAG = PACKED_ENTRY_SHIFT, PACKED_TAG_MASK


def _p_match(rec, mm, base: int, e: int, fp: int, kb: bytes) -> bool:
    """Whether entry ``e`` holds key ``kb``: its whole fingerprint (a wide record's; a narrow one keeps none, the tag
    compared is all of it there), its key's length and bytes. (twin: _core_index.c find)"""
    klen = len(kb)
    fps = rec.fp
    if (fps is not None and fps[e] != fp) or rec.klen[e] != klen:
        return False
    k0 = base + (rec.off[e] << rec.osh) + BLOCK_HEADER_NBYTES + rec.vlen[e]  # block.key_at, inlined
    return mm[k0 : k0 + klen] == kb


def _p_find(ix, rec, mm, base: int, mask: int, fp: int, kb: bytes) -> int:
    """``find`` over one-word slots: a slot whose tag is the fingerprint's low bits is the key's when its entry has
    the whole fingerprint and the key. (twin: _core_index.c find)"""
    word = ix[fp & mask]
    e = (word >> _SHIFT) & _TAG
    if e == EMPTY:
        return EMPTY
    if word & _TAG == fp & _TAG and _p_match(rec, mm, base, e, fp, kb):
        return e
    return _p_find_rest(ix, rec, mm, base, mask, fp, kb)


def _p_find_rest(ix, rec, mm, base: int, mask: int, fp: int, kb: bytes) -> int:
    return _p_probe(ix, rec, mm, base, mask, fp & mask, fp, kb)


def _p_probe(ix, rec, mm, base: int, mask: int, s: int, fp: int, kb: bytes) -> int:
    """``find`` past home slot ``s`` over one-word slots (the caller probed that one), round from the last slot to
    the first: the same under either home rule."""
    tag = fp & _TAG
    for _ in range(mask):
        s = s + 1 if s < mask else 0
        word = ix[s]
        e = (word >> _SHIFT) & _TAG
        if e == EMPTY:
            return EMPTY
        if word & _TAG == tag and _p_match(rec, mm, base, e, fp, kb):
            return e
    raise _full()


def _p_free_slot(ix, mask: int, fp: int) -> int:
    return _p_free_from(ix, mask, fp & mask)


def _p_free_from(ix, mask: int, s: int) -> int:
    for _ in range(mask + 1):
        if not (ix[s] >> _SHIFT) & _TAG:
            return s
        s = s + 1 if s < mask else 0
    raise _full()


def _p_put(ix, s: int, fp: int, e: int) -> None:
    ix[s] = (e << _SHIFT) | (fp & _TAG)


def _p_insert(ix, rec, mask: int, fp: int, e: int) -> None:
    s = _p_free_from(ix, mask, fp & mask)
    ix[s] = (e << _SHIFT) | (fp & _TAG)
    rec.slot[e] = s


def _p_remove(ix, rec, mask: int, s: int, opening=None) -> None:
    """``remove`` over one-word slots: a slot's home is its word's low bits (the tag). (twin: _core_index.c
    index_remove)"""
    _p_shift_back(ix, rec, mask, s, opening, _home)


def _p_shift_back(ix, rec, mask: int, s: int, opening, home) -> None:
    """Empty slot ``s`` and shift back what follows it in its cluster, ``home(word, mask)`` a slot's home: an entry
    may fill the hole only if its home is not cyclically within the hole and its own slot."""
    n = mask + 1
    ix[s] = 0
    j = s
    for _ in range(n):
        j = j + 1 if j < mask else 0
        word = ix[j]
        e = (word >> _SHIFT) & _TAG
        if e == EMPTY:
            return
        if (j - home(word, mask)) % n >= (j - s) % n:
            if opening is not None:
                opening(j)
            ix[s] = word
            rec.slot[e] = s
            ix[j] = 0
            s = j
    raise _full()


def _p_entry(ix, s: int) -> int:
    return (ix[s] >> _SHIFT) & _TAG


def _p_names(ix, s: int, e: int, fp: int) -> bool:
    return ix[s] == (e << _SHIFT) | (fp & _TAG)


def _p_repoint(ix, s: int, e: int) -> None:
    ix[s] = (e << _SHIFT) | (ix[s] & _TAG)


class Packed:
    """The index of one word a slot, ``(entry << 32) | tag`` (layout versions 15 and 16)."""

    packed = True
    home = staticmethod(_home)
    homes = staticmethod(_homes)
    find = staticmethod(_p_find)
    find_rest = staticmethod(_p_find_rest)
    free_slot = staticmethod(_p_free_slot)
    insert = staticmethod(_p_insert)
    remove = staticmethod(_p_remove)
    entry = staticmethod(_p_entry)
    names = staticmethod(_p_names)
    put = staticmethod(_p_put)
    repoint = staticmethod(_p_repoint)


def _r_home(fp: int, mask: int) -> int:
    return ((fp & _TAG) * (mask + 1)) >> 32


def _r_homes(fps, slots: int):
    tags = np.asarray(fps).astype(np.uint64) & np.uint64(_TAG)  # (tag * slots < 2**64: slots are at most 2**32)
    return ((tags * np.uint64(slots)) >> np.uint64(32)).astype(np.int64)


def _r_find(ix, rec, mm, base: int, mask: int, fp: int, kb: bytes) -> int:
    """``find`` over one-word slots in an index of any size: the tag scaled to the slots is the home slot.
    (twin: _core_index.c find)"""
    word = ix[((fp & _TAG) * (mask + 1)) >> 32]
    e = (word >> _SHIFT) & _TAG
    if e == EMPTY:
        return EMPTY
    if word & _TAG == fp & _TAG and _p_match(rec, mm, base, e, fp, kb):
        return e
    return _r_find_rest(ix, rec, mm, base, mask, fp, kb)


def _r_find_rest(ix, rec, mm, base: int, mask: int, fp: int, kb: bytes) -> int:
    return _p_probe(ix, rec, mm, base, mask, ((fp & _TAG) * (mask + 1)) >> 32, fp, kb)


def _r_free_slot(ix, mask: int, fp: int) -> int:
    return _p_free_from(ix, mask, ((fp & _TAG) * (mask + 1)) >> 32)


def _r_insert(ix, rec, mask: int, fp: int, e: int) -> None:
    s = _p_free_from(ix, mask, ((fp & _TAG) * (mask + 1)) >> 32)
    ix[s] = (e << _SHIFT) | (fp & _TAG)
    rec.slot[e] = s


def _r_remove(ix, rec, mask: int, s: int, opening=None) -> None:
    """``remove`` over one-word slots in an index of any size: a slot's home is its tag scaled to the slots.
    (twin: _core_index.c index_remove)"""
    _p_shift_back(ix, rec, mask, s, opening, _r_home)


class Ranged:
    """The index of one word a slot in any number of slots, the home slot the tag scaled to them (layout version
    17)."""

    packed = True
    home = staticmethod(_r_home)
    homes = staticmethod(_r_homes)
    find = staticmethod(_r_find)
    find_rest = staticmethod(_r_find_rest)
    free_slot = staticmethod(_r_free_slot)
    insert = staticmethod(_r_insert)
    remove = staticmethod(_r_remove)
    entry = staticmethod(_p_entry)
    names = staticmethod(_p_names)
    put = staticmethod(_p_put)
    repoint = staticmethod(_p_repoint)


def keyed(xo, ix, rec, mask: int, e: int, fp: int) -> bool:
    """Whether resident entry ``e``'s fingerprint is ``fp``: its record's (wide); a narrow record keeps none, so the
    index slot it names must name it back with ``fp``'s tag, as a lookup finds it (``xo``: the segment's index
    functions, ``of``)."""
    if rec.fp is not None:
        return rec.fp[e] == fp
    s = rec.slot[e]
    return 0 <= s <= mask and xo.names(ix, s, e, fp)


def of(geometry) -> type[Wide] | type[Packed] | type[Ranged]:
    """The index functions of a segment of ``geometry`` (its layout version's slots)."""
    if geometry.ranged_index:
        return Ranged
    return Packed if geometry.packed_index else Wide
