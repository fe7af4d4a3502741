"""A DataLoader's first and second epoch over JPEGs, without a cache, with a per-worker ``functools.lru_cache`` and
with ``shmcache.contrib.torch.CachedDataset``: wall time of each epoch and the peak memory of the whole program.

    python -m benchmarks.apps.dataloader_epochs --images 1000 --workers 4

The JPEGs (``--images``, 500x375, made once at the start) go in a temporary directory that is removed at the end.
The dataset decodes one (Pillow), resizes its shorter side to 256, crops the centre 224x224 and normalizes it to a
float32 tensor (3x224x224, 588 KiB), returned with its index as the label. These transforms are deterministic, as a
cached sample must be: random augmentation belongs after the cache. Every loader shuffles, has ``--workers``
persistent workers (so a worker's lru_cache lives into the second epoch) and batches of ``--batch``.

Each (variant, run) is a process of its own, in its own session (killed with its workers if it overstays), so one
variant's memory never counts in another's. Memory is the sum of the PSS (private pages plus a share of the shared
ones, /proc/<pid>/smaps_rollup) of the loader's process and its workers, sampled every 50 ms during both epochs: the
cache's segment counts once, split among the processes that map each page. The segment's own size is reported
beside it. Every variant's samples are checked to be the same (a fingerprint of every sample's sum, by index).

A dataset larger than the cache (``--larger-than-cache``):

    python -m benchmarks.apps.dataloader_epochs --larger-than-cache --samples 2000 --workers 2 --runs 3

``--samples`` synthetic samples of ``--sample-kib`` KiB (float32 values drawn from a generator seeded by the index),
each costing ``--decode-us`` microseconds to make (a busy loop standing for a decode: the same cost every time, on
any machine, so the cache's effect stands above the loader's overhead), read for ``--epochs`` (at least 3) shuffled
epochs by ``--workers`` persistent workers. Rows: no cache; ``CachedDataset`` over a ``SharedCache`` holding half
the samples (``max_entries``, with ``capacity_bytes`` enough for that many, so only the entry limit evicts) with the
default policy (exact LRU), then with each other policy of OTHER_POLICIES the cache accepts; the cache holding
every sample; and every sample made beforehand and held in memory in each worker (the dataset returns them: the
floor a cache can approach). Each row reports the hit ratio of each epoch after the first (the cache's stats, hits
over lookups, between epochs) and the wall time of each epoch. A sample is ``(values, index, crc32 of the values)``:
every batch's values are checked against their checksum and the checksum against the one expected of the index,
and every epoch must see every index once; anything else fails the run (a non-zero exit).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib

import numpy as np

from benchmarks.measure import pss_total
from shmcache import SharedCache

VARIANTS = ("none", "lru_cache", "shmcache")
IMAGE_SIZE = (500, 375)  # width, height: about ImageNet's average
RESIZE, CROP = 256, 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SAMPLE_NBYTES = 3 * CROP * CROP * 4
SAMPLE_INTERVAL_S = 0.05
RUN_TIMEOUT_S = 1800

# The larger-than-cache configuration's rows: "none", "precomputed", and "shm:<policy>:<percent of the samples>".
# Eviction policies for the rows at 50 %, besides the default (exact LRU): a row is run for each that SharedCache
# accepts (tried on a small segment: shmcache.POLICIES has keep and s3fifo); add names here.
OTHER_POLICIES: tuple[str, ...] = ("keep", "s3fifo", "sieve", "clock", "2q")
DEFAULT_POLICY = "default"  # no policy= argument: the cache's own (exact LRU)


# ---------------------------------------------------------------------------------------------------- the dataset


class JpegDataset:
    """Decode, resize, crop and normalize one JPEG to a float32 tensor; the label is the index."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        with Image.open(self.paths[i]) as img:
            img = img.convert("RGB")
            w, h = img.size
            scale = RESIZE / min(w, h)
            img = img.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
            w, h = img.size
            left, top = (w - CROP) // 2, (h - CROP) // 2
            img = img.crop((left, top, left + CROP, top + CROP))
            arr = np.asarray(img, dtype=np.float32) / 255.0
        arr = (arr - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), i


class LruDataset:
    """``dataset`` behind a ``functools.lru_cache`` of its own in each process (each DataLoader worker)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset
        self._cached = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        if self._cached is None:
            self._cached = functools.lru_cache(maxsize=None)(self.dataset.__getitem__)
        return self._cached(i)

    def __getstate__(self):
        return {"dataset": self.dataset, "_cached": None}


def make_images(directory: str, n: int, seed: int = 0) -> list[str]:
    """``n`` JPEGs of smooth shapes plus noise (so they compress and decode like photographs, not like flat colour)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = IMAGE_SIZE
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    paths = []
    for i in range(n):
        img = np.zeros((h, w, 3), np.float32)
        for c in range(3):
            fx, fy, phase = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.3)]
            img[..., c] = 128 + 90 * np.sin(xx * fx + phase) * np.cos(yy * fy)
        img += rng.normal(0, 12, img.shape).astype(np.float32)
        path = os.path.join(directory, f"{i:06d}.jpg")
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------------- one run (child)


def family() -> list[int]:
    """This process and its children (the DataLoader's workers)."""
    pids = [os.getpid()]
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    return pids


class PeakMemory:
    """The highest ``pss_total(family())`` seen, sampled from a thread every SAMPLE_INTERVAL_S."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.peak = max(self.peak, pss_total(family()))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def run_child(args) -> dict:
    import torch
    import xxhash
    from torch.utils.data import DataLoader

    from shmcache.contrib.torch import CachedDataset

    torch.set_num_threads(1)
    paths = sorted(os.path.join(args.dir, p) for p in os.listdir(args.dir))
    dataset = JpegDataset(paths)
    cache = None
    if args.variant == "lru_cache":
        dataset = LruDataset(dataset)
    elif args.variant == "shmcache":
        capacity = len(paths) * (SAMPLE_NBYTES + 4096) + 16 * 2**20
        cache = SharedCache(args.name, capacity_bytes=capacity, max_entries=2 * len(paths) + 64, create=True)
        dataset = CachedDataset(dataset, cache, name="bench-jpeg")
    try:
        loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                            persistent_workers=args.workers > 0, timeout=600 if args.workers else 0,
                            multiprocessing_context=args.start_method if args.workers else None,
                            generator=torch.Generator().manual_seed(args.seed))
        sums = np.zeros(len(paths), np.float64)
        epochs = []
        with PeakMemory() as mem:
            for _ in range(args.epochs):
                seen = np.zeros(len(paths), np.int64)
                t0 = time.perf_counter()
                for images, labels in loader:
                    per_sample = images.double().sum(dim=(1, 2, 3)).numpy()
                    idx = labels.numpy()
                    sums[idx] = per_sample
                    seen[idx] += 1
                epochs.append(time.perf_counter() - t0)
                if not (seen == 1).all():
                    raise AssertionError("an epoch did not see every sample exactly once")
            del loader  # persistent workers exit here, still inside the sampling
        report = {"variant": args.variant, "epochs_s": epochs, "peak_pss_bytes": mem.peak,
                  "fingerprint": xxhash.xxh3_64_hexdigest(sums.tobytes())}
        if cache is not None:
            st = os.stat(f"/dev/shm/shmcache.{args.name}")
            s = cache.stats()
            report.update(segment_bytes=st.st_blocks * 512, computations=s.computations, hits=s.hits)
        return report
    finally:
        if cache is not None:
            cache.close()
            SharedCache.unlink_name(args.name)


# ------------------------------------------------------------------------------------------------ larger than the cache


class SyntheticDataset:
    """Sample ``i``: ``(values, i, crc32 of the values)``, values float32 from a generator seeded by ``i``, made in
    ``decode_us`` microseconds exactly (a busy loop after the work, so every sample costs the same on any machine)."""

    def __init__(self, n: int, sample_kib: int, decode_us: int) -> None:
        self.n, self.count, self.decode_ns = n, sample_kib * 1024 // 4, decode_us * 1000

    def __len__(self) -> int:
        return self.n

    def make(self, i: int):
        import torch

        values = np.random.default_rng(i).random(self.count, dtype=np.float32)
        return torch.from_numpy(values), i, zlib.crc32(values.tobytes())

    def __getitem__(self, i: int):
        deadline = time.perf_counter_ns() + self.decode_ns
        sample = self.make(i)
        while time.perf_counter_ns() < deadline:
            pass
        return sample


class PrecomputedDataset:
    """Every sample of ``dataset`` made beforehand and held in memory (in each worker: they inherit or unpickle it)."""

    def __init__(self, dataset: SyntheticDataset) -> None:
        self.samples = [dataset.make(i) for i in range(len(dataset))]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]


def parse_variant(variant: str) -> tuple[str, str | None, int]:
    """``"none"``, ``"precomputed"`` or ``"shm:<policy>:<percent>"`` -> (kind, policy, percent)."""
    if variant in ("none", "precomputed"):
        return variant, None, 0
    kind, policy, percent = variant.split(":")
    if kind != "shm" or not policy or not 0 < int(percent) <= 100:
        raise ValueError(f"not a larger-than-cache variant: {variant!r}")
    return kind, policy, int(percent)


def variant_label(variant: str) -> str:
    kind, policy, percent = parse_variant(variant)
    if kind == "none":
        return "no cache"
    if kind == "precomputed":
        return "precomputed in each worker"
    return f"SharedCache {'lru (default)' if policy == DEFAULT_POLICY else policy}, {percent} %"


def available_policies() -> tuple[list[str], list[str]]:
    """The names of OTHER_POLICIES that SharedCache accepts, and those it does not. Each is tried on a small segment
    of its own, unlinked at once."""
    accepted, refused = [], []
    for policy in OTHER_POLICIES:
        name = f"bench-dataloader-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            SharedCache(name, capacity_bytes=1 << 16, max_entries=8, create=True, policy=policy).close()
        except (TypeError, ValueError):
            refused.append(policy)
        else:
            accepted.append(policy)
        finally:
            try:
                SharedCache.unlink_name(name)
            except FileNotFoundError:
                pass
    return accepted, refused


def check_batch(values, indices, checksums, expected: np.ndarray, seen: np.ndarray) -> None:
    """Every sample of the batch is the one of its index, whole: raise AssertionError otherwise."""
    idx = indices.numpy()
    sums = checksums.numpy()
    arr = values.numpy()
    for row in range(len(idx)):
        i = int(idx[row])
        got = zlib.crc32(np.ascontiguousarray(arr[row]).tobytes())
        if got != sums[row] or sums[row] != expected[i]:
            raise AssertionError(f"sample {i}: checksum of the values {got:#x}, carried {int(sums[row]):#x}, "
                                 f"expected {int(expected[i]):#x}")
    seen[idx] += 1


def run_child_larger(args) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from shmcache.contrib.torch import CachedDataset

    torch.set_num_threads(1)
    kind, policy, percent = parse_variant(args.variant)
    base = SyntheticDataset(args.samples, args.sample_kib, args.decode_us)
    expected = np.array([base.make(i)[2] for i in range(args.samples)], np.int64)
    cache = None
    dataset = base
    if kind == "precomputed":
        dataset = PrecomputedDataset(base)
    elif kind == "shm":
        entries = max(1, args.samples * percent // 100)
        extra = {} if policy == DEFAULT_POLICY else {"policy": policy}
        cache = SharedCache(args.name, capacity_bytes=entries * (args.sample_kib * 1024 + 4096) + 16 * 2**20,
                            max_entries=entries, create=True, **extra)
        dataset = CachedDataset(base, cache, name="bench-synthetic")
    try:
        loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                            persistent_workers=args.workers > 0, timeout=600 if args.workers else 0,
                            multiprocessing_context=args.start_method if args.workers else None,
                            generator=torch.Generator().manual_seed(args.seed))
        epochs, hit_ratios = [], []
        for _ in range(args.epochs):
            seen = np.zeros(args.samples, np.int64)
            before = cache.stats() if cache is not None else None
            t0 = time.perf_counter()
            for values, indices, checksums in loader:
                check_batch(values, indices, checksums, expected, seen)
            epochs.append(time.perf_counter() - t0)
            if not (seen == 1).all():
                raise AssertionError("an epoch did not see every sample exactly once")
            if cache is not None:
                after = cache.stats()
                hits, misses = after.hits - before.hits, after.misses - before.misses
                if hits + misses != args.samples:
                    raise AssertionError(f"{hits + misses} lookups in an epoch of {args.samples} samples")
                hit_ratios.append(hits / args.samples)
        del loader  # the persistent workers exit here
        report = {"variant": args.variant, "epochs_s": epochs, "hit_ratios": hit_ratios}
        if cache is not None:
            s = cache.stats()
            report.update(max_entries=s.max_entries, entries=s.entries, evictions=s.evictions,
                          computations=s.computations)
        return report
    finally:
        if cache is not None:
            cache.close()
            SharedCache.unlink_name(args.name)


def larger_variants(percent: int) -> tuple[list[str], list[str], list[str]]:
    """The rows to run (in order), the other policies run and those SharedCache does not have."""
    accepted, refused = available_policies()
    rows = ["none", f"shm:{DEFAULT_POLICY}:{percent}"] + [f"shm:{p}:{percent}" for p in accepted]
    return rows + [f"shm:{DEFAULT_POLICY}:100", "precomputed"], accepted, refused


def main_larger(args) -> int:
    if args.epochs < 3:
        raise SystemExit("--larger-than-cache needs --epochs 3 or more")
    variants, accepted, refused = larger_variants(args.cache_percent)
    results = []
    for run in range(args.runs):
        for v in variants:  # interleaved, so a slow spell of the machine touches every row
            results.append(run_one(v, "", args))
            r = results[-1]
            hits = ", ".join(f"{h:.1%}" for h in r["hit_ratios"][1:]) or "-"
            print(f"run {run + 1} {variant_label(v):32s} epochs {', '.join(f'{s:.2f}' for s in r['epochs_s'])} s,"
                  f" hit ratio after epoch 1: {hits}", file=sys.stderr, flush=True)
    summary = {}
    for v in variants:
        rs = [r for r in results if r["variant"] == v]
        row = {"runs": len(rs), "epochs_s": [statistics.median(r["epochs_s"][e] for r in rs)
                                             for e in range(args.epochs)]}
        if rs[0]["hit_ratios"]:
            row["hit_ratios"] = [statistics.median(r["hit_ratios"][e] for r in rs) for e in range(args.epochs)]
            row.update({k: rs[0][k] for k in ("max_entries", "entries", "evictions", "computations")})
        summary[v] = row
    if args.json:
        print(json.dumps({"samples": args.samples, "sample_kib": args.sample_kib, "decode_us": args.decode_us,
                          "workers": args.workers, "other_policies_run": accepted, "runs": results,
                          "summary": summary}))
        return 0
    print(f"{args.samples} samples of {args.sample_kib} KiB, {args.decode_us} us to make each, {args.workers} workers,"
          f" batch {args.batch}, shuffled, {args.epochs} epochs, median of {args.runs} run(s); the cache at"
          f" {args.cache_percent} % holds {args.samples * args.cache_percent // 100} samples")
    later = range(2, args.epochs + 1)
    print(f"{'row':32s} " + " ".join(f"{f'hits e{e}':>8s}" for e in later) + " "
          + " ".join(f"{f'epoch {e} s':>10s}" for e in range(1, args.epochs + 1)))
    for v, row in summary.items():
        hits = [f"{h:.1%}" for h in row["hit_ratios"][1:]] if "hit_ratios" in row else ["-"] * len(later)
        print(f"{variant_label(v):32s} " + " ".join(f"{h:>8s}" for h in hits) + " "
              + " ".join(f"{s:10.2f}" for s in row["epochs_s"]))
    print("eviction policies run: lru (the default)" + "".join(f", {p}" for p in accepted)
          + (f"; not in SharedCache: {', '.join(refused)}" if refused else ""))
    return 0


# ---------------------------------------------------------------------------------------------------- the driver


def run_one(variant: str, directory: str, args) -> dict:
    name = f"bench-dataloader-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "benchmarks.apps.dataloader_epochs", "--child", variant, "--dir", directory,
           "--name", name, "--workers", str(args.workers), "--batch", str(args.batch), "--epochs", str(args.epochs),
           "--start-method", args.start_method, "--seed", str(args.seed)]
    if args.larger_than_cache:
        cmd += ["--larger-than-cache", "--samples", str(args.samples), "--sample-kib", str(args.sample_kib),
                "--decode-us", str(args.decode_us)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except BaseException:
        # Still running (a timeout, Ctrl-C): its session is ours, so this is the run and the workers it started.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        try:
            SharedCache.unlink_name(name)  # only if the run could not
        except FileNotFoundError:
            pass
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} run failed ({proc.returncode}): {err[-3000:]}")
    return json.loads(out)


def summarize(results: list[dict]) -> dict:
    by = {}
    for v in VARIANTS:
        rs = [r for r in results if r["variant"] == v]
        if not rs:
            continue
        row = {"runs": len(rs)}
        for e in range(len(rs[0]["epochs_s"])):
            row[f"epoch{e + 1}_s"] = statistics.median(r["epochs_s"][e] for r in rs)
        row["peak_pss_mb"] = statistics.median(r["peak_pss_bytes"] for r in rs) / 2**20
        if "segment_bytes" in rs[0]:
            row["segment_mb"] = statistics.median(r["segment_bytes"] for r in rs) / 2**20
            row["computations"] = rs[0]["computations"]
        by[v] = row
    return by


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="runs of each variant; medians are reported")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print every run and the summary as JSON")
    ap.add_argument("--larger-than-cache", action="store_true",
                    help="the synthetic dataset, with a cache of --cache-percent of it (see the module's docstring)")
    ap.add_argument("--samples", type=int, default=2000, help="--larger-than-cache: the dataset's samples")
    ap.add_argument("--sample-kib", type=int, default=64, help="--larger-than-cache: each sample's size")
    ap.add_argument("--decode-us", type=int, default=2000, help="--larger-than-cache: each sample's cost")
    ap.add_argument("--cache-percent", type=int, default=50,
                    help="--larger-than-cache: the cache's max_entries, in percent of the samples")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.larger_than_cache and args.epochs == ap.get_default("epochs"):
        args.epochs = 3
    if args.child:
        args.variant = args.child
        if args.larger_than_cache:
            print(json.dumps(run_child_larger(args)))
        elif args.child in VARIANTS:
            print(json.dumps(run_child(args)))
        else:
            ap.error(f"no variant {args.child!r}")
        return 0
    if args.larger_than_cache:
        return main_larger(args)
    variants = [v for v in args.variants.split(",") if v]
    directory = tempfile.mkdtemp(prefix="shmcache-dataloader-bench-")
    try:
        t0 = time.perf_counter()
        make_images(directory, args.images, args.seed)
        made_s = time.perf_counter() - t0
        results = []
        for run in range(args.runs):
            for v in variants:  # interleaved, so a slow spell of the machine touches every variant
                results.append(run_one(v, directory, args))
                r = results[-1]
                print(f"run {run + 1} {v:10s} epochs {', '.join(f'{s:.2f}' for s in r['epochs_s'])} s, "
                      f"peak PSS {r['peak_pss_bytes'] / 2**20:.0f} MB", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if len({r["fingerprint"] for r in results}) != 1:
        raise SystemExit("the variants' samples differ: " + ", ".join(f"{r['variant']}={r['fingerprint']}"
                                                                      for r in results))
    summary = summarize(results)
    if args.json:
        print(json.dumps({"images": args.images, "workers": args.workers, "made_images_s": made_s,
                          "runs": results, "summary": summary}))
        return 0
    data_mb = args.images * SAMPLE_NBYTES / 2**20
    print(f"{args.images} JPEGs ({IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}) -> {args.images} float32 samples of 3x{CROP}x{CROP}"
          f" ({data_mb:.0f} MB decoded), {args.workers} workers, batch {args.batch}, median of {args.runs} run(s)")
    print(f"{'variant':10s} {'epoch 1 s':>10s} {'epoch 2 s':>10s} {'peak PSS MB':>12s}  note")
    for v, row in summary.items():
        note = f"segment {row['segment_mb']:.0f} MB, {row['computations']} computations" if "segment_mb" in row else ""
        print(f"{v:10s} {row.get('epoch1_s', 0):10.2f} {row.get('epoch2_s', 0):10.2f} {row['peak_pss_mb']:12.0f}  "
              f"{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
