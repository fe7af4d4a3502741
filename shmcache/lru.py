"""The global LRU order: a circular doubly linked list threaded through the entry table, with a sentinel slot.

Like ``functools._lru_cache_wrapper``, the sentinel (slot 0) makes every operation a fixed handful of word writes
with no empty-list or end-of-list branches: ``sentinel.next`` is the most recent entry, ``sentinel.prev`` the least.

Invariant: the resident entries form exactly one cycle through the sentinel, of length ``header.entries + 1``.
All functions assume the cache lock is held.
"""

from __future__ import annotations

from .layout import SENTINEL
from .layout.dtypes import E_NEXT, E_PREV, ENTRY_WORDS

_W = ENTRY_WORDS


def push_front(ent, e: int) -> None:
    """Link entry ``e`` in as the most recently used."""
    first = ent[E_NEXT]  # sentinel.next (the sentinel is slot 0, so its words are the first ENTRY_WORDS)
    b = e * _W
    ent[b + E_PREV] = SENTINEL
    ent[b + E_NEXT] = first
    ent[first * _W + E_PREV] = e
    ent[E_NEXT] = e


def unlink(ent, e: int) -> None:
    """Take entry ``e`` out of the list (its own links are left stale)."""
    b = e * _W
    p = ent[b + E_PREV]
    n = ent[b + E_NEXT]
    ent[p * _W + E_NEXT] = n
    ent[n * _W + E_PREV] = p


def move_to_front(ent, e: int) -> None:
    """Make entry ``e`` the most recently used."""
    b = e * _W
    p = ent[b + E_PREV]
    if p == SENTINEL:
        return
    n = ent[b + E_NEXT]
    ent[p * _W + E_NEXT] = n
    ent[n * _W + E_PREV] = p
    first = ent[E_NEXT]
    ent[b + E_PREV] = SENTINEL
    ent[b + E_NEXT] = first
    ent[first * _W + E_PREV] = e
    ent[E_NEXT] = e


def tail(ent) -> int:
    """The least recently used entry, or SENTINEL when the list is empty."""
    return ent[E_PREV]


def reset(ent) -> None:
    """Make the list empty."""
    ent[E_PREV] = SENTINEL
    ent[E_NEXT] = SENTINEL


def relink(ent, order) -> None:
    """Make the list exactly the entries of ``order``, most recent first (a repair's rebuild); their other words
    are left as they are."""
    prev = SENTINEL
    for e in order:
        ent[prev * _W + E_NEXT] = e
        ent[e * _W + E_PREV] = prev
        prev = e
    ent[prev * _W + E_NEXT] = SENTINEL
    ent[E_PREV] = prev
