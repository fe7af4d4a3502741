"""SharedCache: one bounded LRU cache in shared memory, used the same way from every process on the host.

This is the only module that takes the cache lock. Keys and values are encoded and hashed before the lock is taken
and decoded after it is released, so the lock is held only for the index probe, the list and counter updates and
the copy of the bytes. Methods whose name ends in ``_locked`` must be called with the lock held.

Crash window: a process can die (or be interrupted by an exception) between any two word writes below. A dead
holder is reported to the next locker by the robust mutex; an exception raised inside a locked section is caught
before the lock is released. Either way ``_recover_locked`` verifies the segment and repairs it before anyone else
reads it, so no half-made update is ever seen.
"""

from __future__ import annotations

from . import index, lru
from .arena import Arena, block_nbytes
from .codec import TAG_ARRAY, checksum, decode_array, decode_value, encode_key, encode_value, fingerprint
from .errors import ClosedError, CorruptionError, ShmCacheError, TooLargeError
from .layout import BLOCK_HEADER_NBYTES, EMPTY, MAX_BLOCK_NBYTES, NIL, SENTINEL, Geometry
from .layout.dtypes import (
    E_CHECK, E_FP, E_KEY_NBYTES, E_NEXT, E_OFF, E_SLOT, E_VAL_NBYTES, ENTRY_WORDS, H_CLEARS, H_DELETES, H_ENTRIES,
    H_EVICTIONS, H_FREE_HEAD, H_HITS, H_LOCK_OFF, H_MAX_ENTRIES, H_MAX_RETAINED, H_MISSES, H_PUTS, H_RECOVERIES,
    H_RETAINED, H_UNUSED_NEXT, H_UPDATES,
)
from .lock import SegmentLock, signals_deferred
from .segment import Segment, unlink_name
from .stats import CacheLimits, CacheStats, read_stats, reset_counters
from .verify import VerifyReport, check, repair

DEFAULT_CAPACITY_BYTES = 64 * 2**20
DEFAULT_MAX_ENTRIES = 65536
DEFAULT_LOCK_TIMEOUT = 10.0
_W = ENTRY_WORDS
_VALUE_START = BLOCK_HEADER_NBYTES  # a block is [header][value][key]


def _closed() -> ClosedError:
    return ClosedError("operation on a closed cache", what="use", hint="open a new SharedCache(name) to use it again")


class SharedCache:
    """A bounded LRU cache in POSIX shared memory that every process on the host can open by name.

    ``create=None`` attaches to the cache if it exists and creates it otherwise; ``True`` creates it or raises
    FileExistsError; ``False`` attaches or raises FileNotFoundError. ``capacity_bytes`` (default 64 MiB) bounds the
    encoded keys and values held, ``max_entries`` (default 65536) the number of entries; both are fixed at creation
    and are the highest limits ``set_limits`` accepts. When attaching, they may be omitted; if given, they must match.
    ``mode`` sets the permissions of a new segment (0o600: only this user). ``lock_timeout`` bounds the wait for a
    lock held by a live process; a dead holder is detected at once.

    :raises FileNotFoundError, FileExistsError: as ``create`` says.
    :raises ValueError: for invalid names, sizes or a mismatch with the existing cache's parameters.
    :raises OSError: when the shared memory cannot back the segment (errno ENOSPC, with what was asked and is free).
    :raises LayoutError: when the name holds something that is not a shmcache segment of this layout version.
    """

    _seg: Segment | None = None
    _closed = True

    def __init__(
        self,
        name: str,
        *,
        capacity_bytes: int | None = None,
        max_entries: int | None = None,
        create: bool | None = None,
        mode: int = 0o600,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        if create not in (None, True, False):
            raise ValueError(f"create must be None, True or False, got {create!r}")
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
            raise ValueError(f"mode must be a permission mode between 0 and 0o777, got {mode!r}")
        if not isinstance(lock_timeout, (int, float)) or not lock_timeout > 0:
            raise ValueError(f"lock_timeout must be a positive number of seconds, got {lock_timeout!r}")
        wanted = Geometry.for_capacity(
            DEFAULT_CAPACITY_BYTES if capacity_bytes is None else capacity_bytes,
            DEFAULT_MAX_ENTRIES if max_entries is None else max_entries,
        )
        seg = Segment(name, None if create is False else wanted, create, mode)
        try:
            found = seg.geometry
            for what, asked, have in (
                ("capacity_bytes", capacity_bytes, found.capacity_bytes),
                ("max_entries", max_entries, found.max_entries),
            ):
                if asked is not None and asked != have:
                    raise ValueError(f"cache {name!r} exists with {what}={have}, not {asked}; "
                                     f"omit {what} to attach to it as it is, or use another name")
            self._bind(seg, lock_timeout)
        except BaseException:
            seg.close()
            if seg.created:
                unlink_name(name)
            raise

    def _bind(self, seg: Segment, lock_timeout: float) -> None:
        g = seg.geometry
        self._seg = seg
        self._h = seg.header_words
        self._ix = seg.index_words
        self._ent = seg.entry_words
        self._arena = seg.arena
        self._mm = seg.mm
        self._base = g.arena_off
        self._mask = g.index_slots - 1
        self._capacity_bytes = g.capacity_bytes
        self._ring = Arena(seg.header_words, seg.entry_words, seg.mm, g.arena_off, g.arena_nbytes, g.entry_slots)
        self._lock = SegmentLock(seg.mm, H_LOCK_OFF, lock_timeout)
        self._addr = self._lock.address
        self._trylock = self._lock.trylock
        self._unlock = self._lock.unlock
        self._lock_timeout = lock_timeout
        self.name = seg.name
        self._closed = False

    # ------------------------------------------------------------------------------------------- locking

    def _acquire(self) -> None:
        rc = self._trylock(self._addr)
        if rc:
            self._wait(rc)

    def _wait(self, rc: int) -> None:
        """The lock was busy (or its holder died): wait for it, and repair what a dead holder left."""
        if self._lock.acquire_slow(rc):
            # The previous holder died holding the lock: repair before anyone reads what it left. Signals wait until
            # the repair is done: an interrupted repair would leave the mutex unrecoverable for every process.
            with signals_deferred():
                try:
                    self._recover_locked()
                except Exception:
                    self._reset_entries_locked()
                    self._h[H_RECOVERIES] += 1
                self._lock.mark_consistent()

    def _recover_locked(self, deep: bool = False) -> bool:
        """Verify the segment (``deep``: checksums too) and repair it if needed; True if anything was repaired."""
        if check(self._seg, deep=deep).ok:
            return False
        repair(self._seg)
        self._h[H_RECOVERIES] += 1
        return True

    def _fault_locked(self, exc: BaseException) -> None:
        """An operation failed with the lock held: put the segment right, then let the caller re-raise.

        Inside a locked section only shared data can fail (arguments were encoded and checked before locking), so
        any error other than TooLargeError means damage; an interrupt (Ctrl-C) may have cut an update in half.
        """
        if isinstance(exc, TooLargeError):
            return  # raised before anything was written
        with signals_deferred():
            try:
                self._recover_locked(deep=True)
            except Exception as inner:  # repair itself failed on garbage: start over with an empty cache
                self._reset_entries_locked()
                self._h[H_RECOVERIES] += 1
                raise CorruptionError(f"the cache was emptied after an unrepairable fault: {inner}",
                                      what="repair") from exc
        if isinstance(exc, Exception) and not isinstance(exc, ShmCacheError):
            raise CorruptionError(f"shared data failed a check and the cache was repaired: {exc!r}", what="access",
                                  hint="the operation can be retried") from exc

    # ------------------------------------------------------------------------------------------- the dict-like API

    def get(self, key, default=None):
        """The value cached for ``key``, or ``default``; a hit makes the entry the most recently used."""
        if self._closed:
            raise _closed()
        kb = encode_key(key)
        fp = fingerprint(kb)
        rc = self._trylock(self._addr)  # _acquire(), inlined on the hot path
        if rc:
            self._wait(rc)
        try:
            ent = self._ent
            e = index.find(self._ix, ent, self._mm, self._base, self._mask, fp, kb)
            if e == EMPTY:
                self._h[H_MISSES] += 1
                return default
            lru.move_to_front(ent, e)
            self._h[H_HITS] += 1
            b = e * _W
            v0 = self._base + ent[b + E_OFF] + _VALUE_START
            vlen = ent[b + E_VAL_NBYTES]
            check = ent[b + E_CHECK]
            if self._mm[v0] == TAG_ARRAY:
                view = self._arena[v0 - self._base : v0 - self._base + vlen]
                if checksum(view) != check:
                    raise CorruptionError(f"entry {e} failed its checksum", what="get")
                return decode_array(view)
            raw = self._mm[v0 : v0 + vlen]
        except BaseException as exc:
            self._fault_locked(exc)
            raise
        finally:
            self._unlock(self._addr)
        if checksum(raw) != check:
            self._fault_after(e)
        return decode_value(raw)

    def _fault_after(self, e: int):
        """A value copied out failed its checksum: repair under the lock, then report."""
        self._acquire()
        try:
            with signals_deferred():
                self._recover_locked(deep=True)
        finally:
            self._unlock(self._addr)
        raise CorruptionError(f"entry {e} failed its checksum; the cache was repaired", what="get",
                              hint="the operation can be retried")

    def put(self, key, value) -> None:
        """Store ``value`` under ``key`` as the most recently used entry, evicting least recently used entries as
        the limits require.

        :raises TypeError: if the key or value cannot be encoded (nothing changes).
        :raises TooLargeError: (a ValueError) if the entry exceeds ``max_retained_bytes`` (nothing is evicted).
        """
        if self._closed:
            raise _closed()
        kb = encode_key(key)
        vb = encode_value(value)
        fp = fingerprint(kb)
        check = checksum(vb)
        klen, vlen = len(kb), len(vb)
        size = klen + vlen
        nb = block_nbytes(size)
        if size > self._capacity_bytes or nb > MAX_BLOCK_NBYTES:
            raise self._too_large(size, self._capacity_bytes, "capacity_bytes")
        rc = self._trylock(self._addr)  # _acquire(), inlined on the hot path
        if rc:
            self._wait(rc)
        try:
            h, ent = self._h, self._ent
            if size > h[H_MAX_RETAINED]:
                raise self._too_large(size, h[H_MAX_RETAINED], "max_retained_bytes")
            old = index.find(self._ix, ent, self._mm, self._base, self._mask, fp, kb)
            if old != EMPTY:
                self._remove_locked(old)
                h[H_UPDATES] += 1
            if h[H_ENTRIES] >= h[H_MAX_ENTRIES] or h[H_RETAINED] + size > h[H_MAX_RETAINED]:
                self._evict_until_locked(1, size)
            e = self._take_slot_locked()
            off = self._ring.alloc(nb, e)
            v0 = self._base + off + _VALUE_START
            self._mm[v0 : v0 + vlen] = vb
            self._mm[v0 + vlen : v0 + size] = kb
            b = e * _W
            ent[b + E_FP] = fp
            ent[b + E_OFF] = off
            ent[b + E_KEY_NBYTES] = klen
            ent[b + E_VAL_NBYTES] = vlen
            ent[b + E_CHECK] = check
            index.insert(self._ix, ent, self._mask, fp, e)
            lru.push_front(ent, e)
            h[H_ENTRIES] += 1
            h[H_RETAINED] += size
            h[H_PUTS] += 1
        except BaseException as exc:
            self._fault_locked(exc)
            raise
        finally:
            self._unlock(self._addr)

    def _too_large(self, size: int, limit: int, name: str) -> TooLargeError:
        return TooLargeError(f"entry of {size} bytes (encoded key + value) can never fit: {name} is {limit}",
                             what="put", hint=f"raise {name} or store a smaller value")

    def delete(self, key) -> bool:
        """Remove ``key``; True if it was present."""
        if self._closed:
            raise _closed()
        kb = encode_key(key)
        fp = fingerprint(kb)
        self._acquire()
        try:
            e = index.find(self._ix, self._ent, self._mm, self._base, self._mask, fp, kb)
            if e == EMPTY:
                return False
            self._remove_locked(e)
            self._h[H_DELETES] += 1
            return True
        except BaseException as exc:
            self._fault_locked(exc)
            raise
        finally:
            self._unlock(self._addr)

    def __contains__(self, key) -> bool:
        """Whether ``key`` is cached; neither counts as a lookup nor changes the LRU order."""
        if self._closed:
            raise _closed()
        kb = encode_key(key)
        fp = fingerprint(kb)
        self._acquire()
        try:
            return index.find(self._ix, self._ent, self._mm, self._base, self._mask, fp, kb) != EMPTY
        except BaseException as exc:
            self._fault_locked(exc)
            raise
        finally:
            self._unlock(self._addr)

    _MISSING = object()

    def __getitem__(self, key):
        value = self.get(key, self._MISSING)
        if value is self._MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        self.put(key, value)

    def __delitem__(self, key) -> None:
        if not self.delete(key):
            raise KeyError(key)

    def __len__(self) -> int:
        if self._closed:
            raise _closed()
        return self._h[H_ENTRIES]  # one aligned word: a consistent read without the lock

    # ------------------------------------------------------------------------------------------- structure, locked

    def _remove_locked(self, e: int) -> None:
        h, ent = self._h, self._ent
        b = e * _W
        klen, vlen = ent[b + E_KEY_NBYTES], ent[b + E_VAL_NBYTES]
        index.remove(self._ix, ent, self._mask, ent[b + E_SLOT])
        lru.unlink(ent, e)
        self._ring.free(ent[b + E_OFF], block_nbytes(klen + vlen))
        ent[b + E_CHECK] = 0
        ent[b + E_NEXT] = h[H_FREE_HEAD]
        h[H_FREE_HEAD] = e
        h[H_ENTRIES] -= 1
        h[H_RETAINED] -= klen + vlen

    def _evict_until_locked(self, extra_entries: int, extra_bytes: int) -> None:
        """Evict least recently used entries until ``extra_entries`` more entries of ``extra_bytes`` more bytes fit
        the limits. Bounded by the table size, so damaged counters raise instead of looping."""
        h, ent = self._h, self._ent
        for _ in range(self._seg.geometry.entry_slots):
            if h[H_ENTRIES] + extra_entries <= h[H_MAX_ENTRIES] and h[H_RETAINED] + extra_bytes <= h[H_MAX_RETAINED]:
                return
            e = lru.tail(ent)
            if e == SENTINEL:
                break
            self._remove_locked(e)
            h[H_EVICTIONS] += 1
        raise CorruptionError("the header's counters disagree with the entries on the LRU list", what="evict")

    def _take_slot_locked(self) -> int:
        h = self._h
        e = h[H_FREE_HEAD]
        if e != NIL:
            h[H_FREE_HEAD] = self._ent[e * _W + E_NEXT]
            return e
        e = h[H_UNUSED_NEXT]
        h[H_UNUSED_NEXT] = e + 1
        return e

    def _reset_entries_locked(self) -> None:
        h = self._h
        _, index, entries = self._seg.arrays()
        # Zero the check word of every slot ever handed out, so none is mistaken for resident by a later repair.
        handed_out = h[H_UNUSED_NEXT] if 0 < h[H_UNUSED_NEXT] <= len(entries) else len(entries)
        entries["check"][:handed_out] = 0
        index["entry"] = EMPTY
        lru.reset(self._ent)
        self._ring.reset()
        h[H_ENTRIES] = h[H_RETAINED] = 0
        h[H_FREE_HEAD] = NIL
        h[H_UNUSED_NEXT] = 1

    # ------------------------------------------------------------------------------------------- whole-cache operations

    def clear(self) -> None:
        """Drop every entry and reset the counters (``clears`` counts this call; ``recoveries`` is kept)."""
        if self._closed:
            raise _closed()
        self._acquire()
        try:
            self._reset_entries_locked()
            reset_counters(self._h)
            self._h[H_CLEARS] += 1
        except BaseException as exc:
            self._fault_locked(exc)
            raise
        finally:
            self._unlock(self._addr)

    def stats(self) -> CacheStats:
        """A consistent snapshot of the global counters."""
        if self._closed:
            raise _closed()
        self._acquire()
        try:
            return read_stats(self._h)
        finally:
            self._unlock(self._addr)

    def limits(self) -> CacheLimits:
        """The limits in force."""
        s = self.stats()
        return CacheLimits(max_entries=s.max_entries, max_retained_bytes=s.max_retained_bytes)

    def set_limits(self, limits: CacheLimits) -> None:
        """Change the limits for every process and evict at once to meet them.

        :raises ValueError: if a limit exceeds the capacity the cache was created with.
        """
        if self._closed:
            raise _closed()
        if not isinstance(limits, CacheLimits):
            raise TypeError(f"set_limits takes a CacheLimits, got {type(limits).__name__}")
        g = self._seg.geometry
        if limits.max_entries > g.max_entries or limits.max_retained_bytes > g.capacity_bytes:
            raise ValueError(
                f"limits {limits} exceed the capacity of cache {self.name!r} (max_entries={g.max_entries}, "
                f"capacity_bytes={g.capacity_bytes}); capacity is fixed at creation: recreate the cache to raise it"
            )
        self._acquire()
        try:
            h = self._h
            h[H_MAX_ENTRIES] = limits.max_entries
            h[H_MAX_RETAINED] = limits.max_retained_bytes
            self._evict_until_locked(0, 0)
        except BaseException as exc:
            self._fault_locked(exc)
            raise
        finally:
            self._unlock(self._addr)

    def verify(self, *, deep: bool = True, repair_damage: bool = False) -> VerifyReport:
        """Check every invariant of the segment (``deep`` also re-hashes every stored key and value); with
        ``repair_damage`` a failing segment is repaired before returning the report of what was found."""
        if self._closed:
            raise _closed()
        self._acquire()
        try:
            report = check(self._seg, deep=deep)
            if not report.ok and repair_damage:
                repair(self._seg)
                self._h[H_RECOVERIES] += 1
            return report
        finally:
            self._unlock(self._addr)

    # ------------------------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Release this process's handle (idempotent). The cache lives on for the other processes."""
        if self._closed:
            return
        self._closed = True
        self._ring.close()
        self._lock.close()
        for attr in ("_h", "_ix", "_ent", "_arena", "_mm", "_ring", "_trylock", "_unlock"):
            self.__dict__.pop(attr, None)
        self._seg.close()

    def unlink(self) -> None:
        """Remove the cache from the system, once for everyone; processes that have it open keep working on their
        mapping until they close it, and a later create under the same name gets a fresh cache."""
        unlink_name(self.name)

    @staticmethod
    def unlink_name(name: str) -> None:
        """Remove the named cache without opening it. :raises FileNotFoundError: if there is none."""
        unlink_name(name)

    def __enter__(self) -> SharedCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        # Pickled by name: a spawned or forkserver worker re-attaches to the same segment.
        return (_reattach, (self.name, self._lock_timeout))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} entries"
        return f"<SharedCache {getattr(self, 'name', '?')!r} {state}>"


def _reattach(name: str, lock_timeout: float) -> SharedCache:
    return SharedCache(name, create=False, lock_timeout=lock_timeout)
