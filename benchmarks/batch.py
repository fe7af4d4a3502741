"""``python -m benchmarks.batch``: a batch of small gets (``get_many``) and puts (``put_many``) against the same
keys one call each, timed side by side in one process (interleaved rounds, medians). Prints a table; ``--json FILE``
also writes the figures. Nothing passes or fails here.

A batch takes the lock once and encodes (or decodes) every key and value outside it; single calls pay the lock,
the call and the argument checks per key. Both pay the per-key work: the index probe, the copy, the checksum and
the decoding, which for a small dict (msgpack, ~12k instructions) is most of a get, so the saving shows best with
bytes values. The ratio column is the batch's time over the singles' time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from shmcache import SharedCache

from .measure import make_key, small_value

BATCH = 64
ROUNDS = 7
REPEATS = 200  # batches (and as many rounds of singles) timed per round


def _time(fn, n: int) -> float:
    """Median ns of ``fn()`` over ``n`` calls, each timed alone."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples)


def _compare(cache, keys: list, what: str, value) -> list[dict]:
    """The get and put rows for ``value`` under ``keys``: singles and one batch, timed in interleaved rounds."""
    pairs = [(k, value) for k in keys]
    cache.put_many(pairs)
    get, put = cache.get, cache.put

    def singles_get():
        for k in keys:
            get(k)

    def singles_put():
        for k, v in pairs:
            put(k, v)

    cases = {
        "get singles": singles_get,
        "get_many": lambda: cache.get_many(keys),
        "put singles": singles_put,
        "put_many": lambda: cache.put_many(pairs),
    }
    got = {c: [] for c in cases}
    for _ in range(ROUNDS):  # interleaved, so that a change of load lands on every case alike
        for c, fn in cases.items():
            got[c].append(_time(fn, REPEATS))
    med = {c: statistics.median(v) / 1000 for c, v in got.items()}
    return [{"op": op, "value": what, "batch": len(keys), "singles_us": round(med[singles], 1),
             "batch_us": round(med[batch], 1), "batch_over_singles": round(med[batch] / med[singles], 2)}
            for op, singles, batch in (("get", "get singles", "get_many"), ("put", "put singles", "put_many"))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=BATCH, help=f"keys per batch (default {BATCH})")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    name = f"benchmarks-batch-{os.getpid()}"
    keys = [make_key("b:", i) for i in range(args.batch)]
    rows = []
    with SharedCache(name, capacity_bytes=16 << 20, max_entries=4 * args.batch, create=True) as cache:
        try:
            for what, value in (("dict", small_value()), ("bytes", bytes(100))):
                rows += _compare(cache, keys, what, value)
        finally:
            cache.unlink()
    print(f"{'op':>4}  {'value':>6}  {'keys':>5}  {'singles us':>10}  {'batch us':>9}  batch/singles")
    for r in rows:
        print(f"{r['op']:>4}  {r['value']:>6}  {r['batch']:>5}  {r['singles_us']:>10.1f}  {r['batch_us']:>9.1f}  "
              f"{r['batch_over_singles']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "batch", "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
