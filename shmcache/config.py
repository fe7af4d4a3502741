"""The header words that configure behaviour: ``default_ttl_ns``, ``max_entries``, ``max_retained_bytes`` and
``capacity``; and the idle region's default time to idle (version 14: ``tti_problems``, ``restore_tti``).

A stray write to one of them changes what every process does without breaking any structure (a small positive
default time to live makes every put expire at once, a max_entries of 1 empties the cache), so no structural check
can see it. Each is therefore written with a checksum (``config_check``), after a checked copy of the first three
(line 6 of the header, ``saved_*``, with its own checksum, ``saved_check``): a word that fails its checksum is
damage, and the repair restores it from whichever copy still checks, or, if neither does, to the values that can do
no harm (no default expiry, the capacity as the limits). The capacity word (line 8) has no copy of its own: both
checksums cover it, so a damaged capacity fails both, and the repair takes the one that makes a copy check again
among the values a capacity has in practice (the byte limit it set, or the arena's whole), else the arena's whole.
A capacity of 0 is a segment of layout version 8 or 7, whose checksums cover the first three words alone.

Crash window: ``write`` updates the copy first, then the words. A writer killed within the copy leaves the words
whole (the old values: the copy is rewritten from them); killed within the words, the copy whole (the new values:
the words are rewritten from it). The writers hold the lock: creation, ``Store.set_limits`` and the repair.
"""

from __future__ import annotations

import struct

from .codec import MASK63, xxh3
from .layout import MAX_TTL_NS
from .layout.dtypes import (
    D_DEFAULT_TTI, D_EXPIRES_ON, D_IDLE_ON, D_TTI_CHECK, D_VERSIONS_ON, SHOWN_EXPIRES, SHOWN_IDLE, SHOWN_VERSIONS,
    H_CAPACITY, H_CONFIG_CHECK, H_DEFAULT_TTL, H_MAX_ENTRIES, H_MAX_RETAINED, H_SAVED_CHECK, H_SAVED_MAX_ENTRIES,
    H_SAVED_MAX_RETAINED, H_SAVED_TTL,
)

_WORDS = (H_DEFAULT_TTL, H_MAX_ENTRIES, H_MAX_RETAINED)
_SAVED = (H_SAVED_TTL, H_SAVED_MAX_ENTRIES, H_SAVED_MAX_RETAINED)
_PACK3 = struct.Struct("<3q").pack
_PACK4 = struct.Struct("<4q").pack


def checksum(ttl_ns: int, max_entries: int, max_retained: int, capacity: int = 0) -> int:
    """Never 0, so that a word never written does not check. A capacity of 0 (versions 8 and 7) is not covered."""
    packed = _PACK3(ttl_ns, max_entries, max_retained) if capacity == 0 else _PACK4(
        ttl_ns, max_entries, max_retained, capacity)
    return (xxh3(packed) & MASK63) | 1


def capacity(h, g) -> int:
    """The capacity in force as a number to trust: the word, or the arena's whole where it is 0 or out of range
    (a damaged word also fails the checksums, and the repair restores it)."""
    cap = h[H_CAPACITY]
    return cap if 0 < cap <= g.capacity_bytes else g.capacity_bytes


def write(h, ttl_ns: int, max_entries: int, max_retained: int, cap: int | None = None) -> None:
    """Set the configuration (header words ``h``, the lock held): the copy first, then the words. ``cap`` None:
    the capacity word as it is.

    Crash window: the capacity word is written between the two checksums, so a writer killed around it leaves one
    of them checking (the copy's, written for the new capacity first; or the words', for the old)."""
    cap = h[H_CAPACITY] if cap is None else cap
    h[H_SAVED_TTL], h[H_SAVED_MAX_ENTRIES], h[H_SAVED_MAX_RETAINED] = ttl_ns, max_entries, max_retained
    h[H_SAVED_CHECK] = checksum(ttl_ns, max_entries, max_retained, cap)
    h[H_CAPACITY] = cap
    h[H_DEFAULT_TTL], h[H_MAX_ENTRIES], h[H_MAX_RETAINED] = ttl_ns, max_entries, max_retained
    h[H_CONFIG_CHECK] = checksum(ttl_ns, max_entries, max_retained, cap)


def set_limits(h, max_entries: int, max_retained: int, cap: int | None = None) -> None:
    write(h, h[H_DEFAULT_TTL], max_entries, max_retained, cap)


def _valid(g, values: tuple[int, int, int], check: int, cap: int) -> bool:
    ttl, max_entries, max_retained = values
    return (check == checksum(*values, cap) and 0 <= ttl <= MAX_TTL_NS and 0 < max_entries <= g.max_entries
            and 0 <= cap <= g.capacity_bytes and 0 < max_retained <= (cap or g.capacity_bytes))


def problems(h, g) -> list[str]:
    """What is wrong with the configuration of a segment of geometry ``g``: O(1)."""
    words, saved, cap = tuple(h[w] for w in _WORDS), tuple(h[w] for w in _SAVED), h[H_CAPACITY]
    if not _valid(g, words, h[H_CONFIG_CHECK], cap):
        return [f"the configuration words (default_ttl_ns, max_entries, max_retained_bytes = {words}; capacity "
                f"{cap}) fail their checksum"]
    if not _valid(g, saved, h[H_SAVED_CHECK], cap) or saved != words:
        return ["the configuration's saved copy fails its checksum or differs from the words"]
    return []


def restore(h, g, entries: int | None = None) -> bool:
    """Put the configuration right (the lock held): from the words if they check, else from the copy, else no
    default expiry, the capacity as the byte limit and ``entries`` (None: the geometry's most) as the entry limit.
    Whether anything was wrong."""
    words, saved, cap = tuple(h[w] for w in _WORDS), tuple(h[w] for w in _SAVED), h[H_CAPACITY]
    words_ok, saved_ok = _valid(g, words, h[H_CONFIG_CHECK], cap), _valid(g, saved, h[H_SAVED_CHECK], cap)
    if words_ok and saved_ok and words == saved:
        return False
    if not (words_ok or saved_ok):
        # Both fail: perhaps the capacity word alone was hit. The values a capacity takes in practice, tried.
        for guess in (saved[2], words[2], g.capacity_bytes):
            w_ok, s_ok = _valid(g, words, h[H_CONFIG_CHECK], guess), _valid(g, saved, h[H_SAVED_CHECK], guess)
            if w_ok or s_ok:
                cap, words_ok, saved_ok = guess, w_ok, s_ok
                break
    if words_ok or saved_ok:
        ttl, max_entries, max_retained = words if words_ok else saved
        write(h, ttl, max_entries, max_retained, cap)
    else:
        most = g.max_entries if entries is None or not 0 < entries <= g.max_entries else entries
        write(h, 0, most, g.capacity_bytes, g.capacity_bytes if cap else 0)
    return True


def tti_checksum(tti_ns: int) -> int:
    """The checksum of the idle region's default time to idle (never 0, so that a word never written does not
    check)."""
    return (xxh3(_PACK1(tti_ns)) & MASK63) | 1


_PACK1 = struct.Struct("<q").pack


def write_tti(idle, tti_ns: int) -> None:
    """Set the default time to idle (idle region words ``idle``; creation, or the repair): the word, then its
    checksum. A writer killed between the two leaves a pair that fails, which the repair sets to none."""
    idle[D_DEFAULT_TTI] = tti_ns
    idle[D_TTI_CHECK] = tti_checksum(tti_ns)


def default_tti(idle) -> int:
    """The default time to idle to use (ns; 0: none): the word where it checks and is in range, else none (the
    damage is verify's to report and repair). ``idle`` None: a segment before version 14."""
    if idle is None:
        return 0
    tti = idle[D_DEFAULT_TTI]
    return tti if 0 <= tti <= MAX_TTL_NS and idle[D_TTI_CHECK] == tti_checksum(tti) else 0


_SWITCHES = ((SHOWN_IDLE, D_IDLE_ON, "D_IDLE_ON"), (SHOWN_VERSIONS, D_VERSIONS_ON, "D_VERSIONS_ON"),
             (SHOWN_EXPIRES, D_EXPIRES_ON, "D_EXPIRES_ON"))


def switch_words(lazy: int) -> list[tuple[int, str]]:
    """The words (number, name) that say whether each of the lazy columns ``lazy`` (Geometry.lazy's SHOWN_* bits)
    is in use."""
    return [(w, name) for bit, w, name in _SWITCHES if lazy & bit]


def tti_problems(idle, lazy: int = 0) -> list[str]:
    """What is wrong with the default time to idle (``idle`` None: nothing, a segment before version 14), and
    with the words that say the lazy columns ``lazy`` are in use (Geometry.lazy: D_IDLE_ON and D_VERSIONS_ON from
    version 16, D_EXPIRES_ON from 18: each 0 or 1)."""
    if idle is None:
        return []
    out = []
    tti, check = idle[D_DEFAULT_TTI], idle[D_TTI_CHECK]
    if not 0 <= tti <= MAX_TTL_NS or check != tti_checksum(tti):
        out.append(f"the default time to idle ({tti} ns) fails its checksum or is out of range")
    for w, name in switch_words(lazy):
        if idle[w] not in (0, 1):
            out.append(f"the lazy columns' word {name} is {idle[w]}, not 0 or 1")
    return out


def restore_tti(idle, lazy: int = 0) -> bool:
    """Put the default time to idle right (the lock held): a pair that fails is set to none, the value that can do
    no harm (entries then live until their time to live or eviction); and a switch word of the lazy columns ``lazy``
    (``tti_problems``) other than 0 and 1 to 1, the columns in use, which only costs memory where the other value
    could lose what they hold. Whether anything was wrong."""
    if not tti_problems(idle, lazy):
        return False
    if tti_problems(idle):
        write_tti(idle, 0)
    for w, _ in switch_words(lazy):
        if idle[w] not in (0, 1):
            idle[w] = 1
    return True
