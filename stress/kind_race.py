"""A stray write racing the lock's kind check: a kind word made foreign in the nanoseconds between the check that
every lock call makes (``shmcache/_core_lock.c`` ``try_checked``, ``shmcache/lock.py`` ``SegmentLock.try_checked``)
and glibc's own read of it.

--workers processes put and get self-checking values in a loop while one more process writes a foreign kind into the
mutex and puts the right one back at once, every --gap busy-loop rounds. A locker that passed the check can then
reach glibc with the foreign kind, and glibc takes that kind's path: a plain mutex's (the futex word becomes 1 or 2,
not the holder's thread id, and the mutex is not queued on the holder's robust list), or a priority-inheritance
one's (the word names the holder, but the mutex is not queued either). After --seconds the writer stops, and a
fresh handle must put and get within its lock timeout.

Reading the summary line:

    kind_race: kind=K flips=F ops=N errors=E wrong=0 foreign=G unlisted=U crashes=0 hangs=0 stuck=0 word=W seconds=S

kind     the foreign kind written: plain (glibc's PTHREAD_MUTEX_TIMED_NP, 0), errorcheck (2, not robust), pi
         (PTHREAD_MUTEX_PRIO_INHERIT_NP alone), pi-robust (the right kind with the priority-inheritance bit)
flips    times the foreign kind was written (and put back)
ops      put + get pairs the workers completed; errors: ShmCacheError raised (LockTimeout, CorruptionError)
wrong    gets that returned a value not put under that key; must be 0
foreign  holds that glibc took through the foreign kind's path, found not queued on the robust list and given back
unlisted unlocks through the foreign kind's path, which left the mutex on the holder's robust list: taken off
crashes  processes that died of a signal (SIGSEGV: glibc's robust unlock of a mutex the priority-inheritance path
         never queued); must be 0
hangs    processes still running 60 s after the storm ended (SIGKILLed); must be 0
stuck    1 when the fresh handle's put raised LockTimeout after the storm: the futex word was left naming a thread
         that does not hold the lock (1: "thread 1 holds it"); must be 0
word     the futex word after the storm (0: free)

Exit status 1 when wrong, crashes, hangs or stuck is not 0. Long runs stay out of CI: this script prints figures.
"""

from __future__ import annotations

import argparse
import faulthandler
import multiprocessing as mp
import queue
import os
import random
import struct
import sys
import time

from shmcache import SharedCache
from shmcache.core import lock_mends
from shmcache.errors import LockTimeout, ShmCacheError
from shmcache.layout.dtypes import H_LOCK_OFF
from shmcache.lock import KIND_OFF, MUTEX_KIND

from .common import check_value, exit_on_sigterm, make_value, raw_map, reap, start, unlink_quietly

PI = 0x20  # PTHREAD_MUTEX_PRIO_INHERIT_NP
KINDS = {"plain": 0, "errorcheck": 2, "pi": PI, "pi-robust": MUTEX_KIND | PI}
LOCK_TIMEOUT = 0.5
KEYS = 16


def flipper(name: str, seconds: float, kind: int, gap: int, out) -> None:
    """Write ``kind`` into the mutex's kind word and put the right one back, every ``gap`` busy rounds."""
    mm = raw_map(name, writable=True)
    off = H_LOCK_OFF + KIND_OFF
    good, bad = struct.pack("<i", MUTEX_KIND), struct.pack("<i", kind)
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        mm[off : off + 4] = bad
        mm[off : off + 4] = good
        n += 1
        for _ in range(gap):
            pass
    out.put(("flips", n))


def worker(name: str, seconds: float, seed: int, out) -> None:
    """Put and get self-checking values; count completed pairs, errors and wrong reads."""
    faulthandler.enable()  # a crash prints where it happened
    rng = random.Random(seed)
    cache = SharedCache(name, create=False, lock_timeout=LOCK_TIMEOUT)
    end, ops, errors, wrong = time.monotonic() + seconds, 0, 0, 0
    while time.monotonic() < end:
        key = f"k{rng.randrange(KEYS)}"
        try:
            cache.put(key, make_value(key, ops, rng, 64))
            v = cache.get(key)
            if v is not None and check_value(key, v) is not None:
                wrong += 1
            ops += 1
        except ShmCacheError:
            errors += 1
    out.put(("worker", ops, errors, wrong, *lock_mends()))


def run_one(kind_name: str, args) -> dict:
    name = f"kindrace{os.getpid()}{kind_name.replace('-', '')}"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    fields = dict(kind=kind_name, flips=0, ops=0, errors=0, wrong=0, foreign=0, unlisted=0, crashes=0, hangs=0,
                  stuck=0, word=0)
    try:
        SharedCache(name, capacity_bytes=1 << 20, max_entries=256, lock_timeout=LOCK_TIMEOUT).close()
        procs = [start(ctx, worker, (name, args.seconds, args.seed + i, out)) for i in range(args.workers)]
        procs.append(start(ctx, flipper, (name, args.seconds, KINDS[kind_name], args.gap, out)))
        fields["hangs"] = len(reap(procs, args.seconds + 60))
        fields["crashes"] = sum(1 for p in procs if p.exitcode is not None and p.exitcode < 0) - fields["hangs"]
        for _ in range(sum(1 for p in procs if p.exitcode == 0)):  # one message from each process that finished
            try:
                msg = out.get(timeout=5)
            except queue.Empty:
                break
            if msg[0] == "flips":
                fields["flips"] = msg[1]
            else:
                fields["ops"] += msg[1]
                fields["errors"] += msg[2]
                fields["wrong"] += msg[3]
                fields["foreign"] += msg[4]
                fields["unlisted"] += msg[5]
        with raw_map(name) as mm:
            fields["word"] = struct.unpack_from("<I", mm, H_LOCK_OFF)[0]
        try:
            with SharedCache(name, create=False, lock_timeout=LOCK_TIMEOUT) as cache:
                cache.put("after", 1)
                if cache.get("after") != 1:
                    fields["wrong"] += 1
        except LockTimeout:
            fields["stuck"] = 1
    finally:
        unlink_quietly(name)
    return fields


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m stress.kind_race", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0, help="length of each kind's storm (default 4)")
    p.add_argument("--workers", type=int, default=2, help="processes putting and getting (default 2)")
    p.add_argument("--kind", choices=[*KINDS, "all"], default="all", help="the foreign kind (default all)")
    p.add_argument("--gap", type=int, default=2000, help="busy-loop rounds between two flips (default 2000)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    exit_on_sigterm()  # a SIGTERM unwinds through run_one's finally, which unlinks the cache
    failed = False
    for kind_name in KINDS if args.kind == "all" else [args.kind]:
        f = run_one(kind_name, args)
        failed |= bool(f["wrong"] or f["crashes"] or f["hangs"] or f["stuck"])
        print("kind_race: " + " ".join(f"{k}={v:#x}" if k == "word" else f"{k}={v}" for k, v in f.items())
              + f" seconds={args.seconds:g}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
