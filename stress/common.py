"""Shared parts of the stress scripts: self-checking values, the random workload, worker processes, the summary.

Every value names its key and carries a checksum, or is derived from its key and sequence number alone, so a get of
key K that returns anything but an intact value put under K -- another key's value, a torn copy, a block moved or
freed underneath -- is counted as wrong. Four shapes take the codec's four paths: a msgpack dict padded with random
bytes (with a tuple of a datetime, a UUID and a frozenset derived from key and sequence number, for the standard
types' ext path), a dict holding a numpy array, a bare numpy array (the ``A`` path, decoded under the lock) and raw
bytes.

Workers count into one shared array of int64 words, one row of ``FIELDS`` per worker slot, written only by the
process in that slot: the parent reads progress at any time, and a worker that is SIGKILLed leaves its counts behind.

Every script that creates a cache takes --policy (``shmcache.POLICIES``, or ``all``: each policy in turn, the
seconds split equally, one summary line each, which names its policy). The checks hold under every policy: a put
returns True, or False where it may not be admitted (counted in ``not_admitted``): under ``keep``, a new key the
full cache did not take; under every policy, where the mix has views, a put whose room open views pin or hold.
Anywhere else a False is a lie. No check assumes an eviction order.
"""

from __future__ import annotations

import argparse
import datetime as dt
import faulthandler
import itertools
import json
import mmap
import os
import random
import re
import signal
import sys
import time
import traceback
import uuid
import warnings

import numpy as np
import xxhash

from shmcache import POLICIES, CacheLimits, PinnedError, SharedCache, ShmCacheError, TooLargeError, TooLargeWarning
from shmcache.cache import DEFAULT_POLICY
from shmcache.layout import SEGMENT_PREFIX
from shmcache import readers
from shmcache.layout.dtypes import H_LOCK_OFF
from shmcache.layout.geometry import RESERVE_FACTOR
from shmcache.lock import FUTEX_TID_MASK

# The storms lower the limits below their largest values: a value get_or_compute computed and could not keep is
# expected there (counted in too_large), not news.
warnings.filterwarnings("ignore", category=TooLargeWarning)

FIELDS = ("ops", "wrong", "errors", "foreign", "unverified", "repairs", "refused", "not_admitted", "snapshots",
          "restores")
OPS, WRONG, ERRORS, FOREIGN, UNVERIFIED, REPAIRS, REFUSED, NOT_ADMITTED, SNAPSHOTS, RESTORES = range(len(FIELDS))
NF = len(FIELDS)
MIX = {"get": 55, "put": 32, "delete": 7, "contains": 3, "stats": 1.5, "set_limits": 0.3, "verify": 0.2, "clear": 0.005,
       "put_ttl": 4, "put_tti": 3, "view": 4, "cas": 2, "add": 1, "touch": 1, "kind_put": 2, "kind_get": 3,
       "kind_clear": 0.01,
       "get_many": 2, "put_many": 1, "items": 0.2, "popitem": 0.3, "snapshot": 0.05, "restore": 0.05, "resize": 0.05,
       "stale": 1}
SNAPSHOT_OPS = ("snapshot", "restore")  # in a mix only where the workload is given a directory for its files
KIND = "stress"  # the key kind the kind_* operations use; its keys hold values checked like the others
HOT_SHARE = 0.8  # share of key draws from the heavy-tailed (Zipf-like) distribution; the rest are uniform
MAX_REPORTS = 5  # each process prints this many wrong values or unexpected errors, then only counts them
_MUL = np.uint64(0x9E3779B97F4A7C15)
_xxh = xxhash.xxh3_64_intdigest


def key_name(i: int) -> str:
    return f"k{i}"


_WORKLOAD_KEY = re.compile(r"k(0|[1-9][0-9]*)")  # what key_name makes


def _sum(key: str, seq: int, pad: bytes) -> int:
    return _xxh(key.encode() + pad + seq.to_bytes(8, "little"))


def _words(key: str, seq: int, n: int) -> np.ndarray:
    """``n`` uint64 words that depend on ``key`` and ``seq`` alone (uint64 arithmetic wraps)."""
    return (np.arange(n, dtype=np.uint64) + np.uint64(_sum(key, seq, b""))) * _MUL


def _stamp(key: str, seq: int) -> tuple:
    """Standard types (stdtypes.py's ext path) that depend on ``key`` and ``seq`` alone."""
    h = _sum(key, seq, b"")
    when = _EPOCH + dt.timedelta(microseconds=h % 2**50)
    return when, uuid.UUID(int=h), frozenset((key, seq))


_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))


def make_value(key: str, seq: int, rng: random.Random, nbytes: int):
    """A value of about ``nbytes`` bytes that ``check_value(key, ...)`` accepts and no other key's check does."""
    r = rng.random()
    if r < 0.55:
        pad = rng.randbytes(nbytes)
        return {"k": key, "n": seq, "pad": pad, "sum": _sum(key, seq, pad), "t": _stamp(key, seq)}
    if r < 0.75:
        return {"k": key, "n": seq, "a": _words(key, seq, nbytes // 8)}
    return viewable_value(key, seq, rng, nbytes, bytes_share=0.4)


def viewable_value(key: str, seq: int, rng: random.Random, nbytes: int, bytes_share: float = 0.25):
    """A value ``view()`` serves (a bare array, or bytes ``bytes_share`` of the time) that ``check_value(key, ...)``
    accepts, of about ``nbytes`` bytes."""
    if rng.random() >= bytes_share:
        return np.concatenate((np.array([_xxh(key.encode()), seq], np.uint64), _words(key, seq, nbytes // 8)))
    pad = rng.randbytes(nbytes)
    return b"%s\0%s%s%s" % (key.encode(), seq.to_bytes(8, "little"), pad, _sum(key, seq, pad).to_bytes(8, "little"))


def check_value(key: str, v) -> str | None:
    """None if ``v`` is an intact value put under ``key``, else what is wrong with it."""
    try:
        if isinstance(v, dict):
            if v.get("k") != key:
                return f"value carries key {v.get('k')!r}"
            if "pad" in v:
                ok = v["sum"] == _sum(key, v["n"], v["pad"]) and v["t"] == _stamp(key, v["n"])
            else:
                a = v["a"]
                ok = a.dtype == np.uint64 and a.ndim == 1 and np.array_equal(a, _words(key, v["n"], len(a)))
        elif isinstance(v, np.ndarray):
            if not (v.dtype == np.uint64 and v.ndim == 1 and len(v) >= 2 and int(v[0]) == _xxh(key.encode())):
                return "array does not carry the key"
            ok = np.array_equal(v[2:], _words(key, int(v[1]), len(v) - 2))
        elif isinstance(v, bytes):
            kb, _, rest = v.partition(b"\0")
            if kb != key.encode():
                return f"bytes carry key {kb[:40]!r}"
            ok = len(rest) >= 16 and int.from_bytes(rest[-8:], "little") == _sum(
                key, int.from_bytes(rest[:8], "little"), rest[8:-8])
        else:
            return f"unexpected type {type(v).__name__}"
    except Exception as exc:
        return f"malformed value: {exc!r}"
    return None if ok else "checksum mismatch"


class Workload:
    """Random operations on one cache by one process, each result checked, counted in row ``row`` of ``counts``.

    ``big_share`` of puts carry values of up to ``max_nbytes``; the rest stay under 4 KiB. ``strict``: verify()
    must be ok whenever a worker calls it (no corruption is being injected). ``snapshot_dir``: where the snapshot
    and restore operations keep the worker slot's snapshot file (without one, the mix leaves them out)."""

    def __init__(self, cache, rng, counts, row, *, nkeys, max_nbytes, mix=None, big_share=0.05, strict=True,
                 snapshot_dir=None, views_elsewhere=False):
        mix = mix or MIX
        if snapshot_dir is None:
            mix = {op: w for op, w in mix.items() if op not in SNAPSHOT_OPS}
        # The slot's file: a worker killed while writing it leaves the last whole one, which its replacement restores.
        self.snapshot_path = None if snapshot_dir is None else os.path.join(snapshot_dir, f"slot{row}.snap")
        self.cache, self.rng, self.c, self.base = cache, rng, counts, row * NF
        self.nkeys, self.max_nbytes, self.big_share, self.strict = nkeys, max_nbytes, big_share, strict
        self.ops, self.cum = list(mix), list(itertools.accumulate(mix.values()))
        self.seq = row << 40
        self.reports = 0
        self.kind = cache.kind(KIND)
        self.policy = cache.policy
        # keep's put of a new key may store nothing when full; any policy's whose room views pin or hold (this
        # worker's, or another's of the same cache: ``views_elsewhere``)
        self.may_refuse = self.policy == "keep" or "view" in self.ops or views_elsewhere

    def key(self) -> str:
        if self.rng.random() < HOT_SHARE:
            return key_name(int((self.rng.paretovariate(1.2) - 1) * self.nkeys / 20) % self.nkeys)
        return key_name(self.rng.randrange(self.nkeys))

    def nbytes(self) -> int:
        r = self.rng.random()
        if r < self.big_share:
            return self.rng.randrange(min(4096, self.max_nbytes), self.max_nbytes + 1)
        return self.rng.randrange(256) if r < 0.75 else self.rng.randrange(256, 4096)

    def report(self, field: int, msg: str) -> None:
        self.c[self.base + field] += 1
        if self.reports < MAX_REPORTS and (self.strict or field != ERRORS):  # damage makes errors expected
            self.reports += 1
            print(f"[pid {os.getpid()}] {FIELDS[field]}: {msg}", file=sys.stderr, flush=True)

    def stored(self, what: str, key: str, r) -> None:
        """Check put's result ``r``: True (stored), or False where a put may not be admitted (``may_refuse``:
        counted); anything else -- another False, a non-bool -- is a wrong answer."""
        if r is True:
            return
        if r is False and self.may_refuse:
            self.c[self.base + NOT_ADMITTED] += 1
            return
        self.report(WRONG, f"{what}({key!r}) returned {r!r} under policy {self.policy!r}")

    def step(self) -> None:
        op = self.rng.choices(self.ops, cum_weights=self.cum)[0]
        try:
            getattr(self, "_" + op)()
        except (TooLargeError, PinnedError):
            pass  # documented refusals: a big entry above a lowered limit; a shrink past a block a view reads
        except ShmCacheError as exc:
            self.report(ERRORS, f"{op}: {exc!r}")
        except Exception as exc:
            interrupt = self.interrupt_of(exc)
            if interrupt is not None:
                raise interrupt from None
            self.report(FOREIGN, f"{op}: {traceback.format_exc()}")
        self.c[self.base + OPS] += 1

    def interrupt_of(self, exc: Exception) -> BaseException | None:
        """The interrupt of the worker's own that ``exc`` stands for, if any (none here: the signal storm's
        workload knows one), to be raised as itself rather than counted as a foreign error."""
        return None

    def _get(self) -> None:
        key = self.key()
        v = self.cache.get(key)
        why = None if v is None else check_value(key, v)
        if why:
            self.report(WRONG, f"get({key!r}) returned a wrong value: {why}")

    def _put(self) -> None:
        key = self.key()
        self.seq += 1
        self.stored("put", key, self.cache.put(key, make_value(key, self.seq, self.rng, self.nbytes())))

    def _put_ttl(self) -> None:
        key = self.key()
        self.seq += 1
        value = make_value(key, self.seq, self.rng, self.nbytes())
        self.stored("put", key, self.cache.put(key, value, ttl=self.rng.choice((0.001, 0.01, 0.1))))

    def _put_tti(self) -> None:
        """A put with a time to idle (and now and then a time to live too): the gets and views around it move its
        expiry, under the lock or handed to it from a read without it."""
        key = self.key()
        self.seq += 1
        value = make_value(key, self.seq, self.rng, self.nbytes())
        ttl = self.rng.choice((None, None, 0.05, 1.0))
        self.stored("put", key, self.cache.put(key, value, ttl, tti=self.rng.choice((0.001, 0.01, 0.1, 1.0))))

    def _view(self) -> None:
        """A zero-copy read, checked inside its block while other processes write (and evict) around it; now and
        then the viewed key itself is replaced inside the block (its old entry held aside for the view)."""
        key = self.key()
        try:
            with self.cache.view(key) as v:
                if self.rng.random() < 0.25:
                    self.seq += 1
                    self.cache.put(key, make_value(key, self.seq, self.rng, self.nbytes()))
                else:
                    self.cache.get(self.key())  # hold the pin across another operation
                why = check_value(key, bytes(v) if isinstance(v, memoryview) else v)
        except (KeyError, TypeError):  # absent, or a value views do not serve
            return
        if why:
            self.report(WRONG, f"view({key!r}) showed a wrong value: {why}")

    def _get_many(self) -> None:
        keys = [self.key() for _ in range(self.rng.randrange(1, 9))]
        for key, v in zip(keys, self.cache.get_many(keys)):
            why = None if v is None else check_value(key, v)
            if why:
                self.report(WRONG, f"get_many(...{key!r}...) returned a wrong value: {why}")

    def _put_many(self) -> None:
        items = {}
        for _ in range(self.rng.randrange(1, 6)):
            key = self.key()
            self.seq += 1
            items[key] = make_value(key, self.seq, self.rng, self.nbytes())
        self.cache.put_many(items)

    def _cas(self) -> None:
        key = self.key()
        v, version = self.cache.get_with_version(key)
        if v is None:
            return
        why = check_value(key, v)
        if why:
            self.report(WRONG, f"get_with_version({key!r}) returned a wrong value: {why}")
            return
        self.seq += 1
        self.cache.cas(key, make_value(key, self.seq, self.rng, self.nbytes()), version)

    def _stale(self) -> None:
        """get_or_compute serving stale: values that go stale within milliseconds, refreshed by a thread of this
        process or of another (a worker SIGKILLed mid-refresh hands it on); whatever a call returns is checked."""
        key = self.key()
        self.seq += 1
        seq, nbytes = self.seq, self.nbytes()
        v = self.cache.get_or_compute(key, lambda: make_value(key, seq, random.Random(seq), nbytes), ttl=0.005,
                                      stale_ttl=0.5)
        why = check_value(key, v)
        if why:
            self.report(WRONG, f"get_or_compute({key!r}, stale_ttl=) returned a wrong value: {why}")

    def _add(self) -> None:
        key = self.key()
        self.seq += 1
        self.cache.add(key, make_value(key, self.seq, self.rng, self.nbytes()))

    def _touch(self) -> None:
        self.cache.touch(self.key(), self.rng.choice((0, 0.05)))

    # A kind's values name the kind too: one served under the plain key (or the reverse) fails its check.
    def _kind_put(self) -> None:
        key = self.key()
        self.seq += 1
        self.stored("kind put", key, self.kind.put(key, make_value(f"{KIND}/{key}", self.seq, self.rng, self.nbytes())))

    def _kind_get(self) -> None:
        key = self.key()
        v = self.kind.get(key)
        why = None if v is None else check_value(f"{KIND}/{key}", v)
        if why:
            self.report(WRONG, f"kind get({key!r}) returned a wrong value: {why}")

    def _kind_clear(self) -> None:
        self.kind.clear()

    # The listings hand out keys and values read from the segment, not looked up by a key given: each key must be
    # one that was put, and each value the one put under it. (Keys of other families, a script's own counters, are
    # passed over; a key damaged into a prefix or one byte more of a workload key is not of that family.)
    def _listed(self, what: str, key, v, name: str = "{}") -> None:
        if not isinstance(key, str):
            why = None  # (memoize's keys, of another family)
        elif _WORKLOAD_KEY.fullmatch(key):
            why = check_value(name.format(key), v)
        else:
            why = f"key {key!r} is no key of the workload" if key[:1] == "k" else None
        if why:
            self.report(WRONG, f"{what} handed out ({key!r:.60}, ...): {why}")

    def _items(self) -> None:
        for space, name in ((self.cache, "{}"), (self.kind, KIND + "/{}")):
            for key, v in space.items():
                self._listed("items()", key, v, name)

    def _popitem(self) -> None:
        try:
            key, v = self.cache.popitem()
        except KeyError:
            return
        self._listed("popitem()", key, v)

    def _delete(self) -> None:
        self.cache.delete(self.key())

    def _contains(self) -> None:
        _ = self.key() in self.cache

    def _stats(self) -> None:
        self.cache.stats()

    def _clear(self) -> None:
        self.cache.clear()

    def _set_limits(self) -> None:
        s = self.cache.stats()
        # (the entry limit the cache was made with: its tables reach RESERVE_FACTOR times that, which _resize uses)
        n, nbytes = max(1, s.capacity_entries // RESERVE_FACTOR), s.capacity_bytes
        if self.rng.random() < 0.5:  # back to the full capacity, so lowered limits do not pile up
            self.cache.set_limits(CacheLimits(n, nbytes))
        else:
            lowered = CacheLimits(self.rng.randint(max(1, n // 8), n), self.rng.randint(nbytes // 8, nbytes))
            self.cache.set_limits(lowered)

    def _resize(self) -> None:
        """A new capacity for every process, from a quarter to four times the one the cache was made with (its
        max_capacity_bytes is 16 times that): a shrink evicts, compacts and gives pages back under the others; and
        half the time a new entry limit, from a quarter to four times the one of creation (the tables grow, the
        index is rebuilt at its new size)."""
        most = self.cache.max_capacity_bytes
        made = max(4096, most // RESERVE_FACTOR)
        capacity = min(most, int(made * self.rng.choice([0.25, 0.5, 1, 1, 2, 4])))
        entries = None
        if self.rng.random() < 0.5:
            made_entries = max(1, self.cache.stats().capacity_entries // RESERVE_FACTOR)
            entries = max(1, int(made_entries * self.rng.choice([0.25, 0.5, 1, 1, 2, 4])))
        self.cache.resize(capacity_bytes=capacity, max_entries=entries)

    def _snapshot(self) -> None:
        """Write the cache to the slot's snapshot file while the other workers go on (and may be killed meanwhile)."""
        self.cache.snapshot(self.snapshot_path)
        self.c[self.base + SNAPSHOTS] += 1

    def _restore(self) -> None:
        """Store back what the slot's last snapshot held: values the workers wrote earlier, each still its key's
        (the reads check them). The file is always a whole one, however its writer ended: anything but a complete
        restore with no damaged record is an error."""
        try:
            r = self.cache.restore(self.snapshot_path)
        except FileNotFoundError:
            return
        self.c[self.base + RESTORES] += 1
        if not r.complete or r.damaged:
            self.report(ERRORS, f"restore of {self.snapshot_path}: {r}")

    def _verify(self) -> None:
        report = self.cache.verify(deep=self.rng.random() < 0.3, repair_damage=not self.strict)
        if self.strict and not report.ok:
            self.report(ERRORS, f"verify() failed: {list(report.problems)}")


def worker(name: str, row: int, seed: int, counts, stop, opts: dict) -> None:
    """Body of a hammer / kill_storm worker process: random operations until ``stop`` is set or the parent is gone."""
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1)  # the parent asks for a stack dump when progress stalls
    parent = os.getppid()
    with SharedCache(name, create=False) as cache:
        w = Workload(cache, random.Random(seed), counts, row, **opts)
        while not stop.value and os.getppid() == parent:
            w.step()


def total(counts, field: int, rows: int | None = None) -> int:
    rows = len(counts) // NF if rows is None else rows
    return sum(counts[r * NF + field] for r in range(rows))


class Progress:
    """Notices when the workers' total op count has not grown for ``limit`` seconds."""

    def __init__(self, counts, limit: float) -> None:
        self.counts, self.limit = counts, limit
        self.last, self.since = -1, time.monotonic()

    def stalled(self) -> bool:
        n, now = total(self.counts, OPS), time.monotonic()
        if n != self.last:
            self.last, self.since = n, now
        return now - self.since > self.limit


def raw_map(name: str, writable: bool = False) -> mmap.mmap:
    """The whole segment of cache ``name``, mapped straight from /dev/shm without going through shmcache."""
    fd = os.open(f"/dev/shm/{SEGMENT_PREFIX}{name}", os.O_RDWR if writable else os.O_RDONLY)
    try:
        return mmap.mmap(fd, 0, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
    finally:
        os.close(fd)


def lifetime_reads(cache) -> tuple[int, int, int]:
    """(lookups answered without the lock, retries, fallbacks) over the whole run: the reader slots' sums, which
    stats() reports less what the workload's last clear() set aside."""
    hits, misses, retries, fallbacks = readers.sums(cache._seg.reader_words)
    return hits + misses, retries, fallbacks


def lock_owner(mm: mmap.mmap) -> int:
    """Thread id of the cache lock's holder, 0 when free, from the lock's futex word as shmcache.lock reads it (a
    racy, informational read)."""
    return int.from_bytes(mm[H_LOCK_OFF : H_LOCK_OFF + 4], "little") & FUTEX_TID_MASK


def dump_stalled(procs, mm: mmap.mmap, seconds: float) -> None:
    print(f"no progress for {seconds:g} s; the cache lock is held by tid {lock_owner(mm)}; worker stacks follow",
          file=sys.stderr, flush=True)
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGUSR1)
    time.sleep(1.0)


def exit_on_sigterm() -> None:
    """Make SIGTERM unwind the parent through its ``finally`` (stop workers, unlink the cache) instead of killing it."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def start(ctx, target, args):
    p = ctx.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def reap(procs, timeout: float) -> list:
    """Join ``procs`` within ``timeout`` seconds in all; SIGKILL those still running and return them."""
    deadline = time.monotonic() + timeout
    stuck = []
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            stuck.append(p)
            p.kill()
            p.join(5)
    return stuck


def final_check(cache: SharedCache, nkeys: int, counters: bool = True) -> tuple[bool, int]:
    """verify() must be ok, the stats within the limits and naming the cache's policy, and every cached key must read
    back intact: (ok, wrong). ``counters``: also the policy's counters that must stay 0 -- not_admitted but under
    keep, small_entries, promoted and ghost_hits but under s3fifo (small_entries and promoted under auto too), the
    filter's counts but under auto (not where damage may have set them)."""
    report, s = cache.verify(), cache.stats()
    problems = list(report.problems)
    if s.policy != cache.policy:
        problems.append(f"stats: policy={s.policy!r} in a cache created with {cache.policy!r}")
    if counters and cache.policy != "keep" and s.not_admitted:
        problems.append(f"stats: not_admitted={s.not_admitted} under {cache.policy}, which admits every put")
    if counters and cache.policy not in ("s3fifo", "auto") and (s.small_entries or s.promoted or s.ghost_hits):
        problems.append(f"stats: small_entries={s.small_entries} promoted={s.promoted} ghost_hits={s.ghost_hits} "
                        f"under {cache.policy}, which has no small queue nor ghost")
    if counters and cache.policy == "auto" and s.ghost_hits:
        problems.append(f"stats: ghost_hits={s.ghost_hits} under auto, which has no ghost")
    if cache.policy != "auto" and (s.window_target or s.filter_admitted or s.filter_refused):
        problems.append(f"stats: window_target={s.window_target} filter_admitted={s.filter_admitted} "
                        f"filter_refused={s.filter_refused} under {cache.policy}, which has no window")
    if not 0 <= s.entries <= s.max_entries:
        problems.append(f"stats: entries={s.entries} with max_entries={s.max_entries}")
    if not 0 <= s.retained_bytes <= s.max_retained_bytes:
        problems.append(f"stats: retained_bytes={s.retained_bytes} with max_retained_bytes={s.max_retained_bytes}")
    if not 0 <= s.arena_used_bytes <= s.arena_bytes:
        problems.append(f"stats: arena_used_bytes={s.arena_used_bytes} of arena_bytes={s.arena_bytes}")
    for p in problems:
        print(f"final check: {p}", file=sys.stderr)
    wrong = 0
    for i in range(nkeys):
        key = key_name(i)
        v = cache.get(key)
        why = None if v is None else check_value(key, v)
        if why:
            wrong += 1
            print(f"final check: get({key!r}): {why}", file=sys.stderr)
    return not problems, wrong


def make_parser(doc: str, **defaults) -> argparse.ArgumentParser:
    """The options every script shares; ``defaults`` are the calling script's module-level constants."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = defaults
    p.add_argument("--seconds", type=float, default=d["seconds"], help="how long to run (default %(default)s)")
    p.add_argument("--workers", type=int, default=d["workers"], help="worker processes (default %(default)s)")
    p.add_argument("--seed", type=int, default=d["seed"], help="seed of every random choice (default %(default)s)")
    p.add_argument("--keys", type=int, default=d["keys"], help="distinct keys (default %(default)s)")
    p.add_argument("--capacity-bytes", type=int, default=d["capacity_bytes"], help="cache capacity_bytes "
                   "(default %(default)s)")
    p.add_argument("--max-entries", type=int, default=d["max_entries"], help="cache max_entries (default %(default)s)")
    p.add_argument("--max-value-bytes", type=int, default=d["max_value_bytes"], help="largest value of an "
                   "ordinary put (default %(default)s)")
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), default="fork",
                   help="multiprocessing start method (default %(default)s)")
    p.add_argument("--policy", choices=(*POLICIES, "all"), default=d.get("policy", DEFAULT_POLICY),
                   help="the cache's eviction policy; all: each in turn, --seconds split equally between them, one "
                   "summary line each (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object (one per policy)")
    return p


def run_policies(prog: str, args: argparse.Namespace, run_one) -> int:
    """``run_one(args)`` -> (fields, failed) under the policy --policy names, or under each in turn for ``all`` (each
    run gets an equal share of --seconds and the same seed: ``--policy P --seconds S/3`` runs the same part alone);
    one summary line per run, naming its policy. The exit status is 1 when any run failed."""
    names = POLICIES if args.policy == "all" else (args.policy,)
    status = 0
    for policy in names:
        one = argparse.Namespace(**{**vars(args), "policy": policy, "seconds": args.seconds / len(names)})
        fields, failed = run_one(one)
        status |= finish(prog, {"policy": policy, **fields}, args.json, failed)
    return status


def finish(prog: str, fields: dict, as_json: bool, failed: bool) -> int:
    """Print the one summary line (or JSON object); the exit status is 1 when ``failed``."""
    if as_json:
        print(json.dumps({"script": prog, **fields, "ok": not failed}), flush=True)
    else:
        print(f"{prog}: " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    return 1 if failed else 0


def unlink_quietly(name: str) -> None:
    try:
        SharedCache.unlink_name(name)
    except FileNotFoundError:
        pass
