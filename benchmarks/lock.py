"""``python -m benchmarks.lock``: what the cache lock costs uncontended, and how soon a waiter takes it over from a
holder that was SIGKILLed.

Two figures, on the path this process runs (``SHMCACHE_PURE_PYTHON=1`` for the Python path):

- ``uncontended``: one lock and unlock, timed as a delete of a key that is not there under lru (the lock, one probe
  of the index, the unlock; compiled: all in C) and as a ``Guard.run`` of a function that does nothing (the Python
  path's protocol alone). Medians of ``--rounds`` rounds of ``--ops`` calls, in microseconds.
- ``takeover``: a child process takes the lock and sleeps; this process's waiting thread is in ``get`` (the compiled
  wait, or the Python path's), the child is SIGKILLed, and the time from the kill to the waiter's return is the
  take-over's latency (the kernel drops the dead holder's slot; the waiter judges it at its next look). Median and
  worst of ``--kills`` kills, in milliseconds.

To compare two trees side by side in one run, run this module once from each with ``PYTHONPATH`` set to the tree,
alternating (``--rounds`` each); nothing passes or fails here.

    python -m benchmarks.lock --rounds 7
    SHMCACHE_PURE_PYTHON=1 python -m benchmarks.lock --kills 20
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import threading
import time

from shmcache import SharedCache, core


def _name(tag: str) -> str:
    return f"bench-lock-{tag}-{os.getpid()}-{os.urandom(5).hex()}"


def uncontended(rounds: int, ops: int) -> dict:
    """Microseconds per delete of a missing key (lru), and per ``Guard.run`` of a no-op: medians of ``rounds``."""
    c = SharedCache(_name("u"), capacity_bytes=1 << 20, max_entries=1024, policy="lru")
    try:
        c.put("resident", 1)
        delete, run = c.delete, c._guard.run

        def noop() -> None:
            return None

        deletes, runs = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(ops):
                delete("absent")
            deletes.append((time.perf_counter() - t) / ops * 1e6)
            t = time.perf_counter()
            for _ in range(ops):
                run(noop)
            runs.append((time.perf_counter() - t) / ops * 1e6)
        return {"delete_missing_us": statistics.median(deletes), "guard_run_us": statistics.median(runs)}
    finally:
        c.close()
        c.unlink()


def _hold(name: str, ready) -> None:
    c = SharedCache(name, create=False)
    c._guard.hold()
    ready.set()
    time.sleep(60)


def takeover(kills: int) -> dict:
    """Milliseconds from a holder's SIGKILL to a waiting get's return: median and worst of ``kills``."""
    name = _name("t")
    c = SharedCache(name, capacity_bytes=1 << 20, max_entries=1024, lock_timeout=10)
    ctx = mp.get_context("fork")
    out = []
    try:
        c.put("k", 1)
        for _ in range(kills):
            ready = ctx.Event()
            p = ctx.Process(target=_hold, args=(name, ready))
            p.start()
            assert ready.wait(30)
            done = []
            waiter = threading.Thread(target=lambda: done.append((c.get("k"), time.monotonic())))
            waiter.start()
            time.sleep(0.05)  # the waiter is asleep on the lock by now
            t0 = time.monotonic()
            os.kill(p.pid, signal.SIGKILL)
            waiter.join(30)
            p.join(10)
            assert done and done[0][0] == 1, done
            out.append((done[0][1] - t0) * 1e3)
    finally:
        c.close()
        c.unlink()
    return {"median_ms": statistics.median(out), "worst_ms": max(out), "kills": kills}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=50_000)
    ap.add_argument("--kills", type=int, default=20)
    a = ap.parse_args()
    r = {"path": core.PATH, "uncontended": uncontended(a.rounds, a.ops), "takeover": takeover(a.kills)}
    print(json.dumps(r))


if __name__ == "__main__":
    main()
