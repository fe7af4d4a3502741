"""``python -m benchmarks.tiered``: what a ``TieredCache`` read costs, next to a plain ``SharedCache`` get and a plain
redis-py GET of the same value, all timed side by side in one process against one redis-server on loopback TCP
(interleaved rounds, medians). Prints a table; ``--json FILE`` also writes the figures. Nothing passes or fails.

Rows, for a small dict and a 224x224x3 uint8 array:

- ``SharedCache.get``: the local cache alone, the reference for a tiered local hit;
- ``TieredCache.get, local hit``: what almost every read of a warm host costs;
- ``TieredCache.get, remote hit``: a local miss, read from Redis, checked, decoded and copied into the local cache
  (the local copy is dropped, untimed, before each call);
- ``redis-py GET``: the raw bytes of the value from the same server, and ``GET + decode`` the value rebuilt from
  them (msgpack, or numpy for the array), the peer a remote hit compares with;
- ``TieredCache.put`` and ``redis-py SET``: a write through, against a bare write to Redis;
- ``aget`` and ``aput``: the same through the asyncio API (each awaited in a running loop; Redis through redis-py's
  asyncio client), next to ``redis.asyncio GET + decode``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import time

import msgpack
import numpy as np

from shmcache import SharedCache, TieredCache
from shmcache.codec import KindKey

from .measure import ARRAY, SMALL, array_value, make_key, small_value
from .servers import RedisServer

ROUNDS = 7
CALLS = {SMALL: 2000, ARRAY: 300}


def _time(fn, n: int, before=None) -> float:
    """Median ns of ``fn()`` over ``n`` calls, each timed alone (``before()`` runs untimed ahead of each)."""
    samples = []
    gc.disable()
    try:
        for _ in range(n):
            if before is not None:
                before()
            t0 = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return statistics.median(samples)


async def _atime(afn, n: int, before=None) -> float:
    """``_time`` for a coroutine function, each call awaited in the running loop."""
    samples = []
    gc.disable()
    try:
        for _ in range(n):
            if before is not None:
                before()
            t0 = time.perf_counter_ns()
            await afn()
            samples.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return statistics.median(samples)


def _decoder(kind: str):
    if kind == ARRAY:
        return lambda raw: np.frombuffer(raw, np.uint8).reshape(224, 224, 3).copy()
    return msgpack.unpackb


def _encode(kind: str, value) -> bytes:
    return value.tobytes() if kind == ARRAY else msgpack.packb(value)


def bench(server_url: str) -> list[dict]:
    import redis
    import redis.asyncio

    name = f"benchmarks-tiered-{os.getpid()}"
    client = redis.Redis.from_url(server_url)
    loop = asyncio.new_event_loop()
    aclient = redis.asyncio.Redis.from_url(server_url)
    rows = []
    with SharedCache(name, capacity_bytes=64 << 20, max_entries=1024, create=True) as local:
        tier = TieredCache(local, server_url, namespace=f"bench{os.getpid()}", timeout=1.0)
        try:
            deadline = time.monotonic() + 10
            while tier.stats().listener_starts < 1 and time.monotonic() < deadline:
                time.sleep(0.01)  # the first subscription drops the copies made before it
            for kind, value in ((SMALL, small_value()), (ARRAY, array_value(1))):
                key = make_key("k", 1)
                raw_key = f"raw:{key}"
                local.put(key, value)
                tier.put(key, value)
                client.set(raw_key, _encode(kind, value))
                decode = _decoder(kind)
                lkey = KindKey(tier._n, key)

                def drop_copy():
                    local.delete(lkey)

                cases = {
                    "SharedCache.get": (lambda: local.get(key), None),
                    "TieredCache.get, local hit": (lambda: tier.get(key), None),
                    "TieredCache.get, remote hit": (lambda: tier.get(key), drop_copy),
                    "redis-py GET": (lambda: client.get(raw_key), None),
                    "redis-py GET + decode": (lambda: decode(client.get(raw_key)), None),
                    "TieredCache.put": (lambda: tier.put(key, value), None),
                    "redis-py SET": (lambda: client.set(raw_key, _encode(kind, value)), None),
                }
                acases = {
                    "TieredCache.aget, local hit": (lambda: tier.aget(key), None),
                    "TieredCache.aget, remote hit": (lambda: tier.aget(key), drop_copy),
                    "redis.asyncio GET + decode": (lambda: _aget_decode(aclient, raw_key, decode), None),
                    "TieredCache.aput": (lambda: tier.aput(key, value), None),
                }
                n = CALLS[kind]
                got = {case: [] for case in (*cases, *acases)}
                for _ in range(ROUNDS):  # interleaved: a change of load lands on every case alike
                    for case, (fn, before) in cases.items():
                        got[case].append(_time(fn, n, before))
                    for case, (afn, before) in acases.items():
                        got[case].append(loop.run_until_complete(_atime(afn, n, before)))
                assert tier.stats().stale_fills == 0
                med = {case: statistics.median(v) / 1000 for case, v in got.items()}
                for case, us in med.items():
                    rows.append({"value": kind, "case": case, "median_us": round(us, 2),
                                 "over_sharedcache_get": round(us / med["SharedCache.get"], 2),
                                 "over_redis_get_decode": round(us / med["redis-py GET + decode"], 2)})
                client.delete(raw_key)
        finally:
            tier.clear()
            loop.run_until_complete(aclient.aclose())
            loop.run_until_complete(tier.aclose())
            loop.close()
            tier.unlink()
            local.unlink()
            client.close()
    return rows


async def _aget_decode(aclient, raw_key: str, decode):
    return decode(await aclient.get(raw_key))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tiered", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--redis-url", help="use this Redis instead of starting one on loopback TCP")
    args = p.parse_args(argv)
    if args.redis_url:
        rows = bench(args.redis_url)
    else:
        with RedisServer(tcp=True) as server:
            rows = bench(server.url)
    print(f"{'value':<16} {'case':<30} {'median us':>10} {'/ SharedCache.get':>18} {'/ redis GET+decode':>19}")
    for r in rows:
        print(f"{r['value']:<16} {r['case']:<30} {r['median_us']:>10.2f} {r['over_sharedcache_get']:>18.2f} "
              f"{r['over_redis_get_decode']:>19.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "tiered", "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
