"""The lock protocol of one attached cache: take the lock, admit the call, wait, repair, fault. Written once, here.

Every operation of the Python path runs the same protocol (``Guard.run``; the compiled section runs its own, in C):
take the lock inside ``try`` (so that an exception raised at any bytecode still reaches ``finally``), check the
closed flag and the ``dirty`` word under the lock, and unlock in ``finally`` -- an unlock by a thread that does not
hold the lock is refused by the error-checking mutex (EPERM) and changes nothing. An operation that writes the
structures raises ``dirty`` before its first write and lowers it after its last (``updating``).

Crash window: a process can die, or an exception (Ctrl-C) can cut an update short, between any two writes. A dead
holder is reported to the next locker by the robust mutex, which marks it consistent at once; ``dirty`` then says
whether the dead holder left an update half-done. Whoever locks and finds ``dirty`` set verifies and repairs the
segment before reading it (``Guard.repair``), so no half-made update is ever seen.
"""

from __future__ import annotations

import errno
import functools
import os
from typing import NoReturn

from .codec import MALFORMED
from .errors import ClosedError, CorruptionError, PinnedError, ShmCacheError, TooLargeError
from .layout.dtypes import H_DIRTY, H_HITS, H_LOCK_OFF, H_MISSES, H_PROGRESS, H_RECOVERIES, POLICY_LRU
from .lock import KIND_OFF, MUTEX_KIND_WORD, Damaged, Reentered, SegmentLock, Unrecoverable, signals_deferred
from .lock import ENTRY_MASK, FUTEX_TID_MASK, FUTEX_WAITERS, hot_trylock, hot_unlock, robust
from .core import last_wait
from .seqlock import close_seq, open_seq
from .verify import check, repair

# The header word holding the mutex's kind (and its never-changing spin and elision counts): compared before every
# trylock, because glibc asserts, and aborts the process, inside trylock on some damaged kinds. A damaged word is
# answered as a busy lock (EBUSY), and the waiting path (lock.py) judges and repairs it. Read through the lock page's
# own words (``Segment.lock_words``), which a concurrent close() never releases. Before every unlock too: a word
# damaged while this thread held the lock is put back (glibc's unlock of some kinds asserts as well), and the dirty
# word (also on that page) has the next holder repair the segment. Written inline, without a call: a call is a point
# where an interrupt can be raised, and nothing may come between the finally and the unlock.
H_MUTEX_KIND = (H_LOCK_OFF + KIND_OFF) // 8
FUTEX_WORD = H_LOCK_OFF // 8  # the lock page's word holding the mutex's futex word (low 32 bits: the holder's tid)
EBUSY = errno.EBUSY
# What damaged shared data makes a locked section raise; anything else (Ctrl-C, an exception from a signal handler)
# is an interruption, which needs a repair only if it cut an update short (the dirty word says).
_DAMAGE = (CorruptionError, ValueError) + MALFORMED
_REPAIRING = 2  # the dirty word's value while a repair runs (1: an ordinary update is under way)
# Refusals: raised by an update before its first write, or once every structure is consistent again.
REFUSALS = (PinnedError, TooLargeError)


def closed_error() -> ClosedError:
    return ClosedError("operation on a closed cache", what="use", hint="open a new SharedCache(name) to use it again")


def updating(fn):
    """Decorator for a method of an object with header words ``h`` that writes the cache's structures: ``dirty`` is
    raised before its first write and put back after its last; a refusal (PinnedError, TooLargeError, raised with
    every structure consistent) puts it back too; any other exception leaves it raised, for the repair. Put back,
    not cleared: an update made inside another's bracket leaves the outer bracket raised."""

    @functools.wraps(fn)
    def bracketed(self, *args):
        h = self.h
        if self.seqlocked:
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


class Guard:
    """The lock of one mapped segment, and what a call does around it. ``closed`` is this handle's flag, read
    under the lock by every call."""

    def __init__(self, seg, table, lock_timeout: float) -> None:
        self.seg = seg
        self.table = table  # the repair's last resort empties it
        self.h = seg.header_words
        self.lockw = seg.lock_words
        self.lock = SegmentLock(seg.lock_address, lock_timeout, os.fstat(seg.fd))
        self.addr = self.lock.handle
        self.entry = self.lock.entry
        self.futex = self.lock.futex
        self.robust_prev = 0  # the holder's robust-list head before it took the lock (lock.py settle_release)
        self.closed = False
        self.seqlocked = table.policy != POLICY_LRU  # readers without the lock validate against ``seq``
        # Why here: a mutex of a damaged kind that nobody holds may still let the fast path's trylock through (a
        # waiter would find the damage, a lone caller never), so each attacher looks once.
        if self.lock.kind_damaged() and not self.lock.word():
            self.lock.reinit_damaged(seg.fd, self.mark_dirty)

    # The pattern of every call, written once in ``run`` (``close`` too, marking the handle closed even when the lock
    # cannot be had):
    #     addr = guard.addr
    #     try:
    #         addr = guard.enter()
    #         guard.admit(addr)
    #         ...
    #     except BaseException as exc:
    #         guard.fault(exc, addr)
    #         raise
    #     finally:
    #         (put back a damaged kind word, see H_MUTEX_KIND; and the holder's id into the futex word, see
    #         lock.py "Holds taken through a foreign kind's path")
    #         unlock(addr)
    #         (and settle an unlock that left the mutex listed)
    # ``addr`` is the handle to release: the real lock, or a private mutex when this thread re-entered the cache and
    # must leave the lock to the call that holds it.

    def enter(self, waited: bool = False, me=None):
        """Take the lock (``me``: the calling thread's ``robust.me``, looked up when not given); returns the handle
        the caller releases (see ``wait``). Follow with ``admit``."""
        first = (robust.me if me is None else me).first
        prev = 0 if first is None else first[0]
        rc = hot_trylock(self.addr) if self.lockw[H_MUTEX_KIND] == MUTEX_KIND_WORD else EBUSY
        if not rc and first is not None and first[0] & ENTRY_MASK != self.entry:  # lock.py SegmentLock.checked
            rc = self.lock.give_back_foreign()
        addr = self.wait(rc, waited) if rc else self.addr
        if addr is self.addr:
            self.robust_prev = prev  # written by the holder alone
        return addr

    def run(self, fn, *args, waited: bool = False):
        """``fn(*args)`` run under the lock, with the protocol above: every operation of the Python path goes
        through here (``fn`` is a Store method, or a function of entries.py, kinds.py or tier/copies.py).
        ``waited``: as for ``wait``."""
        me = robust.me  # one thread-local lookup for the lock and the unlock
        addr = self.addr
        try:
            addr = self.enter(waited, me)
            self.admit(addr)
            result = fn(*args)
            close_seq(self.h)
            return result
        except BaseException as exc:
            self.fault(exc, addr)
            raise
        finally:
            # Written inline, without a call before the unlock (see H_MUTEX_KIND).
            listed, first = False, None
            if addr is self.addr:
                if self.lockw[H_MUTEX_KIND] != MUTEX_KIND_WORD:  # see H_MUTEX_KIND
                    self.lockw[H_MUTEX_KIND] = MUTEX_KIND_WORD
                    self.lockw[H_DIRTY] = 1
                first = me.first
                listed = first is not None and first[0] & ENTRY_MASK == self.entry
                if listed and self.lockw[FUTEX_WORD] & FUTEX_TID_MASK != me.tid:  # a waiter wrote 2 over it
                    self.futex.value = me.tid | FUTEX_WAITERS
            hot_unlock(addr)
            if listed and first is not None and first[0] & ENTRY_MASK == self.entry:
                self.lock.settle_release(self.robust_prev)

    def admit(self, addr) -> None:
        """After the lock is taken: refuse a re-entered call or a closed handle, repair what an update left half-done.
        The hot paths call it only when one of the three applies."""
        if addr is not self.addr:
            raise Reentered()
        if self.closed:
            raise closed_error()
        if self.h[H_DIRTY]:
            self.repair()

    def wait(self, rc: int, waited: bool = False):
        """The lock was busy, or its holder died: wait for it (bounded by lock_timeout). Returns the lock's handle;
        when this thread already holds the lock, the private mutex's handle instead, and the caller raises
        Reentered. ``waited``: the compiled section timed out waiting for this call (``timed_out``), so the
        timeout is not waited a second time."""
        prior = (last_wait() or (self.lock.timeout, 0, 0)) if waited else (0.0, 0, 0)
        for _ in range(3):
            try:
                if self.lock.acquire_slow(rc, self.progress, *prior):
                    # The holder died. Consistent at once: what it left half-done is flagged by the dirty word.
                    self.lock.mark_consistent()
                return self.addr
            except Reentered:
                return self.lock.private_handle
            except (Unrecoverable, Damaged) as exc:
                prior = (0.0, 0, 0)  # a re-initialised lock is waited for afresh
                if self.closed:
                    raise closed_error() from None
                if isinstance(exc, Unrecoverable):
                    self.lock.reinit_unrecoverable(self.seg.fd)
                elif not self.lock.reinit_damaged(self.seg.fd, self.mark_dirty) and exc.fallback is not None \
                        and self.lock.word() == exc.word:  # not repaired by another process meanwhile either
                    raise exc.fallback from None
                rc = self.lock.try_checked()
                if rc == 0:
                    return self.addr
        raise CorruptionError("the cache lock stays unrecoverable or damaged", what="lock",
                              hint="remove the cache with `shmcache rm NAME` and recreate it")

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
            h[H_DIRTY] = _REPAIRING  # Crash window: dying in here leaves the repair to the next locker.
            try:
                if not check(self.seg, deep=deep).ok:
                    repair(self.seg)
                    h[H_RECOVERIES] += 1
            except Exception:  # repair itself failed on garbage: start over with an empty cache
                self.table.reset()
                h[H_RECOVERIES] += 1
            h[H_DIRTY] = 0

    def progress(self) -> int | None:
        """The header's progress word, which a holder on a long walk moves (read without the lock: one word, for
        patience only); None once closed."""
        try:
            return None if self.closed else self.h[H_PROGRESS]
        except ValueError:  # closed meanwhile by another thread
            return None

    def fault(self, exc: BaseException, addr) -> None:
        """A call raised. If it holds the lock, put the segment right before ``finally`` releases it."""
        if addr is not self.addr:
            return  # this thread re-entered: the lock belongs to the call it interrupted
        if not self.lock.listed():
            if self.lock.foreign_hold():  # interrupted between the lock call and its check (enter)
                self.lock.give_back_foreign()
            return  # raised before the lock was taken (timeout, bad handle...): nothing was touched
        self.lock.mark_consistent()  # in case it was taken from a dead holder; refused (EINVAL) otherwise
        if self.closed:
            return
        damage = isinstance(exc, _DAMAGE) and (isinstance(exc, CorruptionError) or not isinstance(exc, ShmCacheError))
        if damage or self.h[H_DIRTY]:
            self.repair(deep=damage)
        close_seq(self.h)
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
        return True

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
