"""The asyncio API's figures: what an awaited hit costs beside a plain one, and how long the event loop stalls while a
call waits for a lock held by a stopped process or for another process's computation.

    python -m benchmarks.aio [--ops 20000] [--runs 5] [--wait 1.5]

Cost: ``await cache.aget(k)`` and ``cache.get(k)`` of resident keys (a small dict each), measured side by side in
one process, alternating, median of ``--runs`` runs of ``--ops`` lookups each, and their ratio. Stalls: a ticker
coroutine sleeps 1 ms at a time and records the gaps between its wake-ups while (1) ``await cache.aput(k, v)``
waits ``--wait`` seconds for the lock, held by a process that is SIGSTOPped meanwhile, and (2) ``await
cache.aget_or_compute(k, fn)`` waits ``--wait`` seconds for another process computing ``k``; it prints the largest
gap (p100) and the p99 of each, with the wait itself, and the same ticker's largest gap with nothing waiting, the
loop's own floor on this machine. Every segment made is removed, and every process made is reaped.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
import uuid

from shmcache import SharedCache
from shmcache.core import PATH

ctx = mp.get_context("fork")


def _name(tag: str) -> str:
    return f"bench-aio-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


async def _cost(cache: SharedCache, keys: list, runs: int) -> tuple[float, float]:
    """Median ns per lookup of get and of aget, measured alternately."""
    sync, aio = [], []
    get, aget = cache.get, cache.aget
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        for k in keys:
            get(k)
        sync.append((time.perf_counter_ns() - t0) / len(keys))
        t0 = time.perf_counter_ns()
        for k in keys:
            await aget(k)
        aio.append((time.perf_counter_ns() - t0) / len(keys))
    return statistics.median(sync), statistics.median(aio)


async def _gaps_while(awaitable, floor: bool = False) -> tuple[list[float], float]:
    """The ticker's gaps (ms) while ``awaitable`` runs, and how long it took (s)."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append((now - last) * 1000)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    gaps.clear()
    t0 = time.perf_counter()
    await awaitable
    took = time.perf_counter() - t0
    done.set()
    await ticker
    return gaps, took


async def _django_cost(name: str, keys: list, runs: int) -> tuple[float, float] | None:
    """Median ns per hit of the Django backend's get and aget (None without Django)."""
    try:
        import django
        from django.conf import settings
    except ImportError:
        return None
    if not settings.configured:
        settings.configure(CACHES={"default": {"BACKEND": "shmcache.contrib.django.SharedMemoryCache",
                                               "LOCATION": name, "OPTIONS": {"capacity_bytes": 8 << 20}}})
        django.setup()
    from django.core.cache import caches

    from shmcache.contrib.django import close_handles

    cache = caches["default"]
    try:
        for k in keys:
            cache.set(k, {"k": k})
        sync, aio = [], []
        for _ in range(runs):
            t0 = time.perf_counter_ns()
            for k in keys:
                cache.get(k)
            sync.append((time.perf_counter_ns() - t0) / len(keys))
            t0 = time.perf_counter_ns()
            for k in keys:
                await cache.aget(k)
            aio.append((time.perf_counter_ns() - t0) / len(keys))
        return statistics.median(sync), statistics.median(aio)
    finally:
        close_handles()
        SharedCache.unlink_name(name)


def _hold(name: str, ready) -> None:
    """Take the cache lock and sleep with it (until SIGKILLed: its holder slot goes with it; a waiter takes over)."""
    c = SharedCache(name, create=False)
    c._guard.hold()
    ready.set()
    time.sleep(120)


def _compute(name: str, started, seconds: float) -> None:
    with SharedCache(name, create=False) as c:
        def fn():
            started.set()
            time.sleep(seconds)
            return "computed elsewhere"

        c.get_or_compute("k", fn)
    os._exit(0)


def _summary(gaps: list[float]) -> str:
    gaps = sorted(gaps)
    p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else 0.0
    return f"p100 gap {max(gaps, default=0.0):6.2f} ms, p99 {p99:5.2f} ms over {len(gaps):,} ticks"


async def _stall_lock(name: str, wait: float) -> tuple[list[float], float]:
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(name, ready), daemon=True)
    holder.start()
    try:
        ready.wait(30)
        os.kill(holder.pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()

        def wake() -> None:  # the holder resumes and dies after --wait s (its death frees the lock)
            os.kill(holder.pid, signal.SIGKILL)
            os.kill(holder.pid, signal.SIGCONT)

        loop.call_later(wait, wake)
        with SharedCache(name, create=False, lock_timeout=wait * 10) as c:
            return await _gaps_while(c.aput("k", "v"))
    finally:
        if holder.is_alive():
            os.kill(holder.pid, signal.SIGKILL)
            os.kill(holder.pid, signal.SIGCONT)
        holder.join(30)


async def _stall_compute(name: str, wait: float) -> tuple[list[float], float]:
    started = ctx.Event()
    other = ctx.Process(target=_compute, args=(name, started, wait), daemon=True)
    other.start()
    try:
        started.wait(30)
        with SharedCache(name, create=False) as c:
            return await _gaps_while(c.aget_or_compute("k", lambda: "computed here"))
    finally:
        other.join(30)


async def main_async(args) -> None:
    names = [_name("cost"), _name("lock"), _name("compute")]
    caches = [SharedCache(n, capacity_bytes=8 << 20, max_entries=args.ops + 16, create=True) for n in names]
    try:
        c = caches[0]
        keys = [f"key:{i}" for i in range(args.ops)]
        for k in keys:
            c.put(k, {"k": k, "v": [1, 2, 3]})
        sync_ns, aio_ns = await _cost(c, keys, args.runs)
        print(f"get  {sync_ns:8.0f} ns   aget {aio_ns:8.0f} ns   aget / get = {aio_ns / sync_ns:.2f} "
              f"(median of {args.runs} runs of {args.ops:,} hits, alternating)")
        django = await _django_cost(names[0] + "-dj", keys[: args.ops // 4], args.runs)
        if django:
            print(f"Django backend: get {django[0]:6.0f} ns   aget {django[1]:6.0f} ns   aget / get = "
                  f"{django[1] / django[0]:.2f}")
        floor, _ = await _gaps_while(asyncio.sleep(args.wait))
        print(f"nothing waiting:                     {_summary(floor)}")
        gaps, took = await _stall_lock(names[1], args.wait)
        print(f"aput, lock held by a stopped process: {_summary(gaps)}; aput took {took:.2f} s")
        gaps, took = await _stall_compute(names[2], args.wait)
        print(f"aget_or_compute, computed elsewhere:  {_summary(gaps)}; it took {took:.2f} s")
    finally:
        for cache in caches:
            cache.close()
            cache.unlink()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.aio", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--wait", type=float, default=1.5, help="seconds each stall lasts (default %(default)s)")
    args = p.parse_args(argv)
    print(f"command: python -m benchmarks.aio {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(f"shmcache ({PATH}), Python {sys.version.split()[0]}")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
