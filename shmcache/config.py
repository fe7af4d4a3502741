"""The header words that configure behaviour: ``default_ttl_ns``, ``max_entries`` and ``max_retained_bytes``.

A stray write to one of them changes what every process does without breaking any structure (a small positive
default time to live makes every put expire at once, a max_entries of 1 empties the cache), so no structural check
can see it. Each is therefore written with a checksum (``config_check``), after a checked copy of all three (line 6
of the header, ``saved_*``): a word that fails its checksum is damage, and the repair restores it from whichever
copy still checks, or, if neither does, to the values that can do no harm (no default expiry, the capacity).

Crash window: ``write`` updates the copy first, then the words. A writer killed within the copy leaves the words
whole (the old values: the copy is rewritten from them); killed within the words, the copy whole (the new values:
the words are rewritten from it). The writers hold the lock: creation, ``Store.set_limits`` and the repair.
"""

from __future__ import annotations

import struct

from .codec import MASK63, xxh3
from .layout import MAX_TTL_NS
from .layout.dtypes import (
    H_CONFIG_CHECK, H_DEFAULT_TTL, H_MAX_ENTRIES, H_MAX_RETAINED, H_SAVED_CHECK, H_SAVED_MAX_ENTRIES,
    H_SAVED_MAX_RETAINED, H_SAVED_TTL,
)

_WORDS = (H_DEFAULT_TTL, H_MAX_ENTRIES, H_MAX_RETAINED)
_SAVED = (H_SAVED_TTL, H_SAVED_MAX_ENTRIES, H_SAVED_MAX_RETAINED)
_PACK = struct.Struct("<3q").pack


def checksum(ttl_ns: int, max_entries: int, max_retained: int) -> int:
    """Never 0, so that a word never written does not check."""
    return (xxh3(_PACK(ttl_ns, max_entries, max_retained)) & MASK63) | 1


def write(h, ttl_ns: int, max_entries: int, max_retained: int) -> None:
    """Set the configuration (header words ``h``, the lock held): the copy first, then the words."""
    h[H_SAVED_TTL], h[H_SAVED_MAX_ENTRIES], h[H_SAVED_MAX_RETAINED] = ttl_ns, max_entries, max_retained
    h[H_SAVED_CHECK] = checksum(ttl_ns, max_entries, max_retained)
    h[H_DEFAULT_TTL], h[H_MAX_ENTRIES], h[H_MAX_RETAINED] = ttl_ns, max_entries, max_retained
    h[H_CONFIG_CHECK] = checksum(ttl_ns, max_entries, max_retained)


def set_limits(h, max_entries: int, max_retained: int) -> None:
    write(h, h[H_DEFAULT_TTL], max_entries, max_retained)


def _valid(g, values: tuple[int, int, int], check: int) -> bool:
    ttl, max_entries, max_retained = values
    return (check == checksum(*values) and 0 <= ttl <= MAX_TTL_NS and 0 < max_entries <= g.max_entries
            and 0 < max_retained <= g.capacity_bytes)


def problems(h, g) -> list[str]:
    """What is wrong with the configuration of a segment of geometry ``g``: O(1)."""
    words, saved = tuple(h[w] for w in _WORDS), tuple(h[w] for w in _SAVED)
    if not _valid(g, words, h[H_CONFIG_CHECK]):
        return [f"the configuration words (default_ttl_ns, max_entries, max_retained_bytes = {words}) fail "
                "their checksum"]
    if not _valid(g, saved, h[H_SAVED_CHECK]) or saved != words:
        return ["the configuration's saved copy fails its checksum or differs from the words"]
    return []


def restore(h, g) -> bool:
    """Put the configuration right (the lock held): from the words if they check, else from the copy, else no
    default expiry and the capacity as the limits. Whether anything was wrong."""
    words, saved = tuple(h[w] for w in _WORDS), tuple(h[w] for w in _SAVED)
    words_ok, saved_ok = _valid(g, words, h[H_CONFIG_CHECK]), _valid(g, saved, h[H_SAVED_CHECK])
    if words_ok and saved_ok and words == saved:
        return False
    write(h, *(words if words_ok else saved if saved_ok else (0, g.max_entries, g.capacity_bytes)))
    return True
