"""``CachedDataset``: a map-style torch Dataset whose samples are computed once per host and then read from a
``SharedCache`` by every DataLoader worker, every epoch and every trainer process of the node.

Each ``dataset[i]`` goes through ``cache.get_or_compute``, which is single-flight host-wide: the first process to ask
for a sample computes it while the others that ask meanwhile wait for its result. The dataset pickles with the cache
by name (``SharedCache.__reduce__``), so it works with DataLoader workers started by fork, spawn or forkserver. The
trainer processes of one node (DDP ranks) share samples by opening the same cache name, each with
``SharedCache(name, capacity_bytes=...)`` (``create=None``: the first creates it, the others attach), and wrapping the
same dataset under the same ``name``. What stays cached is bounded by the cache's limits: an evicted sample is
computed again when next asked for.

What is cached is ``dataset[i]``: the deterministic part of loading a sample (decode, resize). Random augmentation
goes in ``CachedDataset``'s own ``transform``, applied to the cached sample on every read and never stored; in the
wrapped dataset's transform it would be cached too, and every epoch would see the first epoch's crops and flips.

Samples are stored by shmcache's codec, never pickled: a tensor as a tensor value (CPU, dense, no grad; dtype, shape
and values exact, bfloat16 included), and a tuple, list or dict of tensors, arrays, numbers and strings -- an
``(image, label)`` pair -- as one msgpack value in which each tensor is an extension (codec.py, ext 4), so a sample is
one entry, read with one lookup and one checksum. A sample the codec cannot encode (a PIL image...) raises TypeError
the first time it is computed: convert it to a tensor in the dataset's transform.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any
from collections.abc import Callable

from torch.utils.data import Dataset, get_worker_info

from shmcache import CapacityWarning, SharedCache
from shmcache.contrib.fit import DatasetFit, sample_nbytes
from shmcache.oversize import Computation

__all__ = ["CachedDataset"]


class CachedDataset(Dataset):
    """``dataset`` with its samples cached in ``cache``, and ``transform`` applied after the cache:
    ``CachedDataset(dataset, cache, transform=t)[i]`` is ``t(dataset[i])``, where ``dataset[i]`` is computed at
    most once on the host while it stays cached, and ``len()`` is ``len(dataset)``.

    What is cached. ``dataset[i]``, and only that: the wrapped dataset, its own transforms included, must be
    deterministic (decode, resize, convert to a tensor), since its result is what every later read gets.
    ``transform`` (keyword only; None: none) is the random part (crops, flips, colour jitter): it is applied to the
    cached sample on every access, the one that computed it included, in the process that reads it (each DataLoader
    worker, with that worker's random state), and its result is never stored. It takes the sample as
    ``dataset[i]`` returns it (an ``(image, label)`` pair from an ``ImageFolder``) and returns what the loader should
    get. The sample is stored before ``transform`` runs, and each hit gets a private copy decoded from the cache, so
    an in-place transform cannot alter what is cached; on a miss it gets the object ``dataset[i]`` returned, as it
    would without the cache. It is pickled with the dataset for spawned workers, so it must be picklable (a
    module-level function or a torchvision transform, not a lambda).

    Keys. By default sample ``i`` is cached under ``(name, i)``: ``name`` defaults to the dataset's class,
    ``"module.QualName"``, so two datasets of different classes never share a key, and a dataset is found again
    under the same keys by the next run, the next process and the other ranks. Two datasets of the same class
    with different samples (a train and a validation ``ImageFolder``, or one with other deterministic transforms)
    must be given different names, or they would read each other's samples. ``transform`` is no part of the key:
    wrappers that differ only in it share the cached samples. An index that is an integer (a Python, numpy or torch
    int) keys as a Python int. ``key``, a function of the index, replaces the whole scheme (it must return a key
    the cache takes, and be picklable for spawned workers).

    ``ttl`` (seconds) is each stored sample's time to live (None: the cache's default); ``timeout`` bounds the wait
    for a sample another process is computing (None: no bound; then ``ComputeTimeout``).

    A cache smaller than the dataset. Each epoch reads every sample once in a new order, so under ``policy="lru"``
    the samples kept are the ones read last, which the next epoch reads at random places: with a cache of half the
    dataset about 15 % of the reads hit, and each miss's put evicts another sample. The default, ``"auto"``, keeps
    its main queue through the epochs (49.5 % of the reads hit, for half the dataset); ``policy="keep"`` stores
    samples until full and then keeps them, so every epoch after the first hits on the cached fraction exactly.
    Under ``"lru"`` or ``"s3fifo"`` a cache that cannot hold the dataset warns (``shmcache.CapacityWarning``, a
    ``UserWarning``) once, with the numbers and the remedy: by entries here, when the dataset has more samples than
    ``max_entries``; by bytes as samples are read, when the mean size of those seen so far, times the dataset's
    length, exceeds ``max_retained_bytes`` (judged in the main process or DataLoader worker 0; contrib/fit.py). A
    sample too large for the cache is returned uncached, computed again on every read, and said once
    (``shmcache.TooLargeWarning``).
    """

    def __init__(self, dataset: Any, cache: SharedCache, key: Callable[[Any], Any] | None = None,
                 ttl: float | None = None, timeout: float | None = None, *, name: str | None = None,
                 transform: Callable[[Any], Any] | None = None) -> None:
        if key is not None and name is not None:
            raise ValueError("pass key= (the whole key) or name= (the namespace of the default key), not both")
        if not isinstance(cache, SharedCache):
            raise TypeError(f"cache must be a SharedCache, not {type(cache).__name__}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, not {type(transform).__name__}")
        cls = type(dataset)
        self.dataset = dataset
        self.cache = cache
        self.key = key
        self.name = name if name is not None else f"{cls.__module__}.{cls.__qualname__}"
        self.ttl = ttl
        self.timeout = timeout
        self.transform = transform
        self._told_as = f"CachedDataset {self.name!r}"  # its family in a TooLargeWarning (shmcache/oversize.py)
        limits = cache.limits()
        self._fit = DatasetFit(self.name, len(dataset), max_entries=limits.max_entries,
                               max_retained_bytes=limits.max_retained_bytes, policy=cache.policy, cache=cache.name)
        said = self._fit.entries()
        if said:
            warnings.warn(said, CapacityWarning, stacklevel=2)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        sample = self.cache.get_or_compute(self.key_of(index), Computation(lambda: self.dataset[index], self._told_as),
                                           timeout=self.timeout, ttl=self.ttl)
        if not self._fit.done:
            self._judge(sample)
        return sample if self.transform is None else self.transform(sample)

    def _judge(self, sample: Any) -> None:
        """Count ``sample`` towards the judgement of the cache's bytes against the dataset (contrib/fit.py), and
        warn once if they cannot hold it. Made in the main process, or in DataLoader worker 0 only: every worker
        would see the same, and say it again."""
        worker = get_worker_info()
        if worker is not None and worker.id != 0:
            return
        said = self._fit.observe(sample_nbytes(sample))
        if said:
            warnings.warn(said, CapacityWarning, stacklevel=3)

    def key_of(self, index: Any) -> Any:
        """The cache key of sample ``index``."""
        if self.key is not None:
            return self.key(index)
        try:
            index = operator.index(index)  # numpy and torch integers key as the int they are
        except TypeError:
            pass
        return (self.name, index)

    def __repr__(self) -> str:
        extra = "" if self.transform is None else f", transform={self.transform!r}"
        return f"{type(self).__name__}({self.dataset!r}, {self.cache!r}, name={self.name!r}{extra})"
