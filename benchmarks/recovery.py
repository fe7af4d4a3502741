"""``python -m benchmarks.recovery``: how long the lock is held to recover after a holder died mid-update, and whether
the processes waiting meanwhile wait it out.

Fills a cache with N small entries, raises the ``dirty`` word as a holder killed in the middle of an update leaves
it, and times the next get, which verifies the segment (and would repair it) before answering, while ``--waiters``
other processes call get at the same instant with a ``lock_timeout`` (``--lock-timeout``) shorter than the
recovery: each must wait for it (its walk moves the header's progress word, which extends their wait) rather than
raise LockTimeout. Then times a deep ``verify()``, which also re-hashes every key and value. Prints one line per
size. Never pass/fail.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

from shmcache import LockTimeout, SharedCache
from shmcache.layout.dtypes import H_DIRTY
from .measure import reap

DEFAULT_ENTRIES = "65536,1000000"
DEFAULT_WAITERS = 8
DEFAULT_LOCK_TIMEOUT = 1.0
VALUE = b"v" * 20


def _waiter(name: str, lock_timeout: float, go, out) -> None:
    with SharedCache(name, create=False, lock_timeout=lock_timeout) as cache:
        go.wait()
        t0 = time.perf_counter()
        try:
            ok = cache.get(1) == VALUE
            out.put(("ok" if ok else "wrong", time.perf_counter() - t0))
        except LockTimeout as exc:
            out.put(("timeout", str(exc)))


def measure(n: int, waiters: int, lock_timeout: float) -> tuple[float, float, dict]:
    name = f"bench-recovery-{os.getpid()}-{n}"
    cache = SharedCache(name, capacity_bytes=64 << 20, max_entries=n, create=True, lock_timeout=lock_timeout)
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_waiter, args=(name, lock_timeout, go, out)) for _ in range(waiters)]
    try:
        for i in range(n):
            cache.put(i, VALUE)
        for p in procs:
            p.start()
        time.sleep(0.5)  # the waiters attached
        cache._h[H_DIRTY] = 1  # what a holder killed between the first and last write of an update leaves
        go.set()
        t0 = time.perf_counter()
        cache.get(0)
        recover = time.perf_counter() - t0
        results: dict = {"ok": 0, "wrong": 0, "timeout": 0, "longest_wait_s": 0.0}
        for _ in procs:
            what, detail = out.get(timeout=600)
            results[what] += 1
            if what == "ok":
                results["longest_wait_s"] = max(results["longest_wait_s"], detail)
            elif what == "timeout":
                print(f"  a waiter raised LockTimeout: {detail}")
        t0 = time.perf_counter()
        report = cache.verify(deep=True)
        deep = time.perf_counter() - t0
        assert report.ok, report.problems
        return recover, deep, results
    finally:
        reap(procs, 60)
        cache.unlink()
        cache.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default=DEFAULT_ENTRIES, help=f"comma-separated sizes (default {DEFAULT_ENTRIES})")
    parser.add_argument("--waiters", type=int, default=DEFAULT_WAITERS,
                        help=f"processes calling get during the recovery (default {DEFAULT_WAITERS})")
    parser.add_argument("--lock-timeout", type=float, default=DEFAULT_LOCK_TIMEOUT,
                        help=f"their lock_timeout, in seconds (default {DEFAULT_LOCK_TIMEOUT})")
    args = parser.parse_args(argv)
    for n in (int(x) for x in args.entries.split(",")):
        recover, deep, r = measure(n, args.waiters, args.lock_timeout)
        print(f"{n:>10,} entries: recovery check under the lock {recover:6.2f} s   deep verify {deep:6.2f} s   "
              f"{args.waiters} waiters (lock_timeout {args.lock_timeout:g} s): {r['ok']} served, "
              f"{r['timeout']} LockTimeouts, {r['wrong']} wrong, longest wait {r['longest_wait_s']:.2f} s")


if __name__ == "__main__":
    main()
