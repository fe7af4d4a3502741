"""Reserve the memory of a file in /dev/shm before mapping it: every file the package sizes and maps goes through here.

Why: ``ftruncate`` alone makes a sparse file on tmpfs; its pages are allocated on first touch, and a full /dev/shm
then kills the toucher with SIGBUS instead of failing the call that made the file. ``posix_fallocate`` allocates
every page at once, so a tmpfs that cannot back the file fails here, with an ``OSError(ENOSPC)`` that says what was
asked, what is free and what to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

SHM_DIR = "/dev/shm"
_NO_ROOM = (errno.ENOSPC, errno.ENOMEM, errno.EFBIG)


def check(nbytes: int, what: str, smaller: str | None) -> None:
    """Raise ``OSError(ENOSPC)`` if /dev/shm has less than ``nbytes`` free (a quick refusal before anything is made;
    ``reserve`` is the check that counts)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return  # no /dev/shm to ask (not Linux): fallocate still refuses what cannot be backed
    free = st.f_bavail * st.f_frsize
    if nbytes > free:
        raise OSError(errno.ENOSPC, message(nbytes, free, what, smaller))


def check_whole(nbytes: int, what: str, smaller: str | None) -> None:
    """Raise ``OSError(ENOSPC)`` if /dev/shm is smaller than ``nbytes`` in all: a segment that could never be held
    whole, though it is backed only as it fills, is refused when it is made rather than when it fills."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return
    whole = st.f_blocks * st.f_frsize
    if nbytes > whole:
        raise OSError(errno.ENOSPC, (
            f"{what} may grow to {nbytes / 2**20:.1f} MiB of shared memory but {SHM_DIR} holds "
            f"{whole / 2**20:.1f} MiB in all; " + (f"{smaller}, " if smaller else "")
            + "or give the host or container more shared memory (e.g. docker run --shm-size=1g)"))


def reserve(fd: int, nbytes: int, what: str, smaller: str | None, backed: int | None = None) -> None:
    """Size the file open as ``fd`` to ``nbytes`` and allocate its first ``backed`` bytes now (all of it: None).
    The rest stays a hole that its user backs (``back``) before it writes there.

    :param what: what needs the memory, for the message (``"cache 'x'"``).
    :param smaller: how the caller can ask for less, for the message (``"pass a smaller capacity_bytes"``), or None.
    :raises OSError: ENOSPC (or ENOMEM, EFBIG) with a message saying what was asked, what is free and what to do.
    """
    backed = nbytes if backed is None else backed
    check(backed, what, smaller)
    try:
        os.ftruncate(fd, nbytes)
        if backed:
            os.posix_fallocate(fd, 0, backed)
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise OSError(exc.errno, message(backed, None, what, smaller)) from None
        raise


def back(fd: int, start: int, stop: int) -> str | None:
    """Allocate bytes ``[start, stop)`` of the file open as ``fd``; None, or the message of a full /dev/shm."""
    try:
        os.posix_fallocate(fd, start, stop - start)
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        try:
            st = os.statvfs(SHM_DIR)
            free = f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB are free"
        except OSError:
            free = "none could be had"
        more = stop - start
        more_text = f"{more / 2**20:.1f} MiB" if more >= 2**20 else f"{-(-more // 1024)} KiB"
        return f"{more_text} more shared memory were needed and {free} in {SHM_DIR}"
    return None


def first_hole(fd: int, start: int, stop: int) -> int:
    """The offset of the first hole of the file open as ``fd`` in ``[start, stop)``, or ``stop`` where there is none
    (``lseek(SEEK_HOLE)``; a system that cannot tell: ``stop``). On tmpfs a hole is a page never written: one
    allocated (``posix_fallocate``) but never written reads as a hole too."""
    if stop <= start:
        return stop
    try:
        return min(os.lseek(fd, start, os.SEEK_HOLE), stop)
    except (OSError, AttributeError):
        return stop


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_fallocate = getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    _fallocate.restype = ctypes.c_int


def release(fd: int, start: int, stop: int) -> bool:
    """Give back the memory of bytes ``[start, stop)`` of the file open as ``fd`` (``fallocate(PUNCH_HOLE)``: the
    file keeps its size, the range reads as zeros). False where the system cannot (the memory stays in use)."""
    if _fallocate is None or stop <= start:
        return False
    return _fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, start, stop - start) == 0


def map_message(nbytes: int, what: str, smaller: str | None) -> str:
    """The message of an ``OSError(ENOMEM)`` from mapping ``nbytes``: the process may map no more memory."""
    return (
        f"{what} needs {nbytes / 2**20:.1f} MiB of address space to map its segment, and this process may map no "
        "more (a memory limit: ulimit -v, RLIMIT_AS, or the container's); "
        + (f"{smaller}, " if smaller else "")
        + "or raise the limit"
    )


def message(nbytes: int, free: int | None, what: str, smaller: str | None) -> str:
    have = f"{free / 2**20:.1f} MiB are free" if free is not None else "it could not be reserved"
    return (
        f"{what} needs {nbytes / 2**20:.1f} MiB of shared memory but {have} in {SHM_DIR}; "
        + (f"{smaller}, " if smaller else "")
        + "remove unused caches (`shmcache ls`, `shmcache sweep`, `shmcache rm`), "
        "or give the host or container more shared memory (e.g. docker run --shm-size=1g)"
    )
