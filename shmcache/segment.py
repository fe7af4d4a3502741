"""Create, attach, close and unlink the shared-memory object of a cache; own every view of its memory.

Creation is race-free without any lock file: whoever opens the object takes ``flock`` on the object's own descriptor,
and while holding it, initialises the segment if its magic is missing. The creator and an attacher that happens to
get there first are therefore interchangeable, and a creator that died half-way (releasing its flock with it) leaves
a segment that the next opener initialises. The magic is written last, so a segment with its magic in place is whole.

Every open is checked before a byte of the file is read or written, and before its flock is taken (``trust.py``):
another user's file, one more open than the ``mode`` asked for, or anything not a regular file is refused with
OwnershipError, so no other user can squat a name for a cache to be initialised in, plant a pre-filled segment, or
hand over a symlink (glibc's ``shm_open`` opens with O_NOFOLLOW).

posix_ipc is used rather than ``multiprocessing.shared_memory`` so that Python's resource_tracker never sees the
segment: a worker that exits must not unlink, or warn about, a cache that other processes still use.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import importlib
import mmap
import os
import shlex
import stat
import time
from functools import partial
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np
import posix_ipc

from . import config, layout, ofd, space
from .errors import AttachTimeout, LayoutError, LayoutVersionError, NoSpaceError, remove_hint
from .layout import Geometry
from .layout import dtypes as d
from .records import Records
from .trust import Trust

_NAME_MAX = 255  # NAME_MAX of the filesystem behind /dev/shm
_SHM_DIR = space.SHM_DIR
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # (Linux's value)
_PAGE = mmap.PAGESIZE  # the system's page: what MAP_FIXED swaps (see Segment._veil)
# The bits of a mapping's cell word 5 (Segment.shown): the lazy columns it shows (Geometry.lazy).
SHOWN_IDLE, SHOWN_VERSIONS, SHOWN_EXPIRES = d.SHOWN_IDLE, d.SHOWN_VERSIONS, d.SHOWN_EXPIRES
_INIT_WAIT_S = 10.0  # how long an attacher waits for a segment that another process is still initialising


def shm_name(name: str) -> str:
    """Validate a cache name and return the POSIX shared-memory object name for it."""
    if not isinstance(name, str):
        raise TypeError(f"cache name must be a str, got {type(name).__name__}")
    if not name or "/" in name or "\0" in name:
        raise ValueError(f"invalid cache name {name!r}: it must be non-empty, without '/' or NUL")
    limit = _NAME_MAX - len(layout.SEGMENT_PREFIX)
    if len(name.encode()) > limit:
        raise ValueError(f"cache name is {len(name.encode())} bytes long; the limit here is {limit}")
    return "/" + layout.SEGMENT_PREFIX + name


def flock_until(fd: int, deadline: float, error) -> None:
    """Take the file's ``flock``, polling until ``deadline`` (``time.monotonic``); then raise ``error()``. The holder
    is a process creating the file: one stopped or stuck there must not block an opener for ever."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise error() from None
            time.sleep(0.001)


def _still_creating(name: str) -> AttachTimeout:
    return AttachTimeout(f"another process has been initialising cache {name!r} for longer than attach_timeout",
                         what="attach", hint=f"if its creator is stopped or stuck, remove it with `shmcache rm "
                                             f"{shlex.quote(name)}` (it holds nothing yet) and create it again; else "
                                             "pass a larger attach_timeout")


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_MAP_FIXED = 0x10  # Linux's value (the mmap module does not export it)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _remap(address: int, nbytes: int, fd: int, offset: int) -> None:
    """Replace ``nbytes`` of this process's mapping at ``address`` (page aligned, inside a mapping of the segment)
    in place: with the file's bytes at ``offset`` (``fd``), or with private zero pages (``fd`` -1). MAP_FIXED swaps
    the pages under the process's memory-map lock, so another thread sees the old pages or the new, never a hole;
    nothing that points into the mapping moves."""
    if fd < 0:
        # MAP_NORESERVE: zero pages that are only read (a write there is a bug, and lands in a private page) must not
        # be charged as memory the process may write: the arena is sized for max_capacity_bytes, often more than the
        # machine's memory, which the kernel's overcommit heuristic would refuse (ENOMEM).
        flags, fd, offset = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED, -1, 0
    else:
        flags = mmap.MAP_SHARED | _MAP_FIXED
    got = _libc.mmap(address, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, offset)
    if got == _MAP_FAILED or got != address:
        err = ctypes.get_errno()
        raise OSError(err, f"remapping {nbytes} bytes of a segment's arena: {os.strerror(err)}")


def _space_args(name: str) -> tuple[str, str]:
    """What a cache segment is called, and how to ask for a smaller one, in ``space``'s messages."""
    return f"cache {name!r}", "pass a smaller capacity_bytes / max_entries / max_capacity_bytes"


class Segment:
    """One process's mapping of a cache segment and the views over it."""

    # Class-level defaults make close() safe on a half-built object.
    mm: mmap.mmap | None = None
    geometry: Geometry  # set once attached or initialised (close() does not read it)
    fd = -1  # the segment's descriptor while open; -1 before and after (never a number another file may reuse)
    initialised_here = False  # this process wrote the segment's header (it may have been created by another)
    features = 0  # the segment's ``features`` word, as attached to (or written)
    version = layout.LAYOUT_VERSION  # the segment's layout version, as attached to (or written)

    def __init__(self, name: str, geometry: Geometry | None, create: bool | None, trust: Trust,
                 default_ttl_ns: int = 0, init_wait: float = _INIT_WAIT_S, features: int = 0,
                 capacity: int | None = None, max_entries: int | None = None, default_tti_ns: int = 0) -> None:
        self._default_ttl_ns = default_ttl_ns  # written into the header only if this call creates the segment
        self._default_tti_ns = default_tti_ns  # and into the idle region (version 14)
        self._features = features  # likewise
        # The capacity a new segment starts with (None: the geometry's whole, which is then not resizable upwards).
        self._capacity = capacity
        # And its entry limit (None: the geometry's most, which is then not resizable upwards).
        self._max_entries = max_entries
        self.name = name
        self.shm_name = shm_name(name)
        self.trust = trust
        path = _SHM_DIR + self.shm_name
        if geometry is not None and create is not False and not os.path.lexists(path):
            # before anything is created: what creation backs (the rest is backed as the arena grows), and the
            # whole, which /dev/shm must be able to hold when it is full
            cap = geometry.capacity_bytes if capacity is None else capacity
            limit = self._limit(geometry)
            backed = geometry.backed(self._index_live(geometry), geometry.slots_for(limit, 0),
                                     geometry.initial_extent(cap, limit), self._shown_at_creation(geometry))
            space.check(sum(stop - start for start, stop in backed), *_space_args(name))
            space.check_whole(geometry.occupied_at_most(cap, self._max_entries), *_space_args(name))
        deadline = time.monotonic() + init_wait
        while True:
            shm = self._open(create, trust)
            try:
                # Invariant: checked before any byte of the file is read or written and before its flock is taken
                # (another user's file could hold that flock to stall us), on the descriptor that will be used.
                trust.check(shm.fd, path, "attach")
                if self._init_or_attach(shm, geometry, deadline):
                    if not self._name_moved(shm.fd):
                        return
                    # Unlinked (and perhaps created anew) while we attached: join what the name holds now.
                    self.close()
                    self.initialised_here = False
            except BaseException:
                self.close()
                if self.initialised_here:  # creation failed half-way: remove what was made, then re-raise
                    shm.unlink()
                raise
            finally:
                shm.close_fd()
            if time.monotonic() > deadline:
                raise LayoutError(
                    f"cache {name!r} exists but was never initialised",
                    what="attach", hint=f"its creator may have died; remove it with `shmcache rm "
                                        f"{shlex.quote(name)}` (it holds nothing) and create it again",
                )
            time.sleep(0.005)

    def _name_moved(self, fd: int) -> bool:
        """Whether the name no longer refers to the object behind ``fd``."""
        try:
            return os.lstat(_SHM_DIR + self.shm_name).st_ino != os.fstat(fd).st_ino
        except FileNotFoundError:
            return True
        except OSError:
            return False  # no /dev/shm to ask (not Linux)

    def _open(self, create: bool | None, trust: Trust):
        """The object at the name, opened (glibc's shm_open adds O_NOFOLLOW), or created with the trust's group and
        mode. Refusals the open itself meets (a symlink, a directory, another user's file) are OwnershipErrors."""
        if create is False:
            try:
                return posix_ipc.SharedMemory(self.shm_name, 0)
            except posix_ipc.ExistentialError:
                raise FileNotFoundError(errno.ENOENT, f"no cache named {self.name!r}", self.shm_name) from None
            except (OSError, ValueError, posix_ipc.PermissionsError) as exc:  # ELOOP; EISDIR (as EINVAL); EACCES
                raise (trust.open_error(_SHM_DIR + self.shm_name, "attach") or exc) from None
        try:
            shm = posix_ipc.SharedMemory(self.shm_name, posix_ipc.O_CREX, mode=trust.mode & 0o700)
        except posix_ipc.ExistentialError:
            if create:
                raise FileExistsError(errno.EEXIST, f"cache {self.name!r} already exists (attach to it with "
                                      f"create=None or False, or {remove_hint(self.name)})", self.shm_name) from None
            return self._open(False, trust)
        try:
            trust.share(shm.fd)
        except BaseException:
            shm.unlink()
            shm.close_fd()
            raise
        return shm

    def _init_or_attach(self, shm, geometry: Geometry | None, deadline: float) -> bool:
        """Under flock: attach if initialised, else initialise if we have a geometry. False: try again later.
        Only for a file that passed the trust check."""
        # Why a file without magic is initialised even when this call did not create it: it passed the owner and
        # mode checks, so only this user, a trusted owner (or root) can have made it -- as trustworthy as a file made
        # here. It is what a creator that died between shm_open and the magic leaves (a crashed gunicorn master);
        # refusing it would wedge the name until someone removes it by hand. Another user's file never gets here.
        flock_until(shm.fd, deadline, partial(_still_creating, self.name))
        try:
            size = os.fstat(shm.fd).st_size
            if size >= d.HEADER_NBYTES:
                with mmap.mmap(shm.fd, d.HEADER_NBYTES) as hm:
                    words = np.frombuffer(hm, dtype="<i8", count=d.HEADER_WORDS).tolist()
                if words[d.H_MAGIC] != 0:
                    self._attach(shm.fd, size, words)
                    return True
            if geometry is None:
                return False
            self._initialise(shm.fd, geometry)
            return True
        finally:
            # Explicitly: the mapping holds a duplicate of the descriptor, so closing ours would not release it.
            fcntl.flock(shm.fd, fcntl.LOCK_UN)

    def _attach(self, fd: int, size: int, words: list[int]) -> None:
        if words[d.H_MAGIC] != layout.MAGIC:
            raise LayoutError(f"{self.shm_name} is not a shmcache segment (bad magic)", what="attach",
                              hint="another program owns this name; choose another cache name")
        if words[d.H_VERSION] not in d.READ_VERSIONS or words[d.H_FEATURES] & ~layout.FEATURES:
            raise LayoutVersionError(
                f"cache {self.name!r} has layout version {words[d.H_VERSION]} (features {words[d.H_FEATURES]:#x}); "
                f"this shmcache reads versions {', '.join(map(str, d.READ_VERSIONS))} (features within "
                f"{layout.FEATURES:#x})",
                what="attach", hint=f"use the same shmcache version in every process, or {remove_hint(self.name)}",
            )
        self.version = words[d.H_VERSION]
        try:
            geometry = Geometry.for_capacity(words[d.H_CAPACITY_BYTES], words[d.H_ENTRY_SLOTS] - 1,
                                             words[d.H_POLICY], self.version)
        except (TypeError, ValueError) as exc:
            raise LayoutError(f"cache {self.name!r} has an impossible geometry: {exc}", what="attach",
                              hint=f"the segment is damaged; {remove_hint(self.name)}") from None
        self.features = words[d.H_FEATURES]
        # (reader_slots is not compared: the layout version fixes it, and verify() restores a damaged one)
        # (version 10's index_slots is the index in force: checked, and repaired, under the lock: Segment.refresh)
        index_slots = geometry.index_slots if self.version >= 10 else words[d.H_INDEX_SLOTS]
        if (geometry.index_slots, geometry.arena_nbytes, geometry.total_nbytes, geometry.ghost_slots) != (
            index_slots, words[d.H_ARENA_NBYTES], words[d.H_TOTAL_NBYTES], words[d.H_GHOST_SLOTS]
        ):
            raise LayoutError(f"cache {self.name!r} has a header that disagrees with its own geometry", what="attach",
                              hint=f"the segment is damaged; {remove_hint(self.name)}")
        if size < geometry.total_nbytes:
            raise LayoutError(
                f"cache {self.name!r} is truncated: {size} bytes, its header says {geometry.total_nbytes}",
                what="attach", hint=remove_hint(self.name),
            )
        self._map(fd, geometry)

    def _limit(self, geometry: Geometry) -> int:
        """The entry limit a new segment starts with (the geometry's most where none was given)."""
        return geometry.max_entries if self._max_entries is None else min(self._max_entries, geometry.max_entries)

    def _index_live(self, geometry: Geometry) -> int:
        """The index a new segment starts with: the one its entry limit needs (version 10), else the whole."""
        if geometry.version < 10:
            return geometry.index_slots
        return min(geometry.index_slots, geometry.index_for(self._limit(geometry)))

    def _shown_at_creation(self, geometry: Geometry) -> int:
        """The lazy columns creation backs and shows (SHOWN_* bits; a layout's others always are, Geometry.lazy):
        the idle columns with a default time to idle, the expires column with it or with a default time to live
        (else the first store that gives one backs them: Store.show_idle, Store.show_expires); never the versions
        column (Store.show_versions)."""
        idle = SHOWN_IDLE | SHOWN_EXPIRES if self._default_tti_ns else 0
        return (idle | (SHOWN_EXPIRES if self._default_ttl_ns else 0)) & geometry.lazy

    def _initialise(self, fd: int, geometry: Geometry) -> None:
        self.initialised_here = True
        total = geometry.total_nbytes
        cap = geometry.capacity_bytes if self._capacity is None else self._capacity
        live, limit = self._index_live(geometry), self._limit(geometry)
        initial = geometry.initial_extent(cap, limit)
        # The header, the tables the entry limit uses and the arena's first pages backed now: a tmpfs that cannot
        # back them fails here, not with SIGBUS later; the rest of the arena is backed as the ring reaches it
        # (arena.py, Segment.back), the rest of the tables by a resize that raises the limit (show_tables). The file
        # is sized for the most a resize may reach: holes, backed by nothing until used.
        space.reserve(fd, total, *_space_args(self.name), backed=0)
        for start, stop in geometry.backed(live, geometry.slots_for(limit, 0), initial,
                                           self._shown_at_creation(geometry)):
            problem = space.back(fd, start, stop)
            if problem is not None:
                raise OSError(errno.ENOSPC, f"cache {self.name!r} could not be created: {problem}")
        self._map(fd, geometry, initial, (live, limit))
        h = self.header_words
        h[d.H_ARENA_EXTENT] = initial
        h[d.H_TOTAL_NBYTES] = total
        h[d.H_ENTRY_SLOTS] = geometry.entry_slots
        h[d.H_INDEX_SLOTS] = live
        h[d.H_ARENA_NBYTES] = geometry.arena_nbytes
        h[d.H_CAPACITY_BYTES] = geometry.capacity_bytes
        h[d.H_POLICY] = geometry.policy
        h[d.H_GHOST_SLOTS] = geometry.ghost_slots
        h[d.H_READER_SLOTS] = d.READER_SLOTS
        config.write(h, self._default_ttl_ns, limit, cap, cap)
        if self.idle_words is not None:
            config.write_tti(self.idle_words, self._default_tti_ns)
            shown = self._shown_at_creation(geometry)
            if shown & SHOWN_IDLE:
                self.idle_words[d.D_IDLE_ON] = 1  # (a default time to idle: its columns backed above)
            if shown & SHOWN_EXPIRES:
                self.idle_words[d.D_EXPIRES_ON] = 1  # (a default time to live or idle: the column backed above)
        h[d.H_UNUSED_NEXT] = 1
        h[d.H_NEXT_EXPIRY] = layout.NEVER
        h[d.H_CREATED_NS] = time.time_ns()
        h[d.H_CREATOR_PID] = os.getpid()
        # The lock's words are zero, as the file was made: a free lock (lock.py).
        h[d.H_VERSION] = self.version = geometry.version
        h[d.H_FEATURES] = self.features = self._features
        # Ordering: the magic goes last; attachers treat a segment without it as not yet initialised.
        h[d.H_MAGIC] = layout.MAGIC

    def _map(self, fd: int, g: Geometry, extent: int | None = None, tables: tuple[int, int] | None = None) -> None:
        """Map the segment; ``extent``: how much of the arena the creator backed, ``tables``: its index in force and
        entry limit (None: attaching, the header says)."""
        self.geometry = g
        # The lock lives in a mapping of its own that outlives close(): a thread still on its way into a cache call
        # when another thread closes the handle must find the lock (and then the closed flag), never unmapped memory.
        self.lock_mm = mmap.mmap(fd, layout.PAGE)
        # The words of the lock's page, kept as long as the page: aio's look at the lock, and the dirty word an
        # unlock sets after a damaged hold, read them also when another thread is closing the handle.
        self.lock_words = memoryview(self.lock_mm).cast("q")
        self._lock_holder = ctypes.c_char.from_buffer(self.lock_mm, d.H_LOCK_OFF)
        self.lock_address = ctypes.addressof(self._lock_holder)
        self.fd = os.dup(fd)  # kept for the lock's holder slot and take-overs (lock.py)
        # Held for as long as this handle is open (and by forked children that inherit the descriptor): sweep()
        # treats a segment whose LIVE_BYTE nobody holds as an orphan. A description of its own, because the mmap
        # objects keep duplicates of ``fd`` (and the lock page outlives close()). Blocks only while a sweep is
        # deciding; the caller's name check then sees the name gone and retries.
        self.live_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        ofd.lock(self.live_fd, ofd.LIVE_BYTE, ofd.READ, wait=True)
        # And this process's PID namespace: the lock trusts a holder's thread id only where no handle is foreign.
        ofd.lock(self.live_fd, ofd.NS_BASE + ofd.pid_namespace(), ofd.READ, wait=True)
        try:
            self.mm = mmap.mmap(fd, g.total_nbytes)
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            raise OSError(errno.ENOMEM, space.map_message(g.total_nbytes, *_space_args(self.name))) from None
        mv = memoryview(self.mm)
        # Flat int64 views: the hot path reads fields as words (see layout/dtypes.py) through these.
        self.header_words = mv[: d.HEADER_NBYTES].cast("q")
        self.index_words = mv[g.index_off : g.index_off + g.index_slots * g.index_slot_nbytes].cast("q")
        # The records, one view per field (records.py: wide or narrow, Geometry.narrow); every record access of the
        # Python path goes through it.
        self.records = Records(mv[g.entries_off : g.entries_off + g.entry_slots * g.entry_nbytes], g.narrow)
        self.arena = mv[g.arena_off : g.arena_off + g.arena_nbytes]
        self.arena_words = self.arena.cast("q")
        self.expires_words = mv[g.expires_off : g.expires_off + g.entry_slots * 8].cast("q")
        self.versions_words = mv[g.versions_off : g.versions_off + g.entry_slots * 8].cast("q")
        self.kinds_bytes = mv[g.kinds_off : g.kinds_off + g.entry_slots]
        self.pins_bytes = mv[g.pins_off : g.pins_off + g.entry_slots]
        self.marks_bytes = mv[g.marks_off : g.marks_off + g.entry_slots]
        # (the ghost in force: its first slots, as many as the index's in force; show_tables moves it)
        self._ghost_all = mv[g.ghost_off : g.ghost_off + g.ghost_slots * d.GHOST.itemsize].cast("q")
        self.ghost_words = self._ghost_all
        self.kind_words = mv[g.kind_table_off : g.kind_table_off + (d.MAX_KINDS + 1) * d.KIND.itemsize].cast("q")
        self.reader_words = mv[g.readers_off : g.readers_off + d.READER_SLOTS * d.READER.itemsize].cast("q")
        # (version 11: the mask of the stripes open, then each stripe's word; None before it: seq alone)
        self.stripe_words = mv[g.stripes_off : g.stripes_off + g.stripes_nbytes].cast("q") if g.stripes_nbytes else None
        # (version 14: the idle region's words, and its two columns; None before it: no entry has a time to idle)
        self.idle_words: memoryview | None
        self.ttis_words: memoryview | None
        self.deadlines_words: memoryview | None
        if g.version >= 14:
            self.idle_words = mv[g.idle_off : g.ttis_off].cast("q")
            self.ttis_words = mv[g.ttis_off : g.ttis_off + g.entry_slots * 8].cast("q")
            self.deadlines_words = mv[g.deadlines_off : g.deadlines_off + g.entry_slots * 8].cast("q")
        else:
            self.idle_words = self.ttis_words = self.deadlines_words = None
        # (version 12: a pinned entry a put, delete or expiry of its key replaces is held aside, not refused)
        self.holds = g.version >= 12
        self._mv = mv
        # How much of the arena this mapping shows of the file: the rest is private zero pages (_veil), so that a
        # read there, which only damage can aim, finds zeros and never a page of the file that is not backed (on a
        # full /dev/shm, a fault there would be SIGBUS). One cell per mapping, read and moved by the Python path
        # and the compiled section alike (Core.watch_extent). A version-7 segment is all backed: all shown.
        # The cell's other words say the same of the tables (version 10: show_tables): the index in force, the
        # entry slots shown, the header's ``resizes`` when they were last taken from the header (-1: not taken, so
        # that the first call takes the lock, where refresh_tables takes and checks them), and the entry limit then
        # (the ring's).
        # (read first: a resize counts itself before its first write, and holds dirty until its last, which
        # attaching checks below: one begun after this read is seen as one, one under way as unsettled words)
        resizes = self.header_words[d.H_RESIZES]
        # Whether this mapping shows the idle columns (version 16: once they are in use, D_IDLE_ON; creation: with a
        # default time to idle; before 16, with the tables). Until then they are its own zero pages: no entry has a
        # time to idle, and nothing writes them (``ttis_live`` and ``deadlines_live`` are None). (read after
        # ``resizes``: the switch writes D_IDLE_ON before it counts its resize, so a switch this read misses is
        # one the first call sees counted, and takes: refresh_tables)
        # Likewise the versions column (version 16: once a caller asks for a version, D_VERSIONS_ON; never at
        # creation) and the expires column (version 18: once an entry has an expiry, D_EXPIRES_ON). A column the
        # layout backs with the tables is shown (Geometry.lazy).
        if tables is not None:
            shown = self._shown_at_creation(g)
        else:
            lazy = self.idle_words if g.lazy_columns else None
            shown = 0 if lazy is None else ((SHOWN_IDLE if lazy[d.D_IDLE_ON] else 0)
                                            | (SHOWN_VERSIONS if lazy[d.D_VERSIONS_ON] else 0)
                                            | (SHOWN_EXPIRES if lazy[d.D_EXPIRES_ON] else 0))
            if shown & SHOWN_IDLE:
                shown |= SHOWN_EXPIRES  # (an idle entry has an expiry: the idle switch shows the column first)
        # (word 5: the lazy columns this mapping shows, SHOWN_* bits)
        self.shown = (ctypes.c_int64 * 6)(g.arena_nbytes, g.index_slots, g.entry_slots, resizes, g.max_entries,
                                          (shown & g.lazy) | (d.SHOWN_ALL & ~g.lazy))
        self._refused = -1  # an extent whose backing failed: not asked again (damage, or another version's writer)
        self._base = np.frombuffer(self.mm, dtype=np.uint8, count=1).ctypes.data
        self._tables_shown = (g.index_slots, g.entry_slots)  # (index slots, entry slots) this mapping shows
        # The cell's words as plain ints, for the Python path: the index's mask and the limit in force, and the entry
        # slots shown (a slot number at or past them is damage: Table.slots).
        self.mask, self.limit, self.slots_shown = g.index_slots - 1, g.max_entries, g.entry_slots
        if self.version >= 10:
            self._tables_shown, self.slots_shown = (0, 0), 1  # (nothing shown yet: show_tables below)
            for off, shown, reserved in g.tables(0, 0):
                self._veil_range(off + shown, off + reserved)
            if tables is None:  # attaching (without the lock): the header's limit and the index it needs
                h = self.header_words
                limit = h[d.H_MAX_ENTRIES]
                live = min(g.index_for(limit), g.index_slots) if 0 < limit <= g.max_entries else 8
                # Words that do not agree (damage, a resize under way, a holder that died in one) are not backed
                # for: the least, which creation backed, taken again and checked by the first call, under the lock
                # (refresh_tables; damage is repaired there).
                if h[d.H_INDEX_SLOTS] != live or h[d.H_DIRTY] or config.problems(h, g):
                    self.shown[3] = -1
                    live, limit = 8, 1
                try:
                    self.show_tables(live, limit, self.slots_in_use())
                except NoSpaceError:  # not backed (damage): the least; refresh_tables tries again
                    self.show_tables(8, 1, 0)
                    self.shown[3] = -1
            else:
                self.show_tables(*tables, 0, backed=True)
        if self.version >= 8:
            if extent is None:
                extent = self.extent()
                if space.back(fd, g.arena_off, g.arena_off + extent) is not None:
                    self._refused, extent = extent, 0  # not backed: shown as zeros, a repair drops what it held
            self._veil(extent)

    def _veil_range(self, start: int, stop: int) -> None:
        """Show private zero pages over the system pages wholly within bytes ``[start, stop)`` of the file."""
        first, end = -(-start // _PAGE) * _PAGE, stop // _PAGE * _PAGE
        if first < end:
            _remap(self._base + first, end - first, -1, 0)

    def show_tables(self, live: int, limit: int, unused_next: int, backed: bool = False, adopt: bool = True) -> None:
        """Make the index of ``live`` slots and the entry limit ``limit`` the ones in force in this mapping, and show
        the index's slots, the ghost's in force and the entry slots the limit and ``unused_next`` need (the entry
        table and its columns: ``Geometry.slots_for``), backed with memory first (``backed``: they are already): a
        resize raised the limit, or this mapping is new. What it showed past them stays shown (a smaller limit
        hides it: ``shrink_tables``). The rest of each region is private zero pages, so a read there, which only damage
        can aim, finds zeros and never a hole of the file (SIGBUS on a full /dev/shm). Version 10. ``adopt`` False:
        shown, the index and limit in force left as they are (a resize backs the tables before it writes).

        :raises NoSpaceError: /dev/shm is full (nothing was shown or adopted).
        """
        g = self.geometry
        was_index, was_slots = self._tables_shown
        to_index, to_slots = max(live, was_index), max(g.slots_for(limit, unused_next), was_slots)
        shown = self.shown[5]
        grown = [(off, was, now) for (off, was, _), (_, now, _) in zip(g.tables(was_index, was_slots, shown),
                                                                        g.tables(to_index, to_slots, shown))
                 if now > was]
        if not backed:
            for off, was, now in grown:
                problem = space.back(self.fd, off + was, off + now)
                if problem is not None:
                    raise NoSpaceError(f"cache {self.name!r} could not grow its tables to {to_slots - 1} entries: "
                                       f"{problem}", what="resize", hint="delete entries, remove unused caches "
                                       "(`shmcache ls`, `shmcache sweep`), or give the host or container more "
                                       "shared memory (docker run --shm-size, a Kubernetes emptyDir with medium: "
                                       "Memory)")
        for off, was, now in grown:
            first, end = (off + was) // _PAGE * _PAGE, -(-(off + now) // _PAGE) * _PAGE
            _remap(self._base + first, min(end, g.total_nbytes) - first, self.fd, first)
        self._tables_shown = (to_index, to_slots)
        self.shown[2] = self.slots_shown = to_slots
        if not adopt:
            return
        self.shown[1], self.shown[4] = live, limit
        self.mask, self.limit = live - 1, limit
        ghost = min(g.ghost_for(live), g.ghost_slots)
        self.ghost_words = self._ghost_all[:ghost]
        self._sizes_of = (None, (0, 0))

    @property
    def ttis_live(self) -> memoryview | None:
        """The ttis column where this mapping shows it (``idle_shown``), else None: no entry has a time to idle."""
        return self.ttis_words if self.idle_shown else None

    @property
    def deadlines_live(self) -> memoryview | None:
        """The deadlines column where this mapping shows it, else None (as ``ttis_live``)."""
        return self.deadlines_words if self.idle_shown else None

    @property
    def versions_live(self) -> memoryview | None:
        """The versions column where this mapping shows it (``versions_shown``), else None: no caller has asked for a
        version yet (version 16), and stores write none."""
        return self.versions_words if self.versions_shown else None

    @property
    def idle_shown(self) -> bool:
        """Whether this mapping shows the idle columns: the cell's bit, one word that the compiled section reads
        too, so that the two paths can never disagree (a signal between two writes could make them)."""
        return bool(self.shown[5] & SHOWN_IDLE)

    @property
    def versions_shown(self) -> bool:
        """Whether this mapping shows the versions column (the cell's bit, as ``idle_shown``)."""
        return bool(self.shown[5] & SHOWN_VERSIONS)

    @property
    def expires_shown(self) -> bool:
        """Whether this mapping shows the expires column (the cell's bit, as ``idle_shown``; version 18: until
        then it reads 0, never, for every slot, and no store writes a word of it but 0 over 0, which it skips)."""
        return bool(self.shown[5] & SHOWN_EXPIRES)

    def show_idle(self) -> None:
        """Show the idle columns (version 16) for the entry slots this mapping shows, backed with memory first, and
        mark them shown in the cell (word 5, which the compiled section reads): the caller holds the lock, and
        either switches them on for every process (Store.show_idle) or takes the switch another process made
        (refresh_tables). What the mapping shows more later, show_tables shows of them too.

        :raises NoSpaceError: /dev/shm is full (nothing was shown).
        """
        self.map_idle()
        self.shown[5] |= SHOWN_IDLE

    def map_idle(self) -> None:
        """``show_idle``'s backing and mapping, the columns not yet marked shown (so that nothing here reads or
        writes them): a switch marks them once D_IDLE_ON is set, so that a switch cut short anywhere never leaves a
        mapping that writes columns the others do not know are in use. A mapping already made is made again, the
        same pages: one the tables' veil hid since is never taken for shown."""
        if not self.idle_shown:
            g = self.geometry
            self._show_columns((g.ttis_off, g.deadlines_off), "the columns of its entries' times to idle", "put")

    def show_versions(self) -> None:
        """Show the versions column (version 16) as ``show_idle`` shows the idle columns (Store.show_versions).

        :raises NoSpaceError: /dev/shm is full (nothing was shown).
        """
        self.map_versions()
        self.shown[5] |= SHOWN_VERSIONS

    def map_versions(self) -> None:
        """``show_versions``'s backing and mapping, the column not yet marked shown (as ``map_idle``)."""
        if not self.versions_shown:
            self._show_columns((self.geometry.versions_off,), "the column of its entries' versions", "version")

    def show_expires(self) -> None:
        """Show the expires column (version 18) as ``show_idle`` shows the idle columns (Store.show_expires).

        :raises NoSpaceError: /dev/shm is full (nothing was shown).
        """
        self.map_expires()
        self.shown[5] |= SHOWN_EXPIRES

    def map_expires(self) -> None:
        """``show_expires``'s backing and mapping, the column not yet marked shown (as ``map_idle``)."""
        if not self.expires_shown:
            self._show_columns((self.geometry.expires_off,), "the column of its entries' expiry times", "put")

    def _show_columns(self, offs: tuple[int, ...], what: str, op: str) -> None:
        g = self.geometry
        spans = [(off, off + self._tables_shown[1] * 8) for off in offs]
        for start, stop in spans:
            problem = space.back(self.fd, start, stop)
            if problem is not None:
                raise NoSpaceError(f"cache {self.name!r} could not back {what}: {problem}", what=op,
                                   hint="delete entries, remove unused caches (`shmcache ls`, `shmcache sweep`), or "
                                   "give the host or container more shared memory (docker run --shm-size, a "
                                   "Kubernetes emptyDir with medium: Memory)")
        for start, stop in spans:
            first, end = start // _PAGE * _PAGE, -(-stop // _PAGE) * _PAGE
            _remap(self._base + first, min(end, g.total_nbytes) - first, self.fd, first)

    def shrink_tables(self, live: int, limit: int, unused_next: int, give_back: bool) -> None:
        """Show private zero pages past what the index of ``live`` slots, the entry limit ``limit`` and the slots
        in use (``unused_next``) need of each table (``Geometry.slots_for``), where this mapping showed more: a
        resize lowered the limit and packed the entries below it (Table.pack), or another process did and this one
        takes its tables (refresh_tables). ``give_back``: the memory of the file's pages there is given back too
        (``fallocate(PUNCH_HOLE)``), which the resize that shrank them does once no read without the lock begun
        before it is under way (readers.quiesce: a page given back is backed again by the next touch, which on a
        full /dev/shm is SIGBUS). Version 10."""
        g = self.geometry
        was_index, was_slots = self._tables_shown
        to_index, to_slots = min(live, was_index), min(g.slots_for(limit, unused_next), was_slots)
        if (to_index, to_slots) == (was_index, was_slots) and not give_back:
            return
        for off, now, reserved in g.tables(to_index, to_slots, self.shown[5]):
            self._veil_range(off + now, off + reserved)
            first, end = -(-(off + now) // _PAGE) * _PAGE, (off + reserved) // _PAGE * _PAGE
            if give_back and first < end:
                space.release(self.fd, first, end)
        self._tables_shown = (to_index, to_slots)
        self.shown[2] = self.slots_shown = to_slots

    def shown_index(self) -> int:
        """The most index slots this mapping shows (and knows backed): the index in force's, or a larger one's."""
        return self._tables_shown[0]

    def refresh_tables(self) -> bool:
        """Take the tables as the header has them now (another process resized, or this mapping is new), under the
        lock: the index in force, whose size must be the one the checked entry limit needs, and the entry slots in
        use shown. False: the words are not ones to take (damage, or a resize cut short): the caller repairs,
        which rewrites them.

        :raises NoSpaceError: /dev/shm cannot back what another process showed (damage)."""
        h, g = self.header_words, self.geometry
        resizes = h[d.H_RESIZES]
        if self.version >= 10:
            live, limit, unused = h[d.H_INDEX_SLOTS], h[d.H_MAX_ENTRIES], h[d.H_UNUSED_NEXT]
            if ((live, limit) != (self.mask + 1, self.limit) or unused > self.shown[2]
                    or g.slots_for(limit, unused) < self.slots_shown or live < self._tables_shown[0]):
                # (what this mapping has already is used as it is: verify judges it, as it judges any word)
                if h[d.H_DIRTY] or config.problems(h, g) or live != g.index_for(limit) or live > g.index_slots:
                    return False
                if self.slots_in_use() < unused:
                    return False  # slots handed out that nobody wrote: a damaged word, which the repair puts back
                try:
                    self.show_tables(live, limit, unused)
                except NoSpaceError:
                    return False  # (what another process backed is backed: only damage asks for more)
                # And no more than that: a resize that lowered the limit gave the pages past it back.
                self.shrink_tables(live, limit, unused, give_back=False)
        else:  # (the tables never move: the words the test of every call compares, as they are)
            self.shown[4] = self.limit = h[d.H_MAX_ENTRIES]
        lazy = self.idle_words
        if lazy is not None and not self.expires_shown and (lazy[d.D_EXPIRES_ON] or lazy[d.D_IDLE_ON]):
            self.show_expires()  # (another process switched the expires column on: version 18; idle needs it)
        if lazy is not None and not self.idle_shown and lazy[d.D_IDLE_ON]:
            self.show_idle()  # (another process switched the idle columns on: version 16)
        if lazy is not None and not self.versions_shown and lazy[d.D_VERSIONS_ON]:
            self.show_versions()  # (and the versions column)
        self.shown[3] = resizes
        return True

    def slots_in_use(self) -> int:
        """The header's ``unused_next`` as a number to trust: within the table, and past the slots this mapping
        shows only as far as the entry table's pages hold data in the file (a slot is handed out only to be written,
        so every page of slots handed out was; asked of the file itself, ``space.first_hole``). A damaged word must
        not make a process back pages nobody used, nor show one never backed."""
        h, g = self.header_words, self.geometry
        unused = h[d.H_UNUSED_NEXT]
        if not 1 <= unused <= g.entry_slots:
            return self.slots_shown
        if unused <= self.slots_shown:
            return unused
        stop = g.entries_off + unused * g.entry_nbytes
        hole = space.first_hole(self.fd, g.entries_off, stop)
        return unused if hole >= stop else max(self.slots_shown, (hole - g.entries_off) // g.entry_nbytes)

    # ((capacity word, entry limit in force), (ring bytes, its top)) last computed: every allocation asks, a resize
    # changes them. None: none yet (any int is a value the word may hold, damaged: -1 would pass for one computed)
    _sizes_of: tuple[tuple[int, int] | None, tuple[int, int]] = (None, (0, 0))

    def _sizes(self) -> tuple[int, int]:
        cap = (self.header_words[d.H_CAPACITY], self.limit)
        seen, sizes = self._sizes_of
        if cap != seen:
            sizes = (self.geometry.ring_nbytes(*cap), self.geometry.extent_top(*cap))
            self._sizes_of = (cap, sizes)
        return sizes

    def ring(self) -> int:
        """Bytes of the arena the ring uses under the capacity and the entry limit in force
        (``Geometry.ring_nbytes``)."""
        return self._sizes()[0]

    def extent_top(self) -> int:
        """The most of the ring the growth rule backs under the capacity and the entry limit in force
        (``Geometry.extent_top``)."""
        return self._sizes()[1]

    def extent(self) -> int:
        """The header's arena extent as a number to trust (arena.py): 0 or past the ring is the whole ring."""
        ext = self.header_words[d.H_ARENA_EXTENT]
        ring = self.ring()
        return ext if 0 < ext <= ring else ring

    # Pages are the system's (mmap.PAGESIZE: 4 KiB here, 16 or 64 KiB on some arm64 kernels), which MAP_FIXED swaps
    # whole; the layout's own 4 KiB alignment (layout.PAGE) need not be a multiple of them. So what is shown of the
    # file ends on a system page, and backing (``_backed_to``) reaches that far: no page of the file is shown that
    # is not backed.

    def _backed_to(self, stop: int) -> int:
        """The file offset that backing the arena up to ``stop`` reaches: the end of its system page."""
        return min(self.geometry.total_nbytes, -(-(self.geometry.arena_off + stop) // _PAGE) * _PAGE)

    def _veil(self, extent: int) -> None:
        """Show the file's arena up to ``extent`` and private zero pages after it."""
        g = self.geometry
        start = -(-(g.arena_off + extent) // _PAGE) * _PAGE
        end = -(-g.total_nbytes // _PAGE) * _PAGE  # (the mapping's end: the system rounds its length up)
        if start < end:
            _remap(self._base + start, end - start, -1, 0)
        self.shown[0] = min(extent, g.arena_nbytes)

    def _show(self, stop: int) -> None:
        """Show the file's arena up to ``stop`` (backed already, to ``_backed_to``), where private zero pages were."""
        g = self.geometry
        start = (g.arena_off + self.shown[0]) // _PAGE * _PAGE
        end = -(-self._backed_to(stop) // _PAGE) * _PAGE
        if end > start:
            _remap(self._base + start, end - start, self.fd, start)
        self.shown[0] = stop

    def refresh(self) -> None:
        """Show what other processes backed of the arena since this mapping last looked (the header's extent),
        after backing it here too: a page of it not backed yet (damage, or a writer of another version) is not
        shown, and the extent is not asked again. An extent below what is shown (a resize shrank the arena and
        released its pages) hides the rest again, so that a later growth backs it before it is written. Under
        the lock (Guard.admit), before anything is read."""
        ext = self.extent()
        if ext < self.shown[0]:
            self._veil(ext)
            return
        if ext == self.shown[0] or ext == self._refused:
            return
        off = self.geometry.arena_off
        if space.back(self.fd, off + self.shown[0], self._backed_to(ext)) is not None:
            self._refused = ext
            return
        self._show(ext)

    def release(self, start: int, give_back: bool) -> bool:
        """Show private zero pages in this mapping from ``start`` of the arena on and, if ``give_back``, give back
        the memory of the file's pages there (``fallocate(PUNCH_HOLE)``): a resize that shrank the ring, the
        header's extent lowered to ``start`` first, under the lock. Whether the memory was given back. (The caller
        says whether that is safe: a page given back is backed again by the next touch, and a process that reads
        without the lock may touch one it found before the extent was lowered: on a full /dev/shm, SIGBUS.)"""
        g = self.geometry
        self._veil(min(start, g.arena_nbytes))
        first = -(-(g.arena_off + start) // _PAGE) * _PAGE  # (the page holding ``start`` stays shown and backed)
        if not give_back or first >= g.arena_off + g.arena_nbytes:
            return False
        return space.release(self.fd, first, g.arena_off + g.arena_nbytes)

    def back(self, stop: int) -> None:
        """Back the arena up to ``stop`` with memory, and show it in this mapping, before anything is written there.

        :raises NoSpaceError: /dev/shm is full (nothing was written).
        """
        off = self.geometry.arena_off
        problem = space.back(self.fd, off + self.shown[0], self._backed_to(stop))
        if problem is None:
            self._show(stop)
        else:
            raise NoSpaceError(f"cache {self.name!r} could not grow its arena to {stop / 2**20:.2f} MiB: {problem}",
                               what="put", hint="delete entries, remove unused caches (`shmcache ls`, `shmcache "
                               "sweep`), or give the host or container more shared memory (docker run --shm-size, "
                               "a Kubernetes emptyDir with medium: Memory)")

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Structured numpy views (header, index, entries) for vectorised walks; drop them before close()."""
        g = self.geometry
        header = np.ndarray((), layout.HEADER, buffer=self.mm, offset=0)
        # (the index in force, and the entry slots shown: past them are zero pages of this process's own)
        index = np.ndarray((self.mask + 1,), g.index_dtype, buffer=self.mm, offset=g.index_off)
        entries = np.ndarray((self.shown[2],), g.entry_dtype, buffer=self.mm, offset=g.entries_off)
        return header, index, entries

    def columns(self) -> tuple[np.ndarray, ...]:
        """numpy views of the per-entry columns (expires, versions, kinds, pins, marks); drop them before
        close()."""
        g, mm = self.geometry, self.mm
        n = self.shown[2]  # (the entry slots shown)
        return (np.ndarray((n,), d.EXPIRES, buffer=mm, offset=g.expires_off),
                np.ndarray((n,), d.VERSIONS, buffer=mm, offset=g.versions_off),
                np.ndarray((n,), d.KINDS, buffer=mm, offset=g.kinds_off),
                np.ndarray((n,), d.PINS, buffer=mm, offset=g.pins_off),
                np.ndarray((n,), d.MARKS, buffer=mm, offset=g.marks_off))

    def kind_table(self) -> np.ndarray:
        """numpy view of the kind table; drop it before close()."""
        return np.ndarray((d.MAX_KINDS + 1,), d.KIND, buffer=self.mm, offset=self.geometry.kind_table_off)

    def close(self) -> None:
        """Unmap the segment (the lock's own page stays mapped until this object is garbage collected)."""
        live_fd = self.__dict__.pop("live_fd", None)
        if live_fd is not None:
            os.close(live_fd)  # this handle no longer holds the segment open (for sweep)
        fd = self.__dict__.pop("fd", None)
        if fd is not None:  # closed once (an attach cut short has one too): never a number reused meanwhile
            os.close(fd)
        if self.mm is None:
            return
        records = self.__dict__.pop("records", None)
        if records is not None:
            records.release()
        for attr in ("arena_words", "arena", "index_words", "header_words", "expires_words",
                     "versions_words", "kinds_bytes", "pins_bytes", "marks_bytes", "ghost_words", "_ghost_all",
                     "kind_words",
                     "reader_words", "stripe_words", "idle_words", "ttis_words", "deadlines_words", "_mv"):
            view = self.__dict__.pop(attr, None)
            if view is not None:
                view.release()
        try:
            self.mm.close()
        except BufferError:
            pass  # a view is still referenced (e.g. by a traceback): the mapping goes when the last view does
        self.mm = None


class Companion(NamedTuple):
    """Segments that belong to a cache and go with it (the Redis tier's stats segments), as the module that makes
    them lists and removes them: ``unlink_of(cache_name)``; ``sweep(remove, cache_names or None, trust)``, entries
    as ``sweep`` returns them."""

    unlink_of: Callable[[str], None]
    sweep: Callable[[bool, Any, Trust], list]


# Why a registry: the modules that make companion segments sit above this one (the tier package imports cache.py,
# which imports this module), so they register here when imported. ``import shmcache`` leaves the tier out until it
# is named, so they are named here too, and imported when a sweep or a removal needs them: a process that never
# named TieredCache still finds (and removes) its stats segments.
_COMPANION_MODULES = ("shmcache.tier.stats",)
_COMPANIONS: list[Companion] = []


def _companions() -> list[Companion]:
    for module in _COMPANION_MODULES:
        importlib.import_module(module)  # registers itself on its first import
    return _COMPANIONS


def add_companion(companion: Companion) -> None:
    """Have ``sweep`` and ``unlink_name`` also handle ``companion``'s segments."""
    _COMPANIONS.append(companion)


def segment_names() -> list[str]:
    """Names of the shmcache caches on this host (their segments in /dev/shm)."""
    try:
        files = os.listdir(_SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(f[len(layout.SEGMENT_PREFIX) :] for f in files if f.startswith(layout.SEGMENT_PREFIX))


def sweep(remove: bool = False, names: Iterable[str] | None = None, *, mode: int = 0o600,
          trust_owner: int | str | Iterable[int | str] | None = None) -> list[dict[str, Any]]:
    """Every cache segment on the host (or those of ``names``), and every ``TieredCache`` stats segment (of those
    caches), with its state: ``in use`` (some process has it open), ``orphan`` (nobody does: left behind by
    processes that are all gone), or ``skipped``, with a ``reason``: a file SharedCache would refuse with the same
    ``mode`` and ``trust_owner`` (another user's, more open than ``mode``, a symlink, not a regular file), which
    the sweep neither opens for locking nor removes. With ``remove``, orphans are unlinked (``removed``: True). A
    segment a live process has open is never removed: every open handle holds a shared lock on its ``LIVE_BYTE``, and
    the sweep unlinks only while it holds that byte exclusively."""
    trust = Trust.of(mode, trust_owner)
    found = []
    for name in segment_names() if names is None else sorted(set(names)):
        try:
            path = _SHM_DIR + shm_name(name)
        except UnicodeEncodeError:  # another user's file, named in bytes that are not UTF-8: no cache of ours
            found.append({"name": name, "cache": name, "state": "skipped", "reason": "its name is not valid UTF-8"})
            continue
        entry = ofd.judge(path, name, ofd.LIVE_BYTE, 1, remove, trust)
        if entry is not None:
            found.append({**entry, "cache": name})
    for companion in _companions():  # the stats segments of TieredCache namespaces, of these caches (or of all)
        found += companion.sweep(remove, None if names is None else set(names), trust)
    return found


def unlink_name(name: str) -> None:
    """Remove the named cache's segment, and its companions' (the stats segments of the TieredCache namespaces it
    fronts); processes that have them mapped keep their mappings until they close them."""
    path = shm_name(name)  # validates the name before anything is removed
    for companion in _companions():
        companion.unlink_of(name)
    try:
        posix_ipc.unlink_shared_memory(path)
    except posix_ipc.ExistentialError:
        raise FileNotFoundError(errno.ENOENT, f"no cache named {name!r}", shm_name(name)) from None


def segment_in_use(name: str) -> bool:
    """Whether some process has the named cache open (holds its ``LIVE_BYTE``), asked without attaching to it."""
    try:
        # Why O_NONBLOCK: a FIFO planted at the name would otherwise block the open for ever.
        fd = os.open(_SHM_DIR + shm_name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # gone, or not ours to look at
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return ofd.held_elsewhere(fd, ofd.LIVE_BYTE)
    finally:
        os.close(fd)


def attached(names: Iterable[str]) -> dict[str, tuple[int | None, list[int]]]:
    """For each named cache: how many handles have it open, of every user and PID namespace (the read locks on its
    ``LIVE_BYTE``, one per handle and the children that inherited it; None where /proc cannot tell), and the
    processes holding them that this one may look into (its user's; every one for root), by pid. Read from /proc,
    without opening the caches or taking any lock."""
    paths = {}
    for name in names:
        try:
            paths[name] = _SHM_DIR + shm_name(name)
        except (UnicodeEncodeError, ValueError):
            continue
    readers = ofd.readers_by_file(ofd.LIVE_BYTE)
    processes = ofd.reading_processes(set(paths.values()), ofd.LIVE_BYTE)
    out: dict[str, tuple[int | None, list[int]]] = {}
    for name, path in paths.items():
        try:
            st = os.lstat(path)
        except OSError:
            continue
        handles = None if readers is None else readers.get(ofd.file_id(st), 0)
        out[name] = handles, sorted(processes.get(path, ()))
    return out
