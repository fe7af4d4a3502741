"""The workloads W1 to W4 (W5 is in memory.py). Each takes a Scale, the peer classes to run and a seed, and returns
result rows.

W1  latency in one process: get hit, get miss and put of three value kinds, one operation timed at a time.
W2  throughput of 1, 2, 4 and 8 forked worker processes on one store: 90% get / 10% put, Zipf keys, eviction.
W3  get-hit latency as the store grows to 1k, 10k, 100k and 1M resident entries.
W4  churn: puts of mixed sizes into a full shmcache (latency, evictions per put, arena utilization, failed puts).

Every store a workload makes is closed in a ``finally`` (which unlinks shmcache segments and removes directories and
servers); every worker process is joined with a timeout and killed if it overstays. A peer that fails yields an
error row and the run goes on with the next.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np

from .measure import (
    ARRAY, BYTES_64K, SMALL, VALUE_MAKERS, array_value, error_row, gc_paused, latency_row, make_key, median_p99,
    minor_faults, reap, row, same_value, small_value, time_each,
)
from .peers import CachetoolsPeer, ShmcachePeer, Sizing


@dataclass(frozen=True)
class Scale:
    """How big and how long each workload runs."""

    w1_ops: dict  # value kind -> timed operations of each type
    w1_big_keys: int  # distinct keys for the 64 KiB and array values (puts go round them: inserts, then updates)
    w2_workers: tuple
    w2_seconds: float
    w2_keys: int
    w3_sizes: tuple
    w3_ops: int
    w4_capacity_bytes: int
    w4_puts: int
    w5_nbytes: int


FULL = Scale(w1_ops={SMALL: 20_000, BYTES_64K: 2_000, ARRAY: 2_000}, w1_big_keys=256, w2_workers=(1, 2, 4, 8),
             w2_seconds=5.0, w2_keys=100_000, w3_sizes=(1_000, 10_000, 100_000, 1_000_000), w3_ops=20_000,
             w4_capacity_bytes=64 * 2**20, w4_puts=20_000, w5_nbytes=200 * 10**6)
QUICK = Scale(w1_ops={SMALL: 5_000, BYTES_64K: 500, ARRAY: 500}, w1_big_keys=128, w2_workers=(1, 2, 4, 8),
              w2_seconds=0.5, w2_keys=20_000, w3_sizes=(1_000, 10_000, 100_000), w3_ops=3_000,
              w4_capacity_bytes=16 * 2**20, w4_puts=2_000, w5_nbytes=40 * 10**6)

W1_MIN_CAPACITY = 64 * 2**20
W1_ROUNDS = 5  # W1 times each operation in this many rounds, the peers taking turns within each
W2_CACHED_SHARE = 0.1  # the bounded stores hold this share of the key space: the working set does not fit
W2_PUT_SHARE = 0.1
W2_BATCH = 256  # operations drawn at once; the clock is read between batches
ZIPF_S = 1.0
START_TIMEOUT_S = 60.0  # for worker processes to start and attach
JOIN_TIMEOUT_S = 30.0
W4_MIN_NBYTES, W4_MAX_NBYTES = 64, 256 * 1024
W4_WARMUP_FILLS = 2  # put this many times the capacity before measuring, so the cache is full and evicting
W4_SAMPLE_EVERY = 50  # puts between two utilization samples


def progress(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def guarded(rows: list, workload: str, peer: str, fn) -> None:
    """Run ``fn()`` and add its rows; an exception becomes an error row (with the traceback on stderr)."""
    t0 = time.monotonic()
    try:
        rows.extend(fn())
    except Exception as exc:
        traceback.print_exc()
        rows.append(error_row(workload, peer, exc))
    progress(f"{workload} {peer}: {time.monotonic() - t0:.1f} s")


def entry_nbytes(key, value) -> int:
    """What one entry counts against shmcache's byte limit (encoded key + value), asked of shmcache itself."""
    with ShmcachePeer(Sizing(max_entries=4, capacity_bytes=4 * 2**20)) as probe:
        probe.put(key, value)
        return probe.cache.stats().retained_bytes


# ------------------------------------------------------------------------------------------- W1


def w1_latency(scale: Scale, peers, seed: int) -> list[dict]:
    rows = []
    rng = np.random.default_rng(seed)
    for kind, make in VALUE_MAKERS.items():
        nops = scale.w1_ops[kind]
        nkeys = nops if kind == SMALL else min(nops, scale.w1_big_keys)
        value = make(seed)
        keys = [make_key("w1:", i) for i in range(nkeys)]
        puts = [keys[i % nkeys] for i in range(nops)]
        hits = [keys[i] for i in rng.integers(0, nkeys, nops)]
        misses = [make_key("w1-miss:", i) for i in range(nops)]
        per_entry = entry_nbytes(keys[0], value)
        sizing = Sizing(max_entries=nkeys + 16, capacity_bytes=max(W1_MIN_CAPACITY, 2 * nkeys * per_entry))
        rows.extend(_w1_interleaved(peers, sizing, kind, value, puts, hits, misses))
    rows.extend(_w1_reference(scale, seed))
    return rows


def _w1_interleaved(peers, sizing, kind, value, puts, hits, misses) -> list[dict]:
    """Every peer's store open at once, each operation timed in W1_ROUNDS rounds that visit the peers in turn, so
    that a change of load on the machine during the run lands on all of them alike and their ratios hold."""
    rows = []
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        stores = {}
        for peer in peers:
            try:
                stores[peer.name] = stack.enter_context(peer(sizing))
            except Exception as exc:
                traceback.print_exc()
                rows.append(error_row("W1", f"{peer.name} {kind}", exc))
        for op, args in (("put", puts), ("get hit", hits), ("get miss", misses)):
            samples = {name: [] for name in stores}
            faults = dict.fromkeys(stores, 0)
            for r in range(W1_ROUNDS):
                part = args[r::W1_ROUNDS]
                for name, store in list(stores.items()):
                    try:
                        before = minor_faults()
                        samples[name].append(time_each(store.put, part, value) if op == "put"
                                             else time_each(store.get, part))
                        faults[name] += minor_faults() - before
                    except Exception as exc:
                        traceback.print_exc()
                        rows.append(error_row("W1", f"{name} {kind}", exc))
                        del stores[name], samples[name]
            for name in stores:
                ns = np.concatenate(samples[name])
                rows.append(latency_row("W1", f"{kind}: {op}", name, ns, faults_per_op=faults[name] / len(ns)))
        shm = stores.get("shmcache")
        if shm is not None and isinstance(value, (np.ndarray, bytes)):
            # A zero-copy read: the view taken and closed, the value's bytes touched by nothing but the checksum.
            def view(key, cache=shm.cache):
                with cache.view(key) as v:
                    return len(v)

            ns = np.concatenate([time_each(view, hits[r::W1_ROUNDS]) for r in range(W1_ROUNDS)])
            rows.append(latency_row("W1", f"{kind}: view (zero-copy)", "shmcache", ns))
        for name, store in stores.items():
            if not (same_value(store.get(hits[0]), value) and store.get(misses[0]) is None):
                for r in rows:
                    if r["peer"] == name and r["case"] == f"{kind}: get hit":
                        r["note"] = "a get returned a wrong value"
    progress(f"W1 {kind}: {len(stores)} stores, interleaved in {W1_ROUNDS} rounds: {time.monotonic() - t0:.1f} s")
    return rows


def _w1_reference(scale: Scale, seed: int) -> list[dict]:
    """Reference rows: np.copy of the 150 KB array, copied again and again (hot in the CPU caches) and of as many
    distinct arrays as W1 stores, in turn (cold, as a get of a random key finds its bytes); the timer around an
    empty call."""
    a = array_value(seed)
    copy_ns = time_each(np.copy, [a] * 2000)
    distinct = [array_value(seed, i) for i in range(scale.w1_big_keys)]
    cold_ns = time_each(np.copy, [distinct[i % len(distinct)] for i in range(2000)])
    empty_ns = time_each(lambda _: None, range(20_000))
    return [latency_row("W1", "reference: np.copy of the 150 KB array", "numpy", copy_ns),
            latency_row("W1", f"reference: np.copy of {len(distinct)} distinct 150 KB arrays in turn", "numpy",
                        cold_ns),
            latency_row("W1", "reference: timer around an empty call", "python", empty_ns)]


# ------------------------------------------------------------------------------------------- W2


def w2_throughput(scale: Scale, peers, seed: int) -> list[dict]:
    rows = []
    nkeys = scale.w2_keys
    cached = int(nkeys * W2_CACHED_SHARE)
    keys = [make_key("w2:", i) for i in range(nkeys)]
    weights = np.arange(1, nkeys + 1, dtype=np.float64) ** -ZIPF_S
    cdf = np.cumsum(weights) / weights.sum()
    value = small_value()
    sizing = Sizing(max_entries=cached, capacity_bytes=cached * entry_nbytes(keys[0], value))
    for peer in peers:
        for n in scale.w2_workers:
            guarded(rows, "W2", f"{peer.name} x{n}",
                    lambda: [_w2_peer(peer, sizing, n, scale.w2_seconds, keys, cdf, value, seed)])
    return rows


def _w2_peer(peer, sizing, nworkers, seconds, keys, cdf, value, seed) -> dict:
    with peer(sizing) as store:
        store.fill((keys[i], value) for i in range(sizing.max_entries))  # the most popular keys: a warm start
        store.bound_to_current_size()
        store.suspend()
        try:
            results = run_forked(_w2_worker, nworkers, (store, seconds, keys, cdf, value, seed), seconds)
        finally:
            store.resume()
    gets, hits = sum(r["gets"] for r in results), sum(r["hits"] for r in results)
    ops_per_s = sum((r["gets"] + r["puts"]) / r["seconds"] for r in results)
    return row("W2", f"{nworkers} worker{'s' if nworkers > 1 else ''}: 90% get / 10% put", peer.name, ops_per_s,
               "ops/s", better="higher", hit_ratio=hits / gets if gets else 0.0, workers=nworkers,
               ops=sum(r["gets"] + r["puts"] for r in results))


def _w2_worker(worker: int, store, seconds, keys, cdf, value, seed, barrier) -> dict:
    handle = store.attach()
    try:
        get, put = handle.get, handle.put
        rng = np.random.default_rng([seed, worker])
        last = len(keys) - 1
        gets = hits = puts = 0
        barrier.wait(START_TIMEOUT_S)
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            ranks = np.minimum(np.searchsorted(cdf, rng.random(W2_BATCH), side="right"), last).tolist()
            writes = (rng.random(W2_BATCH) < W2_PUT_SHARE).tolist()
            for r, w in zip(ranks, writes):
                if w:
                    put(keys[r], value)
                    puts += 1
                else:
                    gets += 1
                    if get(keys[r]) is not None:
                        hits += 1
            now = time.perf_counter()
            if now >= deadline:
                return {"gets": gets, "hits": hits, "puts": puts, "seconds": now - t0}
    finally:
        handle.close()


def _forked_main(target, worker: int, args: tuple, barrier, queue) -> None:
    try:
        result = target(worker, *args, barrier)
    except BaseException as exc:
        result = {"error": f"worker {worker}: {type(exc).__name__}: {exc}"}
        barrier.abort()  # release the others at once rather than at START_TIMEOUT_S
    queue.put(result)


def run_forked(target, nworkers: int, args: tuple, seconds: float) -> list[dict]:
    """Run ``target(worker, *args, barrier)`` in ``nworkers`` forked processes that start together at ``barrier``;
    their results (dicts). Every process is joined, and killed if it is still there after JOIN_TIMEOUT_S."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    barrier = ctx.Barrier(nworkers + 1)
    procs = [ctx.Process(target=_forked_main, args=(target, i, args, barrier, queue), daemon=True)
             for i in range(nworkers)]
    try:
        for p in procs:
            p.start()
        try:
            barrier.wait(START_TIMEOUT_S)
        except Exception:  # a worker failed before the start: its error is in the queue
            pass
        results = [queue.get(timeout=START_TIMEOUT_S + seconds) for _ in procs]
    finally:
        reap(procs, JOIN_TIMEOUT_S)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError("; ".join(errors))
    return results


# ------------------------------------------------------------------------------------------- W3


def w3_growth(scale: Scale, peers, seed: int) -> list[dict]:
    rows = []
    value = small_value()
    largest = scale.w3_sizes[-1]
    keys = [make_key("w3:", i) for i in range(largest)]
    per_entry = entry_nbytes(keys[0], value)
    sizing = Sizing(max_entries=largest + largest // 8, capacity_bytes=int(largest * per_entry * 1.25))
    for peer in peers:
        guarded(rows, "W3", peer.name, lambda: _w3_peer(peer, sizing, scale, keys, value, seed))
    return rows


def _w3_peer(peer, sizing, scale, keys, value, seed) -> list[dict]:
    rows, medians = [], []
    rng = np.random.default_rng(seed)
    with peer(sizing) as store:
        resident = 0
        for n in scale.w3_sizes:
            store.fill((keys[i], value) for i in range(resident, n))
            resident = n
            probe = [keys[i] for i in rng.integers(0, n, scale.w3_ops)]
            ns = time_each(store.get, probe)
            missing = sum(store.get(k) is None for k in probe[:100])
            rows.append(latency_row("W3", f"get hit @ {n:,} entries", peer.name, ns, entries=n,
                                    note=f"{missing}% of sampled gets missed" if missing else ""))
            medians.append(median_p99(ns)[0])
    rows.append(row("W3", f"get hit {_short(scale.w3_sizes[-1])} / {_short(scale.w3_sizes[0])} entries (median)",
                    peer.name, medians[-1] / medians[0], "x"))
    return rows


def _short(n: int) -> str:
    return f"{n // 10**6}M" if n >= 10**6 else f"{n // 1000}k" if n >= 1000 else str(n)


# ------------------------------------------------------------------------------------------- W4


def w4_churn(scale: Scale, peers, seed: int) -> list[dict]:
    rows = []
    rng = np.random.default_rng(seed)
    capacity = scale.w4_capacity_bytes
    mean = (W4_MAX_NBYTES - W4_MIN_NBYTES) / math.log(W4_MAX_NBYTES / W4_MIN_NBYTES)  # of the log-uniform sizes
    warmup = int(W4_WARMUP_FILLS * capacity / mean)
    sizes = np.exp(rng.uniform(math.log(W4_MIN_NBYTES), math.log(W4_MAX_NBYTES), warmup + scale.w4_puts))
    sizes = sizes.astype(np.int64).tolist()
    blob = rng.bytes(W4_MAX_NBYTES)
    names = {p.name for p in peers}
    guarded(rows, "W4", "shmcache", lambda: _w4_shmcache(capacity, sizes, warmup, blob))
    if CachetoolsPeer.name in names:
        guarded(rows, "W4", "cachetools", lambda: _w4_cachetools(capacity, sizes, warmup, blob))
    return rows


_W4_CASE = "put of 64 B..256 KiB (log-uniform) into a full cache"


def _w4_shmcache(capacity: int, sizes: list, warmup: int, blob: bytes) -> list[dict]:
    # max_entries leaves room for 1 KiB per entry on average: the byte limit is the one that binds.
    with ShmcachePeer(Sizing(max_entries=capacity // 1024, capacity_bytes=capacity)) as store:
        stats = store.cache.stats
        _, failures, _ = _timed_puts(store.put, sizes, 0, warmup, blob, None)
        before = stats()
        ns, measured_failures, samples = _timed_puts(store.put, sizes, warmup, len(sizes), blob, stats)
        failures += measured_failures
        after = stats()
    puts = len(sizes) - warmup
    retained = [s.retained_bytes / s.arena_bytes for s in samples]
    used = [s.arena_used_bytes / s.arena_bytes for s in samples]
    note = f"first failure: {failures[0]}" if failures else ""
    return [latency_row("W4", _W4_CASE, "shmcache", ns, note=note),
            row("W4", "evictions per put", "shmcache", (after.evictions - before.evictions) / puts, "/put"),
            row("W4", "arena utilization: retained_bytes / arena_bytes", "shmcache", 100 * float(np.median(retained)),
                "%", better="higher", min=100 * min(retained), entries=after.entries),
            row("W4", "arena in use: arena_used_bytes / arena_bytes", "shmcache", 100 * float(np.median(used)), "%",
                better="higher"),
            row("W4", "failed puts (must be 0), warm-up included", "shmcache", len(failures), "puts")]


def _w4_cachetools(capacity: int, sizes: list, warmup: int, blob: bytes) -> list[dict]:
    import cachetools

    cache = cachetools.LRUCache(maxsize=capacity, getsizeof=len)
    _timed_puts(cache.__setitem__, sizes, 0, warmup, blob, None)
    ns, _, _ = _timed_puts(cache.__setitem__, sizes, warmup, len(sizes), blob, None)
    return [latency_row("W4", _W4_CASE, "cachetools", ns, note="bounded by bytes: getsizeof=len")]


def _timed_puts(put, sizes: list, start: int, stop: int, blob: bytes, stats):
    """Put a new key ``i`` of ``sizes[i]`` bytes for each ``i`` in ``range(start, stop)``, timing each put, and
    sample ``stats()`` now and then: (durations, failures, samples)."""
    clock = time.perf_counter_ns
    ns, failures, samples = [], [], []
    with gc_paused():
        for i in range(start, stop):
            key, value = make_key("w4:", i), blob[: sizes[i]]
            t0 = clock()
            try:
                put(key, value)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
            ns.append(clock() - t0)
            if stats is not None and i % W4_SAMPLE_EVERY == 0:
                samples.append(stats())
    return np.asarray(ns, dtype=np.int64), failures, samples
