"""Linux open-file-description byte locks (``F_OFD_SETLK``), on the segment's own file.

Unlike classic POSIX record locks they belong to an open file description, not to a process: threads exclude each
other through separate descriptions, closing another descriptor of the file drops nothing, and the kernel releases
them when the last descriptor of the description closes -- at the latest when its processes die. The segment uses
disjoint byte ranges (see ``shmcache/layout/__init__.py``): one byte per key below ``LIVE_BYTE`` for
``get_or_compute``'s claims (``flight.py``); ``LIVE_BYTE`` itself, read-locked by every open handle, so that
``sweep`` can tell a segment nobody has open; one byte per entry slot above it, read-locked by the views that
pin the entry (``view.py``); the tier's listener bytes (``tier.layout.LISTENER_BASE``); and one byte per PID
namespace, read-locked by every open handle from that namespace (``NS_BASE``), so that the lock can tell whether
a holder's thread id may belong to a namespace it cannot see (``lock.py``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

# struct flock on Linux (x86_64, aarch64): short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid.
_FLOCK = struct.Struct("hhxxxxqqi4x")
READ, WRITE = fcntl.F_RDLCK, fcntl.F_WRLCK
LIVE_BYTE = 2**62  # read-locked by every open handle; get_or_compute's key bytes are all below it
PIN_BASE = LIVE_BYTE + 1  # byte PIN_BASE + e is read-locked by every view pinning entry slot e
# Byte NS_BASE + (inode of /proc/self/ns/pid, a 32-bit number) is read-locked by every open handle of a process in that
# PID namespace; above the pin bytes and the tier's LISTENER_BASE (2**62 + 2**40 + kind).
NS_BASE = 2**62 + 2**41
NS_SPAN = 2**32


def lock(fd: int, byte: int, kind: int, *, wait: bool, length: int = 1) -> bool:
    """Lock ``length`` bytes from ``byte`` of the file open as ``fd`` (``READ`` shared, ``WRITE`` exclusive); False
    if another description holds a conflicting lock and ``wait`` is False."""
    request = _FLOCK.pack(kind, os.SEEK_SET, byte, length, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, request)
        return True
    except OSError as exc:
        if not wait and exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def unlock_request(byte: int) -> bytes:
    """The ``F_OFD_SETLK`` argument that releases a lock on ``byte``."""
    return _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, byte, 1, 0)


def unlock(fd: int, byte: int) -> None:
    """Release this description's lock on ``byte`` (a no-op where it holds none)."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, unlock_request(byte))


def held_elsewhere(fd: int, byte: int) -> bool:
    """Whether a description other than ``fd``'s holds any lock on ``byte`` (``F_OFD_GETLK``)."""
    return held_in(fd, byte, 1)


def held_in(fd: int, start: int, length: int) -> bool:
    """Whether a description other than ``fd``'s holds any lock on the ``length`` bytes from ``start``."""
    reply = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(WRITE, os.SEEK_SET, start, length, 0))
    return _FLOCK.unpack(reply)[0] != fcntl.F_UNLCK


def pid_namespace() -> int:
    """This process's PID namespace as a number below ``NS_SPAN`` (0 when /proc cannot tell)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino % NS_SPAN
    except OSError:
        return 0


def other_pid_namespaces(fd: int) -> bool:
    """Whether a handle on the file open as ``fd`` belongs to a process of another PID namespace than this one's, whose
    thread ids this process cannot interpret."""
    own = NS_BASE + pid_namespace()
    below, above = own - NS_BASE, NS_BASE + NS_SPAN - own - 1
    return (below > 0 and held_in(fd, NS_BASE, below)) or (above > 0 and held_in(fd, own + 1, above))


def judge(path: str, name: str, byte: int, length: int, remove: bool, trust) -> dict | None:
    """``sweep``'s verdict on the file at ``path``: ``skipped`` (with the ``reason``) if ``trust`` refuses it,
    ``in use`` while any description holds a lock on its ``length`` bytes from ``byte``, else ``orphan`` (unlinked
    with ``remove``, if it is still the file judged); None if it is gone. The bytes are held exclusively while
    judging, so a process that opens the file meanwhile keeps it. A symlink is never followed, and a file refused is
    neither locked nor unlinked."""
    try:
        reason = trust.refusal(os.lstat(path))  # a symlink or a FIFO is refused without being opened
        if reason is not None:
            return {"name": name, "state": "skipped", "reason": reason}
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:  # swapped for a symlink (ELOOP), or not ours to open (EACCES)
        refused = trust.open_error(path, "sweep")
        return {"name": name, "state": "skipped", "reason": refused.reason if refused else "not accessible"}
    try:
        st = os.fstat(fd)
        reason = trust.refusal(st)  # Invariant: the verdict on the descriptor, before it is locked
        if reason is not None:
            return {"name": name, "state": "skipped", "reason": reason}
        if not lock(fd, byte, WRITE, wait=False, length=length):
            return {"name": name, "state": "in use"}
        # (what it holds of /dev/shm: its pages backed, not its file's length, sized for resizes and sparse)
        entry = {"name": name, "state": "orphan", "size_bytes": st.st_blocks * 512, "removed": False}
        if remove:
            try:
                if os.lstat(path).st_ino == st.st_ino:  # still the file judged: not one created since
                    os.unlink(path)
                    entry["removed"] = True
            except FileNotFoundError:
                pass
        return entry
    finally:
        os.close(fd)  # releases the exclusive lock


# ------------------------------------------------------------------------------------- who holds a lock, from /proc
#
# Why /proc: F_OFD_GETLK names one conflicting lock, and no pid (an OFD lock belongs to a description, which
# several processes may share). /proc/locks lists every lock of the host, whoever holds it; /proc/PID/fdinfo/FD
# lists those of the description open as FD, readable for this user's processes (every process's, for root).


def _parse_lock(line: str) -> tuple[int, int, int, int, int] | None:
    """(kind, major, minor, inode, start) of a held OFD lock on one byte, from a line of /proc/locks (or an
    fdinfo ``lock:`` line without its tag); None for any other lock, or a request still waiting (``->``)."""
    f = line.split()
    if len(f) < 8 or f[1] != "OFDLCK" or f[7] != f[6]:
        return None
    try:
        major, minor, inode = f[5].split(":")
        return READ if f[3] == "READ" else WRITE, int(major, 16), int(minor, 16), int(inode), int(f[6])
    except ValueError:
        return None


def readers_by_file(byte: int) -> dict[tuple[int, int, int], int] | None:
    """The read locks held on ``byte`` of every file of the host, counted by file (major, minor, inode): one per
    open file description that holds one. None where /proc/locks cannot be read."""
    try:
        with open("/proc/locks") as f:
            lines = f.readlines()
    except OSError:
        return None
    counts: dict[tuple[int, int, int], int] = {}
    for line in lines:
        lk = _parse_lock(line)
        if lk is not None and lk[0] == READ and lk[4] == byte:
            counts[lk[1:4]] = counts.get(lk[1:4], 0) + 1
    return counts


def file_id(st: os.stat_result) -> tuple[int, int, int]:
    """A file as /proc/locks names it: (major, minor, inode)."""
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def reading_processes(paths: set[str], byte: int) -> dict[str, set[int]]:
    """For each of ``paths``, the processes holding a read lock on its ``byte`` through a descriptor open on it,
    among those whose descriptors this process may read (its user's; every one for root). A process counts once,
    however many of its descriptors hold one; a description shared after fork counts in each process."""
    found: dict[str, set[int]] = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # another user's, or gone
            continue
        for fd in fds:
            try:
                path = os.readlink(f"/proc/{pid}/fd/{fd}")
                if path not in paths:
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    info = f.read()
            except OSError:
                continue
            for line in info.splitlines():
                lk = _parse_lock(line[5:]) if line.startswith("lock:") else None
                if lk is not None and lk[0] == READ and lk[4] == byte:
                    found.setdefault(path, set()).add(int(pid))
                    break
    return found
