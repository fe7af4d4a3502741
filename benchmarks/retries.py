"""``python -m benchmarks.retries``: reads without the lock beside a writer: how many a writer's holds tear.

``--readers`` processes get random resident keys (values that carry their key and a checksum, each checked) while
one process puts new values of random keys of the same set, for ``--seconds``. A read that a hold tore (a word it
validates against moved, or was odd) is retried, and after 64 tries handed to the lock: printed per reader, as
medians over the readers, are its gets per second, the share of its gets retried and the share handed to the lock,
and the wrong values (must be 0: the exit status is 1 otherwise). Since layout version 11 a put opens only the
stripes of the index it writes (64 of them), so a reader is torn only by a put into its key's stripe; before, by
every put that overlapped it.

    python -m benchmarks.retries
    python -m benchmarks.retries --readers 1 --seconds 3 --policy auto --json
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

import xxhash

from shmcache import SharedCache
from .measure import reap


def _value(key: str, seq: int) -> dict:
    pad = bytes((seq + i) % 251 for i in range(64))
    return {"key": key, "seq": seq, "pad": pad, "sum": xxhash.xxh3_64_intdigest(key.encode() + pad)}


def _wrong(key: str, v) -> bool:
    return not (isinstance(v, dict) and v.get("key") == key
                and xxhash.xxh3_64_intdigest(key.encode() + v["pad"]) == v["sum"])


def _read(name: str, worker: int, keys: int, seconds: float, start, queue) -> None:
    cache = SharedCache(name, create=False)
    rng = random.Random(worker)
    names = [f"k{i}" for i in range(keys)]
    before = cache.stats()
    start.wait()
    gets = wrong = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        for _ in range(500):
            k = names[rng.randrange(keys)]
            wrong += _wrong(k, cache.get(k))
        gets += 500
    took = time.perf_counter() - t0
    after = cache.stats()  # (every count of this handle's reads is in its own reader slot: no other reader here)
    queue.put({"gets_per_s": gets / took, "gets": gets, "wrong": wrong,
               "retried": (after.read_retries - before.read_retries) / gets,
               "to_the_lock": (after.read_fallbacks - before.read_fallbacks) / gets})
    cache.close()


def _write(name: str, keys: int, seconds: float, start, queue) -> None:
    cache = SharedCache(name, create=False)
    rng = random.Random(-1)
    start.wait()
    puts, seq, end = 0, 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            seq += 1
            i = rng.randrange(keys)
            cache.put(f"k{i}", _value(f"k{i}", seq))
        puts += 100
    queue.put({"puts_per_s": puts / seconds})
    cache.close()


def measure(args: argparse.Namespace) -> dict:
    """One run: the readers' medians, the writer's puts per second, and whether the cache verified after."""
    name = f"bench-retries-{os.getpid()}"
    cache = SharedCache(name, create=True, capacity_bytes=64 << 20, max_entries=4 * args.keys, policy=args.policy)
    ctx = mp.get_context("fork")
    procs: list = []
    try:
        for i in range(args.keys):
            cache.put(f"k{i}", _value(f"k{i}", 0))
        start, queue = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_read, args=(name, w, args.keys, args.seconds, start, queue))
                 for w in range(args.readers)]
        procs.append(ctx.Process(target=_write, args=(name, args.keys, args.seconds, start, queue)))
        for p in procs:
            p.start()
        time.sleep(0.2)  # every process attached before the clocks start
        start.set()
        got = [queue.get(timeout=args.seconds + 60) for _ in procs]
        readers = [g for g in got if "gets" in g]
        out = {k: statistics.median(r[k] for r in readers) for k in ("gets_per_s", "retried", "to_the_lock")}
        out["wrong"] = sum(r["wrong"] for r in readers)
        out["puts_per_s"] = next(g["puts_per_s"] for g in got if "puts_per_s" in g)
        out["verify_ok"] = cache.verify().ok
        return out
    finally:
        reap(procs, 30)
        cache.close()
        cache.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.retries", description=__doc__.split("\n\n")[0])
    ap.add_argument("--readers", type=int, default=1, help="reading processes (default 1)")
    ap.add_argument("--keys", type=int, default=10_000, help="resident keys (default 10000)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of the run (default 3)")
    ap.add_argument("--policy", default="auto", help="the cache's policy (default auto)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    out = measure(args)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"policy={args.policy} readers={args.readers}: {out['gets_per_s']:,.0f} gets/s a reader, "
              f"{100 * out['retried']:.2f} % retried, {100 * out['to_the_lock']:.3f} % to the lock, "
              f"{out['wrong']} wrong; the writer {out['puts_per_s']:,.0f} puts/s; verify "
              f"{'ok' if out['verify_ok'] else 'FAILED'}")
    return 0 if out["wrong"] == 0 and out["verify_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
