"""SIGKILL cache users at random instants, most of them while they hold the cache lock, and check nothing breaks.

The workload is stress.hammer's, plus --heavy workers that make the lock's hold times long: puts of values up to a
quarter of the capacity (each evicting and compacting a lot), frequent set_limits to low limits and resizes (a
quarter to four times the capacity: a kill mid-resize leaves the old or the new one, repaired). Every KILL_GAP
seconds the parent SIGKILLs one worker that has started working and starts a replacement in its slot. LOCKED_SHARE
of the kills are aimed: the parent watches the holder recorded in the cache lock's word (a raw read of the segment)
for up to HOLDER_WAIT seconds and kills the holder the moment it is one of the workers. The holder's slot dies with
it: the next locker takes the lock over and repairs the segment before anyone reads it. Workers bump a shared op counter
as a heartbeat; if the survivors complete no operation for HANG_SECONDS, the run counts a hang, dumps every worker's
stack and stops.

--policy chooses the cache's eviction policy (default auto); --policy all runs each of shmcache.POLICIES in turn,
--seconds split equally, and prints one summary line for each.

Reading the summary line:

    kill_storm: policy=P ops=N wrong=0 errors=0 hangs=0 crashes=0 kills=K locked_kills=L recoveries=R
                not_admitted=A snapshots=N restores=M resizes=Z unlocked_reads=U read_retries=T read_fallbacks=F
                verify=ok
                seconds=S workers=W

policy        the cache's eviction policy (lru, s3fifo or keep)
ops           operations completed by all workers, killed ones included
wrong         gets that returned a value not put under that key (workers and final read-back); must be 0
errors        ShmCacheError or other exceptions raised by operations, or a worker's verify() not ok; must be 0
hangs         stalls of HANG_SECONDS without progress, plus workers that did not stop when told; must be 0
crashes       workers that died without being killed; must be 0
kills         workers SIGKILLed; locked_kills: of those, killed while the lock named them as its holder
recoveries    repairs of a half-made update left by a killed holder (stats().recoveries); at most about
              locked_kills, fewer because a holder killed between two complete updates leaves nothing to repair
not_admitted  puts that returned False: not admitted by keep's full cache, or for room that views pin or hold
snapshots     snapshots the light workers wrote of the cache (each worker slot to its own file) while the others
              worked and were killed, themselves among them; restores: restores of a slot's file into the cache,
              each of which must find the file whole (a writer killed mid-write leaves the last one), else an error
resizes       resizes of the cache's capacity the workers made (stats().resizes), a kill mid-resize included
unlocked_reads  lookups answered without the lock over the whole run (s3fifo and keep, compiled: summed from the
              reader slots, as stats().unlocked_reads is, but not from the workload's last clear()); read_retries,
              read_fallbacks: of the reads, those begun again under a writer and those that took the lock after all
verify        ok when the final verify() (the policy's invariants included) and stats checks passed, FAILED
              otherwise (details on stderr)

The exit status is 1 when any "must be" above does not hold.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import tempfile
import time

from shmcache import SharedCache

from .common import (
    ERRORS, FOREIGN, MIX, NF, NOT_ADMITTED, OPS, RESTORES, SNAPSHOTS, WRONG, Progress, dump_stalled,
    exit_on_sigterm, final_check, lifetime_reads, lock_owner, make_parser, raw_map, reap, run_policies, start, total,
    unlink_quietly, worker,
)

DEFAULT_SECONDS = 10.0
DEFAULT_WORKERS = 8
DEFAULT_SEED = 1
DEFAULT_KEYS = 4000
DEFAULT_CAPACITY_BYTES = 1 << 20
DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_VALUE_BYTES = 64 * 1024
DEFAULT_HEAVY = 0  # 0: a quarter of the workers, at least one
HEAVY_MIX = {"put": 50, "get": 35, "delete": 5, "set_limits": 8, "verify": 1, "clear": 0.2, "resize": 1}
HEAVY_BIG_SHARE = 0.5  # share of a heavy worker's puts that carry a value of up to a quarter of the capacity
KILL_GAP = (0.01, 0.06)  # seconds between kills, drawn uniformly
LOCKED_SHARE = 0.7  # share of kills aimed at the current lock holder
HOLDER_WAIT = 0.05  # seconds an aimed kill waits for a worker to hold the lock before killing a random one
HANG_SECONDS = 5.0
JOIN_SECONDS = 10.0


def _victim(rng: random.Random, procs: list, running: list, mm, aimed: bool):
    """The worker to kill and whether the lock named it as its holder; None while no worker is running yet."""
    if aimed:
        by_pid = {p.pid: p for p in procs}
        until = time.monotonic() + HOLDER_WAIT
        while time.monotonic() < until:
            p = by_pid.get(lock_owner(mm))
            if p is not None:
                return p, True
    return (rng.choice(running), False) if running else (None, False)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(
        __doc__, seconds=DEFAULT_SECONDS, workers=DEFAULT_WORKERS, seed=DEFAULT_SEED, keys=DEFAULT_KEYS,
        capacity_bytes=DEFAULT_CAPACITY_BYTES, max_entries=DEFAULT_MAX_ENTRIES, max_value_bytes=DEFAULT_MAX_VALUE_BYTES,
    )
    parser.add_argument("--heavy", type=int, default=DEFAULT_HEAVY, help="workers doing long operations under the "
                        "lock (default: a quarter of the workers, at least one)")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    return run_policies("kill_storm", args, _run)


def _run(args) -> tuple[dict, bool]:
    """One run under ``args.policy``: (summary fields, failed)."""
    heavy = args.heavy or max(1, args.workers // 4)
    rng = random.Random(args.seed)
    ctx = mp.get_context(args.start_method)
    name = f"stress-kill_storm-{args.policy}-{os.getpid()}"
    counts = ctx.RawArray("q", args.workers * NF)
    stop = ctx.RawValue("b", 0)
    snapshots = tempfile.mkdtemp(prefix="shmcache-kill_storm-")  # the light workers' snapshot files
    light = dict(nkeys=args.keys, max_nbytes=args.max_value_bytes, mix=MIX, snapshot_dir=snapshots)
    heavy_opts = dict(nkeys=args.keys, max_nbytes=args.capacity_bytes // 4, mix=HEAVY_MIX, big_share=HEAVY_BIG_SHARE,
                      views_elsewhere=True)  # (the light workers' views may pin the room a heavy put needs)
    cache = SharedCache(name, capacity_bytes=args.capacity_bytes, max_entries=args.max_entries, create=True,
                        policy=args.policy)
    procs, dead, born = [], [], [0] * args.workers  # born: the slot's op count when its worker started

    def bury(p) -> None:
        """Release a dead worker's descriptors at once (a Process keeps two pipe ends until closed: thousands of
        kills would run the parent out of descriptors); one not yet reaped is kept for the final reap."""
        if p.exitcode is None:
            dead.append(p)
        else:
            p.close()
    hangs = crashes = kills = locked_kills = recoveries = resizes = wrong = 0
    unlocked = (0, 0, 0)
    ok, elapsed = False, 0.0

    def spawn(row: int):
        opts = heavy_opts if row < heavy else light
        born[row] = counts[row * NF + OPS]
        return start(ctx, worker, (name, row, rng.randrange(2**63), counts, stop, opts))

    t0 = time.monotonic()
    try:
        mm = raw_map(name)
        procs = [spawn(row) for row in range(args.workers)]
        progress = Progress(counts, HANG_SECONDS)
        while time.monotonic() - t0 < args.seconds:
            time.sleep(rng.uniform(*KILL_GAP))
            for row, p in enumerate(procs):  # a worker that died by itself is a crash; replace it all the same
                if p.exitcode is not None:
                    crashes += 1
                    print(f"worker {p.pid} exited with status {p.exitcode}", file=sys.stderr)
                    bury(p)
                    procs[row] = spawn(row)
            if progress.stalled():
                hangs += 1
                dump_stalled(procs, mm, HANG_SECONDS)
                break
            running = [p for row, p in enumerate(procs) if counts[row * NF + OPS] > born[row]]
            p, held = _victim(rng, procs, running, mm, rng.random() < LOCKED_SHARE)
            if p is None:
                continue
            os.kill(p.pid, signal.SIGKILL)
            p.join(5.0)
            kills += 1
            locked_kills += held
            row = procs.index(p)
            procs[row] = spawn(row)
            bury(p)
        elapsed = time.monotonic() - t0
        stop.value = 1
        stuck = reap(procs, JOIN_SECONDS)
        hangs += len(stuck)
        crashes += sum(1 for p in procs if p not in stuck and p.exitcode != 0)
        mm.close()
        if not hangs:
            ok, wrong = final_check(cache, args.keys)
            s = cache.stats()
            recoveries, unlocked, resizes = s.recoveries, lifetime_reads(cache), s.resizes
    finally:
        stop.value = 1
        reap(procs + dead, 5.0)
        cache.close()
        unlink_quietly(name)
        shutil.rmtree(snapshots, ignore_errors=True)
    wrong += total(counts, WRONG)
    errors = total(counts, ERRORS) + total(counts, FOREIGN)
    return {
        "ops": total(counts, OPS), "wrong": wrong, "errors": errors, "hangs": hangs, "crashes": crashes,
        "kills": kills, "locked_kills": locked_kills, "recoveries": recoveries,
        "not_admitted": total(counts, NOT_ADMITTED), "snapshots": total(counts, SNAPSHOTS),
        "restores": total(counts, RESTORES), "resizes": resizes, "unlocked_reads": unlocked[0],
        "read_retries": unlocked[1],
        "read_fallbacks": unlocked[2], "verify": "ok" if ok else "FAILED",
        "seconds": round(elapsed, 1), "workers": args.workers,
    }, bool(wrong or errors or hangs or crashes or not ok)


if __name__ == "__main__":
    sys.exit(main())
