"""The global LRU order: a circular doubly linked list threaded through the entry table, with a sentinel slot.

Like ``functools._lru_cache_wrapper``, the sentinel (slot 0) makes every operation a fixed handful of word writes
with no empty-list or end-of-list branches: ``sentinel.next`` is the most recent entry, ``sentinel.prev`` the least.

Invariant: the resident entries form exactly one cycle through the sentinel, of length ``header.entries + 1``.
All functions assume the cache lock is held.
"""

from __future__ import annotations

from .layout import SENTINEL


def push_front(rec, e: int) -> None:
    """Link entry ``e`` in as the most recently used (``rec``: the segment's records.Records)."""
    pv, nx = rec.prev, rec.next
    first = nx[SENTINEL]
    pv[e] = SENTINEL
    nx[e] = first
    pv[first] = e
    nx[SENTINEL] = e


def unlink(rec, e: int) -> None:
    """Take entry ``e`` out of the list (its own links are left stale)."""
    pv, nx = rec.prev, rec.next
    p = pv[e]
    n = nx[e]
    nx[p] = n
    pv[n] = p


def move_to_front(rec, e: int) -> None:
    """Make entry ``e`` the most recently used."""
    pv, nx = rec.prev, rec.next
    p = pv[e]
    if p == SENTINEL:
        return
    n = nx[e]
    nx[p] = n
    pv[n] = p
    first = nx[SENTINEL]
    pv[e] = SENTINEL
    nx[e] = first
    pv[first] = e
    nx[SENTINEL] = e


def tail(rec) -> int:
    """The least recently used entry, or SENTINEL when the list is empty."""
    return rec.prev[SENTINEL]


def reset(rec) -> None:
    """Make the list empty."""
    rec.prev[SENTINEL] = SENTINEL
    rec.next[SENTINEL] = SENTINEL


def relink(rec, order) -> None:
    """Make the list exactly the entries of ``order``, most recent first (a repair's rebuild); their other fields
    are left as they are."""
    pv, nx = rec.prev, rec.next
    prev = SENTINEL
    for e in order:
        nx[prev] = e
        pv[e] = prev
        prev = e
    nx[prev] = SENTINEL
    pv[SENTINEL] = prev
