"""``python -m benchmarks.scaling``: lookups per second as processes are added, 95 % get / 5 % put, side by side.

Each configuration runs N forked worker processes on one store for ``--seconds``; every worker draws Zipf-skewed
keys (s = 1.0) from ``--keys`` keys, all resident, and does a get (95 %) or a put of the same ~100-byte value (5 %;
``--puts 0`` for reads alone).
The figure is the sum of the workers' operations per second, and the ratio to the same store's figure at one
process. Rounds are interleaved (every store and process count once, then again), and the table shows medians.

Stores:
  shmcache-lru     SharedCache(policy="lru"): every get takes the lock (it relinks the entry)
  shmcache-s3fifo  SharedCache(policy="s3fifo"): gets read without the lock (compiled section, x86-64)
  shmcache-auto    SharedCache(policy="auto"): gets read without the lock too, and add to its frequency sketch
  shmcache-default SharedCache(name): the default configuration (policy, capacity and entry limit), as a user
                   who names nothing gets it
  lmdb             one LMDB environment in /dev/shm, a read transaction per get (needs ``pip install lmdb``)
  private          a dict per process (no sharing: each worker's own copy): the ceiling of a lookup

Scaling is bounded by the cores: on a 2-core machine 1 -> 2 is the whole table; ``--processes 1,2,4,8,16`` on a
machine with 16 cores. Nothing passes or fails here; ``--json FILE`` writes the figures and the machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import tempfile
import time

import numpy as np
from .measure import reap

STORES = ("shmcache-lru", "shmcache-s3fifo", "shmcache-auto", "shmcache-default", "lmdb", "private")


def _value(i: int) -> dict:
    return {"id": i, "name": f"user-{i}", "tags": ["a", "b", "c"], "score": i * 0.5, "pad": "x" * 40}


class _Store:
    """One store, opened in the parent (``open``) and attached in each forked worker (``attach``)."""

    def __init__(self, kind: str, keys: int) -> None:
        self.kind, self.keys, self.dir, self.name, self.cache = kind, keys, None, None, None

    def open(self) -> None:
        if self.kind.startswith("shmcache"):
            from shmcache import SharedCache

            self.name = f"benchmarks-scaling-{os.getpid()}-{self.kind}"
            policy = self.kind.split("-")[1]
            if policy == "default":
                self.cache = SharedCache(self.name, create=True)
            else:
                self.cache = SharedCache(self.name, capacity_bytes=self.keys * 400, max_entries=self.keys * 2,
                                         create=True, policy=policy)
            self.cache.put_many({f"k{i}": _value(i) for i in range(self.keys)})
        elif self.kind == "lmdb":
            import lmdb
            import msgpack

            self.dir = tempfile.mkdtemp(prefix="benchmarks-scaling-", dir="/dev/shm")
            env = lmdb.open(self.dir, map_size=2**30, writemap=True, sync=False, metasync=False, max_readers=256)
            with env.begin(write=True) as txn:
                for i in range(self.keys):
                    txn.put(f"k{i}".encode(), msgpack.packb(_value(i)))
            env.close()

    def attach(self):
        """(get, put) for this process."""
        if self.kind.startswith("shmcache"):
            from shmcache import SharedCache

            c = SharedCache(self.name)
            return c.get, c.put
        if self.kind == "lmdb":
            import lmdb
            import msgpack

            env = lmdb.open(self.dir, map_size=2**30, writemap=True, sync=False, metasync=False, max_readers=256,
                            lock=True)

            def get(k):
                with env.begin() as txn:
                    raw = txn.get(k.encode())
                return None if raw is None else msgpack.unpackb(raw)

            def put(k, v):
                with env.begin(write=True) as txn:
                    txn.put(k.encode(), msgpack.packb(v))

            return get, put
        d = {f"k{i}": _value(i) for i in range(self.keys)}
        return d.get, d.__setitem__

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
            self.cache.unlink()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def _worker(store: _Store, seconds: float, seed: int, puts_share: float, go, out) -> None:
    get, put = store.attach()
    rng = np.random.default_rng(seed)
    n = store.keys
    ranks = np.arange(1, n + 1, dtype=np.float64)
    cdf = np.cumsum(1.0 / ranks)
    cdf /= cdf[-1]
    draws = np.searchsorted(cdf, rng.random(200_000)).tolist()
    puts = (rng.random(200_000) < puts_share).tolist()
    keys = [f"k{i}" for i in range(n)]
    value = _value(0)
    go.wait()
    ops, i, end = 0, 0, time.perf_counter() + seconds
    while True:
        for _ in range(1000):
            k = keys[draws[i]]
            if puts[i]:
                put(k, value)
            elif get(k) is None:
                raise AssertionError(f"{store.kind}: {k} missing")
            i = (i + 1) % 200_000
        ops += 1000
        if time.perf_counter() >= end:
            break
    out.put(ops / seconds)


def _run(store: _Store, n: int, seconds: float, seed: int, puts_share: float) -> float:
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(store, seconds, seed + i, puts_share, go, out)) for i in range(n)]
    for p in procs:
        p.start()
    time.sleep(0.3)  # every worker attached and ready
    go.set()
    try:
        total = sum(out.get(timeout=seconds + 60) for _ in procs)
    finally:
        reap(procs, 10)
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", default="1,2", help="process counts (default %(default)s)")
    ap.add_argument("--stores", default=",".join(STORES), help="stores (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians shown (default %(default)s)")
    ap.add_argument("--keys", type=int, default=10_000, help="resident keys (default %(default)s)")
    ap.add_argument("--puts", type=float, default=0.05, help="share of puts (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.processes.split(",")]
    kinds = [s for s in args.stores.split(",") if s]
    stores = []
    for kind in kinds:
        if kind == "lmdb":
            try:
                import lmdb  # noqa: F401
            except ImportError:
                print("lmdb: skipped (pip install lmdb)")
                continue
        stores.append(_Store(kind, args.keys))
    figures: dict = {(s.kind, n): [] for s in stores for n in counts}
    try:
        for s in stores:
            s.open()
        for _ in range(args.rounds):
            for s in stores:
                for n in counts:
                    figures[(s.kind, n)].append(_run(s, n, args.seconds, args.seed, args.puts))
    finally:
        for s in stores:
            s.close()
    print(f"lookups/s, {100 - 100 * args.puts:g} % get / {100 * args.puts:g} % put, {args.keys} Zipf keys, median of"
          f" {args.rounds} rounds of {args.seconds} s;"
          f" {os.cpu_count()} cores ({platform.processor() or platform.machine()})")
    print(f"{'store':<17}" + "".join(f"{f'{n} proc':>16}" for n in counts) + "".join(
        f"{f'1->{n}':>8}" for n in counts[1:]))
    rows = []
    for s in stores:
        med = {n: statistics.median(figures[(s.kind, n)]) for n in counts}
        print(f"{s.kind:<17}" + "".join(f"{med[n]:>16,.0f}" for n in counts) + "".join(
            f"{med[n] / med[counts[0]]:>7.2f}x" for n in counts[1:]))
        rows.append({"store": s.kind, "ops_per_s": med, "samples": {n: figures[(s.kind, n)] for n in counts}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "machine": platform.machine(),
                       "args": vars(args), "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
