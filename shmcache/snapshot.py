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
import time
from typing import NamedTuple

import msgpack
import xxhash

from . import block, entries, kinds
from .codec import TAG_ARRAY, TAG_BYTES, TAG_MSGPACK, TAG_TENSOR, body_checksum, fingerprint
from .errors import PinnedError, SnapshotError, SnapshotMismatch, SnapshotVersionError, TooLargeError
from .layout import KIND_PREFIX, MAX_BLOCK_NBYTES, MAX_TTL_NS
from .layout.dtypes import POLICY_KEEP, POLICY_NAMES, POLICY_S3FIFO
from .serializers import TAG_PICKLE
from .block import PAD
from .codec import MASK63
from .store import Encoded

MAGIC = b"\x89SHMSNAP"  # the first byte's high bit catches a transfer that strips it (as PNG's does)
MAJOR = 1  # a reader refuses a file of a higher major version: its records may mean something else
MINOR = 0  # a later minor version adds only what an older reader may ignore (a flag bit, a header key)
SYNC = b"\xd3SR\x01"  # the first bytes of every record: what the reader scans for after a damaged one
END = b"\xd3SE\x01"  # the first bytes of the trailer
_HEAD = struct.Struct("<8sHHIQ")  # magic, major, minor, meta_nbytes, seed; then meta (msgpack), then its check
_CHECK = struct.Struct("<Q")  # an XXH3-64
_RECORD = struct.Struct("<4sIIBBHq")  # sync, key_nbytes, body_nbytes, tag, flags, reserved, expires_ns
_TRAILER = struct.Struct("<4sIQQ")  # end, reserved, records, records_nbytes
RECORD_HEAD_NBYTES = _RECORD.size + _CHECK.size  # 32: the fields, then their check
TRAILER_NBYTES = _TRAILER.size + _CHECK.size  # 32
MAX_META_NBYTES = 1 << 20  # a header's msgpack part: a few names; anything larger is damage
COPY_NBYTES = 1 << 20  # the bytes one hold of the cache lock copies at most while a snapshot is written
COPY_ENTRIES = 1024  # and the entries: about a millisecond's hold on the Python path
READ_NBYTES = 8 << 20  # the file's bytes read at once
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
    than what filled the cache's limits (or refused by a full ``keep`` cache, or by a pinned entry); ``complete``:
    the file ended with its trailer and every record it counts was read whole; ``nbytes`` the file's size."""

    restored: int
    damaged: int
    expired: int
    no_room: int
    complete: bool
    nbytes: int
    seconds: float


# ------------------------------------------------------------------------------------------- writing


def _record_head(kb: bytes, tag: int, body: bytes, expires_ns: int, seed: int) -> tuple[bytes, int]:
    head = _RECORD.pack(SYNC, len(kb), len(body), tag, 0, 0, expires_ns)
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
    seg, guard, store = parts
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
    _, guard, store = parts
    slots, fps = entries.hottest_first(guard.run(entries.order_locked, store),
                                       parts.seg.geometry.policy == POLICY_S3FIFO)
    write = f.write
    count = nbytes = damaged = 0
    i = 0
    while i < len(slots):
        copies, i, now, bad = guard.run(entries.copy_locked, store, slots, fps, i, i + COPY_ENTRIES,
                                               COPY_NBYTES)
        real = time.time_ns()  # Why here: the wall clock read next to the monotonic one copy_locked read
        damaged += bad
        for kb, tag, body, check, expires, fp in copies:
            if fingerprint(kb) != fp or body_checksum(tag, body) != check:
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
            head, hcheck = _record_head(kb, tag, body, expires, seed)
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
    """Bounded reads of a file of ``size`` bytes through a window of at least ``READ_NBYTES``."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.buf, self.at = b"", 0

    def read(self, off: int, n: int) -> bytes | None:
        """The file's bytes ``[off, off + n)``, or None where the file does not hold them all."""
        if n < 0 or off < 0 or off + n > self.size:
            return None
        rel = off - self.at
        if 0 <= rel and rel + n <= len(self.buf):
            return self.buf[rel : rel + n]
        self._load(off, max(n, READ_NBYTES))
        return self.buf[:n] if len(self.buf) >= n else None

    def _load(self, off: int, n: int) -> None:
        # Invariant: never more than the file holds past ``off``, whatever a field asked for.
        want = min(n, self.size - off)
        chunks, got = [], 0
        while got < want:
            chunk = os.pread(self.fd, want - got, off + got)
            if not chunk:  # the file shrank meanwhile
                break
            chunks.append(chunk)
            got += len(chunk)
        self.buf, self.at = b"".join(chunks), off

    def find(self, off: int, word: bytes) -> int:
        """Where ``word`` next occurs at or after ``off``; the file's size if nowhere."""
        while off < self.size:
            if not 0 <= off - self.at < len(self.buf) - len(word):
                self._load(off, READ_NBYTES)
                if len(self.buf) < len(word):
                    break
            j = self.buf.find(word, off - self.at)
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


class _Plan:
    """The first pass's findings."""

    def __init__(self) -> None:
        # Each record to restore, hottest first: (offset, length, its head's bytes as the first pass checked them,
        # key length, body length, tag, expiry, the kind number its key names or -1)
        self.taken: list[tuple] = []
        self.valid = 0  # records whose header passed its check
        self.gaps = 0  # damaged stretches skipped by a scan for the next sync word
        self.unusable = 0  # records with a whole header whose fields no writer makes
        self.expired = self.no_room = 0
        self.trailer: tuple[int, int] | None = None


def _plan(src: _Source, head: _Header, max_entries: int, max_bytes: int, now_ns: int) -> _Plan:
    """Walk the record headers, hottest first, choosing those that fit the limits."""
    plan, p, seed, size = _Plan(), head.end, head.seed, src.size
    tags = _TAGS[head.serializer]
    entries_taken = bytes_taken = 0
    gap = False
    while p < size:
        # The head and the key's first two bytes (its kind) in one read where the file holds them (it does but at
        # its very end, where the trailer is): a read fewer a record.
        hk = src.read(p, RECORD_HEAD_NBYTES + 2)
        h = src.read(p, RECORD_HEAD_NBYTES) if hk is None else hk[:RECORD_HEAD_NBYTES]
        if h is not None and h[:4] == SYNC and _xxh(h[: _RECORD.size], seed) == _CHECK.unpack_from(h, _RECORD.size)[0]:
            gap = False
            _, klen, blen, tag, _flags, _, expires = _RECORD.unpack_from(h)
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
                plan.taken.append((p, n, h, klen, blen, tag, expires, kind))
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
    seg, guard, store = parts
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
        plan = _plan(src, head, limits.max_entries, limits.max_retained_bytes, time.time_ns())
        kind_numbers = _kinds_of(parts, head, plan, src)
        stored, failed, expired, refused = _insert(src, head, plan, kind_numbers, hot, now,
                                                   seg.geometry.policy == POLICY_KEEP)
    finally:
        os.close(fd)
    damaged = failed + plan.unusable
    if plan.trailer is not None:
        damaged += max(plan.trailer[0] - plan.valid, 0)
    else:
        damaged += plan.gaps
    complete = plan.trailer is not None and plan.trailer[0] == plan.valid and not plan.gaps and not failed
    return RestoreResult(stored, damaged, plan.expired + expired, plan.no_room + refused, complete, src.size,
                         time.perf_counter() - started)


def _kinds_of(parts, head: _Header, plan: _Plan, src: _Source) -> dict[int, int]:
    """The file's kind numbers as this cache numbers the same names (made here if new; 0: its table is full)."""
    seg, guard, _ = parts
    used = {t[7] for t in plan.taken} - {-1}
    return {k: guard.run(kinds.register_locked, seg, head.kinds[k]) for k in sorted(used) if k in head.kinds}


def _insert(src: _Source, head: _Header, plan: _Plan, kind_numbers: dict, hot, now,
            keep: bool) -> tuple[int, int, int, int]:
    """Read the chosen records again, coldest first, and store them in batches; (stored, damaged, expired,
    refused)."""
    stored = damaged = expired = refused = 0
    taken = plan.taken
    j = len(taken)
    while j > 0:
        # The records [i, j) in one read of at most READ_NBYTES (or one record, however large).
        end = taken[j - 1][0] + taken[j - 1][1]
        i = j - 1
        while i > 0 and end - taken[i - 1][0] <= READ_NBYTES:
            i -= 1
        first = taken[i][0]
        chunk = src.read(first, end - first)
        batch: list[tuple[Encoded, int]] = []
        real = time.time_ns()
        for p, _n, h, klen, blen, tag, expires, _ in reversed(taken[i:j]):
            # Read again and checked whole: its head as the first pass checked it (the file may have changed
            # since), then its key and body against the record's own checksum, seeded with the head's.
            at = p - first
            k0 = at + RECORD_HEAD_NBYTES
            if chunk is None or chunk[at:k0] != h:
                damaged += 1
                continue
            kb, body = chunk[k0 : k0 + klen], chunk[k0 + klen : k0 + klen + blen]
            if _xxh(body, _xxh(kb, _CHECK.unpack_from(h, _RECORD.size)[0])) != _CHECK.unpack_from(
                    chunk, k0 + klen + blen)[0]:
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
            # and the Python path itself, read them by name)
            batch.append((Encoded(kb, tag, body, _xxh(kb) & MASK63, (_xxh(body, tag) & MASK63) | 1, size,
                                  (size + PAD) & -8), ttl))
        j = i
        done, no = _store(batch, hot, now, keep)
        stored += done
        refused += no
    return stored, damaged, expired, refused


def _store(batch: list, hot, now, keep: bool) -> tuple[int, int]:
    """Store ``batch`` ((fields, ttl) pairs, coldest first) through the batch put, one call per run of equal
    ttls; (stored, refused). Under keep every put says whether it was admitted, so they go one by one."""
    stored = refused = 0
    k = 0
    while k < len(batch):
        ttl = batch[k][1]
        m = k + 1
        while m < len(batch) and batch[m][1] == ttl:
            m += 1
        run = [fields for fields, _ in batch[k:m]]
        k = m
        if not keep:
            try:
                hot.put_many(run, now(), ttl)
                stored += len(run)
                continue
            except (PinnedError, TooLargeError):
                pass  # one by one, to learn which: a key an open view pins, or limits lowered meanwhile
        for fields in run:
            try:
                ok = hot.put(fields, now(), ttl)
            except (PinnedError, TooLargeError):
                ok = False
            stored += bool(ok)
            refused += not ok
    return stored, refused

