"""W5: what it costs in memory when several worker processes read the same cached arrays.

Four forked workers each read every one of ``n`` 224x224x3 uint8 arrays (about 200 MB; 40 MB with --quick). With
shmcache the parent puts them in one cache and closes its handle before the workers start, so the segment's pages
are counted only in the workers that map them; each worker gets every array and drops it. With cachetools each
worker builds its own copy, as a private per-process cache does. The parent reads every worker's PSS (private pages
plus its share of shared ones, from /proc/<pid>/smaps_rollup) twice, once they have started and once they have read
everything, while all are alive: the sum after reading, over the data size, is what the data costs the host.
"""

from __future__ import annotations

import multiprocessing as mp
import os

from shmcache import SharedCache
from shmcache.layout import SEGMENT_PREFIX

from .measure import ARRAY, MB, array_value, make_key, pss_bytes, reap, row
from .workloads import guarded

W5_WORKERS = 4
ARRAY_NBYTES = 224 * 224 * 3
STEP_TIMEOUT_S = 300.0  # for one phase (start, read everything) of the workers
ENTRY_SLACK = 1024  # bytes per entry on top of the array, for the key and the encoding


def w5_memory(scale, peers, seed: int) -> list[dict]:
    rows = []
    n = max(1, scale.w5_nbytes // ARRAY_NBYTES)
    names = {p.name for p in peers}
    for kind in ("shmcache", "cachetools"):
        if kind in names:
            guarded(rows, "W5", kind, lambda: _w5_rows(kind, n, seed))
    return rows


def _w5_rows(kind: str, n: int, seed: int) -> list[dict]:
    if kind == "shmcache":
        baseline, after, segment = _w5_shmcache(n, seed)
        note = f"segment in /dev/shm: {segment / MB:.0f} MB"
    else:
        baseline, after = _measure(kind, None, n, seed)
        note = "each worker builds its own copy"
    data = n * ARRAY_NBYTES
    extra = {"data_mb": data / MB, "baseline_mb": baseline / MB, "arrays": n, "workers": W5_WORKERS}
    case = f"{W5_WORKERS} workers read {n} arrays ({data / MB:.0f} MB of {ARRAY})"
    return [row("W5", f"{case}: sum of PSS", kind, after / MB, "MB", note=note, **extra),
            row("W5", "sum of PSS / data size", kind, after / data, "x"),
            row("W5", "(sum of PSS - sum before reading) / data size", kind, (after - baseline) / data, "x")]


def _w5_shmcache(n: int, seed: int) -> tuple[int, int, int]:
    name = f"benchmarks-w5-{os.getpid()}"
    try:
        with SharedCache(name, capacity_bytes=n * (ARRAY_NBYTES + ENTRY_SLACK), max_entries=n + 16,
                         create=True) as cache:
            for i in range(n):
                cache.put(make_key("w5:", i), array_value(seed, i))
        segment = os.path.getsize(f"/dev/shm/{SEGMENT_PREFIX}{name}")
        return (*_measure("shmcache", name, n, seed), segment)
    finally:
        try:
            SharedCache.unlink_name(name)
        except FileNotFoundError:  # creation failed, and removed what it had made
            pass


def _measure(kind: str, name: str | None, n: int, seed: int) -> tuple[int, int]:
    """Start the workers, and sum their PSS once all have started and once all have read everything."""
    ctx = mp.get_context("fork")
    queue, go, finish = ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_worker, args=(kind, name, n, seed, queue, go, finish), daemon=True)
             for _ in range(W5_WORKERS)]
    try:
        for p in procs:
            p.start()
        _wait_all(queue, "ready")
        baseline = sum(pss_bytes(p.pid) for p in procs)
        go.set()
        _wait_all(queue, "done")
        after = sum(pss_bytes(p.pid) for p in procs)
    finally:
        go.set()
        finish.set()
        reap(procs)
    return baseline, after


def _wait_all(queue, phase: str) -> None:
    for _ in range(W5_WORKERS):
        msg = queue.get(timeout=STEP_TIMEOUT_S)
        if msg[0] != phase:
            raise RuntimeError(f"a worker failed: {msg[1]}")


def _worker(kind: str, name: str | None, n: int, seed: int, queue, go, finish) -> None:
    try:
        if kind == "shmcache":
            cache = SharedCache(name, create=False)
        else:
            import cachetools

            cache = cachetools.LRUCache(maxsize=n)
        queue.put(("ready",))
        go.wait(STEP_TIMEOUT_S)
        if kind == "cachetools":
            for i in range(n):
                cache[make_key("w5:", i)] = array_value(seed, i)
        missing = 0
        for i in range(n):
            a = cache.get(make_key("w5:", i))
            missing += a is None or a.shape != (224, 224, 3)
        if missing:
            raise RuntimeError(f"{missing} of {n} arrays missing or of the wrong shape")
        queue.put(("done",))
        finish.wait(STEP_TIMEOUT_S)
        if kind == "shmcache":
            cache.close()
    except BaseException as exc:
        queue.put(("error", f"{type(exc).__name__}: {exc}"))
