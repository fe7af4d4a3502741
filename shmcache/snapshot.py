"""Snapshot files: every live entry of a cache written to a file while every process keeps serving, and read back,
hottest first, into a cache of any size. The byte format is docs/internals.md's "Snapshot files".

Writing never holds the cache lock for the whole snapshot: one hold copies the list's links and the columns that
order it (``entries.order_locked``: numpy copies, a few bytes an entry), walked after the unlock into the policy's
order (``entries.hottest_first``); then holds of at most ``COPY_ENTRIES`` entries and ``COPY_NBYTES`` bytes each
copy the next of them (``entries.copy_locked``), and every copy is checked against its key's fingerprint and its
value's checksum after the unlock. An entry that changed between the two holds is written as the later hold found it, or
left out if it went. Records hold the encoded key and value bytes as the cache holds them, never decoded: a pickle
cache's values are never unpickled here. The file is written beside its destination under a temporary name
(``.NAME.snapshot-PID-RANDOM.tmp``), synced, renamed over it and the directory synced: a process killed at any
point leaves the previous file whole (and perhaps its temporary file, which nothing reads and the next snapshot to
the same path removes: ``sweep``).

Reading treats every byte of the file as hostile: a length is trusted only after its record header's checksum,
never beyond what the file holds, and steers nothing but a bounded read; a record that fails a checksum costs that
record alone (the reader scans for the next record's sync word); a header that fails raises SnapshotError. The
restore is two passes: the record headers, hottest first, choose what fits the cache's limits; then those records
are read again, coldest first, checked whole, and stored through the handle's batch put (``put_many``), so that the
policy's order ends as the file's and the hottest survive.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import struct
import threading
import time
from typing import NamedTuple

import msgpack
import numpy as np
import xxhash

from . import block, entries, kinds
from .codec import TAG_ARRAY, TAG_BYTES, TAG_MSGPACK, TAG_TENSOR, body_checksum, fingerprint
from .errors import PinnedError, SnapshotError, SnapshotMismatch, SnapshotVersionError, TooLargeError
from .layout import KIND_PREFIX, MAX_BLOCK_NBYTES, MAX_TTL_NS
from .layout.dtypes import H_FILL, PACKED_TAG_MASK, POLICY_NAMES
from .serializers import TAG_PICKLE
from .block import PAD
from .codec import MASK63
from .store import Encoded, Placed

MAGIC = b"\x89SHMSNAP"  # the first byte's high bit catches a transfer that strips it (as PNG's does)
MAJOR = 1  # a reader refuses a file of a higher major version: its records may mean something else
MINOR = 1  # a later minor version adds only what an older reader may ignore (a flag bit, a header key); 1: the
#            records' flags carry their entries' marks (FLAG_MARKED)
SYNC = b"\xd3SR\x01"  # the first bytes of every record: what the reader scans for after a damaged one
END = b"\xd3SE\x01"  # the first bytes of the trailer
_HEAD = struct.Struct("<8sHHIQ")  # magic, major, minor, meta_nbytes, seed; then meta (msgpack), then its check
_CHECK = struct.Struct("<Q")  # an XXH3-64
_RECORD = struct.Struct("<4sIIBBHq")  # sync, key_nbytes, body_nbytes, tag, flags, reserved, expires_ns
# A record's flags: with FLAG_MARKED set, the bits of FLAG_MARKS are the marks its entry had (MARK_*: an s3fifo or
# auto cache's small queue and counter), with which a restore into such a cache places the entry (Table.insert).
# (twin: _core_snapshot.c REC_MARKED)
FLAG_MARKED = 8
FLAG_MARKS = 7
_TRAILER = struct.Struct("<4sIQQ")  # end, reserved, records, records_nbytes
RECORD_HEAD_NBYTES = _RECORD.size + _CHECK.size  # 32: the fields, then their check
TRAILER_NBYTES = _TRAILER.size + _CHECK.size  # 32
MAX_META_NBYTES = 1 << 20  # a header's msgpack part: a few names; anything larger is damage
COPY_NBYTES = 1 << 20  # the bytes one hold of the cache lock copies at most while a snapshot is written
COPY_ENTRIES = 1024  # and the entries: about a millisecond's hold on the Python path
READ_NBYTES = 8 << 20  # the file's bytes read at once
PLAN_ROWS = 8192  # the rows one call of the compiled first pass writes at most
BACK_AHEAD_NBYTES = 32 << 20  # what one call of the restore's backing thread allocates
STALE_TMP_S = 60.0  # a temporary file unwritten this long, its writer's flock free, was left by a killed writer
_SERIALIZERS = ("msgpack", "pickle")
_TAGS = {"msgpack": frozenset((TAG_MSGPACK, TAG_BYTES, TAG_ARRAY, TAG_TENSOR)),
         "pickle": frozenset((TAG_MSGPACK, TAG_BYTES, TAG_ARRAY, TAG_TENSOR, TAG_PICKLE))}
_xxh = xxhash.xxh3_64_intdigest
_KIND_MARK = bytes((KIND_PREFIX,))  # a key of some kind starts with it, then the kind's number


class SnapshotInfo(NamedTuple):
    """What ``SharedCache.snapshot`` wrote: ``entries`` records, ``nbytes`` bytes in all, in ``seconds``."""

    path: str
    entries: int
    nbytes: int
    seconds: float


class RestoreResult(NamedTuple):
    """What ``SharedCache.restore`` did with a file: ``restored`` entries stored; ``damaged`` records skipped for a
    failed checksum (or a field no writer makes); ``expired`` records past their time; ``no_room`` records colder
    than what filled the cache's limits (or not admitted: by a full ``keep`` cache, or for room that open views pin);
    ``complete``: the file ended with its trailer and every record it counts was read whole and valid (none
    damaged: a record whose header is whole but holds a field no writer makes is lost all the same); ``nbytes`` the
    file's size."""

    restored: int
    damaged: int
    expired: int
    no_room: int
    complete: bool
    nbytes: int
    seconds: float


# ------------------------------------------------------------------------------------------- writing


def _record_head(kb: bytes, tag: int, body: bytes, expires_ns: int, seed: int, flags: int = 0) -> tuple[bytes, int]:
    head = _RECORD.pack(SYNC, len(kb), len(body), tag, flags, 0, expires_ns)
    check = _xxh(head, seed)
    return head + _CHECK.pack(check), check


def temporary_name(path: str) -> str:
    """The name ``write`` gives its file until it is whole: beside ``path``, hidden, recognisable."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.snapshot-{os.getpid()}-{secrets.token_hex(4)}.tmp")


def sweep(path: str) -> int:
    """Remove the temporary files that writers of ``path`` killed mid-write left beside it; how many went.

    A writer holds an flock on its temporary file from its creation to its close (the kernel drops it when the
    process dies, whatever its PID namespace), and writes it without a pause of STALE_TMP_S; a file of our name
    pattern, ours (this user's regular file: a link is not followed), unwritten for that long and whose flock is
    free is an orphan. The age also covers the instants between a writer's open and its flock, and between its
    close and its rename."""
    directory, base = os.path.split(os.path.abspath(path))
    prefix = f".{base}.snapshot-"
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return 0
    removed, now = 0, time.time()
    for n in names:
        p = os.path.join(directory, n)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # gone meanwhile, a symbolic link (never ours), or not ours to read
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or now - st.st_mtime < STALE_TMP_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer lives
            now_named = os.lstat(p)
            if (now_named.st_dev, now_named.st_ino) == (st.st_dev, st.st_ino):  # still the file judged
                os.unlink(p)
                removed += 1
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def write(parts, path, name: str) -> SnapshotInfo:
    """Write every live entry of the cache whose ``parts`` (``cache.Parts``) are given to ``path``, replacing it
    atomically, after sweeping what killed writers of ``path`` left; see the module docstring."""
    started = time.perf_counter()
    path = os.fspath(path)
    sweep(path)
    seg, guard, store = parts.seg, parts.guard, parts.store
    seed = int.from_bytes(os.urandom(8), "little")
    named = guard.run(kinds.names_locked, seg)
    meta = msgpack.packb({"serializer": store.serializer.name, "policy": POLICY_NAMES[seg.geometry.policy],
                          "cache": name, "created_ns": time.time_ns(), "kinds": named})
    head = _HEAD.pack(MAGIC, MAJOR, MINOR, len(meta), seed) + meta
    tmp = temporary_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "wb", buffering=READ_NBYTES) as f:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until the close: another writer's sweep leaves this file alone
            f.write(head + _CHECK.pack(_xxh(head)))
            count, nbytes = _write_records(f, parts, seed, named)
            trailer = _TRAILER.pack(END, 0, count, nbytes)
            f.write(trailer + _CHECK.pack(_xxh(trailer, seed)))
            f.flush()
            os.fsync(f.fileno())
            total = f.tell()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_directory(os.path.dirname(os.path.abspath(path)))
    return SnapshotInfo(path, count, total, time.perf_counter() - started)


def _write_records(f, parts, seed: int, named: dict) -> tuple[int, int]:
    """Copy the entries out in batches and write each as a record; (records, their bytes)."""
    guard, store = parts.guard, parts.store
    slots, fps = entries.hottest_first(guard.run(entries.order_locked, store), store.table.pol)
    marked = FLAG_MARKED if store.table.pol.marks_on_hit else 0  # (the list policies' entries have no marks)
    write = f.write
    count = nbytes = damaged = 0
    # (narrow records keep no fingerprint: ``fps`` are the index slots' tags, the low 32 bits of each key's)
    fp_bits = PACKED_TAG_MASK if store.rec.fp is None else -1
    i = 0
    while i < len(slots):
        copies, i, now, bad = guard.run(entries.copy_locked, store, slots, fps, i, i + COPY_ENTRIES,
                                               COPY_NBYTES)
        real = time.time_ns()  # Why here: the wall clock read next to the monotonic one copy_locked read
        damaged += bad
        for kb, tag, body, check, expires, fp, marks in copies:
            if fingerprint(kb) & fp_bits != fp or body_checksum(tag, body) != check:
                damaged += 1
                continue
            if kb[:1] == _KIND_MARK and (len(kb) < 2 or kb[1] not in named):
                continue  # a kind made after the names were read (none is ever removed): not in this file's table
            if expires:
                left = expires - now  # (copy_locked skipped the expired: left is positive)
                if left > MAX_TTL_NS:  # a damaged expiry: no entry lives that long, and its wall time would overflow
                    damaged += 1
                    continue
                expires = max(1, left + real)
            head, hcheck = _record_head(kb, tag, body, expires, seed, marked and marked | (marks & FLAG_MARKS))
            write(head)
            write(kb)
            write(body)
            write(_CHECK.pack(_xxh(body, _xxh(kb, hcheck))))
            count += 1
            nbytes += RECORD_HEAD_NBYTES + len(kb) + len(body) + _CHECK.size
    if damaged:
        guard.run(store.repair, True)  # drops them (counted in recoveries), as iteration does
    return count, nbytes


def _sync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------- reading


class _Source:
    """Bounded reads of a file of ``size`` bytes through a window of at least ``READ_NBYTES``, read into the same
    buffer each time (a new one of 8 MiB a read would cost the kernel's zeroing of its pages, a tenth of a large
    restore's time)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.mem = bytearray(0)
        self.buf, self.at = memoryview(self.mem)[:0], 0

    def read(self, off: int, n: int) -> bytes | None:
        """The file's bytes ``[off, off + n)``, or None where the file does not hold them all."""
        win = self.window(off, n)
        return None if win is None else bytes(win[0][off - win[1] : off - win[1] + n])

    def window(self, off: int, n: int) -> tuple[memoryview, int] | None:
        """The window (its bytes, valid until the next read, and their offset in the file) holding at least
        ``[off, off + n)``, loaded if it does not; None where the file does not hold them all."""
        if n < 0 or off < 0 or off + n > self.size:
            return None
        rel = off - self.at
        if not (0 <= rel and rel + n <= len(self.buf)):
            self._load(off, max(n, READ_NBYTES))
            if len(self.buf) < n:
                return None
        return self.buf, self.at

    def _load(self, off: int, n: int) -> None:
        # Invariant: never more than the file holds past ``off``, whatever a field asked for.
        want = min(n, self.size - off)
        if len(self.mem) < want:
            self.mem = bytearray(want)
        view, got = memoryview(self.mem), 0
        while got < want:
            k = os.preadv(self.fd, [view[got:want]], off + got)
            if not k:  # the file shrank meanwhile
                break
            got += k
        self.buf, self.at = view[:got], off

    def find(self, off: int, word: bytes) -> int:
        """Where ``word`` next occurs at or after ``off``; the file's size if nowhere."""
        while off < self.size:
            if not 0 <= off - self.at < len(self.buf) - len(word):
                self._load(off, READ_NBYTES)
                if len(self.buf) < len(word):
                    break
            j = self.mem.find(word, off - self.at, len(self.buf))
            if j >= 0:
                return self.at + j
            off = self.at + len(self.buf) - len(word) + 1
        return self.size


class _Header(NamedTuple):
    serializer: str
    kinds: dict  # number -> name bytes
    seed: int
    end: int  # where the records start


def _refuse(message: str, path: str) -> SnapshotError:
    return SnapshotError(f"{path!r}: {message}", what="restore",
                         hint="the file is not a whole shmcache snapshot; take a new one (SharedCache.snapshot)")


def _header(src: _Source, path: str) -> _Header:
    """The file's header, checked; raises SnapshotError (a newer major version: SnapshotVersionError)."""
    fixed = src.read(0, _HEAD.size)
    if fixed is None or fixed[:8] != MAGIC:
        raise _refuse("not a shmcache snapshot (no magic)", path)
    _, major, minor, meta_nbytes, seed = _HEAD.unpack(fixed)
    if meta_nbytes > MAX_META_NBYTES:
        raise _refuse(f"its header's length ({meta_nbytes}) is out of range: damaged", path)
    whole = src.read(0, _HEAD.size + meta_nbytes + _CHECK.size)
    if whole is None:
        raise _refuse("its header is cut short", path)
    (check,) = _CHECK.unpack_from(whole, _HEAD.size + meta_nbytes)
    if _xxh(whole[: _HEAD.size + meta_nbytes]) != check:
        raise _refuse("its header fails its checksum: damaged", path)
    if major > MAJOR:
        raise SnapshotVersionError(f"{path!r} is a snapshot of format {major}.{minor}; this version of shmcache "
                                   f"reads format {MAJOR}.x", what="restore",
                                   hint="restore it with the newer shmcache that wrote it")
    if major < 1:
        raise _refuse(f"its format version {major}.{minor} was never written", path)
    try:
        meta = msgpack.unpackb(whole[_HEAD.size : _HEAD.size + meta_nbytes], strict_map_key=False)
        serializer, named = meta["serializer"], meta["kinds"]
        if serializer not in _SERIALIZERS or not isinstance(named, dict):
            raise ValueError(serializer)
        names = {}
        for k, v in named.items():
            if type(k) is not int or not 1 <= k <= 255 or not isinstance(v, bytes):
                raise ValueError(k)
            kinds.check_name(v.decode("utf-8"))
            names[k] = v
    except Exception as exc:  # Why so broad: whatever the bytes make msgpack raise, the header is damaged
        raise _refuse(f"its header's fields are not a snapshot's ({type(exc).__name__})", path) from None
    return _Header(serializer, names, seed, len(whole))


# A row of the plan: a record to restore, as its header was when the first pass checked it.
ROW_P, ROW_N, ROW_CHECK, ROW_KLEN, ROW_BLEN, ROW_TAG, ROW_EXPIRES, ROW_KIND, ROW_FLAGS = range(9)
_MASK64 = (1 << 64) - 1


def _signed(word: int) -> int:
    """A 64-bit word as the int64 the compiled section takes."""
    return word - (1 << 64) if word >= 1 << 63 else word


class _Plan:
    """The first pass's findings."""

    def __init__(self) -> None:
        # Each record to restore, hottest first, a row of int64 words (``ROW_*``): its offset and length in the file,
        # its header's check, key length, body length, tag, expiry, the kind number its key names (-1: none), and
        # flags | reserved << 8. Made an array once the walk ends (``rows``).
        self.taken: list[tuple] = []
        self.rows = np.zeros((0, 9), np.int64)
        self.valid = 0  # records whose header passed its check
        self.gaps = 0  # damaged stretches skipped by a scan for the next sync word
        self.unusable = 0  # records with a whole header whose fields no writer makes
        self.expired = self.no_room = 0
        self.trailer: tuple[int, int] | None = None


def _plan(src: _Source, head: _Header, max_entries: int, max_bytes: int, now_ns: int, fast=None) -> _Plan:
    """Walk the record headers, hottest first, choosing those that fit the limits. ``fast``: the compiled section's
    walk (``Core.snapshot_plan``), which takes every run of whole, right records and leaves the rest to this one."""
    plan, p, seed, size = _Plan(), head.end, head.seed, src.size
    tags = _TAGS[head.serializer]
    entries_taken = bytes_taken = 0
    gap = False
    if fast is not None:
        tag_flags = bytes(int(t in tags) for t in range(256))
        kind_flags = bytes(int(k in head.kinds) for k in range(256))
        chunks: list[np.ndarray] = []
        out = np.empty((PLAN_ROWS, 9), np.int64)
        state = np.zeros(8, np.int64)
    while p < size:
        if fast is not None:
            win = src.window(p, RECORD_HEAD_NBYTES + 2)
            if win is not None:
                state[:4] = entries_taken, bytes_taken, max_entries, max_bytes
                state[4:] = plan.valid, plan.unusable, plan.expired, plan.no_room
                q, m = fast(win[0], win[1], size, p, _signed(seed), tag_flags, kind_flags, now_ns, state, out)
                if m:
                    chunks.append(out[:m].copy())
                entries_taken, bytes_taken = int(state[0]), int(state[1])
                plan.valid, plan.unusable, plan.expired, plan.no_room = (int(x) for x in state[4:])
                if q != p:
                    p, gap = q, False
                    continue
        # The head and the key's first two bytes (its kind) in one read where the file holds them (it does but at
        # its very end, where the trailer is): a read fewer a record.
        hk = src.read(p, RECORD_HEAD_NBYTES + 2)
        h = src.read(p, RECORD_HEAD_NBYTES) if hk is None else hk[:RECORD_HEAD_NBYTES]
        if h is not None and h[:4] == SYNC and _xxh(h[: _RECORD.size], seed) == _CHECK.unpack_from(h, _RECORD.size)[0]:
            gap = False
            _, klen, blen, tag, flags, reserved, expires = _RECORD.unpack_from(h)
            n = RECORD_HEAD_NBYTES + klen + blen + _CHECK.size
            if p + n > size:  # cut short: the file ends inside it
                plan.gaps += 1
                break
            plan.valid += 1
            prefix = hk[RECORD_HEAD_NBYTES : RECORD_HEAD_NBYTES + klen] if hk is not None else src.read(
                p + RECORD_HEAD_NBYTES, min(klen, 2))
            size_ = klen + blen + 1
            kind = prefix[1] if prefix is not None and prefix[:1] == _KIND_MARK and klen >= 2 else -1
            if tag not in tags or block.nbytes(size_) > MAX_BLOCK_NBYTES or prefix is None \
                    or (prefix[:1] == _KIND_MARK and (klen < 2 or prefix[1] not in head.kinds)):
                plan.unusable += 1
            elif expires and expires <= now_ns:
                plan.expired += 1
            elif entries_taken < max_entries and bytes_taken + size_ <= max_bytes:
                entries_taken += 1
                bytes_taken += size_
                check = _CHECK.unpack_from(h, _RECORD.size)[0]
                row = (p, n, _signed(check), klen, blen, tag, expires, kind, flags | reserved << 8)
                if fast is not None:
                    chunks.append(np.array([row], np.int64))
                else:
                    plan.taken.append(row)
            else:
                plan.no_room += 1
            p += n
            continue
        if h is not None and h[:4] == END and _xxh(h[: _TRAILER.size], seed) == _CHECK.unpack_from(h, _TRAILER.size)[0]:
            _, _, records, _ = _TRAILER.unpack_from(h)
            plan.trailer = (records, p)
            p += TRAILER_NBYTES
            gap = False
            continue
        if not gap and p + TRAILER_NBYTES == size and plan.trailer is None:
            break  # the trailer's place, damaged: every record before it was read, and no entry is lost
        if not gap:
            plan.gaps += 1
            gap = True
        p = src.find(p + 1, SYNC) if h is not None else size
    if fast is not None:
        if chunks:
            plan.rows = np.concatenate(chunks)
    elif plan.taken:
        plan.rows = np.array(plan.taken, np.int64)
    plan.taken = []
    return plan


def restore(parts, hot, now, path) -> RestoreResult:
    """Restore the snapshot at ``path`` into the cache whose ``parts`` (``cache.Parts``) are given, through its hot
    path ``hot`` (``core.path``'s, whose batches take ``now()``); see the module docstring.

    :raises FileNotFoundError: if there is no file at ``path`` (any OSError of opening or reading it, as raised).
    :raises SnapshotError: if the file's header is damaged or not a snapshot's; SnapshotVersionError for a newer
        major format; SnapshotMismatch if the snapshot's serializer is not the cache's.
    """
    started = time.perf_counter()
    path = os.fspath(path)
    seg, guard, store = parts.seg, parts.guard, parts.store
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO planted at the path must not block
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse("not a regular file", path)
        src = _Source(fd, st.st_size)
        head = _header(src, path)
        mine = store.serializer.name
        if head.serializer != mine:
            raise SnapshotMismatch(
                f"{path!r} is a snapshot of a cache with serializer={head.serializer!r}; this cache has "
                f"serializer={mine!r}", what="restore", snapshot=head.serializer, cache=mine,
                hint=f"restore it into a cache created with serializer={head.serializer!r}")
        limits = guard.run(store.stats)
        fast = hasattr(hot, "snapshot_restore")  # the compiled section's passes, where it runs
        plan = _plan(src, head, limits.max_entries, limits.max_retained_bytes, time.time_ns(),
                     hot.snapshot_plan if fast else None)
        kind_numbers = _kinds_of(parts, head, plan)
        if fast and not seg.expires_shown and (plan.rows[:, ROW_EXPIRES] != 0).any():
            # (layout 18: the expires column switched on first, where the compiled pass would hand over the first
            # record that expires, and with it every record of that read, to this module's slower pass)
            guard.run(store.show_expires)
        payloads = plan.rows[:, ROW_KLEN] + plan.rows[:, ROW_BLEN] + 1
        stop_backing = _back_ahead(seg, int(((payloads + PAD) & -8).sum()))  # their blocks (block.nbytes)
        try:
            stored, failed, expired, refused = _insert(src, head, plan, kind_numbers, hot, now, fast)
        finally:
            stop_backing()
    finally:
        os.close(fd)
    damaged = failed + plan.unusable
    if plan.trailer is not None:
        damaged += max(plan.trailer[0] - plan.valid, 0)
    else:
        damaged += plan.gaps
    complete = (plan.trailer is not None and plan.trailer[0] == plan.valid and not plan.gaps and not failed
                and not plan.unusable)
    return RestoreResult(stored, damaged, plan.expired + expired, plan.no_room + refused, complete, src.size,
                         time.perf_counter() - started)


def _back_ahead(seg, nbytes: int):
    """Back with memory, in a thread, the pages past the arena's extent that ``nbytes`` of blocks will reach, ahead
    of the stores that will grow the extent over them (``Segment.back``, which then finds them backed): the kernel's
    zeroing of each new page, a third of a large restore's time, runs on another core meanwhile. Only backs, under
    no lock: the extent and every mapping stay as they are, and pages a shrink released meanwhile may be backed
    again (``shmcache sweep`` counts what a file holds; the next shrink gives them back). Returns what stops it
    and waits for it; /dev/shm full ends it silently (the stores report it)."""
    ext, ring = seg.extent(), seg.ring()
    free = max(ext - int(seg.header_words[H_FILL]), 0)  # a hint, read without the lock
    start, stop = seg.geometry.arena_off + ext, seg.geometry.arena_off + min(ring, ext + max(nbytes - free, 0))
    if stop - start < BACK_AHEAD_NBYTES:
        return lambda: None
    fd = os.dup(seg.fd)  # its own: the handle may be closed by another thread meanwhile
    done = threading.Event()

    def run() -> None:
        try:
            at = start
            while at < stop and not done.is_set():
                n = min(BACK_AHEAD_NBYTES, stop - at)
                os.posix_fallocate(fd, at, n)
                at += n
        except OSError:
            pass  # /dev/shm full: the stores that need the pages report it
        finally:
            os.close(fd)

    t = threading.Thread(target=run, name="shmcache-restore-back", daemon=True)
    t.start()

    def stop_backing() -> None:
        done.set()
        t.join()

    return stop_backing


def _kinds_of(parts, head: _Header, plan: _Plan) -> dict[int, int]:
    """The file's kind numbers as this cache numbers the same names (made here if new; 0: its table is full)."""
    seg, guard = parts.seg, parts.guard
    used = set(np.unique(plan.rows[:, ROW_KIND]).tolist()) - {-1}
    return {k: guard.run(kinds.register_locked, seg, head.kinds[k]) for k in sorted(used) if k in head.kinds}


def _insert(src: _Source, head: _Header, plan: _Plan, kind_numbers: dict, hot, now,
            fast: bool = False) -> tuple[int, int, int, int]:
    """Read the chosen records again, coldest first, and store them in batches; (stored, damaged, expired,
    refused). ``fast``: through the compiled section's pass (``Core.snapshot_restore``), which leaves to this one
    only a record a hand-over stopped it at (an arena to grow, a repair to make, a store over the limits)."""
    totals = [0, 0, 0, 0]  # stored, damaged, expired, refused
    rows = plan.rows
    starts, ends = rows[:, ROW_P], rows[:, ROW_P] + rows[:, ROW_N]
    kind_map = bytes(kind_numbers.get(k, 0) for k in range(256))
    j = len(rows)
    while j > 0:
        # The records [i, j) in one read of at most READ_NBYTES (or one record, however large).
        end = int(ends[j - 1])
        i = max(int(np.searchsorted(starts[:j], end - READ_NBYTES, "left")), 0)
        i = min(i, j - 1)
        first = int(starts[i])
        win = src.window(first, end - first)  # (no copy: nothing reads the file again until these are stored)
        chunk = None if win is None else win[0][first - win[1] : end - win[1]]
        real = time.time_ns()
        if fast and chunk is not None:
            count = j - i
            block_rows = np.ascontiguousarray(rows[i:j])
            while count > 0:
                *done, left = hot.snapshot_restore(chunk, first, block_rows, count, _signed(head.seed), kind_map,
                                                   real, now())
                for k in range(4):
                    totals[k] += done[k]
                if not left:
                    break
                # A hand-over stopped it at row left - 1: that row here, then the rest there again; or all of them
                # here where it stopped before it stored anything (a hand-over that lasts: a released handle, a
                # lock that times out), which would make every call check the rest again for one row's progress.
                stalled = done[0] + done[3] == 0
                take = block_rows[:left] if stalled else block_rows[left - 1 : left]
                for k, x in enumerate(_insert_rows(chunk, first, take, head, kind_numbers, hot, now, real)):
                    totals[k] += x
                count = 0 if stalled else left - 1
        else:
            for k, x in enumerate(_insert_rows(chunk, first, rows[i:j], head, kind_numbers, hot, now, real)):
                totals[k] += x
        j = i
    return totals[0], totals[1], totals[2], totals[3]


def _insert_rows(chunk: memoryview | None, first: int, rows, head: _Header, kind_numbers: dict, hot, now,
                 real: int) -> tuple[int, int, int, int]:
    """Check and store ``rows`` (the plan's, hottest first) whose records ``chunk`` holds from file offset ``first``,
    coldest first; (stored, damaged, expired, refused). (twin: _core_snapshot.c Core_snapshot_restore)"""
    damaged = expired = 0
    batch: list[tuple[Encoded | Placed, int]] = []
    for p, n, check, klen, blen, tag, expires, _, flags in reversed(rows.tolist()):
        # Read again and checked whole: its head as the first pass checked it (the file may have changed since),
        # then its key and body against the record's own checksum, seeded with the head's.
        at = p - first
        k0 = at + RECORD_HEAD_NBYTES
        h = _RECORD.pack(SYNC, klen, blen, tag, flags & 0xFF, flags >> 8, expires) + _CHECK.pack(check & _MASK64)
        if chunk is None or at < 0 or chunk[at:k0] != h or at + n > len(chunk):
            damaged += 1
            continue
        kb, body = bytes(chunk[k0 : k0 + klen]), bytes(chunk[k0 + klen : k0 + klen + blen])
        if _xxh(body, _xxh(kb, check & _MASK64)) != _CHECK.unpack_from(chunk, k0 + klen + blen)[0]:
            damaged += 1
            continue
        if klen and kb[0] == KIND_PREFIX:  # the file's kind number, as this cache numbers the same name
            k = kind_numbers.get(kb[1], 0) if klen >= 2 else 0
            if not k:
                damaged += 1
                continue
            kb = bytes((KIND_PREFIX, k)) + kb[2:]
        if not expires:
            ttl = 0
        elif expires <= real:
            expired += 1
            continue
        else:
            ttl = min(expires - real, MAX_TTL_NS)
        size = klen + blen + 1
        # (fingerprint, checksum and block size as codec.fingerprint, codec.body_checksum and block.nbytes
        # compute them, inlined; an Encoded, not its fields as a tuple: a batch handed over to the Python path,
        # and the Python path itself, read them by name; a Placed where the record carries its entry's marks)
        fields = (kb, tag, body, _xxh(kb) & MASK63, (_xxh(body, tag) & MASK63) | 1, size, (size + PAD) & -8)
        batch.append((Placed(*fields, flags & FLAG_MARKS) if flags & FLAG_MARKED else Encoded(*fields), ttl))
    stored, refused = _store(batch, hot, now)
    return stored, damaged, expired, refused


def _store(batch: list, hot, now) -> tuple[int, int]:
    """Store ``batch`` ((fields, ttl) pairs, coldest first) through the batch put, one call per run of equal
    ttls; (stored, refused: not admitted, as the batch put counts them, or refused one by one)."""
    stored = refused = 0
    k = 0
    while k < len(batch):
        ttl = batch[k][1]
        m = k + 1
        while m < len(batch) and batch[m][1] == ttl:
            m += 1
        run = [fields for fields, _ in batch[k:m]]
        k = m
        try:
            passed = hot.put_many(run, now(), ttl)
            stored += len(run) - passed
            refused += passed
            continue
        except (PinnedError, TooLargeError):
            pass  # one by one, to learn which: a key an open view pins (version 11), or limits lowered meanwhile
        for fields in run:
            try:
                ok = hot.put(fields, now(), ttl, -1)  # (-1: the cache's default time to idle)
            except (PinnedError, TooLargeError):
                ok = False
            stored += bool(ok)
            refused += not ok
    return stored, refused
