"""The per-host stats of a ``TieredCache`` namespace: a small shared-memory segment of per-process rows
(``tier/layout.py``), and ``TierStats``, their sum.

Each process writes only its own row, so counting is a plain increment with no lock; a row is claimed with an
exclusive open-file-description lock on one byte of the segment's file, which the kernel drops when the process
dies, and the next claimer keeps adding to it.

The segment is opened with the local cache's ``Trust`` (``trust.py``) and checked before a byte of it is read or
written: another user's file, one more open than asked for, a symlink or anything not a regular file is refused.
Rows are claimed through descriptions reopened from the checked descriptor, never through the name again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import ofd, space
from ..errors import AttachTimeout, LayoutError, LayoutVersionError
from ..layout.dtypes import MAX_COUNTER
from ..segment import Companion, add_companion, flock_until
from ..stats import prometheus_label
from ..trust import Trust
from .layout import (
    C_LATENCY, COUNTERS, H_MAGIC, H_ROW_WORDS, H_ROWS, H_VERSION, LATENCY_BUCKETS, LATENCY_PER_OCTAVE,
    TIER_HEADER_WORDS, TIER_MAGIC, TIER_ROW_WORDS, TIER_ROWS, TIER_SEGMENT_PREFIX, TIER_VERSION,
    tier_nbytes,
)

log = logging.getLogger("shmcache.tiered")
_SHM_DIR = "/dev/shm/"
_OPEN_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO planted here never blocks


def segment_name(cache_name: str, namespace: str) -> str:
    return f"{TIER_SEGMENT_PREFIX}{cache_name}.{namespace}"


def segments() -> list[tuple[str, str]]:
    """(cache name, namespace) of every tier stats segment on the host (a namespace has no dot: split at the last)."""
    try:
        files = os.listdir(_SHM_DIR)
    except FileNotFoundError:
        return []
    found = []
    for f in files:
        rest = f[len(TIER_SEGMENT_PREFIX):]
        if f.startswith(TIER_SEGMENT_PREFIX) and "." in rest:
            cache, namespace = rest.rsplit(".", 1)
            found.append((cache, namespace))
    return sorted(found)


@dataclass(frozen=True)
class TierStats:
    """The host's counts for one namespace, summed over every process since the stats segment was made (see
    ``tier.layout.COUNTERS`` for each counter), with the remote latency percentiles (upper bounds of histogram
    buckets 19 % wide, in µs; 0.0 before any call), the namespace's resident entries and bytes in the local
    cache, and whether some process of the host holds the listener role (``listening``)."""

    namespace: str
    local_hits: int
    local_misses: int
    remote_hits: int
    remote_misses: int
    remote_errors: int
    remote_timeouts: int
    remote_skipped: int
    remote_calls: int
    remote_ns: int
    puts: int
    local_only_puts: int
    invalidations: int
    stale_fills: int
    local_clears: int
    computations: int
    lock_waits: int
    lock_takeovers: int
    listener_starts: int
    stale_hits: int
    refreshes: int
    refresh_failures: int
    remote_p50_us: float
    remote_p90_us: float
    remote_p99_us: float
    local_entries: int
    local_retained_bytes: int
    listening: bool

    @property
    def hit_ratio(self) -> float:
        """Lookups served from either tier, over all lookups (0.0 before any)."""
        lookups = self.local_hits + self.local_misses
        return (self.local_hits + self.remote_hits) / lookups if lookups else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_ratio": self.hit_ratio}

    @staticmethod
    def prometheus_lines(items: list) -> list[str]:
        """Prometheus text lines for ``items``, ``((cache name, namespace), TierStats)`` pairs (see
        ``stats.prometheus_text``)."""
        lines: list[str] = []

        def labels(cache, namespace, extra=""):
            return f'cache="{prometheus_label(cache)}",namespace="{prometheus_label(namespace)}"{extra}'

        for name in COUNTERS:
            if name == "remote_ns":
                continue  # the summary's _sum
            metric = f"shmcache_tier_{name}_total"
            lines.append(f"# HELP {metric} TieredCache {name.replace('_', ' ')}, on this host")
            lines.append(f"# TYPE {metric} counter")
            lines += [f"{metric}{{{labels(c, ns)}}} {getattr(t, name)!r}" for (c, ns), t in items]
        metric = "shmcache_tier_remote_latency_seconds"
        lines.append(f"# HELP {metric} TieredCache remote call latency (quantiles: histogram bucket upper bounds)")
        lines.append(f"# TYPE {metric} summary")
        for (c, ns), t in items:
            for q, us in (("0.5", t.remote_p50_us), ("0.9", t.remote_p90_us), ("0.99", t.remote_p99_us)):
                quantile = f',quantile="{q}"'
                lines.append(f"{metric}{{{labels(c, ns, quantile)}}} {us / 1e6!r}")
            lines.append(f"{metric}_sum{{{labels(c, ns)}}} {t.remote_ns / 1e9!r}")
            lines.append(f"{metric}_count{{{labels(c, ns)}}} {t.remote_calls!r}")
        for name, help_text in (("local_entries", "copies of a TieredCache namespace in the host's cache"),
                                ("local_retained_bytes", "bytes of those copies")):
            metric = f"shmcache_tier_{name}"
            lines.append(f"# HELP {metric} {help_text}")
            lines.append(f"# TYPE {metric} gauge")
            lines += [f"{metric}{{{labels(c, ns)}}} {getattr(t, name)!r}" for (c, ns), t in items]
        return lines



def percentile(histogram: np.ndarray, q: float) -> float:
    """The upper bound, in µs, of the bucket holding the ``q``-quantile of the calls counted in ``histogram``."""
    total = int(histogram.sum())
    if not total:
        return 0.0
    i = int(np.searchsorted(np.cumsum(histogram), q * total))
    return round(2 ** ((i + 1) / LATENCY_PER_OCTAVE), 1)


OPEN_TIMEOUT_S = 10.0  # how long an opener waits for another that is creating the file (it holds the flock)


class Rows:
    """This process's handle on the stats segment: ``row`` is its own row, a memoryview of 8-byte words."""

    _fd = -1  # the checked descriptor, kept open for reopening (class default: close() on a half-built object)

    def __init__(self, cache_name: str, namespace: str, trust: Trust = Trust(), *, claim: bool = True,
                 timeout: float = OPEN_TIMEOUT_S) -> None:
        """Open (with ``claim``: create if need be, and claim a row) the stats segment of the namespace; without
        ``claim``, only read it (FileNotFoundError if it does not exist).

        :raises OwnershipError: if ``trust`` refuses the file at the name (see ``trust.py``)."""
        self.name = segment_name(cache_name, namespace)
        self.path = _SHM_DIR + self.name
        self._claim_fd = -1
        fd = _open(self.path, trust, claim)
        try:
            # Invariant: checked before any byte is read or written, and before the flock (see segment.py).
            trust.check(fd, self.path, "open")
            # Why flock: creation and the header's first write must not race; whole-file flock locks are apart from
            # the byte locks that claim rows.
            flock_until(fd, time.monotonic() + timeout, lambda: AttachTimeout(
                f"{self.path} stays locked by another process that is opening it", what="open",
                hint="if that process is stopped or stuck, end it"))
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    # Why an empty file is sized even when this call did not create it: it passed the owner and
                    # mode checks (another user's never gets here), and a creator that died before this leaves it.
                    self._reserve_new(fd)
                elif size != tier_nbytes():
                    raise LayoutError(f"{self.path} is {size} bytes, a tier stats segment is {tier_nbytes()}",
                                      what="open", hint="remove it (TieredCache.unlink) if it is a leftover")
                else:
                    # Why again: a file sized by an older shmcache (ftruncate only) may still have holes, and a page
                    # the tmpfs cannot back would SIGBUS whoever counts in it. Fills only holes; never shrinks.
                    space.reserve(fd, tier_nbytes(), *self._space_args())
                self.mm = mmap.mmap(fd, tier_nbytes())
                self.header = memoryview(self.mm)[: TIER_HEADER_WORDS * 8].cast("q")
                h = self.header
                if h[H_MAGIC] == 0:
                    h[H_VERSION], h[H_ROWS], h[H_ROW_WORDS] = TIER_VERSION, TIER_ROWS, TIER_ROW_WORDS
                    h[H_MAGIC] = TIER_MAGIC
                elif h[H_MAGIC] != TIER_MAGIC:
                    raise LayoutError(f"{self.path} is not a tier stats segment", what="open")
                elif (h[H_VERSION], h[H_ROWS], h[H_ROW_WORDS]) != (TIER_VERSION, TIER_ROWS, TIER_ROW_WORDS):
                    raise LayoutVersionError(f"{self.path} is of tier stats version {h[H_VERSION]}, this shmcache "
                                             f"reads {TIER_VERSION}", what="open", hint="unlink it")
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._ino = fd, os.fstat(fd).st_ino
        self.words: np.ndarray | None = np.frombuffer(self.mm, dtype="<i8", count=TIER_ROWS * TIER_ROW_WORDS,
                                                      offset=TIER_HEADER_WORDS * 8).reshape(TIER_ROWS, TIER_ROW_WORDS)
        self.row = self._claim() if claim else memoryview(bytearray(TIER_ROW_WORDS * 8)).cast("q")

    def _space_args(self) -> tuple[str, None]:
        return f"the TieredCache stats segment {self.name!r}", None  # of a fixed size: nothing smaller to ask for

    def _reserve_new(self, fd: int) -> None:
        """Size and back a file just made (under its flock, so nobody has it mapped); on failure leave no file."""
        try:
            space.reserve(fd, tier_nbytes(), *self._space_args())
        except BaseException:
            os.ftruncate(fd, 0)  # never a sparse file of the right size, which the next opener would map
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:  # still the file made here
                    os.unlink(self.path)
            raise

    def _claim(self):
        """Claim a free row; a private one (counted by nobody else) if all are taken."""
        fd = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR | os.O_CLOEXEC)  # the file checked, not the name's
        for r in range(TIER_ROWS):
            # Why none may be free: besides 256 live processes, ``sweep`` holds every row for the instant it judges
            # a segment; a process opening it in that instant counts privately (and says so).
            if ofd.lock(fd, r, ofd.WRITE, wait=False):
                self._claim_fd = fd
                # A count out of range (damaged, or written by hand) starts over at 0: near 2**63, the next
                # increment would overflow and fail the call that counts.
                words = self.words[r]
                words[(words < 0) | (words > MAX_COUNTER)] = 0
                off = (TIER_HEADER_WORDS + r * TIER_ROW_WORDS) * 8
                return memoryview(self.mm)[off : off + TIER_ROW_WORDS * 8].cast("q")
        os.close(fd)
        log.warning("shmcache: all %d stats rows of %s are taken; this process's counts are not shared",
                    TIER_ROWS, self.name)
        return memoryview(bytearray(TIER_ROW_WORDS * 8)).cast("q")

    def after_fork_in_child(self) -> None:
        """A forked child counts in a row of its own: the parent's claim stays the parent's (closing the child's
        copy of the descriptor does not release a lock its description still holds in the parent)."""
        if self._fd < 0:
            return  # closed
        if self._claim_fd >= 0:
            os.close(self._claim_fd)
            self._claim_fd = -1
        self.row = self._claim()

    def totals(self) -> np.ndarray:
        words = self.words
        if words is None:
            raise ValueError("these tier stats are closed")
        return words.sum(axis=0)

    def stats(self, namespace: str, local_entries: int, local_retained: int, listening: bool) -> TierStats:
        t = self.totals()
        hist = t[C_LATENCY : C_LATENCY + LATENCY_BUCKETS]
        counts = {name: int(t[i]) for i, name in enumerate(COUNTERS)}
        return TierStats(namespace=namespace, **counts, remote_p50_us=percentile(hist, 0.5),
                         remote_p90_us=percentile(hist, 0.9), remote_p99_us=percentile(hist, 0.99),
                         local_entries=local_entries, local_retained_bytes=local_retained, listening=listening)

    def close(self) -> None:
        # Late counts go nowhere. The old row is not released: another thread may be counting in it right now.
        self.row = memoryview(bytearray(TIER_ROW_WORDS * 8)).cast("q")
        self.words = None
        self.header.release()
        if self._claim_fd >= 0:
            os.close(self._claim_fd)
            self._claim_fd = -1
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self.mm.close()
        except BufferError:
            pass  # a row view is still referenced somewhere; the mapping goes with it

    def unlink(self) -> None:
        """Remove the segment this handle opened; a file made at the name since is left alone."""
        try:
            if os.lstat(self.path).st_ino == self._ino:
                os.unlink(self.path)
        except FileNotFoundError:
            pass


def handles(cache_name: str, namespace: str, trust: Trust = Trust()) -> int:
    """How many rows of the namespace's stats segment are held now: one per open TieredCache handle of the host (a
    forked child's counts on its own); 0 when nobody has it open. Reads the kernel's locks (``F_OFD_GETLK``) without
    taking any, so a process opening the segment meanwhile is never pushed to a private row (as ``sweep`` may).

    :raises FileNotFoundError: if the segment does not exist.
    :raises OwnershipError: if ``trust`` refuses the file at the name (nothing of it is read).
    """
    path = _SHM_DIR + segment_name(cache_name, namespace)
    fd = _open(path, trust, False)
    try:
        trust.check(fd, path, "open")
        if not ofd.held_in(fd, 0, TIER_ROWS):
            return 0
        return sum(ofd.held_elsewhere(fd, r) for r in range(TIER_ROWS))
    finally:
        os.close(fd)


def unlink_of(cache_name: str) -> None:
    """Remove the stats segments of every namespace of ``cache_name`` (when the cache itself is removed): processes
    that have one open keep counting in their mapping, and a TieredCache made later starts a fresh one. A file this
    user may not remove (another user's, in the sticky /dev/shm) is left alone."""
    for cache, namespace in segments():
        if cache == cache_name:
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.unlink(_SHM_DIR + segment_name(cache, namespace))  # a symlink is removed, never followed


def _open(path: str, trust: Trust, create: bool) -> int:
    """The file at ``path`` opened without following a symlink; with ``create``, made first if there is none,
    owner-only, then given the trust's group and mode. Refusals the open itself meets are OwnershipErrors."""
    while True:
        try:
            if create:
                try:
                    fd = os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, trust.mode & 0o700)
                except FileExistsError:
                    pass
                else:
                    try:
                        trust.share(fd)
                    except BaseException:
                        os.close(fd)
                        os.unlink(path)
                        raise
                    return fd
            return os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            # Unlinked between our two opens: create it again.
        except OSError as exc:  # ELOOP (a symlink), EACCES (another user's), EISDIR...
            raise (trust.open_error(path, "open") or exc) from None


def sweep(remove: bool = False, caches=None, trust: Trust = Trust()) -> list[dict]:
    """The stats segments on the host (those of ``caches``, if given), each ``in use`` (a process has a row of it),
    ``orphan``, or ``skipped`` with a ``reason`` (``trust`` refuses it: never locked nor removed); with ``remove``,
    orphans are unlinked. A segment is judged while holding all its rows, so one that a process opens meanwhile is
    never removed from under it."""
    found = []
    for cache, namespace in segments():
        if caches is not None and cache not in caches:
            continue
        name = segment_name(cache, namespace)
        entry = ofd.judge(_SHM_DIR + name, name, 0, TIER_ROWS, remove, trust)
        if entry is not None:
            found.append({**entry, "cache": cache})
    return found


add_companion(Companion(unlink_of, sweep))  # a cache's removal and the sweep take its namespaces' stats segments
