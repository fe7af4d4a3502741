"""Hammer one cache from many processes at once and check every value that is read back.

--workers processes run random get / put / delete / contains most of the time, with occasional stats, set_limits
(lowering and raising the limits within the capacity), verify and clear, over --keys keys drawn from a Zipf-like
distribution. The values add up to many times the cache's capacity and range from a few bytes to --max-value-bytes,
so eviction and arena compaction run all the time. Every value names its key and carries a checksum (see
stress/common.py), so a get that returns another key's value or a torn copy is caught. At the end the parent calls
verify(), checks that the stats respect the limits in force, and reads back every key.

--policy chooses the cache's eviction policy (default auto); --policy all runs each of shmcache.POLICIES in turn,
--seconds split equally, and prints one summary line for each. Under keep a put of a new key into the full cache
stores nothing and returns False (counted in not_admitted), and under every policy so does a put whose room the
views of the mix pin or hold; no other put returns False.

Reading the summary line:

    hammer: policy=P ops=N wrong=0 errors=0 hangs=0 crashes=0 kills=0 recoveries=0 not_admitted=A verify=ok
            seconds=S workers=W

policy      the cache's eviction policy (lru, s3fifo or keep)
ops         operations done by all workers together
wrong       gets that returned a value not put under that key (workers and final read-back); must be 0
errors      ShmCacheError or any other exception raised by an operation, or a worker's verify() that was not ok;
            must be 0 (a TooLargeError for a big value above a lowered limit is the documented refusal, not counted)
not_admitted puts that returned False: not admitted by keep's full cache, or for room that views pin or hold
            (rare under the other policies)
hangs       times the workers made no progress for HANG_SECONDS, plus workers that did not stop when told; must be 0
crashes     workers that died on their own; must be 0
kills       workers killed on purpose (always 0 here; see stress.kill_storm)
recoveries  repairs made by the cache itself (stats().recoveries); 0 when no process dies holding the lock
verify      ok when the final verify() (the policy's invariants included) and stats checks passed, FAILED
            otherwise (details on stderr)

The exit status is 1 when any "must be" above does not hold.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

from shmcache import SharedCache

from .common import (
    ERRORS, FOREIGN, NF, NOT_ADMITTED, OPS, WRONG, Progress, dump_stalled, exit_on_sigterm, final_check,
    make_parser, raw_map, reap, run_policies, start, total, unlink_quietly, worker,
)

DEFAULT_SECONDS = 10.0
DEFAULT_WORKERS = 8
DEFAULT_SEED = 1
DEFAULT_KEYS = 4000
DEFAULT_CAPACITY_BYTES = 1 << 20  # small next to the working set (DEFAULT_KEYS values of ~2 KiB on average)
DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_VALUE_BYTES = 64 * 1024
HANG_SECONDS = 5.0  # no operation completed anywhere for this long counts as a hang
JOIN_SECONDS = 10.0  # time the workers get to stop at the end
POLL_SECONDS = 0.2


def main(argv: list[str] | None = None) -> int:
    args = make_parser(
        __doc__, seconds=DEFAULT_SECONDS, workers=DEFAULT_WORKERS, seed=DEFAULT_SEED, keys=DEFAULT_KEYS,
        capacity_bytes=DEFAULT_CAPACITY_BYTES, max_entries=DEFAULT_MAX_ENTRIES, max_value_bytes=DEFAULT_MAX_VALUE_BYTES,
    ).parse_args(argv)
    exit_on_sigterm()
    return run_policies("hammer", args, _run)


def _run(args) -> tuple[dict, bool]:
    """One run under ``args.policy``: (summary fields, failed)."""
    ctx = mp.get_context(args.start_method)
    name = f"stress-hammer-{args.policy}-{os.getpid()}"
    counts = ctx.RawArray("q", args.workers * NF)
    stop = ctx.RawValue("b", 0)
    opts = dict(nkeys=args.keys, max_nbytes=args.max_value_bytes)
    cache = SharedCache(name, capacity_bytes=args.capacity_bytes, max_entries=args.max_entries, create=True,
                        policy=args.policy)
    procs, hangs, crashes, ok, wrong, recoveries, elapsed = [], 0, 0, False, 0, 0, 0.0
    t0 = time.monotonic()
    try:
        mm = raw_map(name)
        procs = [start(ctx, worker, (name, i, args.seed * 1_000_003 + i, counts, stop, opts))
                 for i in range(args.workers)]
        progress = Progress(counts, HANG_SECONDS)
        while time.monotonic() - t0 < args.seconds:
            time.sleep(POLL_SECONDS)
            if progress.stalled():
                hangs += 1
                dump_stalled(procs, mm, HANG_SECONDS)
                break
        elapsed = time.monotonic() - t0
        stop.value = 1
        stuck = reap(procs, JOIN_SECONDS)
        hangs += len(stuck)
        crashes = sum(1 for p in procs if p not in stuck and p.exitcode != 0)
        mm.close()
        if not hangs:  # a stuck lock would stall these too
            ok, wrong = final_check(cache, args.keys)
            recoveries = cache.stats().recoveries
    finally:
        stop.value = 1
        reap(procs, 5.0)
        cache.close()
        unlink_quietly(name)
    wrong += total(counts, WRONG)
    errors = total(counts, ERRORS) + total(counts, FOREIGN)
    return {
        "ops": total(counts, OPS), "wrong": wrong, "errors": errors, "hangs": hangs, "crashes": crashes, "kills": 0,
        "recoveries": recoveries, "not_admitted": total(counts, NOT_ADMITTED), "verify": "ok" if ok else "FAILED",
        "seconds": round(elapsed, 1), "workers": args.workers,
    }, bool(wrong or errors or hangs or crashes or not ok)


if __name__ == "__main__":
    sys.exit(main())
