"""Timing and memory measurement shared by the workloads, the test data they store, and the result rows they return.

Every operation is timed on its own with ``time.perf_counter_ns``, with the garbage collector off for the timed loop
(a collection would land on whichever operation happened to trigger it); figures are medians and p99s in
microseconds. A result row is a plain dict, so the table, the JSON file and the plot all read the same thing.
"""

from __future__ import annotations

import gc
import resource
import time
from contextlib import contextmanager

import numpy as np

KEY_NBYTES = 32  # every key is a str of this many ASCII characters
SMALL = "small dict"
BYTES_64K = "64 KiB bytes"
ARRAY = "224x224x3 uint8"
ARRAY_SHAPE = (224, 224, 3)
BYTES_NBYTES = 64 * 1024
NS_PER_US = 1000.0
MB = 1e6


def reap(procs, timeout: float = 30.0) -> None:
    """Join the worker processes, all within ``timeout`` s, killing (and joining) any still running then: no worker
    outlives its benchmark, whatever raised."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(timeout)


def make_key(prefix: str, i: int) -> str:
    """Key ``i`` of a family: ``prefix`` then ``i`` zero-padded to KEY_NBYTES characters in all."""
    return f"{prefix}{i:0{KEY_NBYTES - len(prefix)}d}"


def small_value() -> dict:
    """A record-like dict of about 100 bytes once encoded (msgpack: 102, pickle: about 150)."""
    return {"user_id": 123456, "name": "Ada Lovelace", "email": "ada@ex.org", "langs": ["en", "fr"],
            "score": 0.875, "active": True, "tags": ["admin", "beta"]}


def bytes_value(seed: int, nbytes: int = BYTES_NBYTES) -> bytes:
    return np.random.default_rng(seed).bytes(nbytes)


def array_value(seed: int, i: int = 0) -> np.ndarray:
    """An image-like 224x224x3 uint8 array (150,528 bytes) that depends on ``seed`` and ``i`` alone."""
    return np.random.default_rng([seed, i]).integers(0, 256, ARRAY_SHAPE, dtype=np.uint8)


VALUE_MAKERS = {SMALL: lambda seed: small_value(), BYTES_64K: bytes_value, ARRAY: array_value}


def same_value(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@contextmanager
def gc_paused():
    """Collect now, then keep the garbage collector off inside the block."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def time_each(op, args, *extra) -> np.ndarray:
    """Call ``op(a, *extra)`` for each ``a`` in ``args``, timing every call alone; the durations in ns."""
    clock = time.perf_counter_ns
    out = []
    append = out.append
    with gc_paused():
        for a in args:
            t0 = clock()
            op(a, *extra)
            append(clock() - t0)
    return np.asarray(out, dtype=np.int64)


def minor_faults() -> int:
    """Minor page faults of this process so far (first touches of pages already in memory)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def median_p99(ns) -> tuple[float, float]:
    """Median and 99th percentile of durations ``ns``, in microseconds."""
    a = np.asarray(ns, dtype=np.float64) / NS_PER_US
    return float(np.median(a)), float(np.percentile(a, 99))


def pss_bytes(pid: int) -> int:
    """Proportional set size of process ``pid``: its private pages plus its share of every page it shares."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss line in /proc/{pid}/smaps_rollup")


def pss_total(pids) -> int:
    """The summed PSS of processes ``pids``; one that has exited meanwhile counts 0."""
    total = 0
    for pid in pids:
        try:
            total += pss_bytes(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def row(workload: str, case: str, peer: str, value, unit: str, *, p99=None, better: str = "lower",
        note: str = "", **extra) -> dict:
    """One result: ``value`` (a median, a rate or a size) in ``unit``; ``better`` says which way is good.

    run.py adds ``ratio``: this row's value over shmcache's for the same workload and case (peer/shmcache).
    """
    return {"workload": workload, "case": case, "peer": peer, "value": value, "p99": p99, "unit": unit,
            "better": better, "note": note, **extra}


def latency_row(workload: str, case: str, peer: str, ns, **extra) -> dict:
    median, p99 = median_p99(ns)
    return row(workload, case, peer, median, "us", p99=p99, ops=len(ns), **extra)


def error_row(workload: str, peer: str, exc: BaseException) -> dict:
    return row(workload, "(error)", peer, None, "", note=f"{type(exc).__name__}: {exc}")
