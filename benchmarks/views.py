"""``python -m benchmarks.views``: a zero-copy ``view`` against a copying ``get`` of the same array, over sizes from
1 KB to 16 MB, timed side by side in one process (interleaved rounds, medians), with ``np.copy`` of the array as the
reference. Prints a table; ``--json FILE`` also writes the figures. Nothing passes or fails here. Each call is timed
inline, from the call to the release of what it gave (a get's copy; a view's array, and with it the pin).

A view pays its lookup and pin, the arrays built over the bytes and their revocation as the block ends, and copies
nothing: under lru the cache lock and two kernel-lock calls (the pin and its end); under s3fifo and keep (compiled,
x86-64) neither, the entry found without the lock and pinned in the handle's reader slot. A get pays the lookup,
one copy and the checksum of the copy. The "view" column is a handle's later
views of a stored value it checked before; "first view" is its first, which also checks the checksum over the bytes
(the checksum policy, docs/usage.md, "Zero-copy reads of large values"): timed by making the handle forget what it
checked before each call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from shmcache import SharedCache

SIZES = (1 << 10, 64 << 10, 150_528, 1 << 20, 4 << 20, 16 << 20)  # 150,528: the 224x224x3 uint8 image of W1
ROUNDS = 5


# Each call is timed inline, as a program would write it, from the call to the release of what it gave (a get's
# copy, a view's array and pin), with no function wrapped around either: a Python call costs about 0.1 us, which is
# neither operation's (the view's alone was wrapped so until 2026-12-04). Medians in ns of ``n`` calls, each timed
# alone.


def _time_call(fn, arg, n: int) -> float:
    """``fn(arg)`` (a get, or np.copy: the operation itself, no wrapper), then the release of its result."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        value = fn(arg)
        del value
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples)


def _time_view(cache, key, n: int, first: bool = False) -> float:
    """``first``: the handle forgets the values it checked before each call (untimed), so that each is a first view."""
    samples = []
    for _ in range(n):
        if first:
            cache._pins.forget()  # (PinDescriptions or _core.Pins: the handle's record of values checked)
        t0 = time.perf_counter_ns()
        with cache.view(key) as arr:
            pass
        del arr
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.views", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--policy", default="lru", help="the cache's eviction policy: under s3fifo and keep, gets and views "
                   "take no lock (default %(default)s)")
    args = p.parse_args(argv)
    name = f"benchmarks-views-{os.getpid()}"
    rows = []
    with SharedCache(name, capacity_bytes=64 << 20, max_entries=64, create=True, policy=args.policy) as cache:
        try:
            for size in SIZES:
                arr = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
                cache.put("a", arr)

                calls = max(20, min(2000, (64 << 20) // size))
                got = {"get": [], "view": [], "first view": [], "np.copy": []}
                for _ in range(ROUNDS):  # interleaved, so that a change of load lands on all alike
                    got["get"].append(_time_call(cache.get, "a", calls))
                    got["view"].append(_time_view(cache, "a", calls))
                    got["first view"].append(_time_view(cache, "a", calls, first=True))
                    got["np.copy"].append(_time_call(np.copy, arr, calls))
                med = {k: statistics.median(v) / 1000 for k, v in got.items()}
                rows.append({"bytes": size, **{f"{k.replace(' ', '_')}_us": round(v, 2) for k, v in med.items()},
                             "view_over_get": round(med["view"] / med["get"], 2)})
        finally:
            cache.unlink()
    print(f"policy {args.policy}")
    print(f"{'bytes':>10}  {'get us':>9}  {'view us':>9}  {'first view us':>13}  {'np.copy us':>10}  view/get")
    for r in rows:
        print(f"{r['bytes']:>10,}  {r['get_us']:>9.1f}  {r['view_us']:>9.1f}  {r['first_view_us']:>13.1f}  "
              f"{r['np.copy_us']:>10.1f}  {r['view_over_get']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "views", "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
