"""SharedCache: one bounded cache in shared memory, used the same way from every process on the host.

The public facade over three parts (docs/design.md draws them): ``guard.Guard`` runs the lock protocol (take,
admit, wait, fault, repair), ``store.Store`` the locked operations over the structures, and ``table.Table`` the
structures themselves. Keys and values are encoded and hashed before the lock is taken and (arrays aside) decoded
after it is released, so the lock is held only for the index probe, the list and counter updates and the copy of the
bytes. The hot calls (get, put, delete, view, the batches) go to one object bound per handle (``core.path``): the
compiled section, which hands over to the Python path what it does not finish, or the Python path alone; every
other operation runs through ``Guard.run``.

Modules built on the core (kinds, entries, the Redis tier, the CLI) reach the parts through ``parts(cache)``, never
through a private attribute.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar, overload

from . import config, core, flight, memo, serializers, space
from . import policies
from . import snapshot as snapshots
from .durations import seconds, ttl_ns
from .codec import encode_key, fingerprint
from .codec import MASK63 as _MASK63, xxh3 as _xxh  # bound as globals: put's two hash calls
from .errors import (
    ClosedError, CorruptionError, KindsFullError, ReentrantCallError, SnapshotError, SnapshotWarning, TooLargeError,
    remove_hint,
)
from . import kinds
from .guard import Guard
from .kinds import KindView
from .layout import BLOCK_ALIGN, EMPTY, MAX_BLOCK_NBYTES, MAX_TTL_NS, Geometry
from .layout.dtypes import (
    H_COMPUTATIONS, H_DEFAULT_TTL, H_MAX_ENTRIES, H_MISSES, H_TAKEOVERS, H_WAITS, POLICY_NAMES,
    S_REFRESH_FAILED, S_REFRESHES, S_STALE_HITS,
)
from .layout.geometry import MAX_ENTRIES_LIMIT, RESERVE_FACTOR, narrow_reserve
from . import aio
from .aio import AsyncMethods
from .keylock import KeyLock
from .mapping import MISSING, LocalMapping, memo_family
from .oversize import Told
from .refresh import Refreshes
from .segment import Segment, unlink_name
from .snapshot import RestoreResult, SnapshotInfo
from .stats import CacheLimits, CacheStats
from .block import PAD
from .store import UNVIEWABLE, Store
from .table import Table
from .trust import Trust
from .verify import VerifyReport, check
from .view import DevView, View, outlived_warning

if TYPE_CHECKING:
    from .memo import Memoized

# The default limits fit a container's default /dev/shm (64 MiB under Docker and Kubernetes) with half of it to
# spare: the whole segment is 40 MiB at most, and an empty one occupies under 6 MiB (the arena is backed as it
# fills: arena.py).
DEFAULT_CAPACITY_BYTES = 32 * 2**20
DEFAULT_MAX_ENTRIES = 32768
# A new cache's policy when none is named: auto reads without the lock (a hit writes no shared list), so gets and
# views scale with the processes, and it adapts its window to the traffic (docs/usage.md, "Eviction policies").
DEFAULT_POLICY = "auto"
# What one hold of the lock evicts at most when limits are lowered, before the hold that lowers them
# (SharedCache._evict_ahead): a few milliseconds' work on the Python path.
EVICT_STEP = 2048
EVICT_STEP_NBYTES = 64 << 20
# The most address space a cache reserves for resizes when not told (max_capacity_bytes): 1 TiB.
_DEFAULT_RESERVE_MOST = 2**40
DEFAULT_LOCK_TIMEOUT = 10.0
DEFAULT_ATTACH_TIMEOUT = 10.0  # seconds an attacher waits for a segment that another process is still creating
_log = logging.getLogger("shmcache")
_MONOTONIC = (-1).__int__  # what the compiled section is given as the time: -1, read CLOCK_MONOTONIC itself
_DEV = sys.flags.dev_mode  # python -X dev: views note what outlives their blocks (view.DevView)
P = ParamSpec("P")
R = TypeVar("R")
_SC = TypeVar("_SC", bound="SharedCache")


class Parts(NamedTuple):
    """The parts of an open SharedCache that the modules built on the core use: its segment, its guard (the lock
    protocol: ``guard.run(fn, *args)``), its store (the locked operations, ``fn``'s first argument) and its
    background refreshes of stale values (``refreshes.running``: how many are queued or under way)."""

    seg: Segment
    guard: Guard
    store: Store
    refreshes: Refreshes


def parts(cache: SharedCache) -> Parts:
    """``cache``'s parts (see Parts); the one way in for kinds, entries, the Redis tier and the CLI."""
    return cache._parts

class SharedCache(LocalMapping, AsyncMethods):
    """A bounded cache in POSIX shared memory that every process on the host can open by name.

    ``create=None`` attaches to the cache if it exists and creates it otherwise; ``True`` creates it or raises
    FileExistsError; ``False`` attaches or raises FileNotFoundError. ``capacity_bytes`` (default 32 MiB) bounds the
    encoded keys and values held, ``max_entries`` (default 32768) the number of entries. The segment's tables are
    backed for the entry limit in force (about 165 bytes per entry of ``max_entries``), its arena as entries fill
    it: a cache occupies what it holds and a little more (block headers, slack for compaction), up to its capacity.
    ``resize`` (and ``set_limits``) change both while every process serves: the capacity up to
    ``max_capacity_bytes`` (creation only; default 16 times ``capacity_bytes``, address space and a sparse file
    that cost no memory until used), the entry limit up to 16 times the ``max_entries`` of creation (tables
    reserved likewise, backed only as a resize needs them). When
    attaching, they may be omitted (the cache as it is); a ``capacity_bytes`` or ``max_entries`` given that differs
    from the cache's resizes it to them (the newest opener's values win).
    ``lock_timeout`` bounds the wait for a lock held by a live process (a finite number of seconds: a stuck holder
    must make the others fail, not hang them); a dead holder is detected at once.
    ``attach_timeout`` bounds the wait for a segment that another process is still creating (then AttachTimeout,
    or LayoutError if it was never initialised).
    ``default_ttl`` (seconds; creation only, like the capacity) is the time to live of entries stored without a
    ``ttl``; None or 0: they never expire. ``default_tti`` (likewise) is the time to idle of entries stored without
    a ``tti`` (``put``): an entry nobody reads for that long expires.

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

    ``policy`` (creation only, recorded in the segment; None: the segment's, or ``"auto"`` for a new one) chooses
    what is evicted, from ``shmcache.POLICIES``: ``"auto"``, adaptive (a window, a frequency filter and main, the
    window's share climbed to the hit ratio), which writes no shared list on a hit, so that gets and views take no
    lock; ``"lru"``, exact least recently used, every hit relinked under the lock; ``"s3fifo"``, S3-FIFO, which
    keeps more of what is asked again on most traffic and writes no shared list on a hit either; ``"keep"``, for
    repeated shuffled passes over a dataset larger than the cache: admit until full, then keep (a put it does not
    admit returns False). docs/usage.md, "Eviction policies", says what each guarantees.

    ``serializer`` (creation only, recorded in the segment) encodes the values: ``"msgpack"`` (the default) stores
    plain data and never runs code when reading; ``"pickle"`` stores any picklable value (bytes and numeric arrays
    keep their raw encodings), and every handle must then ask for it: whoever can write the segment can run code in
    each process that reads it (shmcache/serializers.py). Keys are never pickled.

    ``restore_from`` (a path) fills the cache from a snapshot file (``snapshot()``, ``restore()``) when, and only
    when, this call creates it: however many processes open the cache at once, one restores, once; ``restored``
    then holds its RestoreResult (None in every other handle). The others see the entries arrive as it stores
    them. No file at the path restores nothing, silently (a first run); a file that cannot be restored (its header
    damaged or foreign, its serializer the other one, unreadable) warns SnapshotWarning and leaves the cache empty.

    :raises FileNotFoundError, FileExistsError: as ``create`` says.
    :raises ValueError: for invalid names or sizes, a size the existing cache cannot be resized to, or another
        ``policy``, ``default_ttl``, ``default_tti`` or ``max_capacity_bytes`` than the existing cache's.
    :raises OSError: when the shared memory cannot back the segment (errno ENOSPC, with what was asked and is free).
    :raises LayoutError: when the name holds something that is not a shmcache segment of this layout version.
    :raises SerializerMismatch: (a ValueError) when the cache was created with the other ``serializer``.
    :raises OwnershipError: when the file at the name is another user's (and not trusted), more open than ``mode``,
        or not a regular file: nothing of it was read or written.
    :raises AttachTimeout: (a TimeoutError) when another process is still creating the segment after
        ``attach_timeout`` seconds.
    """

    _seg: Segment  # set by _bind, as _guard is
    restored: RestoreResult | None = None  # what restore_from restored, in the handle that created the cache
    _guard: Guard  # set by _bind; absent from an object whose construction failed (then it is closed)

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
        serializer: str = "msgpack",
        policy: str | None = None,
        restore_from: str | os.PathLike[str] | None = None,
        max_capacity_bytes: int | None = None,
        default_tti: float | None = None,
    ) -> None:
        if create not in (None, True, False):
            raise ValueError(f"create must be None, True or False, got {create!r}")
        ser = serializers.named(serializer)
        policy_number = policies.number(DEFAULT_POLICY if policy is None else policy)
        trust = Trust.of(mode, trust_owner, group)
        seconds("lock_timeout", lock_timeout)
        seconds("attach_timeout", attach_timeout)
        capacity = DEFAULT_CAPACITY_BYTES if capacity_bytes is None else capacity_bytes
        if capacity_bytes is None and max_capacity_bytes is not None:
            capacity = min(capacity, max_capacity_bytes)
        wanted = Geometry.for_capacity(capacity, DEFAULT_MAX_ENTRIES if max_entries is None else max_entries,
                                       policy_number)  # (validates both)
        if max_capacity_bytes is None:
            reserve = max(capacity, min(RESERVE_FACTOR * capacity, _DEFAULT_RESERVE_MOST))
        else:
            reserve = max_capacity_bytes
            Geometry.for_capacity(reserve, 1)  # (validates it)
            if reserve < capacity:
                raise ValueError(f"max_capacity_bytes ({reserve}) must be at least capacity_bytes ({capacity})")
        limit = wanted.max_entries
        entries = min(RESERVE_FACTOR * limit, MAX_ENTRIES_LIMIT)
        if max_capacity_bytes is None:
            reserve = narrow_reserve(capacity, reserve, entries, policy_number)
        wanted = Geometry.for_capacity(reserve, entries, policy_number)
        default_ttl_ns = 0 if default_ttl is None else ttl_ns(default_ttl)
        default_tti_ns = 0 if default_tti is None else ttl_ns(default_tti, "default_tti")
        seg = Segment(name, None if create is False else wanted, create, trust, default_ttl_ns, attach_timeout,
                      ser.feature, capacity, limit, default_tti_ns)
        try:
            serializers.check(name, seg.features, ser)
            found = seg.geometry
            for what, asked, have in (
                ("max_capacity_bytes", max_capacity_bytes, found.capacity_bytes),
                ("policy", policy, POLICY_NAMES[found.policy]),
                ("default_ttl", None if default_ttl is None else default_ttl_ns / 1e9,
                 seg.header_words[H_DEFAULT_TTL] / 1e9),
                ("default_tti", None if default_tti is None else default_tti_ns / 1e9,
                 config.default_tti(seg.idle_words) / 1e9),
            ):
                if asked is not None and asked != have:
                    raise ValueError(f"cache {name!r} exists with {what}={have!r}, not {asked!r}; "
                                     f"omit {what} to attach to it as it is, use another name, or "
                                     f"{remove_hint(name)}")
            self._bind(seg, lock_timeout, clock or time.monotonic_ns, ser)
            if not seg.initialised_here and (capacity_bytes is not None or max_entries is not None):
                self._apply(capacity_bytes, max_entries)
        except BaseException:
            seg.close()
            if seg.initialised_here:  # made with our parameters; a segment another process set up is theirs
                unlink_name(name)
            raise
        if restore_from is not None and seg.initialised_here:
            self._restore_created(restore_from)

    def _apply(self, capacity_bytes: int | None, max_entries: int | None) -> None:
        """An attacher's ``capacity_bytes`` / ``max_entries``: the cache resized to them where they differ."""
        g = self._seg.geometry
        if max_entries is not None and max_entries > g.max_entries:
            raise ValueError(f"cache {self.name!r} exists with room for at most {g.max_entries} entries, not "
                             f"{max_entries}; omit max_entries to attach to it as it is, use another name, or "
                             f"{remove_hint(self.name)} (its tables grow to {RESERVE_FACTOR} times the max_entries "
                             "it was created with)")
        if (capacity_bytes not in (None, self.capacity_bytes)
                or max_entries not in (None, self._h[H_MAX_ENTRIES])):
            self.resize(capacity_bytes=capacity_bytes, max_entries=max_entries)

    def _restore_created(self, path: str | os.PathLike[str]) -> None:
        """``restore_from``'s restore, into the cache this handle has just created."""
        try:
            self.restored = self.restore(path)
        except FileNotFoundError:
            pass  # no snapshot yet: a first run
        except (SnapshotError, OSError) as exc:
            warnings.warn(f"cache {self.name!r} starts empty: its snapshot could not be restored: {exc}",
                          SnapshotWarning, stacklevel=3)

    def _bind(self, seg: Segment, lock_timeout: float, clock, ser: serializers.Serializer) -> None:
        g = seg.geometry
        table = Table(seg, clock)
        guard = Guard(seg, table, lock_timeout)
        store = Store(seg, table, clock, guard.repair, ser, guard.bump)
        self._refreshes = Refreshes()  # get_or_compute's background refreshes of stale values (refresh.py)
        self._parts = Parts(seg, guard, store, self._refreshes)
        self._told = Told()  # the key families warned about a value too large to keep (oversize.py)
        self._seg, self._guard, self._store = seg, guard, store
        # The segment's tables at hand (one attribute read each instead of two; views and tests use them).
        self._h, self._ix, self._mm = seg.header_words, seg.index_words, seg.mm
        self._clock = clock
        self._decode = ser.decode  # the serializer's: every value read
        self._encode_value = ser.encode  # and every value stored
        self._arena = seg.arena
        self._base = g.arena_off
        self._capacity_bytes = g.capacity_bytes  # the most a resize reaches: a store above it can never fit
        self._table = table
        self._addr = guard.addr
        self._lockw = guard.lockw  # the lock page's words: the asyncio methods look at the lock through them
        self._lock_timeout = lock_timeout
        self.name = seg.name
        # The descriptions views pin through (view.py; compiled: _view.c).
        # What the hot calls go to (core.path): the compiled section bound with the Python path it hands over to,
        # or the Python path alone; _core is the Core, or None. The Core reads CLOCK_MONOTONIC itself (-1) unless
        # this handle has a clock of its own.
        # The descriptions views pin through (view.py's PinDescriptions; compiled: _view.c's Pins) come with it.
        self._path, self._core, self._pins = core.path(seg, guard, store, lock_timeout)
        self._outlived: list = []  # (-X dev: the arrays of ended views, weakly, for close()'s ResourceWarning)
        self._now = _MONOTONIC if clock is time.monotonic_ns else clock
        # Last: a handle dropped without close() closes what it opened as it is collected. Why weak references to
        # the parts that hold the clock (the Core through its hand-over): a clock may hold the handle, and the
        # finaliser's own references would then keep it for ever (the segment and the pins hold nothing of ours).
        self._finalizer = weakref.finalize(self, _release, seg, self._pins, guard.slot,
                                           *map(weakref.ref, (guard, table, store, self._core or store)))
        self._finalizer.atexit = False  # at exit the process's end closes all; daemon threads may still be inside

    @property
    def _mask(self) -> int:
        """The index in force's slots less one, in this handle's mapping (Segment.show_tables)."""
        return self._seg.mask

    @property
    def policy(self) -> str:
        """The eviction policy the cache was created with (one of ``shmcache.POLICIES``)."""
        return POLICY_NAMES[self._seg.geometry.policy]

    @property
    def closed(self) -> bool:
        """Whether this handle is closed (``close()``); the cache itself lives on for the other processes."""
        guard = self.__dict__.get("_guard")
        return guard is None or guard.closed

    # ------------------------------------------------------------------------------------------- the dict-like API

    def get(self, key: Any, default: Any = None) -> Any:
        """The value cached for ``key``, or ``default``; a hit is taken as the policy does (lru: the entry becomes the
        most recently used)."""
        # The key is encoded and hashed by the path (Core.get_key in C: a str's UTF-8 and XXH3, without a call), and
        # the value checked and decoded, outside the lock: it is held for as little as possible. An EncodedKey is
        # key bytes already encoded, for TieredCache's local hits (no other method takes one).
        return self._path.get_key(key, self._now(), default)

    def put(self, key: Any, value: Any, ttl: float | None = None, tti: float | None = None) -> bool:
        """Store ``value`` under ``key``, evicting as the limits require (expired entries first, then as the policy
        chooses: under lru the least recently used). ``ttl``: seconds until the entry expires (0: never; None: the
        cache's ``default_ttl``). ``tti``: seconds without a read after which it expires (0: never; None: the cache's
        ``default_tti``): a get, a view or a batch get of it is a read, ``in`` is not; it expires at the earlier of
        the two. True if it was stored; False if it was not admitted (counted in
        ``stats().not_admitted``; a replaced value is gone then): under ``policy="keep"``, a new entry the full cache
        did not take; under every policy, one whose room is all pinned or held by open views (docs/usage.md,
        "Views", says how much that can be).

        :raises TypeError: if the key or value cannot be encoded (nothing changes).
        :raises TooLargeError: (a ValueError) if the entry exceeds ``max_retained_bytes`` (nothing is evicted).
        :raises PinnedError: only on a segment of layout version 11 or before, if an open view pins the key's entry.
        :raises ValueError: for a ``tti`` on a cache of layout version 13 or before, which has no idle expiry.
        """
        # Store.encode, inlined (the call costs as much as the arithmetic).
        if type(key) is str:
            try:
                kb = key.encode()
            except UnicodeEncodeError:
                kb = encode_key(key)  # raises the TypeError
        else:
            kb = encode_key(key)
        tag, body = self._encode_value(value)
        size = len(kb) + len(body) + 1
        nb = (size + PAD) & -BLOCK_ALIGN  # block.nbytes, inlined
        # (the bound no resize reaches, a constant: one above the capacity in force is refused under the lock, by
        # the byte limit, which is the capacity unless set_limits lowered it; Store.refuse_locked)
        if size > self._capacity_bytes or nb > MAX_BLOCK_NBYTES:
            raise self._store.refuse(size)
        check = (_xxh(body, tag) & _MASK63) | 1
        encoded = (kb, tag, body, _xxh(kb) & _MASK63, check, size, nb)  # a store.Fields
        return self._path.put(encoded, self._now(), -1 if ttl is None else ttl_ns(ttl),
                              -1 if tti is None else self._tti_ns(tti))

    def _tti_ns(self, tti: float) -> int:
        """A time to idle in seconds as ns, for this cache (checked, before the lock)."""
        ns = ttl_ns(tti, "tti")
        if ns and self._seg.idle_words is None:
            raise ValueError(f"cache {self.name!r} has layout version {self._seg.version}, which has no idle expiry "
                             f"(tti needs version 14); {remove_hint(self.name)} to make it anew")
        return ns

    def delete(self, key: Any) -> bool:
        """Remove ``key``; True if it was present."""
        kb = encode_key(key)
        return self._path.delete(kb, fingerprint(kb), self._now())

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
        encoded = self._store.encode(key, value)
        return self._guard.run(self._store.store_if, present, version, None if ttl is None else ttl_ns(ttl),
                               encoded)

    def get_with_version(self, key: Any, default: Any = None) -> tuple[Any, int | None]:
        """``(value, version)`` for ``key``, or ``(default, None)`` if it is absent; the version changes with every
        store of the key and is what ``cas`` compares (memcached ``gets``)."""
        kb = encode_key(key)
        found = self._guard.run(self._store.get_with_version, kb, fingerprint(kb))
        if found is None:
            return default, None
        tag, body, version = found
        try:
            return self._decode(tag, body), version
        except ValueError as exc:
            self._guard.undecodable(exc)

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
        return self._guard.run(self._store.touch, kb, fingerprint(kb), None if ttl is None else ttl_ns(ttl))

    def expire(self) -> int:
        """Drop every expired entry now (they are otherwise dropped when read, or when room is needed); how many."""
        return self._guard.run(self._store.expire)

    def pop(self, key: Any, default: Any = MISSING) -> Any:
        """Remove ``key`` and return its value, or ``default`` if it is absent (without a default: KeyError);
        counted as a lookup and, when present, a delete (``dict.pop``; diskcache ``pop``)."""
        kb = encode_key(key)
        found = self._guard.run(self._store.pop, kb, fingerprint(kb))
        if found is None:
            if default is MISSING:
                raise KeyError(key)
            return default
        try:
            return self._decode(*found)
        except ValueError as exc:  # removed already: nothing is left to drop
            raise CorruptionError(f"the value popped does not decode: {exc}", what="pop",
                                  hint="the value must be stored again") from exc

    def incr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """Add ``delta`` to the integer stored under ``key`` and return the new value. An absent key starts at
        ``initial`` (``None``: raise KeyError instead). memcached ``incr``, APCu ``apcu_inc``, diskcache ``incr``.

        :raises TypeError: if the stored value (or ``delta``, ``initial``) is not an int; nothing changes.
        """
        if type(delta) is not int or (initial is not None and type(initial) is not int):
            raise TypeError("incr needs int delta and initial")
        kb = encode_key(key)
        value = self._guard.run(self._store.incr, key, kb, fingerprint(kb), delta, initial)
        if isinstance(value, Exception):
            raise value
        return value

    def decr(self, key: Any, delta: int = 1, initial: int | None = 0) -> int:
        """``incr`` by ``-delta`` (no floor at zero, unlike memcached: the values are Python ints)."""
        if type(delta) is not int:
            raise TypeError("decr needs an int delta")
        return self.incr(key, -delta, initial)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is cached (and not expired); neither counts as a lookup nor changes the LRU order. An
        expired entry it finds is dropped, and counted in ``expired``."""
        kb = encode_key(key)
        return self._guard.run(self._store.find_live, kb, fingerprint(kb)) != EMPTY

    def get_or_compute(self, key: Any, fn: Callable[[], R], *, timeout: float | None = None,
                       ttl: float | None = None, stale_ttl: float | None = None) -> R:
        """The value cached for ``key``; on a miss, ``fn()``'s result, stored and returned, with ``fn`` run by one
        caller on the whole host at a time: callers in other processes (or threads) that miss the same key
        meanwhile wait for that result instead of computing it again.

        A waiter holds neither the cache lock nor anything that delays other keys. If the computing caller raises,
        the exception is its own and one waiter computes instead (a takeover); if its process dies, the kernel
        frees the key at once and a waiter takes over. ``timeout`` bounds the wait for a live computation (None: no
        bound; a finite number of seconds otherwise; ``fn`` itself is never interrupted); ``ttl`` is the stored
        result's, as in ``put``. A result too large for the cache is returned without being stored, so every call
        computes it again: ``stats().too_large`` counts it, and a ``TooLargeWarning`` says so once per family of
        keys (the key's kind, or the function calling ``get_or_compute``; ``memoize``'s function, a
        ``CachedDataset``) with the result's size and the limit. Stats: the call counts one lookup (a hit, or a
        miss), plus a computation, a wait or a takeover.

        ``stale_ttl``: serve stale while one caller refreshes. The result is stored to live ``ttl + stale_ttl``
        (``ttl``: this call's, or the cache's ``default_ttl``; one of them is needed); once no more than
        ``stale_ttl`` of that is left, the value is stale, and every call gets it at once while one caller on the
        host computes the next value in the background of its own call (a thread; a task of the loop for
        ``aget_or_compute``) and stores it. A refresh that raises is logged (logger ``shmcache``) and counted, and
        the stale value is served on until ``stale_ttl`` ends; then the key is missing, and the next call computes
        it as without ``stale_ttl``. A refresher that dies frees the key at once: the next call that finds the value
        stale refreshes it. Freshness is judged by the time the entry has left, so a value stored by ``put`` with
        a ttl of at most ``stale_ttl`` is stale at once, and refreshed by the first call. ``stats()`` counts
        ``stale_hits``, ``refreshes`` (each also a computation) and ``refresh_failures``.

        :raises ComputeTimeout: (a TimeoutError) if another caller is still computing the key after ``timeout`` s.
        :raises ReentrantCallError: (a RuntimeError) if ``fn`` itself calls ``get_or_compute`` for the same key.
        :raises ValueError: if ``timeout`` or ``stale_ttl`` is neither None nor a finite number of seconds from 0,
            or if ``stale_ttl`` is given for a value that would never expire (no ``ttl``, no ``default_ttl``).
        """
        seconds("timeout", timeout, none=True, zero=True)
        stale_ns, ttl = self._stale_ttl(ttl, stale_ttl)  # refused before anything is looked up, hit or miss
        value = self.get(key, MISSING)
        if value is not MISSING:
            if stale_ns and self._went_stale(key, stale_ns):
                self._refreshes.start(fingerprint(encode_key(key)),
                                      partial(self._refresh, key, fn, ttl, stale_ns))
            return value
        kb = encode_key(key)
        # Why: the claim object exists before anything is taken, so ``finally`` releases whatever an exception at any
        # bytecode left taken (see flight.py).
        claim = flight.Claim()
        try:
            describe = partial(self._guard.run, flight.open_description, self._seg.fd)
            waited = claim.take(describe, fingerprint(kb), timeout, lambda: key in self)
            # Another caller may have stored the value while this one waited, or between its miss and its claim.
            if not claim.held or key in self:
                value = self.get(key, MISSING)
                if value is not MISSING:
                    # Counted as a hit: the get above counts it, and the first lookup's miss is taken back.
                    self._count(*self._miss_taken_back(), (H_WAITS, 1 if waited else 0))
                    return value
                if not claim.held:  # gone again: wait for the claim itself this time
                    waited = claim.take(describe, fingerprint(kb), timeout) or waited
            self._count((H_COMPUTATIONS, 1), (H_WAITS, 1 if waited else 0), (H_TAKEOVERS, 1 if waited else 0))
            value = fn()
            try:
                self.put(key, value, ttl)
            except TooLargeError as exc:  # correct to return, impossible to keep: counted, and said once
                self._told.refused(exc, self.name, key, fn, self._kind_name)
            return value
        finally:
            claim.release()

    def _stale_ttl(self, ttl: float | None, stale_ttl: float | None) -> tuple[int, float | None]:
        """(the stale window in ns, 0 for none; the ttl to store a result with: ``ttl + stale_ttl`` where there is a
        window, else ``ttl``), both checked.

        :raises ValueError: as ``get_or_compute`` says.
        """
        base = None if ttl is None else ttl_ns(ttl)
        if stale_ttl is None or not seconds("stale_ttl", stale_ttl, zero=True):
            return 0, ttl
        stale = ttl_ns(stale_ttl)
        if base is None:
            base = self._h[H_DEFAULT_TTL]  # (read unlocked: a setting, never changed after creation)
        if not 0 < base <= MAX_TTL_NS - stale:
            raise ValueError("stale_ttl needs a time to live for the value: pass ttl= (or create the cache with "
                             "default_ttl=)" if base == 0 else f"ttl + stale_ttl must be at most {MAX_TTL_NS / 1e9:g} "
                             "s")
        return stale, (base + stale) / 1e9

    def _went_stale(self, key: Any, stale_ns: int) -> bool:
        """Whether ``key``'s value has at most ``stale_ns`` left to live (and some): stale, and counted so."""
        kb = encode_key(key)
        left = self._guard.run(self._store.time_left, kb, fingerprint(kb))
        if not left or left > stale_ns:  # fresh, never expiring, or gone since
            return False
        self._guard.run(self._store.count_stale, S_STALE_HITS)
        return True

    def _refresh_first(self, key: Any, stale_ns: int) -> bool:
        """A refresh's look, once it holds the key's claim: whether the value is still stale (another process may
        have stored a fresh one between this one's look and its claim; a value gone is left to the next miss)."""
        kb = encode_key(key)
        left = self._guard.run(self._store.time_left, kb, fingerprint(kb))
        if not left or left > stale_ns:
            return False
        self._count((H_COMPUTATIONS, 1))
        self._guard.run(self._store.count_stale, S_REFRESHES)
        return True

    def _refresh_failed(self, key: Any, exc: BaseException) -> None:
        """A refresh's function raised ``exc``: counted and logged (the stale value is served on)."""
        self._guard.run(self._store.count_stale, S_REFRESH_FAILED)
        _log.warning("shmcache %r: refreshing the stale value of key %r raised; the stale value is served until its "
                     "stale_ttl ends", self.name, key, exc_info=exc)

    def _refresh(self, key: Any, fn: Callable[[], Any], ttl: float | None, stale_ns: int) -> None:
        """The background refresh of ``key``'s stale value (a thread's, ``refresh.Refreshes``): claimed without
        waiting (a caller elsewhere that holds the claim refreshes it instead), looked at again, computed, stored
        to live ``ttl`` (the window included)."""
        claim = flight.Claim()
        try:
            describe = partial(self._guard.run, flight.open_description, self._seg.fd)
            if not claim.try_take(describe, fingerprint(encode_key(key))) or not self._refresh_first(key, stale_ns):
                return
            try:
                value = fn()
            except Exception as exc:
                self._refresh_failed(key, exc)
                return
            try:
                self.put(key, value, ttl)
            except TooLargeError as exc:
                self._told.refused(exc, self.name, key, fn, self._kind_name)
        except (ClosedError, ReentrantCallError):
            pass  # closed meanwhile, or the caller's task computes the key itself: the next stale call refreshes it
        except Exception as exc:  # the cache failed under it (a lock timeout, damage): said, never raised in a thread
            _log.warning("shmcache %r: the refresh of key %r could not finish", self.name, key, exc_info=exc)
        finally:
            claim.release()

    async def _arefresh(self, key: Any, fn: Callable[[], Any], ttl: float | None, stale_ns: int) -> None:
        """``_refresh`` as a task of the caller's loop (``aget_or_compute``): ``fn`` may be a coroutine function."""
        claim = flight.Claim()
        try:
            claim.adopt(await self.acall(self._guard.run, flight.open_description, self._seg.fd))
            fp = fingerprint(encode_key(key))
            claim.refuse_nested(fp)
            if not claim.lock_nowait(fp) or not await self.acall(self._refresh_first, key, stale_ns):
                return
            try:
                value = fn()
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:
                await self.acall(self._refresh_failed, key, exc)
                return
            try:
                await self.aput(key, value, ttl)
            except TooLargeError as exc:
                self._told.refused(exc, self.name, key, fn, self._kind_name)
        except (ClosedError, ReentrantCallError):
            pass  # closed meanwhile, or the caller's task computes the key itself: the next stale call refreshes it
        except Exception as exc:  # the cache failed under it (a lock timeout, damage): said, never raised in a thread
            _log.warning("shmcache %r: the refresh of key %r could not finish", self.name, key, exc_info=exc)
        finally:
            claim.release()

    def lock(self, key: Any, *, blocking: bool = True, timeout: float | None = None) -> KeyLock:
        """A lock named by ``key``, held across every process of the host: ``with cache.lock("job"):`` (or ``async
        with``; ``acquire``/``release``). Its holder's death frees it at once; it is not reentrant. ``blocking`` and
        ``timeout`` (seconds; None: no bound) are acquire's defaults; a ``with`` that cannot take it raises
        TimeoutError. Independent of the entries: no value is stored, and ``key`` names no entry."""
        seconds("timeout", timeout, none=True, zero=True)
        return KeyLock(self, key, blocking, timeout, partial(self._guard.run, flight.open_description, self._seg.fd))

    @overload
    async def aget_or_compute(self, key: Any, fn: Callable[[], Awaitable[R]], *,  # type: ignore[overload-overlap]
                              timeout: float | None = None, ttl: float | None = None,
                              stale_ttl: float | None = None) -> R: ...

    @overload
    async def aget_or_compute(self, key: Any, fn: Callable[[], R], *, timeout: float | None = None,
                              ttl: float | None = None, stale_ttl: float | None = None) -> R: ...

    async def aget_or_compute(self, key: Any, fn: Callable[[], Any], *, timeout: float | None = None,
                              ttl: float | None = None, stale_ttl: float | None = None) -> Any:
        """``get_or_compute``, awaitable: ``fn`` may be a coroutine function (or return an awaitable), and a wait for
        another caller's computation of the key polls its claim with ``asyncio.sleep``, never blocking the loop. The
        same stats, timeout and errors; a cancellation at any ``await`` releases the claim (aio.py). A refresh of a
        stale value (``stale_ttl``) is a task of the running loop."""
        seconds("timeout", timeout, none=True, zero=True)
        stale_ns, ttl = self._stale_ttl(ttl, stale_ttl)  # refused before anything is looked up, hit or miss
        value = await self.aget(key, MISSING)
        if value is not MISSING:
            if stale_ns and await self.acall(self._went_stale, key, stale_ns):
                self._refreshes.start_task(fingerprint(encode_key(key)),
                                           partial(self._arefresh, key, fn, ttl, stale_ns))
            return value
        fp = fingerprint(encode_key(key))

        async def describe():
            return await self.acall(self._guard.run, flight.open_description, self._seg.fd)

        def stored() -> bool:  # looked for only when looking cannot wait for the lock
            return self.lock_free() and key in self

        # Why: the claim object exists before anything is taken, so ``finally`` releases whatever an exception at
        # any await (a cancellation) or bytecode left taken (see flight.py).
        claim = flight.Claim()
        try:
            waited = await aio.take(claim, fp, timeout, describe, stored)
            # Another caller may have stored the value while this one waited, or between its miss and its claim.
            if not claim.held or await self.acontains(key):
                value = await self.aget(key, MISSING)
                if value is not MISSING:
                    # Counted as a hit: the get above counts it, and the first lookup's miss is taken back.
                    await self.acall(self._count, *self._miss_taken_back(), (H_WAITS, 1 if waited else 0))
                    return value
                if not claim.held:  # gone again: wait for the claim itself this time
                    waited = await aio.take(claim, fp, timeout, describe, None) or waited
            await self.acall(self._count, (H_COMPUTATIONS, 1), (H_WAITS, 1 if waited else 0),
                             (H_TAKEOVERS, 1 if waited else 0))
            value = fn()
            if inspect.isawaitable(value):
                value = await value
            try:
                await self.aput(key, value, ttl)
            except TooLargeError as exc:  # correct to return, impossible to keep: counted, and said once
                self._told.refused(exc, self.name, key, fn, self._kind_name)
            return value
        finally:
            claim.release()

    @overload
    def memoize(self, fn: Callable[P, R], *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (), stale_ttl: float | None = None) -> Memoized[P, R]: ...

    @overload
    def memoize(self, fn: None = None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (),
                stale_ttl: float | None = None) -> Callable[[Callable[P, R]], Memoized[P, R]]: ...

    def memoize(self, fn: Callable[P, R] | None = None, *, name: str | None = None, timeout: float | None = None,
                ttl: float | None = None, key: Callable[..., Any] | None = None,
                ignore: str | Iterable[str] = (),
                stale_ttl: float | None = None) -> Memoized[P, R] | Callable[[Callable[P, R]], Memoized[P, R]]:
        """Decorator: memoize a function in this cache, for every process, like ``functools.lru_cache`` with the
        cache shared. ``@cache.memoize`` or ``@cache.memoize(name=..., timeout=...)``.

        The key is the function's name (``module.qualname``, or ``name=``) with its positional and keyword arguments,
        encoded canonically: keyword order does not matter, argument types do (``f(1)`` and ``f(1.0)`` are two
        entries), and, as with ``lru_cache``, ``f(1, b=2)`` and ``f(1, 2)`` are two entries. Arguments must be
        valid keys (TypeError otherwise). A ``functools.partial`` is named by its function and its arguments, a
        callable with no ``__qualname__`` needs ``name=``. Misses go through ``get_or_compute``, so concurrent
        callers anywhere on the host compute each result once, and ``ttl`` is their time to live. The wrapper has
        ``cache_info()`` (this process's calls: served from the cache, or computed here) and ``cache_clear()``
        (removes this function's entries for everyone).

        ``ignore``: parameter names left out of the key (a connection, a logger, a ``verbose`` flag); the arguments
        are then bound to the signature first, defaults applied, so ``f(1, 2)``, ``f(1, b=2)`` and ``f(1)`` with
        ``b=2`` its default are one entry. ``key``: a function of the arguments whose result (a valid key)
        replaces them in the key. As with ``lru_cache``, a memoized method is keyed by its instance, which must then
        be a valid key (a TypeError says so), a classmethod by its class's qualified name; ``key=lambda self, x:
        (self.id, x)`` keys by what identifies the instance, ``ignore=("self",)`` shares the results across every
        instance. ``stale_ttl``: results are served stale while one caller refreshes them (``get_or_compute``).
        """
        seconds("timeout", timeout, none=True, zero=True)

        def decorate(f: Callable[P, R]) -> Memoized[P, R]:
            return memo.memoized(self, memo_family(self), f, name, timeout, ttl, key, ignore, stale_ttl)

        return decorate if fn is None else decorate(fn)

    def _kind_name(self, number: int) -> str:
        return kinds.name_of(self._seg, number)

    def _miss_taken_back(self) -> tuple[tuple[int, int], ...]:
        """Take back a miss this handle counted: from its reader slot, where a read without the lock counts it (a
        header count cannot go below 0, and the slot's would stay); else the header delta that takes it back."""
        reader = None if self._core is None else self._core.reader
        return () if reader is not None and reader.take_back_miss() else ((H_MISSES, -1),)

    def _count(self, *deltas: tuple[int, int]) -> None:
        """Add to header counters: ``(word, delta)`` pairs."""
        self._guard.run(self._store.count, deltas)

    def __len__(self) -> int:
        """Live entries of no kind: what iteration yields (a kind's are its KindView's). Expired entries not yet
        dropped are not counted, though they stay resident until read, ``expire()`` or a need for room (and count
        in ``stats().entries`` until then). A count out of range (damaged) is repaired first, so the number
        returned is always valid."""
        return self._guard.run(self._store.live_entries, 0)

    # ------------------------------------------------------------------------------------------- whole-cache operations

    def clear(self) -> int:  # type: ignore[override]  # (returns how many it removed; dict.clear returns None)
        """Drop every entry, of every kind, and reset the counters (``clears`` counts this call; ``recoveries`` is
        kept); how many entries were dropped."""
        return self._guard.run(self._store.clear)

    def stats(self) -> CacheStats:
        """A consistent snapshot of the global counters, with each key kind's counts."""
        return self._guard.run(self._store.stats)

    # ------------------------------------------------------------------------------------------- snapshot files

    def snapshot(self, path: str | os.PathLike[str]) -> SnapshotInfo:
        """Write every live entry, of every kind, to the file ``path``, hottest first (lru: most recently used
        first; s3fifo: main's entries, then small's; keep: newest first), while every process keeps using the
        cache: the lock is held for a list of the entries, then for a megabyte's copy at a time. Keys and values are
        written as the cache holds them, encoded (a pickle cache's are never unpickled), each with a checksum, and
        each expiry as a wall-clock time. ``path`` is replaced atomically: the file is written to a temporary file
        beside it (``.NAME.snapshot-PID-RANDOM.tmp``; one a killed writer left is removed by the next snapshot to
        ``path``) and renamed over it.

        :raises OSError: if the file cannot be written (the previous one at ``path`` is left as it was).
        """
        return snapshots.write(self._parts, path, self.name)

    def restore(self, path: str | os.PathLike[str]) -> RestoreResult:
        """Store the entries of the snapshot file ``path`` in this cache, whatever its size: those expired are
        skipped, and of the rest the hottest that fit the limits are stored, coldest first, so that the policy's
        order ends as it was when the snapshot was taken. A damaged record (a failed checksum) costs that entry
        alone. Stored as ``put_many`` stores (a key present is replaced; under keep, a full cache admits nothing);
        each entry keeps what was left of its time to live.

        :raises FileNotFoundError: if there is no file at ``path``.
        :raises SnapshotError: if the file's header is damaged or not a snapshot's (SnapshotVersionError: written by
            a newer shmcache); nothing was stored.
        :raises SnapshotMismatch: (a SnapshotError and a ValueError) if the snapshot was taken of a cache of the
            other ``serializer``; nothing was stored.
        """
        return snapshots.restore(self._parts, self._path, self._now, path)

    async def asnapshot(self, path: str | os.PathLike[str]) -> SnapshotInfo:
        """``snapshot``, awaitable: run in a worker thread (it writes a file and takes the lock many times)."""
        return await asyncio.to_thread(self.snapshot, path)

    async def arestore(self, path: str | os.PathLike[str]) -> RestoreResult:
        """``restore``, awaitable: run in a worker thread (it reads a file and takes the lock many times)."""
        return await asyncio.to_thread(self.restore, path)

    # ------------------------------------------------------------------------------------------- kinds and views

    def kind(self, name: str) -> KindView:
        """The keys of kind ``name``: the cache's API in a namespace of its own, with its own ``clear()``, ``len()``
        and counts (also in ``stats().kinds``); eviction and limits stay global. A kind is created on first use and
        lasts as long as the cache (at most 255 kinds; a name is 1 to 40 bytes of UTF-8)."""
        nb = kinds.check_name(name)
        k = self._guard.run(kinds.register_locked, self._seg, nb)
        if not k:
            raise KindsFullError(f"cache {self.name!r} has 255 kinds already; no room for {name!r}", what="kind",
                                 hint="use fewer kinds (they are namespaces, not data)")
        return KindView(self, self._parts, k, name)

    def view(self, key: Any) -> View:
        """The value of ``key`` without a copy: ``with cache.view(key) as arr:`` gives a read-only numpy array
        (a read-only memoryview for a bytes value, a tensor over read-only memory for a tensor value: see view.py)
        over the bytes in shared memory. Counted as a lookup.

        A view is its export: the entry is pinned (not evicted, not moved, not overwritten) exactly as long as the
        memory handed out is referenced -- the array, still valid after the block until it is dropped (``del arr``;
        ``arr.copy()`` to keep the values), or anything made of it; a memoryview is released at the block's end --
        and never past the process's death. It blocks no writer: a put, delete, pop or clear of the key (any
        process's) succeeds, and the bytes viewed are held aside until the pin ends (layout version 12; before it,
        they raise PinnedError, and clear() keeps the entry).

        :raises KeyError: if the key is absent.
        :raises TypeError: if the value is not a numpy array, a tensor or bytes (use get()); nothing is counted.
        :raises CorruptionError: if the stored value is damaged (its checksum, or a tag no encoder writes): the
            entry is dropped and the lookup counted as a miss, as get does.
        """
        # The key is encoded and hashed by the path (Core.view_key in C: a str's UTF-8 and XXH3, without a call).
        got = self._path.view_key(key, self._now(), self._pins)
        if got is None:
            raise KeyError(key)
        if got is UNVIEWABLE:
            raise TypeError("view() reads numpy arrays, tensors and bytes values without copying; use get() for "
                            "others")
        if _DEV:
            return DevView(got, self._outlived)  # type: ignore[return-value]  # (the same methods)
        return got

    @property
    def capacity_bytes(self) -> int:
        """The capacity in force: the most encoded key and value bytes the cache holds (``resize`` changes it)."""
        return config.capacity(self._h, self._seg.geometry)

    @property
    def max_capacity_bytes(self) -> int:
        """The most ``capacity_bytes`` a resize reaches, fixed at creation."""
        return self._seg.geometry.capacity_bytes

    def resize(self, *, capacity_bytes: int | None = None, max_entries: int | None = None) -> None:
        """Change the capacity and the entry limit for every process while they serve (None: as it is). The
        byte limit becomes the new capacity, as at creation; a smaller cache evicts at once as its policy chooses,
        slides what it keeps to the arena's start, and gives back the memory past it (docs/usage.md, "Resizing a
        cache"). ``stats().resizes`` counts resizes.

        Entries that open views read and the smaller cache has no room for leave the index at once; their bytes
        are given back as the views end (held entries, counted in ``stats().held_entries``).

        :raises ValueError: a capacity above ``max_capacity_bytes``, an entry limit above the most the cache's
            tables reach (16 times the ``max_entries`` it was created with; a cache made by the release before,
            layout version 9, reaches the ``max_entries`` of its creation), or a cache made by an older release
            (layout version 8 or 7), which is not resized.
        :raises PinnedError: if a smaller capacity would end the arena before a block that an open view reads (the
            cache stays as it was, less what was evicted). A new ``max_entries`` alone never moves a block (on a
            cache made by the release before, layout version 12, a lower one can refuse so too).
        :raises OSError: ENOSPC when /dev/shm could never hold the new capacity; NoSpaceError when it cannot
            back the larger tables now (the cache stays as it was).
        """
        g, name = self._seg.geometry, self.name
        cap = self.capacity_bytes if capacity_bytes is None else capacity_bytes
        entries = None if max_entries is None else max_entries
        for what, n in (("capacity_bytes", cap), ("max_entries", 1 if entries is None else entries)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"{what} must be an int, got {type(n).__name__}")
            if n <= 0:
                raise ValueError(f"{what} must be positive, got {n}")
        if cap > g.capacity_bytes:
            raise ValueError(f"cache {name!r} can grow to max_capacity_bytes={g.capacity_bytes}, not {cap}: a "
                             "larger one is a new cache (snapshot it, `shmcache rm` it, create it with a larger "
                             "max_capacity_bytes, restore)")
        if entries is not None and entries > g.max_entries:
            raise ValueError(f"cache {name!r} can grow to {g.max_entries} entries, not {entries}: its tables are "
                             f"reserved for {RESERVE_FACTOR} times the max_entries it was created with (a larger "
                             "one is a new cache: snapshot it, `shmcache rm` it, create it larger, restore)")
        if self._seg.version < 9:
            raise ValueError(f"cache {name!r} was made by an older release (layout version {self._seg.version}), "
                             "whose segments are not resized: snapshot it, remove it and restore into a new one")
        space.check_whole(g.occupied_at_most(cap, self._h[H_MAX_ENTRIES] if entries is None else entries),
                          f"cache {name!r}", "pass a smaller capacity_bytes")
        self._evict_ahead(entries, cap)
        self._guard.run(self._store.resize, cap, entries)

    def limits(self) -> CacheLimits:
        """The limits in force."""
        s = self.stats()
        return CacheLimits(max_entries=s.max_entries, max_retained_bytes=s.max_retained_bytes)

    def set_limits(self, limits: CacheLimits | None = None, *, max_entries: int | None = None,
                   max_retained_bytes: int | None = None) -> None:
        """Change the limits for every process and evict at once to meet them: a CacheLimits, or either limit by
        keyword alone (the other stays as it is, read under the same hold of the lock).

        A ``max_retained_bytes`` above the capacity grows the capacity to it (``resize``). Entries that open views
        read and the new limits leave no room for leave the index at once, and their bytes are given back as the
        views end; until then they count against the limits, and a put is not admitted if it needs their room.

        :raises ValueError: if ``max_entries`` exceeds the most the cache's tables reach (see ``resize``), or
            ``max_retained_bytes`` its ``max_capacity_bytes``.
        :raises PinnedError: only on a cache made by an older release: layout version 12, if a lower
            ``max_entries``, which makes its arena's ring a little smaller, would end it before a block that an open
            view reads (the old limits stay); version 11 or before, if entries pinned by open views alone exceed the
            new limits.
        """
        g = self._seg.geometry
        if limits is None:
            if max_entries is None and max_retained_bytes is None:
                raise TypeError("set_limits needs a CacheLimits, max_entries= or max_retained_bytes=")
            # Validates the limits given (types, positive); a limit left out is kept, as None.
            limits = CacheLimits(g.max_entries if max_entries is None else max_entries,
                                 1 if max_retained_bytes is None else max_retained_bytes)
        elif max_entries is not None or max_retained_bytes is not None:
            raise TypeError("set_limits takes a CacheLimits or keywords, not both")
        elif not isinstance(limits, CacheLimits):
            raise TypeError(f"set_limits takes a CacheLimits, got {type(limits).__name__}")
        else:
            max_entries, max_retained_bytes = limits.max_entries, limits.max_retained_bytes
        if limits.max_entries > g.max_entries or limits.max_retained_bytes > g.capacity_bytes:
            raise ValueError(
                f"limits {limits} exceed what cache {self.name!r} can grow to (max_entries={g.max_entries}, "
                f"max_capacity_bytes={g.capacity_bytes}); both are fixed at creation: a larger cache is a new one"
            )
        if max_retained_bytes is not None and max_retained_bytes > self.capacity_bytes:
            self.resize(capacity_bytes=max_retained_bytes, max_entries=max_entries)
            return
        self._evict_ahead(max_entries, max_retained_bytes)
        self._guard.run(self._store.set_limits, max_entries, max_retained_bytes)

    def _evict_ahead(self, max_entries: int | None, max_bytes: int | None) -> None:
        """Before lower limits are set: evict what they will not hold in short holds of the lock (``EVICT_STEP``
        entries or ``EVICT_STEP_NBYTES`` bytes each), every other process serving between them, instead of in the
        one hold that sets them (a million evictions are seconds on the Python path). Puts meanwhile may refill
        what was evicted; the hold that sets the limits evicts whatever is left. At most as many holds as the
        evictions need, plus a few."""
        s = self._guard.run(self._store.stats)
        most_entries = s.entries if max_entries is None else max_entries
        most_bytes = s.retained_bytes if max_bytes is None else max_bytes
        over = (max(s.entries - most_entries, 0) // EVICT_STEP
                + max(s.retained_bytes - most_bytes, 0) // EVICT_STEP_NBYTES)
        for _ in range(over + 4 if over else 0):
            if self._path.evict_toward(most_entries, most_bytes, EVICT_STEP, EVICT_STEP_NBYTES, self._now()):
                break

    def verify(self, *, deep: bool = True, repair_damage: bool = False) -> VerifyReport:
        """Check every invariant of the segment (``deep`` also re-hashes every stored key and value and decodes every
        value); with ``repair_damage`` a failing segment is repaired before returning the report of what was found."""
        return self._guard.run(self._verify_locked, deep, repair_damage)

    def _verify_locked(self, deep: bool, repair_damage: bool) -> VerifyReport:
        report = check(self._seg, deep=deep, now=self._table.clock())
        if not report.ok and repair_damage:
            self._guard.repair(deep=deep)
        return report

    # ------------------------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Release this process's handle (idempotent). The cache lives on for the other processes.

        Waits for calls other threads have in progress on this handle; calls made after it raise ClosedError.
        """
        if self.closed or not self._guard.close():
            return
        if _DEV:
            outlived_warning(self.name, self._outlived)
        # And the compiled section's calls still inside (waiting for the lock with the GIL released: they judge its
        # holder through the segment's descriptors, which the finaliser closes), as Guard.close waits for the Python
        # path's. They find the handle closed (released) once the lock is theirs, and leave.
        compiled = self._core
        if compiled is not None:
            deadline = time.monotonic() + self._lock_timeout
            while compiled.users and time.monotonic() < deadline:
                time.sleep(0.001)
        self._finalizer()  # (once: the finaliser is spent, and the collection of the handle does nothing more)

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
        return (_reattach, (self.name, self._lock_timeout, *self._seg.trust.args(), self._store.serializer.name))

    def __repr__(self) -> str:
        name = f"{type(self).__name__}({getattr(self, 'name', '?')!r}"
        if self.closed:
            return f"{name}, closed)"
        # Why without the lock: a repr (in a traceback, a debugger) must never wait; a racy count is fine to show.
        entries = kinds.plain_entries_locked(self._seg)
        return f"{name}, entries={entries}, capacity_bytes={self.capacity_bytes})"

    def _space(self) -> tuple[Parts, int]:
        return self._parts, 0  # the mapping API's keys: those of no kind (mapping.LocalMapping)

    def _hot(self) -> tuple:
        return self._path, self._now  # what the batches call (mapping.LocalMapping)


def _release(seg: Segment, pins, slot, *parts: weakref.ref) -> None:
    """Close what a handle opened and unmap its segment: close()'s end (the guard closed under the lock), and the
    finaliser of a handle collected open (no call can be inside: each holds the handle). ``slot``: the lock's holder
    slot, closed last but for the mapping. ``parts``: the guard, table,
    store and Core, which a collection of the handle in its cycle collects too (they are gone by then). A mapping
    some view still exports stays until that view goes (Segment.close)."""
    guard, table, store, compiled = (ref() for ref in parts)
    if guard is not None:
        guard.closed = True
    if compiled is not None and compiled is not store:
        compiled.release()  # its buffer export, or the mapping cannot be unmapped; gives its reader slot back
    if table is not None:
        table.close()
    if store is not None:
        store.close()
    pins.close()
    slot.close()  # the lock's holder slot (lock.HolderSlot): its description, and the kernel lock through it
    seg.close()


def _reattach(name: str, lock_timeout: float, mode: int = 0o600, trust_owner: Any = (),
              group: int | str | None = None, serializer: str = "msgpack") -> SharedCache:
    return SharedCache(name, create=False, lock_timeout=lock_timeout, mode=mode, trust_owner=trust_owner,
                       group=group, serializer=serializer)
