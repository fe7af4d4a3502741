"""``python -m benchmarks.probes``: what the index's load costs a lookup, layout version 16 beside 17.

Version 16's index has a power of two of slots, at most half full; 17's the fewest that keep it at most 0.7 full
(layout/geometry.py index_for). For each, a cache of ``--entries`` entries filled to its limit (the index as full as
the limit lets it be), then, read from the index itself: the slots a hit probes on average (its distance from its
home slot, and one), and the slots a miss probes on average (from a home slot drawn uniformly, to the first empty
one); and timed, on this process's path: a get of a resident key and of an absent one, the median of ``--repeats``
batches of ``--lookups`` lookups, both versions in each repeat, so that their ratio is taken side by side. Nothing
passes or fails here.

    python -m benchmarks.probes
    python -m benchmarks.probes --entries 1000000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from shmcache import SharedCache, index, layout
from shmcache.cache import parts


def _laid_out_as(version: int):
    """Geometry.for_capacity made to lay a segment out as layout ``version`` did, and the original, to put back."""
    made = layout.Geometry.for_capacity.__func__

    def as_version(cls, capacity_bytes, max_entries, policy=0, version=version):
        return made(cls, capacity_bytes, max_entries, policy, version)

    layout.Geometry.for_capacity = classmethod(as_version)
    return made


def _probes(cache: SharedCache) -> tuple[float, float, float]:
    """(load, slots a hit probes, slots a miss probes), averaged over the index in force."""
    seg = parts(cache).seg
    g = seg.geometry
    n = seg.mask + 1
    table = np.ndarray((n,), g.index_dtype, buffer=seg.mm, offset=g.index_off)
    occupied = table["entry"] != layout.EMPTY
    at = np.flatnonzero(occupied)
    homes = index.of(g).homes(table["fp"][at], n)
    hit = float(np.mean((at - homes) % n)) + 1
    # A miss from home slot i probes the run of occupied slots from i, and the empty slot after it.
    run = np.zeros(n, dtype=np.int64)
    empties = np.flatnonzero(~occupied)
    if len(empties):
        nxt = np.searchsorted(empties, np.arange(n))  # the first empty slot at or after each slot, cyclically
        wrapped = nxt == len(empties)
        first = np.where(wrapped, empties[0] + n, empties[np.minimum(nxt, len(empties) - 1)])
        run = first - np.arange(n)
    del table
    return len(at) / n, hit, float(np.mean(run)) + 1


def _batch(cache: SharedCache, keys: list[str]) -> float:
    get = cache.get
    t0 = time.perf_counter()
    for k in keys:
        get(k)
    return (time.perf_counter() - t0) / len(keys)


def measure(entries: int, lookups: int, repeats: int) -> dict:
    """The figures of both versions (``rows``, 16 then 17) and the path that made them; every cache made is gone."""
    caches: dict[int, SharedCache] = {}
    try:
        for version in (16, 17):
            made = _laid_out_as(version)
            try:
                c = SharedCache(f"bench-probes-{version}-{os.getpid()}", create=True, policy="lru",
                                capacity_bytes=max(1 << 20, entries * 64), max_entries=entries)
            finally:
                layout.Geometry.for_capacity = classmethod(made)
            caches[version] = c
            for i in range(entries):
                c.put(f"k{i}", i)
        hits = [f"k{i}" for i in range(0, entries, max(1, entries // lookups))][:lookups]
        misses = [f"absent{i}" for i in range(len(hits))]
        times: dict[tuple[int, str], list[float]] = {(v, w): [] for v in caches for w in ("hit", "miss")}
        for _ in range(repeats):
            for v, c in caches.items():
                times[v, "hit"].append(_batch(c, hits))
                times[v, "miss"].append(_batch(c, misses))
        rows = []
        for v, c in caches.items():
            load, hit, miss = _probes(c)
            slots = parts(c).seg.mask + 1
            rows.append({"version": v, "index_slots": slots, "load": round(load, 3),
                         "index_bytes_per_entry": round(8 * slots / entries, 1),
                         "hit_probes": round(hit, 2), "miss_probes": round(miss, 2),
                         "get_hit_us": round(statistics.median(times[v, "hit"]) * 1e6, 3),
                         "get_miss_us": round(statistics.median(times[v, "miss"]) * 1e6, 3)})
        path = "compiled" if caches[17]._core is not None else "python"
        return {"entries": entries, "path": path, "lookups": len(hits), "repeats": repeats, "rows": rows}
    finally:
        for c in caches.values():
            c.unlink()
            c.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.probes", description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--lookups", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = measure(args.entries, args.lookups, args.repeats)
    rows = out["rows"]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['entries']} entries, lru, {out['path']} path, medians of {out['repeats']} batches of "
          f"{out['lookups']} lookups")
    print(f"{'version':>7} {'slots':>9} {'load':>6} {'B/entry':>8} {'hit probes':>11} {'miss probes':>12} "
          f"{'get hit us':>11} {'get miss us':>12}")
    for r in rows:
        print(f"{r['version']:>7} {r['index_slots']:>9} {r['load']:>6} {r['index_bytes_per_entry']:>8} "
              f"{r['hit_probes']:>11} {r['miss_probes']:>12} {r['get_hit_us']:>11} {r['get_miss_us']:>12}")
    a, b = rows
    print(f"17 / 16: get hit {b['get_hit_us'] / a['get_hit_us']:.3f}, "
          f"get miss {b['get_miss_us'] / a['get_miss_us']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
