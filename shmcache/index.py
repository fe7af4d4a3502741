"""Open-addressing table from key fingerprint to entry slot, over the index words: find, insert, remove.

Linear probing; the table has at least twice as many slots as there are entries, so probes stay short. ``remove``
shifts the rest of the cluster back instead of leaving tombstones, which keeps every lookup's probe sequence ending
at an empty slot and lets each entry record the slot that points at it (``E_SLOT``) for O(1) removal.

All functions assume the cache lock is held. Probe loops are bounded by the table size, so a corrupted table (no
empty slot anywhere) raises CorruptionError instead of looping forever.
"""

from __future__ import annotations

from .errors import CorruptionError
from .layout import BLOCK_HEADER_NBYTES, EMPTY
from .layout.dtypes import E_KEY_NBYTES, E_OFF, E_SLOT, E_VAL_NBYTES, ENTRY_WORDS, I_ENTRY, I_FP, INDEX_SHIFT


def _full() -> CorruptionError:
    return CorruptionError("the index table has no empty slot", what="index")


def find(ix, ent, mm, base: int, mask: int, fp: int, kb: bytes) -> int:
    """Entry slot holding key bytes ``kb`` (fingerprint ``fp``), or EMPTY. ``mm`` is the mapping and ``base`` the
    arena's offset in it: keys are compared as bytes copied out of the mapping, which beats a memoryview compare."""
    # Why: the first probe is unrolled because it is almost always the last; a loop costs more to set up than it.
    w = (fp & mask) << INDEX_SHIFT
    e = ix[w + I_ENTRY]
    if e == EMPTY:
        return EMPTY
    if ix[w + I_FP] == fp:
        b = e * ENTRY_WORDS
        klen = len(kb)
        if ent[b + E_KEY_NBYTES] == klen:
            k0 = base + ent[b + E_OFF] + BLOCK_HEADER_NBYTES + ent[b + E_VAL_NBYTES]  # block.key_at, inlined
            if mm[k0 : k0 + klen] == kb:
                return e
    return find_rest(ix, ent, mm, base, mask, fp, kb)


def find_rest(ix, ent, mm, base: int, mask: int, fp: int, kb: bytes) -> int:
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
            b = e * ENTRY_WORDS
            if ent[b + E_KEY_NBYTES] == klen:
                k0 = base + ent[b + E_OFF] + BLOCK_HEADER_NBYTES + ent[b + E_VAL_NBYTES]  # block.key_at, inlined
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


def insert(ix, ent, mask: int, fp: int, e: int) -> None:
    """Point the first free slot of ``fp``'s probe sequence at entry ``e`` (the key must not be present)."""
    s = free_slot(ix, mask, fp)
    ix[(s << INDEX_SHIFT) + I_FP] = fp
    ix[(s << INDEX_SHIFT) + I_ENTRY] = e
    ent[e * ENTRY_WORDS + E_SLOT] = s


def remove(ix, ent, mask: int, s: int, opening=None) -> None:
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
            ent[e * ENTRY_WORDS + E_SLOT] = s
            ix[w + I_ENTRY] = EMPTY
            s = j
    raise _full()
