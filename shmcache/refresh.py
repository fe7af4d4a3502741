"""Stale-while-revalidate for ``get_or_compute(..., stale_ttl=...)``: the refreshes a handle runs in the background.

A value stored with a ``stale_ttl`` lives ``ttl + stale_ttl``; once less than ``stale_ttl`` of that is left, it is
stale: every caller is answered with it at once, and one caller on the host computes the next value in the
background of its own call. Two things keep the refreshes to one per key:

- In this process, ``Refreshes`` starts at most one background job per key at a time (a record of the fingerprints
  queued or under way, since the handle's threads may all meet the stale value at once).
- On the host, the job first claims the key as a computation does (``flight.Claim.try_take``, without waiting): a
  process that does not get the claim leaves the refresh to the one that has it. A claim dies with its process, so a
  refresher SIGKILLed mid-computation hands the refresh to the next caller that finds the value stale.

The job of a synchronous call is queued for the process's refresh threads (``Workers``: up to WORKERS_MAX daemon
threads fed by one ``queue.SimpleQueue``, each ending after IDLE_S without work); that of an ``aget_or_compute`` is a
task on the caller's loop, so that a coroutine function is awaited where it was written to run. A job belongs to
the queue, not to a thread: an exception from a signal handler that cuts a thread's start short in the main thread
(the new thread may then never run) leaves the job for the next thread, which the next call starts, and threads
that a worker starts (where no signal handler runs) are never cut short. Fork: the child has none of the parent's
threads, so it forgets the refreshes under way and the jobs queued (a fork hook), and its copies of their claims
are closed by flight.py's; its own calls then refresh as any process's do. ``cache.py`` holds what the job does
(the claim, the second look, the computation, the store); this module only schedules it.
"""

from __future__ import annotations

import _thread
import asyncio
import functools
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any


class Refreshes:
    """The background refreshes of one handle: ``start`` (a thread) and ``start_task`` (a task of the running loop)
    run ``job`` unless one is already queued or under way for the same fingerprint in this process.

    What is under way is a dict of fingerprint to the monotonic time its job was queued, written by the caller with
    one store and cleared by the job as it ends. Why not a set under a lock, added to and then undone on failure: a
    signal handler's exception (KeyboardInterrupt) can land between the record and the ``try`` that would undo it,
    and the key would then stay recorded, with no job, for the life of the process: never refreshed here again.
    Here such a record (an exception between the store and the queueing) only holds back this process's refreshes
    of the key for PENDING_S, after which a record is taken for lost; a job that outlives it may meet a second one,
    which finds the key's claim taken and does nothing."""

    __slots__ = ("_pending", "_tasks", "__weakref__")

    def __init__(self) -> None:
        self._forget()
        _ALL.add(self)

    def _forget(self) -> None:
        """Nothing under way: at creation, and in a forked child (which has none of the parent's threads)."""
        self._pending: dict[int, float] = {}  # fingerprint -> when its job was queued (monotonic s)
        self._tasks: set[asyncio.Task[None]] = set()  # (a strong reference: the loop keeps only a weak one)

    def _queued(self, fp: int) -> float | None:
        """The time a job of ``fp`` is recorded at now, or None if one is queued or under way here already (and not
        taken for lost: a record older than PENDING_S). One dict store: the record is whole or absent, whatever
        exception lands around it."""
        now = time.monotonic()
        since = self._pending.get(fp)
        if since is not None and now - since < PENDING_S:
            return None
        self._pending[fp] = now
        return now

    def _ended(self, fp: int, since: float) -> None:
        """The job of ``fp`` queued at ``since`` ended: its record goes, unless a later one replaced it."""
        if self._pending.get(fp) == since:
            self._pending.pop(fp, None)

    def start(self, fp: int, job: Callable[[], None]) -> bool:
        """Queue ``job()`` for the process's refresh threads, unless a refresh of ``fp`` is queued or under way here;
        whether it was queued."""
        since = self._queued(fp)
        if since is None:
            _workers.ensure()  # (a start cut short may have left a job waiting for a thread)
            return False
        _workers.put(functools.partial(_run, self, fp, since, job))
        _workers.ensure()  # (cut short in there, the job stays queued, and the key recorded, until a thread runs it)
        return True

    def start_task(self, fp: int, job: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Run ``await job()`` as a task of the running loop, unless a refresh of ``fp`` is queued or under way here;
        whether it was started."""
        since = self._queued(fp)
        if since is None:
            return False
        coro = _arun(self, fp, since, job)
        try:
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        except BaseException:  # (no running loop: nothing started, and the key is free again)
            coro.close()
            self._ended(fp, since)
            raise
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, fp, since))
        return True

    def _task_done(self, fp: int, since: float, task: asyncio.Task[None]) -> None:
        """A refresh task ended, whether its job ran or not: a task cancelled before its first step (an ``aclose()``
        right after the call that started it) never runs the ``finally`` of ``_arun``, and its record must go too.
        (Both end it, and the second finds it gone: ``_arun``'s ``finally`` covers the task an interrupt left
        without this callback, landing between ``create_task`` and ``add_done_callback``.)"""
        self._tasks.discard(task)
        self._ended(fp, since)

    async def acancel(self) -> None:
        """Cancel this handle's refreshes that run as tasks of the running loop and wait for them to end (each
        releases its claim as it ends); those of other loops are left to theirs. For an ``aclose()``: nothing of the
        handle runs on the loop after it."""
        loop = asyncio.get_running_loop()
        mine = [t for t in list(self._tasks) if t.get_loop() is loop and not t.done()]
        for task in mine:
            task.cancel()
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)

    @property
    def running(self) -> int:
        """How many refreshes this handle has queued or under way now (records taken for lost aside)."""
        now = time.monotonic()
        return sum(now - since < PENDING_S for since in list(self._pending.values()))


PENDING_S = 10.0  # a refresh recorded this long ago with no end is taken for lost (see Refreshes)
_start_thread = _thread.start_new_thread  # (a name of this module's: tests interrupt a start here)


def _run(refreshes: Refreshes, fp: int, since: float, job: Callable[[], None]) -> None:
    """A queued refresh, as a refresh thread runs it (no signal handler runs there)."""
    try:
        job()
    finally:
        refreshes._ended(fp, since)


async def _arun(refreshes: Refreshes, fp: int, since: float, job: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        await job()
    finally:
        refreshes._ended(fp, since)


WORKERS_MAX = 4  # refresh threads a process runs at once at most
IDLE_S = 1.0  # a refresh thread with no job for this long ends
START_S = 1.0  # a thread started this long ago that has not begun its loop is taken for lost (its start cut short)


class Workers:
    """The process's refresh threads: jobs through one queue, run by up to WORKERS_MAX daemon threads. ``put``
    queues a job; ``ensure`` starts a thread where the queued jobs outnumber the idle threads (one start at a time;
    a start whose thread has not begun within START_S is taken for lost, cut short by a signal); a thread that
    takes a job starts another on the same terms, so that jobs queued meanwhile run side by side; a thread with no
    job for IDLE_S ends, unless a job came in the meantime (decided under the threads' lock after it stopped
    counting as idle, so that no job queued before an ``ensure`` is ever left without a thread that will take it,
    but one whose start was cut short: ``ensure``).

    Why the caller's thread takes no blocking lock here: it is the one signal handlers run in, and an exception
    raised by one may land between a lock's acquisition and the ``try`` that would release it (CPython 3.14 delivers
    one right after ``with``'s ``__enter__`` returns); a lock left held so would stop every refresh of the process
    for good. ``_lock`` is taken by the refresh threads alone (no handler runs there), and the one start at a time
    is a lock the caller only tries, whose hold a lost start leaves is taken over once it is START_S old."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the refresh threads' counts: taken in refresh threads only
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0  # threads waiting for a job
        self._running = 0  # threads that began their loop and have not ended it
        self._start = threading.Lock()  # held from a start's decision until its thread begins (or the start fails)
        self._starting = 0.0  # monotonic time of the start that holds _start; 0.0: none recorded

    def put(self, job: Callable[[], None]) -> None:
        """Queue ``job`` (it reports its own failures); ``ensure`` then sees that a thread will run it. (No lock: a
        thread that ends stops counting as idle before it looks at the queue, so ``ensure`` after this either sees
        it idle and it then finds the job, or sees it gone and starts another.)"""
        self._jobs.put(job)

    def ensure(self) -> None:
        """Start a thread if the queued jobs outnumber the idle threads, fewer than WORKERS_MAX run, and no start is
        under way (or the one under way is lost). Reads the counts without a lock (each a single word, and a
        count read a moment late only starts a thread the next call would have); most calls find nothing to do."""
        if self._jobs.qsize() <= self._idle or self._running >= WORKERS_MAX:
            return
        now = time.monotonic()
        if not self._start.acquire(blocking=False):
            # A start under way, or one cut short (between the acquire and the record, or before its thread began)
            # that left the lock held: taken over once its record is START_S old. Two callers that take it over at
            # once start a thread each: one more than needed, which ends idle.
            if now - self._starting < START_S:
                return
        self._starting = now
        try:
            # Why a thread of _thread's that starts the refresh thread, rather than Thread.start here: this is the
            # thread signal handlers run in, and an exception of one landing inside threading's start can leave
            # threading's own registry lock held by this thread (CPython 3.14: after a ``with``'s __enter__), so
            # that every thread started after it blocks in its bootstrap for good, ours and the application's.
            # start_new_thread is one call into C: cut short before it, nothing started (the start is taken over
            # once START_S old); after it, the thread runs whatever the caller does.
            _start_thread(self._spawn, ())
        except RuntimeError:  # no thread to be had now ("can't start new thread"): the next call tries again
            self._started()

    def _spawn(self) -> None:
        """Start a refresh thread, from a thread of its own where no signal handler runs (``ensure``)."""
        try:
            threading.Thread(target=self._work, name="shmcache-refresh", daemon=True).start()
        except BaseException:  # (no thread to be had: the next ``ensure`` tries again)
            self._started()

    def _started(self) -> None:
        """The start under way is over: its record cleared and its lock released (already released where a start
        taken over and the one that took it over both began)."""
        self._starting = 0.0
        try:
            self._start.release()
        except RuntimeError:
            pass

    def _work(self) -> None:
        with self._lock:
            self._running += 1
        self._started()
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._jobs.empty():
                        self._running -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
            self.ensure()  # (more jobs than idle threads: another thread, started here, where no signal lands)
            try:
                job()
            except BaseException:  # (a job reports its own failures: this is one it let through; the thread ends)
                with self._lock:
                    self._running -= 1
                raise
            # Why: a job holds its handle (a bound method in its closure); kept through the wait for the next one,
            # it would keep a handle its owner dropped alive, its descriptors open, for up to IDLE_S more.
            del job

    @property
    def busy(self) -> int:
        """Threads running a job now (read without a lock: a moment's figure)."""
        return self._running - self._idle

    @property
    def queued(self) -> int:
        """Jobs waiting for a thread now (a moment's figure, as ``busy``)."""
        return self._jobs.qsize()


_workers = Workers()
_ALL: weakref.WeakSet[Refreshes] = weakref.WeakSet()  # every handle's, for the fork hook


def workers() -> Workers:
    """This process's refresh threads (a forked child has its own)."""
    return _workers


def _after_fork_in_child() -> None:
    global _workers
    _workers = Workers()  # (the parent's threads are not here; its queued jobs are the parent's)
    for refreshes in list(_ALL):
        refreshes._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
