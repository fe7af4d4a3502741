"""Stale-while-revalidate for ``get_or_compute(..., stale_ttl=...)``: the refreshes a handle runs in the background.

A value stored with a ``stale_ttl`` lives ``ttl + stale_ttl``; once less than ``stale_ttl`` of that is left, it is
stale: every caller is answered with it at once, and one caller on the host computes the next value in the
background of its own call. Two things keep the refreshes to one per key:

- In this process, ``Refreshes`` starts at most one background job per key at a time (a set of the fingerprints
  under way, under a lock, since the handle's threads may all meet the stale value at once).
- On the host, the job first claims the key as a computation does (``flight.Claim.try_take``, without waiting): a
  process that does not get the claim leaves the refresh to the one that has it. A claim dies with its process, so a
  refresher SIGKILLed mid-computation hands the refresh to the next caller that finds the value stale.

The job of a synchronous call runs in a daemon thread; that of an ``aget_or_compute`` is a task on the caller's
loop, so that a coroutine function is awaited where it was written to run. Fork: the child has none of the
parent's threads, so it forgets the refreshes under way (a fork hook), and its copies of their claims are closed
by flight.py's; its own calls then refresh as any process's do. ``cache.py`` holds what the job does (the
claim, the second look, the computation, the store); this module only schedules it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any


class Refreshes:
    """The background refreshes of one handle: ``start`` (a thread) and ``start_task`` (a task of the running loop)
    run ``job`` unless one is already under way for the same fingerprint in this process."""

    __slots__ = ("_lock", "_running", "_tasks", "__weakref__")

    def __init__(self) -> None:
        self._forget()
        _ALL.add(self)

    def _forget(self) -> None:
        """Nothing under way: at creation, and in a forked child (whose lock another thread may have held)."""
        self._lock = threading.Lock()
        self._running: set[int] = set()  # fingerprints whose refresh this process runs now
        self._tasks: set[asyncio.Task[None]] = set()  # (a strong reference: the loop keeps only a weak one)

    def _claim(self, fp: int) -> bool:
        with self._lock:
            if fp in self._running:
                return False
            self._running.add(fp)
            return True

    def _done(self, fp: int) -> None:
        with self._lock:
            self._running.discard(fp)

    def start(self, fp: int, job: Callable[[], None]) -> bool:
        """Run ``job()`` in a daemon thread, unless a refresh of ``fp`` is under way here; whether it was started."""
        if not self._claim(fp):
            return False

        def run() -> None:
            try:
                job()
            finally:
                self._done(fp)

        try:
            threading.Thread(target=run, name="shmcache-refresh", daemon=True).start()
        except BaseException:  # (no thread to run it: the key is free for the next caller)
            self._done(fp)
            raise
        return True

    def start_task(self, fp: int, job: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Run ``await job()`` as a task of the running loop, unless a refresh of ``fp`` is under way here; whether
        it was started."""
        if not self._claim(fp):
            return False
        try:
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(job())
        except BaseException:
            self._done(fp)
            raise
        self._tasks.add(task)

        def finished(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            self._done(fp)

        task.add_done_callback(finished)
        return True

    @property
    def running(self) -> int:
        """How many refreshes this handle runs now."""
        with self._lock:
            return len(self._running)


_ALL: weakref.WeakSet[Refreshes] = weakref.WeakSet()  # every handle's, for the fork hook


def _after_fork_in_child() -> None:
    for refreshes in list(_ALL):
        refreshes._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
