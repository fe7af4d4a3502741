"""The invalidation listener of a ``TieredCache`` namespace: one process per host subscribes to the namespace's
channel and applies the other hosts' invalidations to the host's shared-memory cache.

Every process with a handle runs a daemon thread that tries, every ``ELECT_S``, to take an exclusive
open-file-description lock on the namespace's byte of the local segment (``layout.tier.LISTENER_BASE``); the one
that holds it listens. When the listener's process dies the kernel frees the lock and another process takes over
within ``ELECT_S``. Why one per host: each message costs a few lock operations on the shared-memory cache, and N
listeners per host would do the same work N times.

Pub/sub delivers only to a live subscription: whatever was published while no one on the host was subscribed is
lost. So every (re)subscription -- the first, after a reconnect, after a takeover -- begins with ``on_gap``, which
drops the namespace's local copies; messages cannot be missed unnoticed, only gaps, and gaps empty the near cache.
"""

from __future__ import annotations

import logging
import os
import threading

from . import ofd

log = logging.getLogger("shmcache.tiered")

ELECT_S = 0.1  # how often a process that does not listen checks whether it should
POLL_S = 0.1  # a listener waits this long for a message before checking whether it is closed
BACKOFF_S = (0.05, 2.0)  # pause after a failed subscription: first, and most, doubling between


class Listener:
    """The listening thread of one process; ``close()`` stops it and frees the listener role."""

    def __init__(self, segment_fd: int, byte: int, subscribe, on_message, on_gap, on_start) -> None:
        self._byte = byte
        self._subscribe = subscribe  # () -> a redis-py PubSub already subscribed to the channel
        self._on_message = on_message
        self._on_gap = on_gap
        self._on_start = on_start
        # A description of our own: the lock is this description's, whatever else the process does with the fd.
        self._fd = os.open(f"/proc/self/fd/{segment_fd}", os.O_RDWR | os.O_CLOEXEC)
        self._stop = threading.Event()
        self.leading = False
        self._thread = threading.Thread(target=self._run, name="shmcache-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pause = BACKOFF_S[0]
        while not self._stop.is_set():
            if not self.leading:
                if not ofd.lock(self._fd, self._byte, ofd.WRITE, wait=False):
                    self._stop.wait(ELECT_S)
                    continue
                self.leading = True
            try:
                self._listen()
                pause = BACKOFF_S[0]
            except Exception as exc:  # the connection failed: the next subscription starts with a gap
                if self._stop.is_set():
                    break
                log.info("shmcache: invalidation listener lost Redis (%r); resubscribing", exc)
                self._stop.wait(pause)
                pause = min(pause * 2, BACKOFF_S[1])

    def _listen(self) -> None:
        pubsub = self._subscribe()
        try:
            # Invariant: nothing is dropped before the subscription is confirmed, so whatever is written after
            # this gap is either cleared here or arrives as a message.
            while not self._stop.is_set():
                msg = pubsub.get_message(timeout=POLL_S)
                if msg is not None and msg["type"] == "subscribe":
                    break
            self._on_gap()
            self._on_start()
            while not self._stop.is_set():
                msg = pubsub.get_message(timeout=POLL_S)
                if msg is not None and msg["type"] == "message":
                    try:
                        self._on_message(msg["data"])
                    except Exception:  # a bad message or a local failure must not stop the listening
                        log.exception("shmcache: invalidation failed to apply")
        finally:
            try:
                pubsub.close()
            except Exception:
                pass

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._fd >= 0:
            os.close(self._fd)  # frees the listener role
            self._fd = -1

    def after_fork_in_child(self) -> None:
        """The thread did not survive the fork; the parent still owns the description's lock, so the child only
        lets go of its copy of the descriptor (which does not release it)."""
        self._stop.set()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
