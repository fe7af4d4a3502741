"""The invalidation listener of a ``TieredCache`` namespace: one process per host subscribes to the namespace's
channel and applies every write's invalidation to the host's shared-memory cache.

Every process with a handle runs a daemon thread that tries, every ``ELECT_S``, to take an exclusive
open-file-description lock on the namespace's byte of the local segment (``tier.layout.LISTENER_BASE``); the one
that holds it listens. When the listener's process dies the kernel frees the lock and another process takes over
within ``ELECT_S``. Why one per host: each message costs a lock hold on the shared-memory cache, and N listeners per
host would do the same work N times.

Pub/sub delivers only to a live subscription: whatever was published while no one on the host was subscribed is
lost. So every (re)subscription -- the first, after a reconnect, after a takeover -- begins with a gap
(``TieredCache._on_gap``): the namespace's copies and fills in flight are dropped. A message that fails to apply is
a gap too. A connection that dies without a word is caught by a heartbeat: a PING when the channel has been quiet
for ``HEARTBEAT_S``, and a resubscription when nothing at all came back for ``SILENCE_S``.

Redis's own changes. The tier's writes publish their versioned messages, but another client's ``SET`` or ``DEL``, an
expiry or a ``maxmemory`` eviction publishes nothing. So a standalone Redis (6 or later, and Valkey) is also asked to
track the namespace: ``Subscription`` subscribes the same RESP2 connection to ``__redis__:invalidate`` too, and turns
``CLIENT TRACKING ON REDIRECT <that connection> BCAST PREFIX <the namespace's prefix>`` on, from a connection of its
own kept open beside it. Redis then sends the name of every key of the namespace that changes, whoever changed it
(a nil for a flush, which is a gap). Such a message has no version: the owner asks Redis for the key's
(``TieredCache._on_tracked``). Tracking lasts as long as both connections: their state (``CLIENT TRACKINGINFO``) is
checked every ``HEARTBEAT_S``, and a broken redirection is a gap, as a lost subscription is.

The thread holds its ``TieredCache`` by a weak reference, so a handle nobody closed can still be collected; the
thread then ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import ofd

log = logging.getLogger("shmcache.tiered")

ELECT_S = 0.1  # how often a process that does not listen checks whether it should
POLL_S = 0.1  # a listener waits this long for a message before checking whether it should stop
HEARTBEAT_S = 2.0  # a quiet subscription is PINGed this often
SILENCE_S = 3 * HEARTBEAT_S  # and given up when not even a PONG came back for this long
TRACKING_CHANNEL = b"__redis__:invalidate"  # where Redis sends a RESP2 redirection's invalidations
BACKOFF_S = (0.05, 2.0)  # pause after a failed subscription: first, and most, doubling between


class _Gone(Exception):
    """The TieredCache was collected."""


class Calls(NamedTuple):
    """What the listener calls on its owner (each takes the owner first): open a subscription (a redis-py PubSub, or
    a ``Subscription``, subscribed to the namespace's channel), apply a message, drop every copy after a gap in the
    stream, note that the host is listening again, and apply the keys of a tracking invalidation."""

    subscribe: Callable[[Any], Any]
    on_message: Callable[[Any, bytes], None]
    on_gap: Callable[[Any], None]
    on_listening: Callable[[Any], None]
    on_tracked: Callable[[Any, list], None]


class Subscription:
    """A listener's subscription that Redis's tracking feeds as well: ``pubsub`` (a RESP2 redis-py PubSub) subscribed
    to the namespace's channel and to ``TRACKING_CHANNEL``, and ``tracker``, a connection of its own on which
    broadcast tracking of the namespace's prefix redirects to the pubsub's connection; ``pool``, theirs alone. It
    answers the listener as a PubSub does, and raises ConnectionError once tracking is off or its redirection broken
    (checked every ``HEARTBEAT_S``): the listener then subscribes again, after a gap."""

    def __init__(self, pubsub, tracker, pool) -> None:
        self._pubsub, self._tracker, self._pool = pubsub, tracker, pool  # (pool: the two's own, disconnected at close)
        self._checked = time.monotonic()

    def get_message(self, timeout: float):
        if time.monotonic() - self._checked > HEARTBEAT_S:
            self.check()
        return self._pubsub.get_message(timeout=timeout)

    def ping(self) -> None:
        self._pubsub.ping()

    def check(self) -> None:
        """Raise ConnectionError unless broadcast tracking still redirects to this subscription."""
        self._checked = time.monotonic()
        info = self._tracker.execute_command("CLIENT", "TRACKINGINFO")
        if isinstance(info, list):  # (RESP2 answers a flat list of names and values)
            info = dict(zip(info[::2], info[1::2]))
        flags = {f.decode() if isinstance(f, bytes) else f for f in info.get(b"flags", info.get("flags", ()))}
        if "on" not in flags or "broken_redirect" in flags:
            raise ConnectionError(f"Redis's tracking of the namespace stopped (flags {sorted(flags)})")

    def close(self) -> None:
        """Close both connections (never back to a pool: a connection that tracks must not serve anything else)."""
        try:
            self._pubsub.close()
            self._tracker.close()
        finally:
            self._pool.disconnect()


class Listener:
    """The listening thread of one process; ``close()`` stops it and frees the listener role."""

    def __init__(self, segment_fd: int, byte: int, owner_ref, calls: Calls) -> None:
        self._byte = byte
        self._owner_ref = owner_ref  # weakref to the TieredCache, which ``calls`` are made on
        self._calls = calls
        # A description of our own: the lock is this description's, whatever else the process does with the fd.
        self._fd = os.open(f"/proc/self/fd/{segment_fd}", os.O_RDWR | os.O_CLOEXEC)
        self._stop = threading.Event()
        self.leading = False
        # Set once this process's listener has found its place: another process listens, or this one has made its
        # first subscription (and its gap), or failed to. A TieredCache waits for it before its first call, so that
        # a first subscription's gap never drops a copy its own first put stored (see TieredCache._listen).
        self.settled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shmcache-listener", daemon=True)
        self._thread.start()

    def _owner(self):
        owner = self._owner_ref()
        if owner is None:
            raise _Gone()
        return owner

    def _run(self) -> None:
        pause = BACKOFF_S[0]
        try:
            while not self._stop.is_set():
                if not self.leading:
                    if not ofd.lock(self._fd, self._byte, ofd.WRITE, wait=False):
                        self.settled.set()  # another process listens for the host
                        self._owner()  # ends the thread once the handle is gone
                        self._stop.wait(ELECT_S)
                        continue
                    self.leading = True
                try:
                    self._listen()
                    pause = BACKOFF_S[0]
                except _Gone:
                    raise
                except Exception as exc:  # the connection failed: the next subscription starts with a gap
                    self.settled.set()
                    if self._stop.is_set():
                        break
                    log.info("shmcache: invalidation listener lost Redis (%r); resubscribing", exc)
                    self._stop.wait(pause)
                    pause = min(pause * 2, BACKOFF_S[1])
        except _Gone:
            pass
        finally:
            self.settled.set()  # a thread that ends has settled too: nobody waits on it
            if self._stop.is_set() or self._owner_ref() is None:
                self._close_fd()

    def _listen(self) -> None:
        pubsub = self._calls.subscribe(self._owner())
        try:
            # Invariant: nothing is dropped before the subscription is confirmed, so whatever is written after
            # this gap is either dropped here or arrives as a message.
            deadline = time.monotonic() + SILENCE_S
            while not self._stop.is_set():
                msg = pubsub.get_message(timeout=POLL_S)
                if msg is not None and msg["type"] == "subscribe":
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("no subscription confirmed")
            owner = self._owner()
            self._calls.on_gap(owner)
            self._calls.on_listening(owner)
            del owner
            self.settled.set()
            heard = pinged = time.monotonic()
            while not self._stop.is_set():
                msg = pubsub.get_message(timeout=POLL_S)
                now = time.monotonic()
                if msg is None:
                    if self._owner_ref() is None:
                        raise _Gone()
                    if now - heard > SILENCE_S:
                        raise TimeoutError(f"nothing from Redis for {SILENCE_S:g} s")
                    if now - heard > HEARTBEAT_S and now - pinged > HEARTBEAT_S:
                        pubsub.ping()
                        pinged = now
                    continue
                heard = now
                if msg["type"] == "message":
                    if msg["channel"] == TRACKING_CHANNEL:
                        self._tracked(msg["data"])
                    else:
                        self._apply(msg["data"])
        finally:
            try:
                pubsub.close()
            except Exception:
                pass

    def _apply(self, data: bytes) -> None:
        owner = self._owner()
        try:
            self._calls.on_message(owner, data)
        except Exception:
            # An invalidation not applied is a lost one: drop everything instead (and if that fails too, the
            # subscription starts over, with a gap).
            log.exception("shmcache: an invalidation failed to apply; dropping the namespace's copies")
            self._calls.on_gap(owner)

    def _tracked(self, keys) -> None:
        """A tracking invalidation: the Redis names of the keys that changed, or None (a flush: every key)."""
        owner = self._owner()
        try:
            if keys is None:
                self._calls.on_gap(owner)
            else:
                self._calls.on_tracked(owner, keys)
        except Exception:
            log.exception("shmcache: a tracking invalidation failed to apply; dropping the namespace's copies")
            self._calls.on_gap(owner)

    def _close_fd(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # frees the listener role

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_fd()  # else the thread closes it as it ends: never under a thread still using it

    def after_fork_in_child(self) -> None:
        """The thread did not survive the fork; the parent still owns the description's lock, so the child only
        lets go of its copy of the descriptor (which does not release it)."""
        self._stop.set()
        self._close_fd()
