"""Whether a cache can hold a dataset: what ``CachedDataset`` warns about, judged without torch.

A dataset larger than the cache hits far less than its cached fraction under a policy that evicts by recency (lru,
s3fifo): each shuffled epoch reads every sample once, so what is kept is what was read last, and the next epoch wants
it at random places. ``DatasetFit`` says so once, by either limit: by entries at once (the dataset's length is
known), by bytes from the samples seen so far, their mean size extrapolated to the whole dataset. Under
``policy="keep"`` an undersized cache is what the policy is for, and under ``"auto"`` (the default) its filter keeps
main as it is through the epochs (nearly the cached fraction hits): nothing is said.

Sizes are ``sample_nbytes``'s: the payload of tensors, arrays, bytes and strings, a lower bound of what the cache
counts (which adds the key and the encoding's headers), so the figure it gives is never an overstatement.
"""

from __future__ import annotations

from typing import Any

MIN_SEEN = 8  # samples seen before their mean is extrapolated (fewer only when the dataset has fewer)
MAX_SEEN = 1024  # samples after which the mean is settled: the judgement ends, and with it its cost per read
_DEPTH = 8  # containers nested deeper are not looked into
QUIET_POLICIES = ("keep", "auto")  # the policies under which shuffled epochs hit about the cached fraction


def sample_nbytes(sample: Any, depth: int = 0) -> int:
    """A lower bound of the bytes ``sample`` takes encoded: the ``nbytes`` of tensors and arrays, the length of
    bytes and strings, one byte a scalar, the sum over tuples, lists and dicts; 0 for what it cannot see into."""
    nbytes = getattr(sample, "nbytes", None)  # numpy arrays, torch tensors, memoryviews
    if type(nbytes) is int:
        return nbytes
    if isinstance(sample, (bytes, bytearray, str)):
        return len(sample)
    if sample is None or isinstance(sample, (bool, int, float, complex)):
        return 1
    if depth >= _DEPTH:
        return 0
    if isinstance(sample, (tuple, list)):
        return 1 + sum(sample_nbytes(x, depth + 1) for x in sample)
    if isinstance(sample, dict):
        return 1 + sum(sample_nbytes(k, depth + 1) + sample_nbytes(v, depth + 1) for k, v in sample.items())
    return 0


class DatasetFit:
    """Whether a cache with limits ``max_entries`` and ``max_retained_bytes`` and eviction ``policy`` can hold a
    dataset called ``name`` of ``samples`` samples, in cache ``cache``. ``entries()`` judges by entries at once,
    ``observe(nbytes)`` by bytes as samples are seen; each returns the warning's text the first time the dataset
    cannot fit, and None otherwise. ``done``: nothing more is to be said (it was said, the policy keeps, or
    ``MAX_SEEN`` samples showed that it fits)."""

    def __init__(self, name: str, samples: int, *, max_entries: int, max_retained_bytes: int, policy: str,
                 cache: str = "") -> None:
        self.name, self.samples, self.cache, self.policy = name, samples, cache, policy
        self.max_entries, self.max_retained_bytes = max_entries, max_retained_bytes
        self.done = policy in QUIET_POLICIES or samples <= 0
        self.seen = 0
        self.total_nbytes = 0

    def entries(self) -> str | None:
        """The warning if the dataset has more samples than the cache has entries."""
        if self.done or self.samples <= self.max_entries:
            return None
        self.done = True
        return (f"CachedDataset {self.name!r}: the cache{self._named()} holds at most {self.max_entries:,} entries, "
                f"fewer than the dataset's {self.samples:,} samples (max_entries is {self.max_entries:,}); "
                f"{self._remedy(f'max_entries of at least {self.samples:,}')}")

    def observe(self, nbytes: int) -> str | None:
        """Count a sample of ``nbytes`` seen; the warning if the samples seen, extrapolated, exceed the byte limit."""
        if self.done:
            return None
        self.seen += 1
        self.total_nbytes += nbytes
        if self.total_nbytes <= self.max_retained_bytes and self.seen < min(MIN_SEEN, self.samples):
            return None  # too few to extrapolate from, and those seen fit
        need = self.total_nbytes * self.samples // self.seen
        if need <= self.max_retained_bytes:
            if self.seen >= MAX_SEEN:
                self.done = True
            return None
        self.done = True
        return (f"CachedDataset {self.name!r}: its {self.samples:,} samples need at least {need:,} bytes "
                f"({self.total_nbytes // self.seen:,} per sample, the mean of the {self.seen:,} seen so far), more "
                f"than the {self.max_retained_bytes:,} the cache{self._named()} holds (max_retained_bytes); "
                f"{self._remedy(f'capacity_bytes of at least {need:,}')}")

    def _named(self) -> str:
        return f" {self.cache!r}" if self.cache else ""

    def _remedy(self, bigger: str) -> str:
        return (f"under policy={self.policy!r} shuffled epochs hit far less than the cached fraction: create the cache "
                f"with policy='keep' (every epoch after the first then hits on the cached fraction), or one with "
                f"{bigger} (docs/frameworks.md)")
