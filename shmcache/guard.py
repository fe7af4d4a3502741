"""The lock protocol of one attached cache: take the lock, admit the call, wait, repair, fault. Written once, here.

Every operation of the Python path runs the same protocol (``Guard.run``; the compiled section runs its own, in C):
record the try in the thread's private record of holds (``lock.me.holds``: a call from inside a call is refused
there, before the lock is touched), take the lock inside ``try`` (so that an exception raised at any bytecode still
reaches ``finally``), check the closed flag and the ``dirty`` word under the lock, and in ``finally`` give the lock
back if its word names this thread. An operation that writes the
structures raises ``dirty`` before its first write and lowers it after its last (``updating``).

Crash window: a process can die, or an exception (Ctrl-C) can cut an update short, between any two writes. A dead
holder is found by the next locker's wait (lock.py, "Owner death"), which takes the lock over and sets ``dirty``.
Whoever locks and finds ``dirty`` set verifies and repairs the
segment before reading it (``Guard.repair``), so no half-made update is ever seen.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import NoReturn

from .codec import MALFORMED
from .errors import ClosedError, CorruptionError, NoSpaceError, PinnedError, ShmCacheError, TooLargeError
from .layout.dtypes import (
    H_ARENA_EXTENT, H_DIRTY, H_INDEX_SLOTS, H_MAX_ENTRIES, H_RESIZES, H_HITS, H_LOCK_OFF, H_MISSES, H_PROGRESS,
    H_RECOVERIES, S_OPEN,
)
from . import lock
from .lock import FUTEX_TID_MASK, FUTEX_WAITERS, Reentered, SegmentLock, futex_trylock, me, signals_deferred
from .compiled import last_wait, word_try
from .seqlock import close_seq, open_seq
from .verify import check, repair, settle_tables

# What damaged shared data makes a locked section raise; anything else (Ctrl-C, an exception from a signal handler)
# is an interruption, which needs a repair only if it cut an update short (the dirty word says).
_DAMAGE = (CorruptionError, ValueError) + MALFORMED
_REPAIRING = 2  # the dirty word's value while a repair runs (1: an ordinary update is under way)
# Refusals: raised by an update before its first write, or once every structure is consistent again.
REFUSALS = (PinnedError, TooLargeError, NoSpaceError)


def closed_error() -> ClosedError:
    return ClosedError("operation on a closed cache", what="use", hint="open a new SharedCache(name) to use it again")


def _bracket(fn, opens_seq: bool):
    @functools.wraps(fn)
    def bracketed(self, *args):
        h = self.h
        if opens_seq and self.seqlocked:
            open_seq(h)
        was = h[H_DIRTY]
        h[H_DIRTY] = 1
        try:
            result = fn(self, *args)
        except REFUSALS:
            h[H_DIRTY] = was
            raise
        h[H_DIRTY] = was
        return result

    return bracketed


def updating(fn):
    """Decorator for a method of an object with header words ``h`` that writes the cache's structures: ``dirty`` is
    raised before its first write and put back after its last; a refusal (PinnedError, TooLargeError, NoSpaceError,
    raised with every structure consistent) puts it back too; any other exception leaves it raised, for the repair.
    Put back, not cleared: an update made inside another's bracket leaves the outer bracket raised. The readers'
    ``seq`` is opened first (not under lru): for what writes across the stripes (see seqlock.py)."""
    return _bracket(fn, True)


def updating_entries(fn):
    """``updating`` for a method that writes only entries it names (a store, a remove): the table opens the stripe
    of each slot and entry before it writes them (``Table.open_slot``, ``Table.open_entry``), so that readers of the
    other stripes read on. (twins: _core_sections.c put_write, delete_locked)"""
    return _bracket(fn, False)


def _add_one(h, word: int) -> None:
    h[word] += 1


class Guard:
    """The lock of one mapped segment, and what a call does around it. ``closed`` is this handle's flag, read
    under the lock by every call."""

    def __init__(self, seg, table, lock_timeout: float) -> None:
        self.seg = seg
        self.shown = seg.shown  # how far this mapping shows the arena (Segment.refresh)
        self.table = table  # the repair's last resort empties it
        self.h = seg.header_words
        self.lockw = seg.lock_words
        self.lock = SegmentLock(seg.lock_address, lock_timeout, seg.fd, os.fstat(seg.fd))
        self.addr = seg.lock_address
        self.ident = self.lock.ident
        self.holder = self.lock.holder
        self.slot = self.lock.slot
        self.lock32 = memoryview(seg.lock_mm).cast("I")  # the lock page's 32-bit words, as long as the page
        self.fw = H_LOCK_OFF // 4  # the futex word's index there; the holder word follows it
        self._try = word_try() or futex_trylock  # a compare-and-swap where the compiled section is built
        # Clearing the word, as C calls (no bytecode: see run). On x86-64 a plain store of 0 is a release (stores
        # are seen in program order), and a WAITERS set in the instant between the look and the store costs that
        # sleeper one slice; elsewhere the kernel's atomic store (FUTEX_WAKE_OP), ordered after the hold's stores.
        if lock.PLAIN_RELEASE:
            self._clear = functools.partial(self.lock32.__setitem__, self.fw, 0)
        else:
            self._clear = self.lock.clear_call
        self._bump = self.lock.bump_call
        self.closed = False
        self.inside: set[int] = set()  # the threads inside run (waiting for the lock or holding it), by thread id
        self.seqlocked = table.pol.reads_unlocked  # readers without the lock validate against ``seq``
        self.stripes = table.stripes  # and their stripes' words (None before version 11)

    # The pattern of every call, written once in ``run`` (``close`` too, marking the handle closed even when the lock
    # cannot be had):
    #     if guard.ident in me.holds: raise Reentered()
    #     try:
    #         me.holds.add(guard.ident)
    #         guard.enter()
    #         guard.admit()
    #         ...
    #     except BaseException as exc:
    #         guard.fault(exc)
    #         raise
    #     finally:
    #         (give the lock back if its word names this thread)
    #         me.holds.discard(guard.ident)
    # The record comes before the try of the word, so that a call made from a signal handler that interrupts this
    # one anywhere between the two is refused as re-entered; the finally looks at the word, not at a flag, so that
    # an interrupt between the lock's call and the next bytecode still gives the lock back.

    def enter(self, waited: bool = False) -> None:
        """Take the lock (the try recorded in ``me.holds`` already). Follow with ``admit``."""
        rc = self._try(self.addr)
        if rc:
            self.wait(rc, waited)
        self.holder.value = self.slot.number

    def run(self, fn, *args, waited: bool = False):
        """``fn(*args)`` run under the lock, with the protocol above: every operation of the Python path goes
        through here (``fn`` is a Store method, or a function of entries.py, kinds.py or tier/copies.py).
        ``waited``: as for ``wait``."""
        holds = me.holds
        ident = self.ident
        # A record without the word naming this thread belongs to a call this one interrupted before its try or
        # after its release (or was left by a finally an interrupt cut short): this call runs whole in between, and
        # leaves the record to its owner. Dropping it would let the interrupted call hold the lock unrecorded, and a
        # call from a signal handler then would take the word naming this thread for damage.
        outer = ident in holds
        if outer and self.lock32[self.fw] & FUTEX_TID_MASK == me.tid:
            raise Reentered()
        entered = False
        try:
            if not outer:
                holds.add(ident)
                self.inside.add(me.tid)
            self.enter(waited)
            entered = True
            h, shown = self.h, self.shown
            if (self.closed or h[H_DIRTY] or h[H_ARENA_EXTENT] != shown[0] or h[H_RESIZES] != shown[3]
                    or h[H_INDEX_SLOTS] != shown[1] or h[H_MAX_ENTRIES] != shown[4]):  # (twin: _core_arena.c hidden)
                self.admit()
            result = fn(*args)
            close_seq(self.h, self.stripes)
            return result
        except BaseException as exc:
            self.fault(exc)
            raise
        finally:
            # Written inline, with no Python call before the word is cleared: a signal handler runs only at a call
            # or a loop's jump, so none comes between the look at the word and its release (``_clear`` is a C
            # call). Anything after may be cut short: a record left in ``holds`` refuses nothing while the word
            # does not name this thread, a wake not made costs a sleeper one slice.
            w = self.lock32[self.fw]
            if w & FUTEX_TID_MASK == me.tid:
                self.lock32[self.fw + 1] = 0
                self._clear()
                if w & FUTEX_WAITERS:
                    self._bump()
            elif entered:
                # A stray write changed the word during the hold (another thread may have come in): the word is left
                # as it is, no longer naming this handle's slot (waiters judge it by its thread id), and the next
                # holder repairs. The lock page outlives close(), unlike the header's mapping.
                self.lock32[self.fw + 1] = 0
                self.lockw[H_DIRTY] = 1
            if not outer:
                holds.discard(ident)
                self.inside.discard(me.tid)

    def bump(self, word: int) -> None:
        """Add one to header counter ``word`` for something refused before the lock was taken (a value too large
        for the capacity): one short hold; inside a call of this thread that holds it already, at once."""
        if self.ident in me.holds and self.lock32[self.fw] & FUTEX_TID_MASK == me.tid:
            self.h[word] += 1
        else:
            self.run(_add_one, self.h, word)

    def hold(self) -> None:
        """Take the lock as a call of this thread holds it, outside any call, until ``let_go`` (tests and benchmarks
        that play a holder: stopped, killed, or interrupted by a signal handler)."""
        me.holds.add(self.ident)
        self.enter()

    def let_go(self) -> None:
        """Give back what ``hold`` took."""
        if not self.lock.release():
            self.lock.holder.value = 0
            self.lockw[H_DIRTY] = 1
        me.holds.discard(self.ident)

    def admit(self) -> None:
        """After the lock is taken: refuse a closed handle, show what another process grew of the arena or hide
        what a resize released (before anything is read there: Segment.refresh), take the tables a resize changed
        (Segment.refresh_tables), repair what an update left half-done or the tables' words that are not ones to
        take. The hot paths call it only when one of these applies."""
        if self.closed:
            raise closed_error()
        taken = self.seg.refresh_tables()  # (first: the ring follows the entry limit it takes)
        if self.h[H_ARENA_EXTENT] != self.shown[0]:
            self.seg.refresh()
        if not taken or self.h[H_DIRTY]:
            self.repair()

    def wait(self, rc: int, waited: bool = False) -> None:
        """The lock was busy: wait for it (bounded by lock_timeout), taking it over from a holder judged gone (the
        dirty word is set then, and ``admit`` repairs). ``waited``: the compiled section timed out waiting for this
        call (``timed_out``), so the timeout is not waited a second time."""
        prior = (last_wait() or (self.lock.timeout, 0, 0)) if waited else (0.0, 0, 0)
        self.lock.acquire_slow(rc, self.progress, *prior, mark_dirty=self.mark_dirty)

    def mark_dirty(self) -> None:
        """Make the next holder verify and repair the segment (a damaged lock is being re-initialised)."""
        self.h[H_DIRTY] = 1

    def repair(self, deep: bool = False) -> None:
        """Verify the segment (``deep``: checksums too) and repair what fails; empty the cache if even that fails.
        Lock held."""
        h = self.h
        with signals_deferred():
            if self.seqlocked:
                open_seq(h)
            if self.stripes is not None:  # every stripe's word evened as the hold ends: any odd one is damage now
                self.stripes[S_OPEN] = -1
            h[H_DIRTY] = _REPAIRING  # Crash window: dying in here leaves the repair to the next locker.
            try:
                now = self.table.clock()
                if not check(self.seg, deep=deep, now=now).ok:
                    repair(self.seg, now)
                    h[H_RECOVERIES] += 1
            except Exception:  # repair itself failed on garbage: start over with an empty cache
                self.table.reset()
                settle_tables(self.seg)
                h[H_RECOVERIES] += 1
            h[H_DIRTY] = 0
            if not self.seg.refresh_tables():  # (what the repair wrote is what it showed: taken, unless damaged anew)
                self.table.reset()
                settle_tables(self.seg)

    def progress(self) -> int | None:
        """The header's progress word, which a holder on a long walk moves (read without the lock: one word, for
        patience only); None once closed."""
        try:
            return None if self.closed else self.h[H_PROGRESS]
        except ValueError:  # closed meanwhile by another thread
            return None

    def fault(self, exc: BaseException) -> None:
        """A call raised. If it holds the lock, put the segment right before ``finally`` releases it."""
        if not self.lock.owned():
            return  # raised before the lock was taken (timeout, re-entered...): nothing was touched
        if self.closed:
            return
        damage = isinstance(exc, _DAMAGE) and (isinstance(exc, CorruptionError) or not isinstance(exc, ShmCacheError))
        if damage or self.h[H_DIRTY]:
            self.repair(deep=damage)
        close_seq(self.h, self.stripes)
        if damage and not isinstance(exc, CorruptionError):
            raise CorruptionError(f"shared data failed a check and the cache was repaired: {exc!r}", what="access",
                                  hint="the operation can be retried") from exc

    def close(self) -> bool:
        """Mark the handle closed, under the lock so that calls of other threads still inside finish first. False
        when the lock could not be had: the handle is closed all the same, and the caller leaves the unmapping to
        the garbage collector, in case a call of another thread is still inside."""
        try:
            self.run(self._mark_closed)
        except (ShmCacheError, RuntimeError):  # (``run`` made the fault's repair already)
            self.closed = True
            return False
        # Calls of other threads that were waiting for the lock meanwhile find the flag once they have it, and leave:
        # they are waited for too, since a wait judges the holder through the segment's descriptors, which the
        # caller closes next (one closed under a waiter raised EBADF; one reused by another file would mislead it).
        # Only threads that live: a forked child inherits the set with the parent's other threads in it (they do
        # not exist in the child), and a signal handler's exception may cut a call's finally before its discard.
        deadline = time.monotonic() + self.lock.timeout
        mine = me.tid
        while True:
            waiting = [t for t in tuple(self.inside) if t != mine]
            if waiting:
                alive = {t.native_id for t in threading.enumerate()}
                waiting = [t for t in waiting if t in alive]
            if not waiting:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def _mark_closed(self) -> None:
        self.closed = True

    # ------------------------------------------------------------------------------------------- damage found late
    # Values are checked after the unlock (the lock is held only for the copy); a failure takes the lock again.

    def checksum_failed(self, e: int, counted: bool = True, what: str = "get") -> NoReturn:
        """A value copied out of entry ``e`` failed its checksum: repair (``counted``: the read counted as a hit
        becomes a miss), then raise CorruptionError."""
        self.run(self._drop_damaged, counted)
        raise CorruptionError(f"entry {e} failed its checksum and was dropped", what=what,
                              hint="the operation can be retried")

    def _drop_damaged(self, counted: bool) -> None:
        if counted:
            self.h[H_HITS] -= 1
            self.h[H_MISSES] += 1
        self.repair(deep=True)

    def undecodable(self, exc: ValueError) -> NoReturn:
        """A value passed its checksum but does not decode: it was stored so. Drop every such entry (a deep repair
        decodes each value), then raise CorruptionError."""
        self.run(self.repair, True)
        raise CorruptionError(f"a stored value does not decode and was dropped: {exc}", what="get",
                              hint="the operation can be retried; the value must be stored again") from exc
