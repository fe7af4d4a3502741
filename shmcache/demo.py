"""``shmcache bench``: worker processes share one cache in front of a simulated expensive transform.

Each worker draws keys from a Zipf distribution (s = 1, as request keys in a web pool or samples re-read across
epochs tend to be), reads through the cache, and on a miss "computes" the value (a busy loop of ``--compute-us``) and
puts it. Every value read is checked against its key. The parent shows progress once a second from the cache's
global stats and ends with a table, or one JSON document with ``--json``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np
import xxhash

from .cache import SharedCache

_SAMPLE_EVERY = 16  # latency is recorded for one operation in this many, to keep the workers' overhead small


def _value_for(key: int, nbytes: int) -> bytes:
    seed = xxhash.xxh3_64_digest(key.to_bytes(8, "little"))
    return (seed * (nbytes // 8 + 1))[:nbytes]


def _compute(key: int, nbytes: int, compute_us: float) -> bytes:
    end = time.perf_counter() + compute_us / 1e6
    while time.perf_counter() < end:
        pass
    return _value_for(key, nbytes)


def _worker(name: str, worker: int, args: dict, deadline: float, queue) -> None:
    rng = np.random.default_rng(args["seed"] * 1000 + worker)
    weights = 1.0 / np.arange(1, args["keys"] + 1)
    weights /= weights.sum()
    hit_lat, miss_lat = [], []
    ops = hits = wrong = 0
    with SharedCache(name, create=False) as cache:
        while time.monotonic() < deadline:
            for key in rng.choice(args["keys"], size=2048, p=weights).tolist():
                t0 = time.perf_counter_ns()
                value = cache.get(key)
                if value is None:
                    cache.put(key, _compute(key, args["value_bytes"], args["compute_us"]))
                    lat = miss_lat
                else:
                    hits += 1
                    wrong += value != _value_for(key, args["value_bytes"])
                    lat = hit_lat
                if ops % _SAMPLE_EVERY == 0:
                    lat.append(time.perf_counter_ns() - t0)
                ops += 1
            if time.monotonic() >= deadline:
                break
    queue.put({"worker": worker, "ops": ops, "hits": hits, "wrong": wrong, "hit_ns": hit_lat, "miss_ns": miss_lat})


def _percentiles(samples: list[int]) -> dict:
    if not samples:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(samples) / 1000.0
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def run_demo(args) -> int:
    name = f"bench-{os.getpid()}"
    params = {"keys": args.keys, "value_bytes": args.value_bytes, "compute_us": args.compute_us, "seed": args.seed}
    capacity = int(args.capacity_mib * 2**20)
    max_entries = max(16, capacity // max(64, args.value_bytes // 2))
    ctx = mp.get_context("spawn" if sys.platform == "darwin" else "fork")
    queue = ctx.Queue()
    cache = SharedCache(name, capacity_bytes=capacity, max_entries=max_entries, create=True)
    procs = []
    try:
        t0 = time.monotonic()
        deadline = t0 + args.seconds
        procs = [ctx.Process(target=_worker, args=(name, i, params, deadline, queue)) for i in range(args.workers)]
        for p in procs:
            p.start()
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            if not args.json:
                s = cache.stats()
                print(f"\r{time.monotonic() - t0:5.1f}s  lookups={s.hits + s.misses:>10,}  hit ratio={s.hit_ratio:6.1%}"
                      f"  entries={s.entries:>7,}  evictions={s.evictions:>8,}", end="", flush=True)
        results = sorted((queue.get(timeout=60) for _ in procs), key=lambda r: r["worker"])
        for p in procs:
            p.join(timeout=30)
        elapsed = time.monotonic() - t0
        s = cache.stats()
        report = {
            "workers": args.workers,
            "seconds": elapsed,
            "ops": sum(r["ops"] for r in results),
            "ops_per_s": sum(r["ops"] for r in results) / elapsed,
            "hit_ratio": s.hit_ratio,
            "wrong_values": sum(r["wrong"] for r in results),
            "evictions": s.evictions,
            "entries": s.entries,
            "per_worker_ops": [r["ops"] for r in results],
            "hit_latency_us": _percentiles([x for r in results for x in r["hit_ns"]]),
            "miss_latency_us": _percentiles([x for r in results for x in r["miss_ns"]]),
            "verify_ok": cache.verify(deep=False).ok,
        }
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        cache.unlink()
        cache.close()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print()
        _print_report(report, params)
    return 0 if report["wrong_values"] == 0 and report["verify_ok"] else 1


def _print_report(r: dict, params: dict) -> None:
    print(f"\n{r['workers']} workers, {r['seconds']:.1f} s, {params['keys']:,} Zipf keys, "
          f"{params['value_bytes']} B values, {params['compute_us']:.0f} us per computed value")
    print(f"  throughput   {r['ops_per_s']:>12,.0f} lookups/s   (per worker: {', '.join(map(str, r['per_worker_ops']))})")
    print(f"  hit ratio    {r['hit_ratio']:>12.1%}")
    print(f"  evictions    {r['evictions']:>12,}   entries resident: {r['entries']:,}")
    print(f"  wrong values {r['wrong_values']:>12}   integrity check: {'ok' if r['verify_ok'] else 'FAILED'}")
    print("  latency (us)        p50       p90       p99       max")
    for label, key in (("hit", "hit_latency_us"), ("miss+compute", "miss_latency_us")):
        p = r[key]
        if p["p50"] is None:
            continue
        print(f"  {label:<14}{p['p50']:>9.1f} {p['p90']:>9.1f} {p['p99']:>9.1f} {p['max']:>9.1f}")
