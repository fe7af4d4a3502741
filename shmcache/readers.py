"""Reader slots: where a handle that reads without the lock counts its hits and misses and pins its views
(layout/dtypes.py READER).

A handle claims one of the segment's ``READER_SLOTS`` slots with an exclusive OFD lock on byte ``READER_BASE +
slot`` (``ofd.py``), taken through a description of its own and held for the handle's life; its words are then
written by that handle alone, with plain increments and no lock. The kernel drops the lock when the process dies;
the slot's counts stay, the next claimer adds to them, and ``stats()`` sums every slot: nothing a dead process
counted is lost. A slot's pin words are the views its holder opened without a system call (``_core_unlocked.c``):
they count only while the slot is held, so a dead viewer's pins end with it, and the next claimer clears them. A
forked child holds its parent's description too, so it claims a slot of its own before it counts
(``_after_fork_in_child``). With every slot taken a handle reads under the lock, as the Python path always does.
"""

from __future__ import annotations

import os
import time
import weakref

import numpy as np

from . import ofd
from .seqlock import barrier_everywhere
from .layout.dtypes import (
    H_BASE_FALLBACKS, H_BASE_HITS, H_BASE_MISSES, H_BASE_RETRIES, MAX_COUNTER, PIN_SLOT_MASK, R_FALLBACKS, R_HITS,
    R_HOLDER, R_MISSES, R_PINS, R_READING, R_RETRIES, READER_PINS, READER_SLOTS, READER_WORDS,
)

# The OFD byte of reader slot r: READER_BASE + r, above the tier's listener bytes (LISTENER_BASE + kind, below
# 2**62 + 2**40 + 256) and below the PID-namespace bytes (ofd.NS_BASE = 2**62 + 2**41).
READER_BASE = 2**62 + 2**40 + 2**20
_COUNTS = (R_HITS, R_MISSES, R_RETRIES, R_FALLBACKS)
_BASES = (H_BASE_HITS, H_BASE_MISSES, H_BASE_RETRIES, H_BASE_FALLBACKS)
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every Reader of this process, for the fork hook


class Reader:
    """One claimed reader slot of a segment (``slot`` is None once none could be had or it was given back).
    ``core``: the compiled section counting in it, told of a new slot after a fork."""

    __slots__ = ("slot", "fd", "_seg_fd", "_words", "_core", "__weakref__")

    def __init__(self, seg) -> None:
        self.slot: int | None = None
        self.fd = -1
        self._seg_fd = seg.fd
        self._words = seg.reader_words
        self._core = None
        self._claim()
        _LIVE.add(self)

    def _claim(self) -> None:
        fd = os.open(f"/proc/self/fd/{self._seg_fd}", os.O_RDWR | os.O_CLOEXEC)  # the file checked, not a name
        try:
            start = os.getpid() % READER_SLOTS  # spread: fewer slots tried when many processes open at once
            for i in range(READER_SLOTS):
                r = (start + i) % READER_SLOTS
                if ofd.lock(fd, READER_BASE + r, ofd.WRITE, wait=False):
                    w = r * READER_WORDS
                    for c in _COUNTS:  # a count out of range (damaged) starts over: stats() must stay sane
                        if not 0 <= self._words[w + c] < MAX_COUNTER:
                            self._words[w + c] = 0
                    for i in range(READER_PINS):  # a dead holder's pins: they ended with it
                        self._words[w + R_PINS + i] = 0
                    self._words[w + R_READING] = 0  # a dead holder's read under way: it ended with it
                    self._words[w + R_HOLDER] = os.getpid()
                    self.slot, self.fd, fd = r, fd, -1
                    return
        finally:
            if fd >= 0:
                os.close(fd)

    def bind(self, core) -> None:
        """Have ``core`` (a ``_core.Core``) count its reads without the lock in this slot (none: it reads under
        the lock)."""
        self._core = core
        core.use_reader(self, -1 if self.slot is None else self.slot)

    def take_back_miss(self) -> bool:
        """Take back one miss counted in this slot (``get_or_compute``'s first lookup, when its wait ends in a hit,
        counted then): False when the slot counts none (its count was found out of range and started over)."""
        if self.slot is None:
            return False
        w = self.slot * READER_WORDS + R_MISSES
        if not 0 < self._words[w] <= MAX_COUNTER:
            return False
        self._words[w] -= 1  # the holder's own word, written under the GIL as the compiled reads count in it
        return True

    def close(self) -> None:
        """Give the slot back (the kernel drops the lock with the description); its counts stay in the segment."""
        self.slot = None
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def _after_fork_in_child(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the child's copy only: the parent's lock stays with its own
            self.fd, self.slot = -1, None
            self._claim()
            if self._core is not None:
                self.bind(self._core)


def _after_fork_in_child() -> None:
    for reader in list(_LIVE):
        try:
            reader._after_fork_in_child()
        except (OSError, ValueError):  # (ValueError: its segment was closed meanwhile)
            reader.slot = None  # no slot: the core reads under the lock (it never counts in the parent's)


os.register_at_fork(after_in_child=_after_fork_in_child)


def quiesce(seg, timeout: float = 0.05) -> bool:
    """Whether no handle that holds a reader slot of ``seg`` is still in a read of the arena without the lock begun
    before now, waiting up to ``timeout`` seconds for those that are (the lock held, ``seq`` odd: a read begun
    after this looks finds the hold and does not touch the arena). What a resize must know before it gives pages
    back: a reader that found an offset before the resize would back a page again by touching it, which on a full
    /dev/shm is SIGBUS. False where it cannot tell (no membarrier, a reader stuck or stopped): then nothing is given
    back.

    The readers count their reads in their slot's ``reading`` word with a plain store and no fence (_core_methods.c
    ``reading``); the barrier made here on every thread first makes each count visible before it is read."""
    words = seg.reader_words
    if not barrier_everywhere():
        return False
    pending = [r for r in range(READER_SLOTS) if words[r * READER_WORDS + R_READING]]
    deadline = time.monotonic() + timeout
    while True:
        # A slot nobody holds counts nothing: its holder died (mid-read, perhaps), and its next claimer zeroes it.
        pending = [r for r in pending if words[r * READER_WORDS + R_READING]
                   and ofd.held_elsewhere(seg.live_fd, READER_BASE + r)]
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0002)


def slot_pinned(words, fd: int, e: int) -> bool:
    """Whether a view of a live reader slot's holder pins entry ``e`` (a pin word naming it, in a slot whose kernel
    lock some description holds: not a dead process's). ``fd``: a description of the segment that holds no slot."""
    a = np.frombuffer(words, dtype=np.int64).reshape(READER_SLOTS, READER_WORDS)[:, R_PINS : R_PINS + READER_PINS]
    rows = np.flatnonzero((((a & PIN_SLOT_MASK) == e) & ((a >> 32) > 0)).any(axis=1))
    return any(ofd.held_elsewhere(fd, READER_BASE + int(r)) for r in rows)


def sums(words) -> tuple[int, int, int, int]:
    """(hits, misses, retries, fallbacks) summed over every reader slot since the segment was made, clear() or not
    (a damaged count clipped into range)."""
    a = np.frombuffer(words, dtype=np.int64).reshape(READER_SLOTS, READER_WORDS)
    return tuple(int(a[:, c].clip(0, MAX_COUNTER).sum()) for c in _COUNTS)  # type: ignore[return-value]


def totals(h, words) -> tuple[int, int, int, int]:
    """(hits, misses, retries, fallbacks) of every reader slot, less what clear() set aside (``base_*``)."""
    return tuple(max(0, s - h[b]) for s, b in zip(sums(words), _BASES))  # type: ignore[return-value]


def set_aside(h, words) -> None:
    """clear(): the slots' sums become the new base, so that stats() counts from zero (a slot is its holder's to
    write, never another process's: it is not zeroed)."""
    for s, b in zip(sums(words), _BASES):
        h[b] = s
