"""``python -m benchmarks.snapshot``: how long a snapshot and a restore of a full cache take, and what a snapshot
costs the processes reading the cache meanwhile.

Three figures, on the path this process runs (``SHMCACHE_PURE_PYTHON=1`` for the Python path):

- ``snapshot``: ``SharedCache.snapshot`` of ``--entries`` entries of ``--value-bytes`` bytes each (bytes values,
  32-byte keys) to a file in ``--dir``, fsyncs included: median of ``--rounds``, in seconds and MiB/s.
- ``restore``: ``SharedCache.restore`` of that file into a new, empty cache of the same size: median of
  ``--rounds`` (each round's in ``restores_s``).
- ``readers``: ``--readers`` processes get random keys throughout, each get timed; their p50 and p99 in
  microseconds while a snapshot is written, and in a window as long just before it with no snapshot, side by side
  in every round (medians over rounds and readers). On a machine with fewer cores than readers + 1 the snapshot's
  CPU competes with the readers too, and the figures say so as much as they say what its lock holds cost.
  ``--readers 0`` leaves them out.

Nothing passes or fails here.

    python -m benchmarks.snapshot --entries 4096 --value-bytes 65536 --rounds 3
    SHMCACHE_PURE_PYTHON=1 python -m benchmarks.snapshot --entries 1024
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import tempfile
import time

import numpy as np

from shmcache import SharedCache, core
from .measure import reap

MIB = 1 << 20
IDLE, DURING, OFF, STOP = 0, 1, 2, 3  # what the readers are timing: the window before, a snapshot, nothing


def _name(tag: str) -> str:
    return f"bench-snapshot-{tag}-{os.getpid()}-{os.urandom(5).hex()}"


def _key(i: int) -> str:
    return f"key-{i:028d}"


def _read(name: str, entries: int, phase, rnd, q) -> None:
    """Get random keys until told to stop, timing each get by the (round, phase) it ran in; send p50/p99s."""
    rng = random.Random(os.getpid())
    samples: dict[tuple[int, int], list[int]] = {}
    clock = time.perf_counter_ns
    with SharedCache(name, create=False) as c:
        get = c.get
        while True:
            p, r = phase.value, rnd.value
            if p == STOP:
                break
            k = _key(rng.randrange(entries))
            t = clock()
            v = get(k)
            dt = clock() - t
            if v is None:
                raise AssertionError(f"{k} missing")
            if p != OFF:
                samples.setdefault((r, p), []).append(dt)
    out = {key: (float(np.percentile(v, 50)) / 1e3, float(np.percentile(v, 99)) / 1e3, len(v))
           for key, v in samples.items()}
    q.put(out)


def run(entries: int, value_bytes: int, rounds: int, readers: int, directory: str, policy: str) -> dict:
    capacity = entries * (value_bytes + 64) + MIB
    name, other = _name("src"), _name("dst")
    path = os.path.join(directory, f"{name}.snap")
    ctx = mp.get_context("fork")
    phase, rnd, q = ctx.Value("i", OFF), ctx.Value("i", 0), ctx.Queue()
    c = SharedCache(name, capacity_bytes=capacity, max_entries=entries, policy=policy)
    procs = []
    try:
        rng = np.random.default_rng(1)
        for start in range(0, entries, 256):
            c.put_many({_key(i): rng.bytes(value_bytes) for i in range(start, min(entries, start + 256))})
        procs = [ctx.Process(target=_read, args=(name, entries, phase, rnd, q)) for _ in range(readers)]
        for p in procs:
            p.start()
        time.sleep(0.5)  # the readers are reading
        snaps, restores = [], []
        for r in range(rounds):
            rnd.value = r
            window = snaps[-1] if snaps else 0.5
            phase.value = IDLE
            time.sleep(window)
            phase.value = DURING
            t = time.perf_counter()
            info = c.snapshot(path)
            snaps.append(time.perf_counter() - t)
            phase.value = OFF
            d = SharedCache(other, capacity_bytes=capacity, max_entries=entries, policy=policy)
            try:
                t = time.perf_counter()
                result = d.restore(path)
                restores.append(time.perf_counter() - t)
                assert result.restored == entries and result.complete, result
            finally:
                d.close()
                d.unlink()
        phase.value = STOP
        reports = [q.get(timeout=120) for _ in procs]
    finally:
        phase.value = STOP
        reap(procs, 30)
        c.close()
        c.unlink()
        if os.path.exists(path):
            os.unlink(path)

    def latency(which: int, i: int) -> float:
        return statistics.median(rep[(r, which)][i] for rep in reports for r in range(rounds) if (r, which) in rep)

    nbytes = info.nbytes
    snap, rest = statistics.median(snaps), statistics.median(restores)
    out = {
        "path": core.PATH, "policy": policy, "entries": entries, "value_bytes": value_bytes, "file_mib": nbytes / MIB,
        "snapshot_s": snap, "snapshot_mib_s": nbytes / MIB / snap,
        "restore_s": rest, "restore_mib_s": nbytes / MIB / rest,
        "restores_s": restores, "readers": readers,
    }
    if readers:  # (none: the snapshot and restore times alone)
        out["get_p50_us"] = {"without": latency(IDLE, 0), "during_snapshot": latency(DURING, 0)}
        out["get_p99_us"] = {"without": latency(IDLE, 1), "during_snapshot": latency(DURING, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=4096)
    ap.add_argument("--value-bytes", type=int, default=64 * 1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the snapshot file is written")
    a = ap.parse_args()
    print(json.dumps(run(a.entries, a.value_bytes, a.rounds, a.readers, a.dir, a.policy)))


if __name__ == "__main__":
    main()
