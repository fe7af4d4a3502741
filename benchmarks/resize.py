"""``python -m benchmarks.resize``: a cache resized from 64 MiB to 1 GiB and back while 8 processes serve it.

Four phases on one cache (``--capacity`` made, ``--grown`` reached; ``max_capacity_bytes`` the default, 16 times).
The entry limit follows the capacity: made for twice the values ``--capacity`` holds, grown in proportion (at most
the 16 times its tables reach), so a resize also rebuilds the index at its new size:

- ``up``: the cache filled to its capacity with nobody else on it, then grown: how many entries the growth lost
  (must be 0) and how long the resize held the lock.
- ``down``: the grown cache filled to its capacity, with nobody else on it, then shrunk back: how many entries the
  shrink evicted (ahead of its last hold, in holds of 2,048: ``Core.evict_toward`` on the compiled path), every
  entry kept checked, and how long the whole call took (``SHMCACHE_PURE_PYTHON=1``: the Python path's time).
- ``steady``: ``--workers`` processes get and put values that carry their key and a checksum (60 % gets) over
  ``--keys`` keys for ``--seconds``, with no resize: each get timed alone (``perf_counter_ns``).
- ``resizing``: the same, while this process resizes the cache between ``--capacity`` and ``--grown`` every
  ``--pause`` seconds (up, down, up...: the workers fill it between two), timing each.

Printed per phase: gets, wrong values, errors, the get's p50 and p99 (µs, medians over the workers of each
worker's percentile), and for ``resizing`` the resizes made and their median and longest time. The two phases run
on the same machine one after the other, so their ratio is the figure to quote. Wrong values or errors make the
exit status 1.

``--reindex``, instead: how long one process holds the lock for a resize that rebuilds the index (the entry limit
times 4 and back, 10,000 to 1,000,000 small entries resident, nobody else on the cache; medians of 5).

    python -m benchmarks.resize
    python -m benchmarks.resize --capacity 64MiB --grown 1GiB --workers 8 --seconds 10 --json
    python -m benchmarks.resize --reindex
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time

import numpy as np
import xxhash

from shmcache import PinnedError, SharedCache, core
from shmcache.cli import parse_size
from .measure import reap

MIB = 1 << 20


def _value(key: str, seq: int, nbytes: int) -> dict:
    pad = bytes((seq + i) % 251 for i in range(min(nbytes, 64))) * (nbytes // 64 + 1)
    pad = pad[:nbytes]
    return {"key": key, "seq": seq, "pad": pad, "sum": xxhash.xxh3_64_intdigest(key.encode() + pad)}


def _wrong(key: str, v) -> bool:
    return not (isinstance(v, dict) and v.get("key") == key
                and xxhash.xxh3_64_intdigest(key.encode() + v["pad"]) == v["sum"])


def _serve(name: str, worker: int, keys: int, nbytes: int, seconds: float, start, queue) -> None:
    rng = random.Random(worker)
    times, wrong, errors, puts = [], 0, 0, 0
    with SharedCache(name, create=False) as c:
        start.wait(60)
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            i += 1
            k = f"k{rng.randrange(keys)}"
            try:
                if rng.random() < 0.6:
                    t0 = time.perf_counter_ns()
                    v = c.get(k)
                    times.append(time.perf_counter_ns() - t0)
                    if v is not None and _wrong(k, v):
                        wrong += 1
                else:
                    c.put(k, _value(k, worker * 10**8 + i, nbytes))
                    puts += 1
            except PinnedError:
                pass
            except Exception:  # counted: any is a failure
                errors += 1
    t = np.array(times, dtype=np.int64)
    queue.put({"gets": len(t), "puts": puts, "wrong": wrong, "errors": errors,
               "p50_us": float(np.percentile(t, 50)) / 1e3 if len(t) else 0.0,
               "p99_us": float(np.percentile(t, 99)) / 1e3 if len(t) else 0.0})


def _phase(name: str, args, resize_between: tuple[tuple[int, int], tuple[int, int]] | None) -> dict:
    ctx = mp.get_context("fork")
    queue, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_serve, args=(name, w, args.keys, args.value_bytes, args.seconds, start, queue))
             for w in range(args.workers)]
    for p in procs:
        p.start()
    took: list[float] = []
    try:
        time.sleep(0.5)  # every worker attached
        start.set()
        if resize_between is not None:
            with SharedCache(name, create=False) as c:
                end, n = time.monotonic() + args.seconds, 0
                while time.monotonic() < end:
                    t0 = time.perf_counter()
                    capacity, entries = resize_between[(n + 1) % 2]
                    c.resize(capacity_bytes=capacity, max_entries=entries)
                    took.append(time.perf_counter() - t0)
                    n += 1
                    time.sleep(args.pause)
        results = [queue.get(timeout=args.seconds + 120) for _ in procs]
    finally:
        reap(procs, 30)
    out = {"gets": sum(r["gets"] for r in results), "puts": sum(r["puts"] for r in results),
           "wrong": sum(r["wrong"] for r in results), "errors": sum(r["errors"] for r in results),
           "get_p50_us": statistics.median(r["p50_us"] for r in results),
           "get_p99_us": statistics.median(r["p99_us"] for r in results)}
    if took:
        out.update(resizes=len(took), resize_median_ms=statistics.median(took) * 1e3, resize_max_ms=max(took) * 1e3)
    return out


def measure(args) -> dict:
    name = f"bench-resize-{os.getpid()}"
    out: dict = {"path": core.PATH, "policy": args.policy, "capacity_mib": args.capacity / MIB,
                 "grown_mib": args.grown / MIB, "workers": args.workers, "seconds": args.seconds}
    entries = max(1024, 2 * args.capacity // max(64, args.value_bytes))
    grown_entries = min(16 * entries, entries * args.grown // args.capacity)
    out.update(entries=entries, grown_entries=grown_entries)
    try:
        with SharedCache(name, capacity_bytes=args.capacity, max_entries=entries, create=True,
                         policy=args.policy) as c:
            for i in range(args.keys):
                c.put(f"k{i}", _value(f"k{i}", i, args.value_bytes))
            before = set(c.keys())
            t0 = time.perf_counter()
            c.resize(capacity_bytes=args.grown, max_entries=grown_entries)
            grew = time.perf_counter() - t0
            after = set(c.keys())
            wrong = sum(1 for k in after if _wrong(k, c.get(k)))
            out["up"] = {"entries": len(before), "lost": len(before - after), "wrong": wrong,
                         "resize_ms": grew * 1e3}
            n = args.grown // args.value_bytes  # (the grown cache filled: its capacity's worth of values)
            for i in range(0, n, 1024):
                c.put_many({f"f{j}": _value(f"f{j}", j, args.value_bytes) for j in range(i, min(n, i + 1024))})
            full = len(c)
            t0 = time.perf_counter()
            c.resize(capacity_bytes=args.capacity, max_entries=entries)
            shrank = time.perf_counter() - t0
            kept = list(c.keys())
            out["down"] = {"entries": full, "evicted": full - len(kept),
                           "wrong": sum(1 for k in kept if _wrong(k, c.get(k))), "resize_ms": shrank * 1e3}
        out["steady"] = _phase(name, args, None)
        out["resizing"] = _phase(name, args, ((args.capacity, entries), (args.grown, grown_entries)))
        with SharedCache(name, create=False) as c:
            out["verify_ok"] = c.verify().ok
    finally:
        try:
            SharedCache.unlink_name(name)
        except FileNotFoundError:
            pass
    return out


def reindex_times(sizes=(10_000, 100_000, 1_000_000), rounds: int = 5) -> list[dict]:
    """For each size: the median time of a resize to 4 times the entry limit and of one back, that many entries
    resident (8-byte values), each rebuilding the index at its new size (Table.reindex)."""
    out = []
    for n in sizes:
        name = f"bench-resize-{os.getpid()}-{n}"
        c = SharedCache(name, capacity_bytes=max(MIB, n * 64), max_entries=n, create=True, policy="s3fifo")
        try:
            c.put_many({f"k{i}": b"v" * 8 for i in range(n)})
            up, down = [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                c.resize(max_entries=4 * n)
                up.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                c.resize(max_entries=n)
                down.append(time.perf_counter() - t0)
            out.append({"entries": len(c), "up_ms": statistics.median(up) * 1e3,
                        "down_ms": statistics.median(down) * 1e3, "verify_ok": c.verify(deep=False).ok})
        finally:
            c.close()
            SharedCache.unlink_name(name)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.resize", description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=parse_size, default=64 * MIB)
    p.add_argument("--grown", type=parse_size, default=1024 * MIB)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--pause", type=float, default=1.0, help="seconds between two resizes")
    p.add_argument("--keys", type=int, default=100_000, help="keys the workers use (and the first fill)")
    p.add_argument("--value-bytes", type=int, default=4000)
    p.add_argument("--policy", default="lru")
    p.add_argument("--json", action="store_true")
    p.add_argument("--reindex", action="store_true", help="time the index's rebuild alone (see above)")
    args = p.parse_args(argv)
    if args.reindex:
        rows = reindex_times()
        if args.json:
            print(json.dumps({"path": core.PATH, "reindex": rows}, indent=2))
        for r in [] if args.json else rows:
            print(f"{r['entries']:>9} entries: limit x4 {r['up_ms']:7.1f} ms, back {r['down_ms']:7.1f} ms "
                  f"(medians of 5; verify {'ok' if r['verify_ok'] else 'FAILED'})")
        return 0 if all(r["verify_ok"] for r in rows) else 1
    out = measure(args)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        up, down, st, rz = out["up"], out["down"], out["steady"], out["resizing"]
        print(f"resize ({out['path']}, {out['policy']}, {out['workers']} workers, {out['seconds']:g} s a phase): "
              f"{out['capacity_mib']:g} MiB <-> {out['grown_mib']:g} MiB, max_entries {out['entries']} <-> "
              f"{out['grown_entries']}")
        print(f"  up, alone: {up['entries']} entries, {up['lost']} lost, {up['wrong']} wrong, "
              f"{up['resize_ms']:.1f} ms")
        print(f"  down, alone: {down['entries']} entries, {down['evicted']} evicted, {down['wrong']} wrong, "
              f"{down['resize_ms']:.1f} ms")
        for label, ph in (("steady", st), ("resizing", rz)):
            extra = (f", {ph['resizes']} resizes (median {ph['resize_median_ms']:.1f} ms, longest "
                     f"{ph['resize_max_ms']:.1f} ms)") if "resizes" in ph else ""
            print(f"  {label:9} {ph['gets']} gets, {ph['wrong']} wrong, {ph['errors']} errors, get p50 "
                  f"{ph['get_p50_us']:.2f} us, p99 {ph['get_p99_us']:.2f} us{extra}")
        print(f"  get p99 resizing / steady: {rz['get_p99_us'] / st['get_p99_us']:.2f}; verify "
              f"{'ok' if out['verify_ok'] else 'FAILED'}")
    bad = out["up"]["lost"] or out["up"]["wrong"] or out["down"]["wrong"] or not out["verify_ok"] or any(
        out[ph]["wrong"] or out[ph]["errors"] for ph in ("steady", "resizing"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
