"""PyTorch DataLoader workers sharing decoded samples through one shmcache.

Each sample is decoded and transformed once on the whole host, by whichever DataLoader worker asks first; every
other worker, and every later epoch, reads it from the cache instead of decoding it again
(``shmcache.contrib.torch.CachedDataset`` wraps the plain dataset), and the cached tensors are held once in shared
memory rather than once per worker.

    pip install torch          # any CPU build will do
    python examples/dataloader.py --epochs 2 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from shmcache import SharedCache
from shmcache.contrib.torch import CachedDataset

SHAPE = (3, 32, 32)


def decode(index: int) -> torch.Tensor:
    """Stands in for reading and decoding an image, then augmenting it: deterministic in ``index``."""
    rng = np.random.default_rng(index)
    img = rng.integers(0, 256, SHAPE, dtype=np.uint8).astype(np.float32) / 255.0
    return torch.from_numpy((img - img.mean()) / (img.std() + 1e-6))


class Decoded(Dataset):
    """The dataset as it would be without a cache: every ``__getitem__`` decodes."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return decode(index), index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default=f"dataloader-example-{os.getpid()}")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    epochs = []
    with SharedCache(args.name, capacity_bytes=32 * 2**20, max_entries=4096, create=True) as cache:
        try:
            # The wrapped dataset goes through the cache: its handle pickles by name, so "fork" and "spawn"
            # workers alike share it, and each sample is decoded once on the host.
            dataset = CachedDataset(Decoded(args.samples), cache, name="decoded")
            loader = DataLoader(dataset, batch_size=8, shuffle=True,
                                num_workers=args.workers, multiprocessing_context=args.start_method)
            ok = True
            for _ in range(args.epochs):
                seen = []
                for batch, indices in loader:
                    for sample, index in zip(batch, indices.tolist()):
                        ok &= bool(torch.equal(sample, decode(index)))
                        seen.append(index)
                s = cache.stats()
                ok &= sorted(seen) == list(range(args.samples))
                epochs.append({"computations": s.computations, "hits": s.hits, "misses": s.misses})
        finally:
            cache.unlink()
    report = {"samples": args.samples, "workers": args.workers, "values_ok": ok, "epochs": epochs}
    if args.json:
        print(json.dumps(report))
    else:
        for i, e in enumerate(epochs, 1):
            print(f"after epoch {i}: {e['computations']} samples decoded in all, {e['hits']} reads served from the "
                  "cache")
        print("every sample matched its decode" if ok else "WRONG samples")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
