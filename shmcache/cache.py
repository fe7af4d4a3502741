"""SharedCache: one bounded LRU cache in shared memory, used the same way from every process on the host.

This is the only module that takes the cache lock. Keys and values are encoded and hashed before the lock is taken
and (arrays aside) decoded after it is released, so the lock is held only for the index probe, the list and counter
updates and the copy of the bytes. Methods whose name ends in ``_locked`` must be called with the lock held.

Every operation runs the same protocol: take the lock inside ``try`` (so that an exception raised at any bytecode
still reaches ``finally``), check the closed flag and the ``dirty`` word under the lock, set ``dirty`` before the
first write of an update and clear it after the last, and unlock in ``finally`` -- an unlock by a thread that does
not hold the lock is refused by the error-checking mutex (EPERM) and changes nothing.

Crash window: a process can die, or an exception (Ctrl-C) can cut an update short, between any two writes. A dead
holder is reported to the next locker by the robust mutex, which marks it consistent at once; ``dirty`` then says
whether the dead holder left an update half-done. Whoever locks and finds ``dirty`` set verifies and repairs the
segment before reading it (``_repair_locked``), so no half-made update is ever seen.
"""

from __future__ import annotations

import errno
import math
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import numpy as np

from . import flight, index, lru, memo, ofd
from .codec import (
    _MASK63, MALFORMED, TAG_ARRAY, TAG_BYTES, TAG_TENSOR, EncodedKey, _xxh, array_checksum, body_checksum, copy_array,
    decode_body, encode_key, encode_parts, fingerprint,
)
from .errors import ClosedError, CorruptionError, KindsFullError, PinnedError, ShmCacheError, TooLargeError
from . import kinds
from .kinds import KindView
from .layout import BLOCK_ALIGN, BLOCK_HEADER_NBYTES, EMPTY, MAX_BLOCK_NBYTES, MAX_TTL_NS, SENTINEL, Geometry
from .layout.dtypes import (
    E_CHECK, E_KEY_NBYTES, E_NEXT, E_OFF, E_PREV, E_VAL_NBYTES, ENTRY_WORDS, H_CLEARS, H_COMPUTATIONS,
    H_DEFAULT_TTL, H_DELETES, H_DIRTY, H_ENTRIES, H_EXPIRED, H_HITS, H_MAX_ENTRIES, H_MAX_RETAINED, H_MISSES,
    H_LOCK_OFF, H_NEXT_EXPIRY, H_PUTS, H_RECOVERIES, H_RETAINED, H_TAKEOVERS, H_UNUSED_NEXT, H_UPDATES, H_WAITS,
    H_WRITING,
)
from .lock import KIND_OFF, MUTEX_KIND_WORD, Damaged, Reentered, SegmentLock, Unrecoverable, signals_deferred
from .lock import hot_trylock as _trylock
from .lock import hot_unlock as _unlock
from .mapping import MISSING, LocalMapping
from .segment import Segment, unlink_name
from .stats import CacheLimits, CacheStats, read_stats, reset_counters
from .table import Table
from .trust import Trust
from .verify import VerifyReport, check, header_problems, repair
from .view import Pin, PinDescriptions, View

if TYPE_CHECKING:
    from .memo import Memoized

DEFAULT_CAPACITY_BYTES = 64 * 2**20
DEFAULT_MAX_ENTRIES = 65536
DEFAULT_LOCK_TIMEOUT = 10.0
DEFAULT_ATTACH_TIMEOUT = 10.0  # seconds an attacher waits for a segment that another process is still creating
_W = ENTRY_WORDS
# The header word holding the mutex's kind (and its never-changing spin and elision counts): compared before every
# trylock, because glibc asserts, and aborts the process, inside trylock on some damaged kinds. A damaged word is
# answered as a busy lock (EBUSY), and the waiting path (lock.py) judges and repairs it. Read through the lock page's
# own words (``Segment.lock_words``), which a concurrent close() never releases. Before every unlock too: a word
# damaged while this thread held the lock is put back (glibc's unlock of some kinds asserts as well), and the dirty
# word (also on that page) has the next holder repair the segment. Written inline, without a call: a call is a point
# where an interrupt can be raised, and nothing may come between the finally and the unlock.
_H_MUTEX_KIND = (H_LOCK_OFF + KIND_OFF) // 8
_EBUSY = errno.EBUSY
_VALUE_START = BLOCK_HEADER_NBYTES  # a block is [header][value][key]
_BLOCK_PAD = BLOCK_HEADER_NBYTES + BLOCK_ALIGN - 1
# What damaged shared data makes a locked section raise; anything else (Ctrl-C, an exception from a signal handler)
# is an interruption, which needs a repair only if it cut an update short (the dirty word says).
_DAMAGE = (CorruptionError, ValueError) + MALFORMED
_REPAIRING = 2  # the dirty word's value while a repair runs (1: an ordinary update is under way)
_VIEWABLE = (TAG_ARRAY, TAG_BYTES, TAG_TENSOR)  # the value tags view() serves
MAX_TTL = MAX_TTL_NS / 1e9  # seconds (73 years): clock + ttl stays below 2**63 ns for any CLOCK_MONOTONIC reading
_UNVIEWABLE = object()
P = ParamSpec("P")
R = TypeVar("R")
_SC = TypeVar("_SC", bound="SharedCache")


def ttl_ns(ttl: float) -> int:
    """A time to live in seconds as ns (0: never expires); raises ValueError or TypeError for anything else."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"ttl must be a number of seconds, got {type(ttl).__name__}")
    if not 0 <= ttl <= MAX_TTL:
        raise ValueError(f"ttl must be a number of seconds from 0 (never expires) to {MAX_TTL:.0f}, got {ttl!r}")
    return max(1, round(ttl * 1e9)) if ttl else 0


def seconds(name: str, value, *, none: bool = False, zero: bool = False):
    """``value``, a duration in seconds given as parameter ``name``, checked: a finite number above 0 (from 0 with
    ``zero``), or None where ``none`` allows it (no bound). NaN and the infinities are refused: an infinite wait is
    asked for with None where one is allowed, never with a number that later arithmetic cannot take.

    :raises ValueError: naming the parameter, for anything else.
    """
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not (
            value >= 0 if zero else value > 0):
        allowed = ("from 0" if zero else "above 0") + (", or None for no bound" if none else "")
        raise ValueError(f"{name} must be a finite number of seconds {allowed}; got {value!r}")
    return value


def _closed() -> ClosedError:
    return ClosedError("operation on a closed cache", what="use", hint="open a new SharedCache(name) to use it again")


class SharedCache(LocalMapping):
    """A bounded LRU cache in POSIX shared memory that every process on the host can open by name.

    ``create=None`` attaches to the cache if it exists and creates it otherwise; ``True`` creates it or raises
    FileExistsError; ``False`` attaches or raises FileNotFoundError. ``capacity_bytes`` (default 64 MiB) bounds the
    encoded keys and values held, ``max_entries`` (default 65536) the number of entries; both are fixed at creation
    and are the highest limits ``set_limits`` accepts. When attaching, they may be omitted; if given, they must match.
    ``lock_timeout`` bounds the wait for a lock held by a live process (a finite number of seconds: a stuck holder
    must make the others fail, not hang them); a dead holder is detected at once.
    ``attach_timeout`` bounds the wait for a segment that another process is still creating (then AttachTimeout,
    or LayoutError if it was never initialised).
    ``default_ttl`` (seconds; creation only, like the capacity) is the time to live of entries stored without a
    ``ttl``; None or 0: they never expire.

    Who may share it. The file at the name is checked before a byte of it is read or written, whether this call
    creates it or attaches: it must be a regular file (a symlink is never followed), owned by this process's
    effective uid, with permissions within ``mode``; anything else raises OwnershipError (root is not special). So
    another user can neither make the name first for this cache to be initialised in, nor plant a pre-filled one.
    ``mode`` (default 0o600: this user only) is both the permissions of a segment this call creates and the broadest
    an existing one may have. Deliberate sharing between users is opted into on both sides: the creator passes
    ``mode=0o660`` (and ``group=``, a gid or group name, to give the new segment that group rather than its own);
    the other users pass the same ``mode`` (and ``group``: then no other group may have access) and
    ``trust_owner=`` (a uid, a user name, or an iterable of them): the segment may then also be owned by one of
    those. A trusted owner, and anyone the mode lets write, can change every value this handle reads.

    Expiry times are CLOCK_MONOTONIC readings, which every process of the host shares and which never jump with
    the wall clock. They mean nothing after a reboot, but the segment (in a tmpfs) does not survive one either.
    ``clock`` replaces the clock (a function returning ns) for this handle only: for deterministic tests.

    :raises FileNotFoundError, FileExistsError: as ``create`` says.
    :raises ValueError: for invalid names, sizes or a mismatch with the existing cache's parameters.
    :raises OSError: when the shared memory cannot back the segment (errno ENOSPC, with what was asked and is free).
    :raises LayoutError: when the name holds something that is not a shmcache segment of this layout version.
    :raises OwnershipError: when the file at the name is another user's (and not trusted), more open than ``mode``,
        or not a regular file: nothing of it was read or written.
    :raises AttachTimeout: (a TimeoutError) when another process is still creating the segment after
        ``attach_timeout`` seconds.
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
        default_ttl: float | None = None,
        clock: Callable[[], int] | None = None,
        trust_owner: int | str | Iterable[int | str] | None = None,
        group: int | str | None = None,
        attach_timeout: float = DEFAULT_ATTACH_TIMEOUT,
    ) -> None:
        if create not in (None, True, False):
            raise ValueError(f"create must be None, True or False, got {create!r}")
        trust = Trust.of(mode, trust_owner, group)
        seconds("lock_timeout", lock_timeout)
        seconds("attach_timeout", attach_timeout)
        wanted = Geometry.for_capacity(
            DEFAULT_CAPACITY_BYTES if capacity_bytes is None else capacity_bytes,
            DEFAULT_MAX_ENTRIES if max_entries is None else max_entries,
        )
        default_ttl_ns = 0 if default_ttl is None else ttl_ns(default_ttl)
        seg = Segment(name, None if create is False else wanted, create, trust, default_ttl_ns, attach_timeout)
        try:
            found = seg.geometry
            for what, asked, have in (
                ("capacity_bytes", capacity_bytes, found.capacity_bytes),
                ("max_entries", max_entries, found.max_entries),
                ("default_ttl", None if default_ttl is None else default_ttl_ns / 1e9,
                 seg.header_words[H_DEFAULT_TTL] / 1e9),
            ):
                if asked is not None and asked != have:
                    raise ValueError(f"cache {name!r} exists with {what}={have}, not {asked}; "
                                     f"omit {what} to attach to it as it is, or use another name")
            self._bind(seg, lock_timeout, clock or time.monotonic_ns)
        except BaseException:
            seg.close()
            if seg.initialised_here:  # made with our parameters; a segment another process set up is theirs
                unlink_name(name)
            raise

    def _bind(self, seg: Segment, lock_timeout: float, clock) -> None:
        g = seg.geometry
        self._seg = seg
        self._h = seg.header_words
        self._ix = seg.index_words
        self._ent = seg.entry_words
        self._exp = seg.expires_words
        self._clock = clock
        self._arena = seg.arena
        self._mm = seg.mm
        self._base = g.arena_off
        self._mask = g.index_slots - 1
        self._capacity_bytes = g.capacity_bytes
        self._table = Table(seg, clock)
        self._pins = PinDescriptions(seg.fd)
        self._lock = SegmentLock(seg.lock_address, lock_timeout, os.fstat(seg.fd).st_ino)
        self._addr = self._lock.handle
        self._lockw = seg.lock_words
        self._trylock = _trylock
        self._unlock = _unlock
        self._lock_timeout = lock_timeout
        self.name = seg.name
        self._closed = False
        # Why here: a mutex of a damaged kind that nobody holds may still let the fast path's trylock through (a
        # waiter would find the damage, a lone caller never), so each attacher looks once.
        if self._lock.kind_damaged() and not self._lock.word():
            self._lock.reinit_damaged(seg.fd, self._mark_dirty)

    # ------------------------------------------------------------------------------------------- locking
    # The pattern of every call (see the module docstring), written once in ``_locked``; get and put inline it, and
    # close() varies it (it must mark the handle closed even when the lock cannot be had):
    #     addr = self._addr
    #     try:
    #         addr = self._enter()
    #         self._admit(addr)
    #         ...
    #     except BaseException as exc:
    #         self._fault(exc, addr)
    #         raise
    #     finally:
    #         self._unlock(addr)
    # ``addr`` is the handle to release: the real lock, or a private mutex when this thread re-entered the cache and
    # must leave the lock to the call that holds it.

    def _enter(self):
        """Take the lock; returns the handle the caller releases (see ``_wait``). Follow with ``_admit``."""
        rc = self._trylock(self._addr) if self._lockw[_H_MUTEX_KIND] == MUTEX_KIND_WORD else _EBUSY
        return self._wait(rc) if rc else self._addr

    def _locked(self, fn, *args):
        """``fn(*args)`` run under the lock, with the protocol above: every operation but the inlined get and put
        goes through here. Methods meant to be ``fn`` end in ``_locked``."""
        addr = self._addr
        try:
            addr = self._enter()
            self._admit(addr)
            return fn(*args)
        except BaseException as exc:
            self._fault(exc, addr)
            raise
        finally:
            if self._lockw[_H_MUTEX_KIND] != MUTEX_KIND_WORD and addr is self._addr:  # see _H_MUTEX_KIND
                self._lockw[_H_MUTEX_KIND] = MUTEX_KIND_WORD
                self._lockw[H_DIRTY] = 1
            self._unlock(addr)

    def _admit(self, addr) -> None:
        """After the lock is taken: refuse a re-entered call or a closed handle, repair what an update left half-done.
        The hot paths call it only when one of the three applies."""
        if addr is not self._addr:
            raise Reentered()
        if self._closed:
            raise _closed()
        if self._h[H_DIRTY]:
            self._repair_locked()

    def _wait(self, rc: int):
        """The lock was busy, or its holder died: wait for it (bounded by lock_timeout). Returns the lock's handle;
        when this thread already holds the lock, the private mutex's handle instead, and the caller raises
        Reentered."""
        for _ in range(3):
            try:
                if self._lock.acquire_slow(rc, self._repairing):
                    # The holder died. Consistent at once: what it left half-done is flagged by the dirty word.
                    self._lock.mark_consistent()
                return self._addr
            except Reentered:
                return self._lock.private_handle
            except (Unrecoverable, Damaged) as exc:
                if self._closed:
                    raise _closed() from None
                if isinstance(exc, Unrecoverable):
                    self._lock.reinit_unrecoverable(self._seg.fd)
                elif not self._lock.reinit_damaged(self._seg.fd, self._mark_dirty) and exc.fallback is not None \
                        and self._lock.word() == exc.word:  # not repaired by another process meanwhile either
                    raise exc.fallback from None
                rc = self._lock.try_checked()
                if rc == 0:
                    return self._addr
        raise CorruptionError("the cache lock stays unrecoverable or damaged", what="lock",
                              hint="remove the cache with `shmcache rm NAME` and recreate it")

    def _mark_dirty(self) -> None:
        """Make the next holder verify and repair the segment (a damaged lock is being re-initialised)."""
        self._h[H_DIRTY] = 1

    def _repair_locked(self, deep: bool = False) -> None:
        """Verify the segment (``deep``: checksums too) and repair what fails; empty the cache if even that fails."""
        h = self._h
        with signals_deferred():
            h[H_DIRTY] = _REPAIRING  # Crash window: dying in here leaves the repair to the next locker.
            try:
                if not check(self._seg, deep=deep).ok:
                    repair(self._seg)
                    h[H_RECOVERIES] += 1
            except Exception:  # repair itself failed on garbage: start over with an empty cache
                self._table.reset()
                h[H_RECOVERIES] += 1
            h[H_DIRTY] = 0

    def _repairing(self) -> bool:
        """Whether the lock's holder is repairing the segment (read without the lock: one word, for patience only)."""
        try:
            return not self._closed and self._h[H_DIRTY] == _REPAIRING
        except ValueError:  # closed meanwhile by another thread
            return False

    def _fault(self, exc: BaseException, addr) -> None:
        """A call raised. If it holds the lock, put the segment right before ``finally`` releases it."""
        if addr is not self._addr:
            return  # this thread re-entered: the lock belongs to the call it interrupted
        if not self._lock.owned():
            return  # raised before the lock was taken (timeout, bad handle...): nothing was touched
        self._lock.mark_consistent()  # in case it was taken from a dead holder; refused (EINVAL) otherwise
        if self._closed:
            return
        damage = isinstance(exc, _DAMAGE) and (isinstance(exc, CorruptionError) or not isinstance(exc, ShmCacheError))
        if damage or self._h[H_DIRTY]:
            self._repair_locked(deep=damage)
        if damage and not isinstance(exc, CorruptionError):
            raise CorruptionError(f"shared data failed a check and the cache was repaired: {exc!r}", what="access",
                                  hint="the operation can be retried") from exc

    # ------------------------------------------------------------------------------------------- the dict-like API

    def get(self, key: Any, default: Any = None) -> Any:
        """The value cached for ``key``, or ``default``; a hit makes the entry the most recently used."""
        # An EncodedKey is key bytes already encoded, for TieredCache's local hits, which would otherwise pay for
        # an object to carry them (and no other method takes one: encode_key refuses it).
        # The hot path, written out in one function: encode_key, fingerprint, index.find's first probe and
        # lru.move_to_front are inlined (each call costs as much as the work it does); the other paths use them.
        if type(key) is str:
            try:
                kb = key.encode()
            except UnicodeEncodeError:
                kb = encode_key(key)  # raises the TypeError
        elif type(key) is EncodedKey:
            kb = key
        else:
            kb = encode_key(key)
        fp = _xxh(kb) & _MASK63
        # Whatever needs no lock is done before taking it: the lock is held for as little as possible. (The views
        # read here may be released by a concurrent close(); the closed check under the lock comes before any use.)
        w = (fp & self._mask) << 1
        klen = len(kb)
        h, ix, ent, mm, base = self._h, self._ix, self._ent, self._mm, self._base
        addr = self._addr
        try:
            rc = _trylock(addr) if self._lockw[_H_MUTEX_KIND] == MUTEX_KIND_WORD else _EBUSY  # _enter(), _admit()
            if rc:
                addr = self._wait(rc)
            if addr is not self._addr or self._closed or h[H_DIRTY]:
                self._admit(addr)
            e = ix[w + 1]
            if e == EMPTY:
                h[H_MISSES] += 1
                return default
            b = e * _W
            v0 = base + ent[b + E_OFF] + _VALUE_START  # mapping offset of the value; the key follows it
            vlen = ent[b + E_VAL_NBYTES]
            k0 = v0 + vlen
            if ix[w] != fp or ent[b + E_KEY_NBYTES] != klen or mm[k0 : k0 + klen] != kb:
                e = index.find_rest(ix, ent, mm, base, self._mask, fp, kb)
                if e == EMPTY:
                    h[H_MISSES] += 1
                    return default
                b = e * _W
                v0 = base + ent[b + E_OFF] + _VALUE_START
                vlen = ent[b + E_VAL_NBYTES]
            x = self._exp[e]
            if x and x <= self._clock():
                self._lapse_locked(e)
                h[H_MISSES] += 1
                return default
            p = ent[b + E_PREV]
            if p != SENTINEL:  # not already the most recent: move it to the front
                h[H_DIRTY] = 1
                n = ent[b + E_NEXT]
                ent[p * _W + E_NEXT] = n
                ent[n * _W + E_PREV] = p
                first = ent[E_NEXT]
                ent[b + E_PREV] = SENTINEL
                ent[b + E_NEXT] = first
                ent[first * _W + E_PREV] = e
                ent[E_NEXT] = e
                h[H_DIRTY] = 0
            h[H_HITS] += 1
            check = ent[b + E_CHECK]
            tag = mm[v0]
            if tag == TAG_ARRAY:
                # Arrays are copied under the lock straight into the array returned (one copy), and checked after.
                voff = v0 - base
                body, head = copy_array(self._arena[voff : voff + vlen])
            else:
                body = mm[v0 + 1 : v0 + vlen]
        except BaseException as exc:
            self._fault(exc, addr)
            raise
        finally:
            if self._lockw[_H_MUTEX_KIND] != MUTEX_KIND_WORD and addr is self._addr:  # see _H_MUTEX_KIND
                self._lockw[_H_MUTEX_KIND] = MUTEX_KIND_WORD
                self._lockw[H_DIRTY] = 1
            _unlock(addr)
        if tag == TAG_ARRAY:
            if array_checksum(head, body) != check:
                self._checksum_failed(e)
            return body
        if (_xxh(body, tag) & _MASK63) | 1 != check:
            self._checksum_failed(e)
        try:
            return decode_body(tag, body)
        except ValueError as exc:
            self._undecodable(exc)

    def _undecodable(self, exc: ValueError):
        """A value passed its checksum but does not decode: it was stored so. Drop every such entry (a deep repair
        decodes each value), then report."""
        self._locked(self._repair_locked, True)
        raise CorruptionError(f"a stored value does not decode and was dropped: {exc}", what="get",
                              hint="the operation can be retried; the value must be stored again") from exc

    def _checksum_failed(self, e: int):
        """A value copied out failed its checksum: count the lookup as a miss, repair, then report."""
        self._locked(self._checksum_failed_locked)
        raise CorruptionError(f"entry {e} failed its checksum and was dropped", what="get",
                              hint="the operation can be retried")

    def _checksum_failed_locked(self) -> None:
        self._h[H_HITS] -= 1
        self._h[H_MISSES] += 1
        self._repair_locked(deep=True)

    def _lapse_locked(self, e: int, to_insert: bool = False) -> None:
        """Resident entry ``e`` has expired: drop it and count it in ``expired``. A view may still pin it: then it
        stays (it reads as absent), unless the caller is about to insert its key (``to_insert``), which raises
        PinnedError: the key must never be in the index twice."""
        h, table = self._h, self._table
        if table.pins[e] and table.pinned(e):
            if to_insert:
                table.refuse_pinned(e, "replaced")
            return
        h[H_DIRTY] = 1
        table.remove(e)
        h[H_EXPIRED] += 1
        h[H_DIRTY] = 0

    def _find_live(self, kb: bytes, fp: int, to_insert: bool = False) -> int:
        """The entry slot of key bytes ``kb`` (fingerprint ``fp``), or EMPTY, an expired entry being dropped and
        reported absent (lock held); ``to_insert``: see ``_lapse_locked``."""
        e = index.find(self._ix, self._ent, self._mm, self._base, self._mask, fp, kb)
        if e != EMPTY and self._exp[e] and self._table.expired(e):
            self._lapse_locked(e, to_insert)
            return EMPTY
        return e

    def _expires_locked(self, ttl) -> int:
        """The expiry time of an entry stored now with ``ttl`` (ns, already checked; None: the default)."""
        if ttl is None:
            ttl = self._h[H_DEFAULT_TTL]
            if not 0 <= ttl <= MAX_TTL_NS:
                raise CorruptionError(f"the default time to live is {ttl} ns, out of range", what="put")
        return self._clock() + ttl if ttl else 0

    def put(self, key: Any, value: Any, ttl: float | None = None) -> None:
        """Store ``value`` under ``key`` as the most recently used entry, evicting least recently used entries as
        the limits require (expired ones first). ``ttl``: seconds until the entry expires (0: never; None: the
        cache's ``default_ttl``).

        :raises TypeError: if the key or value cannot be encoded (nothing changes).
        :raises TooLargeError: (a ValueError) if the entry exceeds ``max_retained_bytes`` (nothing is evicted).
        :raises PinnedError: if an open view pins the key's entry, or the room needed is pinned.
        """
        kb, tag, body, fp, check, size, nb = self._encode(key, value)
        if ttl is not None:
            ttl = ttl_ns(ttl)
        addr = self._addr
        try:
            h = self._h
            rc = _trylock(addr) if self._lockw[_H_MUTEX_KIND] == MUTEX_KIND_WORD else _EBUSY  # _enter(), _admit()
            if rc:
                addr = self._wait(rc)
            if addr is not self._addr or self._closed or h[H_DIRTY]:
                self._admit(addr)
            if ttl is None:  # _expires_locked, inlined
                ttl = h[H_DEFAULT_TTL]
                if not 0 <= ttl <= MAX_TTL_NS:  # damaged (every put would expire at once): repaired, then used
                    self._repair_locked()
                    ttl = h[H_DEFAULT_TTL]
            old = index.find(self._ix, self._ent, self._mm, self._base, self._mask, fp, kb)  # _find_live, inlined
            if old != EMPTY and self._exp[old] and self._table.expired(old):
                self._lapse_locked(old, True)
                old = EMPTY
            self._store_locked(old, kb, tag, body, fp, check, size, nb, self._clock() + ttl if ttl else 0)
        except BaseException as exc:
            self._fault(exc, addr)
            raise
        finally:
            if self._lockw[_H_MUTEX_KIND] != MUTEX_KIND_WORD and addr is self._addr:  # see _H_MUTEX_KIND
                self._lockw[_H_MUTEX_KIND] = MUTEX_KIND_WORD
                self._lockw[H_DIRTY] = 1
            _unlock(addr)

    def _encode(self, key, value, kb: bytes | None = None, parts: tuple | None = None) -> tuple:
        """Everything a store needs that can be computed without the lock: (key bytes, value tag, value body,
        fingerprint, checksum, payload size, block size); ``kb``: the key already encoded; ``parts``: the value
        already encoded, as (tag, body). Raises TypeError or TooLargeError; nothing has changed."""
        if kb is None:
            kb = encode_key(key)
        tag, body = encode_parts(value) if parts is None else parts  # one function: the put path pays no call
        size = len(kb) + len(body) + 1
        nb = (size + _BLOCK_PAD) & -BLOCK_ALIGN  # arena.block_nbytes, inlined
        if size > self._capacity_bytes or nb > MAX_BLOCK_NBYTES:
            raise self._too_large(size, self._capacity_bytes, "capacity_bytes")
        return kb, tag, body, _xxh(kb) & _MASK63, (_xxh(body, tag) & _MASK63) | 1, size, nb

    def _store_locked(self, old: int, kb: bytes, tag: int, body: bytes, fp: int, check: int, size: int,
                      nb: int, expires: int, version: int = 0) -> None:
        """Store an encoded entry as the most recent, expiring at ``expires`` (0: never), with ``version`` (0: the
        next of the version clock); ``old`` is the key's resident entry (expired or not), or EMPTY.

        :raises TooLargeError: if ``size`` exceeds the byte limit in force (nothing changes).
        :raises PinnedError: if ``old`` is pinned (nothing changes), or the room needed is.
        """
        h, table = self._h, self._table
        if size > h[H_MAX_RETAINED]:
            raise self._too_large(size, h[H_MAX_RETAINED], "max_retained_bytes")
        if old != EMPTY and table.pins[old]:
            table.refuse_pinned(old, "replaced")
        h[H_DIRTY] = 1
        if old != EMPTY:
            h[H_UPDATES] += 1
            if not table.overwrite(old, kb, tag, body, check, nb, expires, version):
                table.remove(old)
                old = EMPTY
        if old == EMPTY:
            try:
                if h[H_ENTRIES] >= h[H_MAX_ENTRIES] or h[H_RETAINED] + size > h[H_MAX_RETAINED]:
                    table.evict_until(1, size)
                while True:
                    try:
                        table.insert(kb, tag, body, fp, check, nb, expires, version)
                        break
                    except PinnedError:
                        # Pinned blocks split the free space: evicting more (what is not pinned) may join it.
                        if not table.evict_one():
                            raise
            except PinnedError:
                # Refused with every structure consistent (the evictions done stand): no repair is needed.
                h[H_WRITING] = 0
                h[H_DIRTY] = 0
                raise
        h[H_PUTS] += 1
        h[H_WRITING] = 0
        h[H_DIRTY] = 0

    def _too_large(self, size: int, limit: int, name: str) -> TooLargeError:
        return TooLargeError(f"entry of {size} bytes (encoded key + value) can never fit: {name} is {limit}",
                             what="put", hint=f"raise {name} or store a smaller value")

    def delete(self, key: Any) -> bool:
        """Remove ``key``; True if it was present."""
        kb = encode_key(key)
        return self._locked(self._delete_locked, kb, fingerprint(kb))

    def _delete_locked(self, kb: bytes, fp: int) -> bool:
        e = self._find_live(kb, fp)
        if e == EMPTY:
            return False
        self._table.refuse_pinned(e, "deleted")
        self._h[H_DIRTY] = 1
        self._table.remove(e)
        self._h[H_DELETES] += 1
        self._h[H_DIRTY] = 0
        return True

    # ------------------------------------------------------------------------------------------- atomic operations
    # Each runs under one hold of the lock, so it is indivisible across processes: what it reads is what it changes.

    def add(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """Store ``value`` only if ``key`` is absent (or expired); True if it was stored (memcached ``add``, APCu
        ``apcu_add``, diskcache ``add``)."""
        return self._store_if(key, value, ttl, present=False)

    def replace(self, key: Any, value: Any, ttl: float | None = None) -> bool:
        """Store ``value`` only if ``key`` is present; True if it was stored (memcached ``replace``)."""
        return self._store_if(key, value, ttl, present=True)

    def _store_if(self, key, value, ttl, *, present: bool, version: int | None = None) -> bool:
        encoded = self._encode(key, value)
        return self._locked(self._store_if_locked, present, version, None if ttl is None else ttl_ns(ttl), *encoded)

    def _store_if_locked(self, present: bool, version: int | None, ttl, kb: bytes, tag: int, body: bytes, fp: int,
                         check: int, size: int, nb: int) -> bool:
        old = self._find_live(kb, fp, not present)
        if (old != EMPTY) != present or (version is not None and self._table.ver[old] != version):
            if size > self._h[H_MAX_RETAINED]:  # refused as a put would be, whether or not the key is present
                raise self._too_large(size, self._h[H_MAX_RETAINED], "max_retained_bytes")
            return False
        self._store_locked(old, kb, tag, body, fp, check, size, nb, self._expires_locked(ttl))
        return True

    def get_with_version(self, key: Any, default: Any = None) -> tuple[Any, int | None]:
        """``(value, version)`` for ``key``, or ``(default, None)`` if it is absent; the version changes with every
        store of the key and is what ``cas`` compares (memcached ``gets``)."""
        kb = encode_key(key)
        found = self._locked(self._get_with_version_locked, kb, fingerprint(kb))
        if found is None:
            return default, None
        tag, body, version = found
        try:
            return decode_body(tag, body), version
        except ValueError as exc:
            self._undecodable(exc)

    def _get_with_version_locked(self, kb: bytes, fp: int):
        h = self._h
        e = self._find_live(kb, fp)
        if e == EMPTY:
            h[H_MISSES] += 1
            return None
        tag, body = self._body_locked(e)
        h[H_DIRTY] = 1
        lru.move_to_front(self._ent, e)
        h[H_HITS] += 1
        h[H_DIRTY] = 0
        return tag, body, self._table.ver[e]

    def cas(self, key: Any, value: Any, version: int, ttl: float | None = None) -> bool:
        """Store ``value`` only if ``key``'s entry still has ``version`` (from ``get_with_version``): nobody stored
        the key in between. True if stored; False if the key changed, expired or went (memcached ``cas``)."""
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version must be an int from get_with_version, got {version!r}")
        return self._store_if(key, value, ttl, present=True, version=version)

    def touch(self, key: Any, ttl: float | None = None) -> bool:
        """Give ``key`` a new time to live from now (0: never expires; None: the cache's default), without
        changing its value, version or place in the LRU order; True if the key was present (memcached ``touch``,
        diskcache ``touch``)."""
        kb = encode_key(key)
        return self._locked(self._touch_locked, kb, fingerprint(kb), None if ttl is None else ttl_ns(ttl))

    def _touch_locked(self, kb: bytes, fp: int, ttl) -> bool:
        e = self._find_live(kb, fp)
        if e == EMPTY:
            return False
        expires = self._expires_locked(ttl)
        h = self._h
        # Ordering: next_expiry (a lower bound) is lowered before the entry's expiry is, so that dying between the
        # two writes leaves it a bound still; neither write needs the dirty word.
        if expires and expires < h[H_NEXT_EXPIRY]:
            h[H_NEXT_EXPIRY] = expires
        self._exp[e] = expires
        return True

    def expire(self) -> int:
        """Drop every expired entry now (they are otherwise dropped when read, or when room is needed); how many."""
        return self._locked(self._expire_locked)

    def _expire_locked(self) -> int:
        self._h[H_DIRTY] = 1
        n = self._table.reclaim_expired()
        self._h[H_DIRTY] = 0
        return n

    def pop(self, key: Any, default: Any = MISSING) -> Any:
        """Remove ``key`` and return its value, or ``default`` if it is absent (without a default: KeyError);
        counted as a lookup and, when present, a delete (``dict.pop``; diskcache ``pop``)."""
        kb = encode_key(key)
        found = self._locked(self._pop_locked, kb, fingerprint(kb))
        if found is None:
            if default is MISSING:
                raise KeyError(key)
            return default
        try:
            return decode_body(*found)
        except ValueError as exc:  # removed already: nothing is left to drop
            raise CorruptionError(f"the value popped does not decode: {exc}", what="pop",
                                  hint="the value must be stored again") from exc

    def _pop_locked(self, kb: bytes, fp: int) -> tuple[int, bytes] | None:
        h = self._h
        e = self._find_live(kb, fp)
        if e == EMPTY:
            h[H_MISSES] += 1
            return None
        self._table.refuse_pinned(e, "popped")
        found = self._body_locked(e)
        h[H_DIRTY] = 1
        self._table.remove(e)
        h[H_HITS] += 1
        h[H_DELETES] += 1
        h[H_DIRTY] = 0
        return found

    def incr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """Add ``delta`` to the integer stored under ``key`` and return the new value. An absent key starts at
        ``initial`` (``None``: raise KeyError instead). memcached ``incr``, APCu ``apcu_inc``, diskcache ``incr``.

        :raises TypeError: if the stored value (or ``delta``, ``initial``) is not an int; nothing changes.
        """
        if type(delta) is not int or (initial is not None and type(initial) is not int):
            raise TypeError("incr needs int delta and initial")
        kb = encode_key(key)
        value = self._locked(self._incr_locked, key, kb, fingerprint(kb), delta, initial)
        if isinstance(value, Exception):
            raise value
        return value

    def _incr_locked(self, key, kb: bytes, fp: int, delta: int, initial: int | None):
        """The new value, or the exception to raise once the lock is released: raised here, a KeyError or a
        TypeError would be taken for damage (see ``_fault``) and cost a repair."""
        old = self._find_live(kb, fp, initial is not None)
        if old == EMPTY:
            if initial is None:
                return KeyError(key)
            current = initial
            expires = self._expires_locked(None)
        else:
            current = decode_body(*self._body_locked(old))  # a few bytes: decoded under the lock
            if type(current) is not int:
                return TypeError(f"incr on a {type(current).__name__} value: only int values can be incremented")
            expires = self._exp[old]  # a counter keeps its expiry (memcached does the same)
        value = current + delta
        self._store_locked(old, *self._encode(key, value, kb), expires)
        return value

    def decr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``incr`` by ``-delta`` (no floor at zero, unlike memcached: the values are Python ints)."""
        if type(delta) is not int:
            raise TypeError("decr needs an int delta")
        return self.incr(key, -delta, initial)

    def _body_locked(self, e: int) -> tuple[int, bytes]:
        """Tag and body bytes of resident entry ``e``, copied and checked against its checksum (lock held)."""
        ent, base = self._ent, self._base
        b = e * _W
        v0 = base + ent[b + E_OFF] + _VALUE_START
        vlen = ent[b + E_VAL_NBYTES]
        tag = self._mm[v0]
        body = self._mm[v0 + 1 : v0 + vlen]
        if body_checksum(tag, body) != ent[b + E_CHECK]:
            raise CorruptionError(f"entry {e} failed its checksum", what="read")
        return tag, body

    def _delete_prefix(self, prefix: bytes) -> int:
        """Remove every entry whose encoded key starts with ``prefix``; how many. Walks the whole LRU list under the
        lock (bounded by the table size), like clear(): for rare maintenance, not the hot path."""
        return self._locked(self._delete_prefix_locked, prefix)

    def _delete_prefix_locked(self, prefix: bytes) -> int:
        h, ent, mm, base, n = self._h, self._ent, self._mm, self._base, len(prefix)
        doomed = []
        e = ent[E_NEXT]
        for _ in range(self._table.slots):
            if e == SENTINEL:
                break
            b = e * _W
            if ent[b + E_KEY_NBYTES] >= n:
                k0 = base + ent[b + E_OFF] + _VALUE_START + ent[b + E_VAL_NBYTES]
                if mm[k0 : k0 + n] == prefix and not self._table.pinned(e):
                    doomed.append(e)
            e = ent[b + E_NEXT]
        if doomed:
            h[H_DIRTY] = 1
            for e in doomed:
                self._table.remove(e)
            h[H_DELETES] += len(doomed)
            h[H_DIRTY] = 0
        return len(doomed)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is cached (and not expired); neither counts as a lookup nor changes the LRU order. An
        expired entry it finds is dropped, and counted in ``expired``."""
        kb = encode_key(key)
        return self._locked(self._find_live, kb, fingerprint(kb)) != EMPTY

    def get_or_compute(self, key: Any, fn: Callable[[], R], *, timeout: float | None = None,
                       ttl: float | None = None) -> R:
        """The value cached for ``key``; on a miss, ``fn()``'s result, stored and returned, with ``fn`` run by one
        caller on the whole host at a time: callers in other processes (or threads) that miss the same key
        meanwhile wait for that result instead of computing it again.

        A waiter holds neither the cache lock nor anything that delays other keys. If the computing caller raises,
        the exception is its own and one waiter computes instead (a takeover); if its process dies, the kernel
        frees the key at once and a waiter takes over. ``timeout`` bounds the wait for a live computation (None: no
        bound; a finite number of seconds otherwise; ``fn`` itself is never interrupted); ``ttl`` is the stored
        result's, as in ``put``. A result too large for the cache is returned without being stored. Stats: the call
        counts one lookup (a hit, or a miss), plus a computation, a wait or a takeover.

        :raises ComputeTimeout: (a TimeoutError) if another caller is still computing the key after ``timeout`` s.
        :raises ReentrantCallError: (a RuntimeError) if ``fn`` itself calls ``get_or_compute`` for the same key.
        :raises ValueError: if ``timeout`` is neither None nor a finite number of seconds from 0.
        """
        seconds("timeout", timeout, none=True, zero=True)
        if ttl is not None:
            ttl_ns(ttl)  # refused before anything is looked up, hit or miss
        value = self.get(key, MISSING)
        if value is not MISSING:
            return value
        kb = encode_key(key)
        # Why: the claim object exists before anything is taken, so ``finally`` releases whatever an exception at any
        # bytecode left taken (see flight.py).
        claim = flight.Claim()
        try:
            waited = claim.take(self._seg.fd, fingerprint(kb), timeout, lambda: key in self)
            # Another caller may have stored the value while this one waited, or between its miss and its claim.
            if not claim.held or key in self:
                value = self.get(key, MISSING)
                if value is not MISSING:
                    # Counted as a hit: the get above counts it, and the first lookup's miss is taken back.
                    self._count((H_MISSES, -1), (H_WAITS, 1 if waited else 0))
                    return value
                if not claim.held:  # gone again: wait for the claim itself this time
                    waited = claim.take(self._seg.fd, fingerprint(kb), timeout) or waited
            self._count((H_COMPUTATIONS, 1), (H_WAITS, 1 if waited else 0), (H_TAKEOVERS, 1 if waited else 0))
            value = fn()
            try:
                self.put(key, value, ttl)
            except TooLargeError:
                pass  # correct to return, impossible to keep; the next caller computes it again
            return value
        finally:
            claim.release()

    @overload
    def memoize(self, fn: Callable[P, R], *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None) -> Memoized[P, R]: ...

    @overload
    def memoize(self, fn: None = None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None) -> Callable[[Callable[P, R]], Memoized[P, R]]: ...

    def memoize(self, fn: Callable[P, R] | None = None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None) -> Memoized[P, R] | Callable[[Callable[P, R]], Memoized[P, R]]:
        """Decorator: memoize a function in this cache, for every process, like ``functools.lru_cache`` with the
        cache shared. ``@cache.memoize`` or ``@cache.memoize(name=..., timeout=...)``.

        The key is the function's name (``module.qualname``, or ``name=``) with its positional and keyword arguments,
        encoded canonically: keyword order does not matter, argument types do (``f(1)`` and ``f(1.0)`` are two
        entries), and, as with ``lru_cache``, ``f(1, b=2)`` and ``f(1, 2)`` are two entries. Arguments must be
        valid keys (TypeError otherwise). Misses go through ``get_or_compute``, so concurrent callers anywhere on
        the host compute each result once, and ``ttl`` is their time to live. The wrapper has ``cache_info()`` (this process's calls: served from the
        cache, or computed here) and ``cache_clear()`` (removes this function's entries for everyone).
        """
        seconds("timeout", timeout, none=True, zero=True)

        def decorate(f: Callable[P, R]) -> Memoized[P, R]:
            return memo.memoized(self, f, name or memo.function_name(f), timeout, ttl)

        return decorate if fn is None else decorate(fn)

    def _count(self, *deltas: tuple[int, int]) -> None:
        """Add to header counters: ``(word, delta)`` pairs (never below 0: a clear() may have reset one between)."""
        self._locked(self._count_locked, deltas)

    def _count_locked(self, deltas) -> None:
        h = self._h
        for word, delta in deltas:
            h[word] = max(0, h[word] + delta)

    def __len__(self) -> int:
        """Resident entries of no kind (what iteration yields; a kind's are its KindView's), expired ones not yet
        dropped included (they go when read or when room is needed). A count out of range (damaged) is repaired
        first, so the number returned is always valid."""
        return self._locked(self._len_locked)

    def _len_locked(self) -> int:
        if not 0 <= self._h[H_ENTRIES] < self._table.slots:
            self._repair_locked()  # len() must not raise a raw ValueError on a damaged count
        return kinds.plain_entries_locked(self._seg)

    # ------------------------------------------------------------------------------------------- whole-cache operations

    def clear(self) -> int:
        """Drop every entry, of every kind, and reset the counters (``clears`` counts this call; ``recoveries`` is
        kept); how many entries were dropped."""
        return self._locked(self._clear_locked)

    def _clear_locked(self) -> int:
        h, table = self._h, self._table
        before = h[H_ENTRIES]
        handed_out = h[H_UNUSED_NEXT] if 0 < h[H_UNUSED_NEXT] <= table.slots else table.slots
        flagged = np.flatnonzero(np.frombuffer(table.pins, dtype=np.uint8, count=handed_out)).tolist()
        keep = {e for e in flagged if self._ent[e * _W + E_CHECK] and table.pinned(e)}
        h[H_DIRTY] = 1
        if not keep:
            table.reset()
        else:  # entries pinned by open views stay; the rest go one by one
            e = self._ent[E_NEXT]
            for _ in range(table.slots):
                if e == SENTINEL:
                    break
                n = self._ent[e * _W + E_NEXT]
                if e not in keep:
                    table.remove(e)
                e = n
        reset_counters(h)
        h[H_CLEARS] += 1
        h[H_DIRTY] = 0
        return before - h[H_ENTRIES]

    def stats(self) -> CacheStats:
        """A consistent snapshot of the global counters, with each key kind's counts."""
        return self._locked(self._stats_locked)

    def _stats_locked(self) -> CacheStats:
        if header_problems(self._seg):  # a counter or limit out of range is never reported: repaired first
            self._repair_locked()
        return read_stats(self._h, kinds.stats_locked(self._seg))

    # ------------------------------------------------------------------------------------------- kinds and views

    def kind(self, name: str) -> KindView:
        """The keys of kind ``name``: the cache's API in a namespace of its own, with its own ``clear()``, ``len()``
        and counts (also in ``stats().kinds``); eviction and limits stay global. A kind is created on first use and
        lasts as long as the cache (at most 255 kinds; a name is 1 to 40 bytes of UTF-8)."""
        nb = kinds.check_name(name)
        k = self._locked(kinds.register_locked, self._seg, nb)
        if not k:
            raise KindsFullError(f"cache {self.name!r} has 255 kinds already; no room for {name!r}", what="kind",
                                 hint="use fewer kinds (they are namespaces, not data)")
        return KindView(self, k, name)

    def view(self, key: Any) -> View:
        """The value of ``key`` without a copy: ``with cache.view(key) as arr:`` gives a read-only numpy array
        (a read-only memoryview for a bytes value, a tensor over read-only memory for a tensor value: see view.py)
        over the bytes in shared memory. Counted as a lookup.

        While the block runs, the entry is pinned: not evicted, not moved, not overwritten (put, delete and pop of
        the key raise PinnedError; clear() keeps it). The pin ends with the block -- the array handed out is then
        revoked, an empty array on which arithmetic raises -- or, for any array derived from it meanwhile, when that
        is dropped; and whenever the process dies.

        :raises KeyError: if the key is absent.
        :raises TypeError: if the value is not a numpy array, a tensor or bytes (use get()); nothing is counted.
        """
        kb = encode_key(key)
        pins = self._pins
        # Why: the pin exists before anything is taken, and owns its description until it is handed over to the
        # view: an exception at any bytecode before that drops it, which closes the description and whatever lock it
        # took (see view.py).
        pin = Pin()
        try:
            found = self._locked(self._pin_locked, kb, fingerprint(kb), pins.take(pin))
            if found is None:
                raise KeyError(key)
            if found is _UNVIEWABLE:
                raise TypeError("view() reads numpy arrays, tensors and bytes values without copying; use get() for "
                                "others")
            e, voff, vlen, check = found
            pin.byte = ofd.PIN_BASE + e
            value = self._arena[voff : voff + vlen].toreadonly()
            # Checked outside the lock: the entry is pinned, so no writer may change these bytes any more.
            if body_checksum(value[0], value[1:]) != check:
                pins.release(pin)
                self._checksum_failed(e)
            return View(value, pins, pin, self._base + voff)
        except BaseException:
            pins.release(pin)  # an unknown byte closes the description, dropping its lock; a no-op if released
            raise

    def _pin_locked(self, kb: bytes, fp: int, fd: int):
        h, table = self._h, self._table
        e = self._find_live(kb, fp)
        if e == EMPTY:
            h[H_MISSES] += 1
            return None
        b = e * _W
        if self._mm[self._base + self._ent[b + E_OFF] + _VALUE_START] not in _VIEWABLE:
            return _UNVIEWABLE  # refused before anything is counted or pinned
        # Ordering: the flag before the kernel lock, so a holder dying between the two leaves a stale flag (cleared
        # by the next who tests it), never a pin nobody can see.
        table.pins[e] = 1
        ofd.lock(fd, ofd.PIN_BASE + e, ofd.READ, wait=False)  # never refused: pin bytes are only ever read-locked
        h[H_DIRTY] = 1
        lru.move_to_front(self._ent, e)
        h[H_HITS] += 1
        h[H_DIRTY] = 0
        return e, self._ent[b + E_OFF] + _VALUE_START, self._ent[b + E_VAL_NBYTES], self._ent[b + E_CHECK]

    def limits(self) -> CacheLimits:
        """The limits in force."""
        s = self.stats()
        return CacheLimits(max_entries=s.max_entries, max_retained_bytes=s.max_retained_bytes)

    def set_limits(self, limits: CacheLimits | None = None, *, max_entries: int | None = None,
                   max_retained_bytes: int | None = None) -> None:
        """Change the limits for every process and evict at once to meet them: a CacheLimits, or either limit by
        keyword alone (the other stays as it is, read under the same hold of the lock).

        :raises ValueError: if a limit exceeds the capacity the cache was created with.
        :raises PinnedError: if entries pinned by open views alone exceed the new limits (the old ones stay).
        """
        g = self._seg.geometry
        if limits is None:
            if max_entries is None and max_retained_bytes is None:
                raise TypeError("set_limits needs a CacheLimits, max_entries= or max_retained_bytes=")
            # Validates the limits given (types, positive); a limit left out is kept, as None.
            limits = CacheLimits(g.max_entries if max_entries is None else max_entries,
                                 g.capacity_bytes if max_retained_bytes is None else max_retained_bytes)
        elif max_entries is not None or max_retained_bytes is not None:
            raise TypeError("set_limits takes a CacheLimits or keywords, not both")
        elif not isinstance(limits, CacheLimits):
            raise TypeError(f"set_limits takes a CacheLimits, got {type(limits).__name__}")
        else:
            max_entries, max_retained_bytes = limits.max_entries, limits.max_retained_bytes
        if limits.max_entries > g.max_entries or limits.max_retained_bytes > g.capacity_bytes:
            raise ValueError(
                f"limits {limits} exceed the capacity of cache {self.name!r} (max_entries={g.max_entries}, "
                f"capacity_bytes={g.capacity_bytes}); capacity is fixed at creation: recreate the cache to raise it"
            )
        self._locked(self._set_limits_locked, max_entries, max_retained_bytes)

    def _set_limits_locked(self, max_entries: int | None, max_retained_bytes: int | None) -> None:
        h = self._h
        before = h[H_MAX_ENTRIES], h[H_MAX_RETAINED]
        h[H_DIRTY] = 1
        h[H_MAX_ENTRIES] = before[0] if max_entries is None else max_entries
        h[H_MAX_RETAINED] = before[1] if max_retained_bytes is None else max_retained_bytes
        try:
            self._table.evict_until(0, 0)
        except PinnedError:
            # Pinned entries alone exceed the new limits: the old ones stay (the evictions made still meet them).
            h[H_MAX_ENTRIES], h[H_MAX_RETAINED] = before
            h[H_DIRTY] = 0
            raise
        h[H_DIRTY] = 0

    def verify(self, *, deep: bool = True, repair_damage: bool = False) -> VerifyReport:
        """Check every invariant of the segment (``deep`` also re-hashes every stored key and value and decodes every
        value); with ``repair_damage`` a failing segment is repaired before returning the report of what was found."""
        return self._locked(self._verify_locked, deep, repair_damage)

    def _verify_locked(self, deep: bool, repair_damage: bool) -> VerifyReport:
        report = check(self._seg, deep=deep)
        if not report.ok and repair_damage:
            self._repair_locked(deep=deep)
        return report

    # ------------------------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Release this process's handle (idempotent). The cache lives on for the other processes.

        Waits for calls other threads have in progress on this handle; calls made after it raise ClosedError.
        """
        if self._closed:
            return
        addr = self._addr
        try:
            addr = self._enter()
            self._admit(addr)
            self._closed = True
        except BaseException as exc:
            self._fault(exc, addr)
            if not isinstance(exc, (ShmCacheError, RuntimeError)):
                raise
            # The lock could not be had: mark the handle closed and leave the unmapping to the garbage collector,
            # in case a call of another thread is still inside.
            self._closed = True
            return
        finally:
            if self._lockw[_H_MUTEX_KIND] != MUTEX_KIND_WORD and addr is self._addr:  # see _H_MUTEX_KIND
                self._lockw[_H_MUTEX_KIND] = MUTEX_KIND_WORD
                self._lockw[H_DIRTY] = 1
            self._unlock(addr)
        self._table.close()
        self._pins.close()
        self._seg.close()

    def unlink(self) -> None:
        """Remove the cache from the system, once for everyone; processes that have it open keep working on their
        mapping until they close it, and a later create under the same name gets a fresh cache."""
        unlink_name(self.name)

    @staticmethod
    def unlink_name(name: str) -> None:
        """Remove the named cache without opening it. :raises FileNotFoundError: if there is none."""
        unlink_name(name)

    def __enter__(self: _SC) -> _SC:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Callable[..., SharedCache], tuple[Any, ...]]:
        # Pickled by name (and what it trusts): a spawned or forkserver worker re-attaches to the same segment.
        return (_reattach, (self.name, self._lock_timeout, *self._seg.trust.args()))

    def __repr__(self) -> str:
        name = f"{type(self).__name__}({getattr(self, 'name', '?')!r}"
        if self._closed:
            return f"{name}, closed)"
        # Why without the lock: a repr (in a traceback, a debugger) must never wait; a racy count is fine to show.
        entries = kinds.plain_entries_locked(self._seg)
        return f"{name}, entries={entries}, capacity_bytes={self._capacity_bytes})"

    def _space(self) -> tuple:
        return self, 0  # the mapping API's keys: those of no kind (mapping.LocalMapping)

    def _maxsize(self) -> int:
        return self.limits().max_entries


def _reattach(name: str, lock_timeout: float, mode: int = 0o600, trust_owner: Any = (),
              group: int | str | None = None) -> SharedCache:
    return SharedCache(name, create=False, lock_timeout=lock_timeout, mode=mode, trust_owner=trust_owner,
                       group=group)
