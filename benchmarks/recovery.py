"""``python -m benchmarks.recovery``: how long the lock is held to recover after a holder died mid-update.

Fills a cache with N small entries, raises the ``dirty`` word as a holder killed in the middle of an update leaves
it, and times the next get, which verifies the segment (and would repair it) before answering; then times a deep
``verify()``, which also re-hashes every key and value. Prints one line per size. Never pass/fail.
"""

from __future__ import annotations

import argparse
import os
import time

from shmcache import SharedCache
from shmcache.layout.dtypes import H_DIRTY

DEFAULT_ENTRIES = "65536,1000000"
VALUE = b"v" * 20


def measure(n: int) -> tuple[float, float]:
    name = f"bench-recovery-{os.getpid()}-{n}"
    cache = SharedCache(name, capacity_bytes=64 << 20, max_entries=n, create=True)
    try:
        for i in range(n):
            cache.put(i, VALUE)
        cache._h[H_DIRTY] = 1  # what a holder killed between the first and last write of an update leaves
        t0 = time.perf_counter()
        cache.get(0)
        recover = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = cache.verify(deep=True)
        deep = time.perf_counter() - t0
        assert report.ok, report.problems
        return recover, deep
    finally:
        cache.unlink()
        cache.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default=DEFAULT_ENTRIES, help=f"comma-separated sizes (default {DEFAULT_ENTRIES})")
    args = parser.parse_args(argv)
    for n in (int(x) for x in args.entries.split(",")):
        recover, deep = measure(n)
        print(f"{n:>10,} entries: recovery check under the lock {recover:6.2f} s   deep verify {deep:6.2f} s")


if __name__ == "__main__":
    main()
