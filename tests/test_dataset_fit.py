"""``shmcache.contrib.fit``: whether a cache can hold a dataset, by entries and by bytes extrapolated from the
samples seen (what ``CachedDataset`` warns about), without torch."""

from __future__ import annotations

import numpy as np
import pytest

from shmcache import SharedCache
from shmcache.contrib.fit import MAX_SEEN, MIN_SEEN, DatasetFit, sample_nbytes

IMAGE = np.zeros((3, 32, 32), dtype=np.float32)  # 12,288 bytes


def _fit(samples=1000, max_entries=65536, max_retained_bytes=2**30, policy="lru") -> DatasetFit:
    return DatasetFit("train", samples, max_entries=max_entries, max_retained_bytes=max_retained_bytes,
                      policy=policy, cache="samples")


def test_sample_nbytes_counts_the_payload():
    assert sample_nbytes(IMAGE) == 12_288
    assert sample_nbytes((IMAGE, 7)) == 1 + 12_288 + 1
    assert sample_nbytes({"image": IMAGE, "label": "cat"}) == 1 + 5 + 12_288 + 5 + 3
    assert sample_nbytes([b"abc", bytearray(4), memoryview(b"12345"), None, 1.5]) == 1 + 3 + 4 + 5 + 1 + 1
    assert sample_nbytes(object()) == 0  # what it cannot see into counts nothing: a lower bound
    nested: list = [IMAGE]
    for _ in range(20):
        nested = [nested]
    assert sample_nbytes(nested) < 12_288  # too deep to look into, not a recursion error


def test_dataset_fit_warns_by_bytes_for_a_cache_of_half_the_dataset():
    """The README's way of sizing a cache, by capacity_bytes, to half the dataset: max_entries is no help."""
    n = 1000
    fit = _fit(n, max_retained_bytes=n * 12_290 // 2)
    assert fit.entries() is None
    said = [fit.observe(sample_nbytes((IMAGE, i))) for i in range(MIN_SEEN)]
    assert said[:-1] == [None] * (MIN_SEEN - 1)  # too few seen to extrapolate from, and those seen fit
    text = said[-1]
    assert text is not None
    assert text.startswith("CachedDataset 'train': its 1,000 samples need at least 12,290,000 bytes (12,290 per "
                           "sample, the mean of the 8 seen so far), more than the 6,145,000 the cache 'samples' "
                           "holds (max_retained_bytes)")
    assert "policy='keep'" in text and "capacity_bytes of at least 12,290,000" in text and "'lru'" in text
    assert fit.done
    assert all(fit.observe(12_290) is None for _ in range(100))  # once


def test_dataset_fit_warns_at_once_when_the_samples_seen_already_exceed():
    fit = _fit(1000, max_retained_bytes=20_000)
    assert fit.observe(12_288) is None
    assert "need at least" in (fit.observe(12_288) or "")


def test_dataset_fit_by_entries_at_once_then_no_more():
    fit = _fit(1000, max_entries=500, max_retained_bytes=1000)
    text = fit.entries()
    assert text is not None and "holds at most 500 entries, fewer than the dataset's 1,000 samples" in text
    assert "max_entries of at least 1,000" in text and "policy='keep'" in text
    assert fit.observe(10**9) is None  # said once, whichever limit


@pytest.mark.parametrize("policy", ["keep", "auto"])  # (auto: its filter keeps main through shuffled epochs)
def test_dataset_fit_says_nothing_under_keep_or_auto(policy):
    fit = _fit(1000, max_entries=10, max_retained_bytes=1000, policy=policy)
    assert fit.entries() is None
    assert all(fit.observe(10**6) is None for _ in range(MIN_SEEN * 2))


def test_dataset_fit_that_fits_is_settled_after_max_seen():
    fit = _fit(10_000, max_retained_bytes=10_000 * 12_288)
    assert all(fit.observe(12_288) is None for _ in range(MAX_SEEN))
    assert fit.done and fit.seen == MAX_SEEN


def test_dataset_fit_small_dataset_judged_on_all_its_samples():
    fit = _fit(3, max_retained_bytes=30_000)
    assert fit.observe(12_000) is None and fit.observe(12_000) is None
    assert fit.observe(12_000) is not None  # 36,000 > 30,000, with every sample seen


def test_dataset_fit_from_a_cache_sized_in_bytes(name):
    """The limits as a cache gives them (CachedDataset reads them with limits() and policy)."""
    with SharedCache(name, capacity_bytes=8 * 2**20, max_entries=4096, create=True, policy="lru") as c:
        lim = c.limits()
        fit = DatasetFit("train", 1024, max_entries=lim.max_entries, max_retained_bytes=lim.max_retained_bytes,
                         policy=c.policy, cache=c.name)
        assert fit.entries() is None
        said = [fit.observe(sample_nbytes((IMAGE, i))) for i in range(MIN_SEEN)]
        assert said[-1] is not None and f"the cache {name!r} holds" in said[-1]
