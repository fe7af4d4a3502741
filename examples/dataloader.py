"""PyTorch DataLoader workers sharing decoded samples through one shmcache.

Each sample is decoded once on the whole host, by whichever DataLoader worker asks first; every other worker, and
every later epoch, reads it from the cache instead of decoding it again (``shmcache.contrib.torch.CachedDataset``
wraps the plain dataset), and the cached tensors are held once in shared memory rather than once per worker. Only
the deterministic part (decode, resize, normalize) is cached: the random augmentation (a crop and a flip) is
CachedDataset's ``transform``, applied in the worker to every sample read, so each epoch sees new augmentations.

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

SHAPE = (3, 36, 36)  # as decoded and resized: what is cached
CROP = 32  # what the model gets, a random crop of it


def decode(index: int) -> torch.Tensor:
    """Stands in for reading, decoding, resizing and normalizing an image: deterministic in ``index``, so it can be
    cached."""
    rng = np.random.default_rng(index)
    img = rng.integers(0, 256, SHAPE, dtype=np.uint8).astype(np.float32) / 255.0
    return torch.from_numpy((img - img.mean()) / (img.std() + 1e-6))


def augment(sample):
    """The random part, applied after the cache to every sample read: a random CROP x CROP crop, flipped left to
    right half the time, drawn from the worker's torch random state. A module-level function, so spawned workers
    can unpickle it."""
    image, index = sample
    top, left = torch.randint(SHAPE[1] - CROP + 1, (2,)).tolist()
    image = image[:, top:top + CROP, left:left + CROP]
    if torch.rand(()) < 0.5:
        image = image.flip(-1)
    return image.contiguous(), index


def augmentation_of(sample: torch.Tensor, index: int) -> tuple[int, int, bool] | None:
    """The (top, left, flipped) crop of ``decode(index)`` that ``sample`` is; None if it is none of them."""
    full = decode(index)
    for top in range(SHAPE[1] - CROP + 1):
        for left in range(SHAPE[2] - CROP + 1):
            crop = full[:, top:top + CROP, left:left + CROP]
            for flipped in (False, True):
                if torch.equal(sample, crop.flip(-1) if flipped else crop):
                    return top, left, flipped
    return None


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
            # workers alike share it, and each sample is decoded once on the host. ``augment`` runs after the
            # cache, on every read; persistent workers keep their handles (and, with spawn, their imports) from one
            # epoch to the next instead of starting again.
            dataset = CachedDataset(Decoded(args.samples), cache, name="decoded", transform=augment)
            loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=args.workers,
                                multiprocessing_context=args.start_method if args.workers else None,
                                persistent_workers=args.workers > 0)
            ok = True
            before: dict[int, tuple[int, int, bool] | None] = {}
            for _ in range(args.epochs):
                seen = {}
                for batch, indices in loader:
                    for sample, index in zip(batch, indices.tolist()):
                        seen[index] = augmentation_of(sample, index)
                        ok &= seen[index] is not None  # a crop (and flip) of its decode, whichever
                s = cache.stats()
                ok &= sorted(seen) == list(range(args.samples))
                changed = sum(seen[i] != before.get(i) for i in seen) if before else None
                epochs.append({"computations": s.computations, "hits": s.hits, "misses": s.misses,
                               "augmentations_changed": changed})
                before = seen
            del loader  # persistent workers exit with it, before the cache is unlinked
        finally:
            cache.unlink()
    report = {"samples": args.samples, "workers": args.workers, "values_ok": ok, "epochs": epochs}
    if args.json:
        print(json.dumps(report))
    else:
        for i, e in enumerate(epochs, 1):
            new = "" if e["augmentations_changed"] is None else (f", {e['augmentations_changed']} samples "
                                                                  "augmented otherwise than the epoch before")
            print(f"after epoch {i}: {e['computations']} samples decoded in all, {e['hits']} reads served from the "
                  f"cache{new}")
        print("every sample was a crop of its decode" if ok else "WRONG samples")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
