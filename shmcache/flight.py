"""Single-flight for ``get_or_compute``: at most one caller on the host computes a given key at a time.

The claim on a key is a Linux open-file-description lock (``F_OFD_SETLK``) on one byte of the segment's own file, at
an offset taken from the key's fingerprint. Why that mechanism:

- The kernel drops the lock when the claiming process dies (SIGKILL, OOM...), so a waiter takes over at once, with
  no lease to expire and no PID to check.
- The lock is held by an open file description, not by a process, so each claim opens its own: threads of one
  process exclude each other like processes do, and closing another descriptor of the file cannot drop it (the
  trap of classic POSIX record locks).
- One byte per key: claims on different keys never wait for each other (two keys share a byte only if their 62-bit
  fingerprint prefixes collide, which merely serialises them). Nothing is created on disk, so nothing is left
  behind, and the claim is never the cache lock, which stays free for every other call while a function runs.

A claim is released by closing its descriptor. A process that forks while it holds a claim passes the descriptor
to the child, and the claim lasts until both have closed it or exited.
"""

from __future__ import annotations

import os
import threading
import time

from . import ofd
from .errors import ComputeTimeout

_POLL_FIRST_S = 0.0005  # a waiter polls its claim, doubling the pause up to _POLL_MAX_S
_POLL_MAX_S = 0.005


class _Claims(threading.local):
    def __init__(self) -> None:
        self.keys: set[tuple[int, int]] = set()  # (segment inode, byte) this thread has claimed


_claims = _Claims()


class Claim:
    """A claim on one key's byte; ``release()`` (or the end of a ``with`` block) gives it up."""

    def __init__(self, fd: int, tag: tuple[int, int]) -> None:
        self._fd = fd
        self._tag = tag

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            _claims.keys.discard(self._tag)
            os.close(fd)  # closing the description releases its lock

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim(segment_fd: int, fp: int, timeout: float | None) -> tuple[Claim, bool]:
    """Claim the key of fingerprint ``fp`` on the segment open as ``segment_fd``; returns the claim and whether
    another caller held it first (so this one waited). Waits without limit when ``timeout`` is None.

    :raises ComputeTimeout: if the key stays claimed for ``timeout`` seconds.
    :raises RuntimeError: if this thread already holds the claim (``fn`` called ``get_or_compute`` on its own key).
    """
    byte = fp >> 1  # below ofd.LIVE_BYTE (2**62), which marks open handles
    tag = (os.fstat(segment_fd).st_ino, byte)
    if tag in _claims.keys:
        raise RuntimeError("get_or_compute was called for a key inside the computation of that same key")
    # A description of our own for this claim (the segment's descriptor is shared with whatever else this
    # process does with it, and is inherited by forked children).
    fd = os.open(f"/proc/self/fd/{segment_fd}", os.O_RDWR | os.O_CLOEXEC)
    try:
        waited = False
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _POLL_FIRST_S
        while not ofd.lock(fd, byte, ofd.WRITE, wait=False):
            waited = True
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ComputeTimeout(
                        f"another caller has been computing this key for over {timeout:g} s", what="get_or_compute",
                        hint="raise timeout=, or look at the process computing it (it is alive: a dead one frees "
                             "the key at once)")
                pause = min(pause, left)
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)
    except BaseException:
        os.close(fd)
        raise
    _claims.keys.add(tag)
    return Claim(fd, tag), waited
