"""multiprocessing.Pool workers sharing one cache: each distinct item is transformed once, by whichever worker gets
to it first, and every other worker that needs it reads the result.

    python examples/pool.py                        # fork (the Linux default)
    python examples/pool.py --start-method spawn   # workers start fresh and re-attach by name
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os

import numpy as np

from shmcache import SharedCache

_cache = None  # each worker's handle, opened once by the pool initializer


def _init(name: str) -> None:
    global _cache
    _cache = SharedCache(name, create=False)


def expensive_transform(item: int) -> np.ndarray:
    """Stands in for decoding and augmenting a sample: a deterministic 64x64 float32 image of ``item``."""
    rng = np.random.default_rng(item)
    img = rng.random((64, 64), dtype=np.float32)
    for _ in range(20):
        img = np.sqrt(img * img + 0.5)
    return img


def task(item: int) -> float:
    img = _cache.get_or_compute(("sample", item), lambda: expensive_transform(item))
    return float(img.sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default=f"pool-example-{os.getpid()}")
    ap.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    items = [i % 16 for i in range(64)]
    with SharedCache(args.name, capacity_bytes=8 * 2**20, max_entries=1024, create=True) as cache:
        try:
            ctx = mp.get_context(args.start_method)
            with ctx.Pool(args.workers, initializer=_init, initargs=(args.name,)) as pool:
                sums = pool.map(task, items)
            expected = [float(expensive_transform(i).sum()) for i in items]
            s = cache.stats()
            report = {"items": len(items), "distinct": len(set(items)), "results_ok": sums == expected,
                      "computations": s.computations, "waits": s.waits, "hits": s.hits, "misses": s.misses}
        finally:
            cache.unlink()
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['items']} tasks over {report['distinct']} distinct items: {report['computations']} "
              f"computations, {report['hits']} hits ({report['waits']} after waiting for another worker); "
              f"results {'correct' if report['results_ok'] else 'WRONG'}")
    return 0 if report["results_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
