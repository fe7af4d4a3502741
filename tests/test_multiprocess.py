"""Several processes share one cache under every start method: every value read is one written for its key, and
the global stats add up across processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from shmcache import SharedCache
from tests.workers import workload_child, workload_on_handle

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
WORKERS, OPS, KEYS = 3, 4000, 60


def _run(ctx, target, args_for) -> list[dict]:
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(i), queue)) for i in range(WORKERS)]
    try:
        for p in procs:
            p.start()
        results = [queue.get(timeout=90) for _ in procs]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)


def _check_totals(cache: SharedCache, results: list[dict]) -> None:
    assert sum(r["wrong"] for r in results) == 0
    s = cache.stats()
    assert s.hits == sum(r["hits"] for r in results)
    assert s.misses == sum(r["misses"] for r in results)
    assert s.puts == sum(r["puts"] for r in results)
    assert s.deletes == sum(r["deletes"] for r in results)
    assert s.hits > 0 and s.evictions > 0  # the workload really shared entries and hit the limits
    assert s.entries == len(cache) <= s.max_entries and s.retained_bytes <= s.max_retained_bytes
    assert cache.verify().ok


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocess_attach_by_name(name, method):
    # Small limits so that eviction and arena compaction run all the time.
    with SharedCache(name, capacity_bytes=12_000, max_entries=40, create=True) as cache:
        results = _run(mp.get_context(method), workload_child, lambda i: (name, i, OPS, KEYS, 7))
        _check_totals(cache, results)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocess_handle_passed_to_children(name, method):
    """A handle opened before fork works in the children; under spawn and forkserver it is pickled by name."""
    with SharedCache(name, capacity_bytes=12_000, max_entries=40, create=True) as cache:
        results = _run(mp.get_context(method), workload_on_handle, lambda i: (cache, i, OPS, KEYS, 11))
        _check_totals(cache, results)


def test_multiprocess_parent_and_forked_children_exclude_each_other(name):
    """The parent keeps working while its forked children do: the lock still excludes them after fork."""
    ctx = mp.get_context("fork")
    with SharedCache(name, capacity_bytes=12_000, max_entries=40, create=True) as cache:
        queue = ctx.Queue()
        procs = [ctx.Process(target=workload_on_handle, args=(cache, i, OPS, KEYS, 13, queue)) for i in range(2)]
        try:
            for p in procs:
                p.start()
            from tests.workers import mixed_workload

            mine = mixed_workload(cache, 9, OPS, KEYS, 13)
            results = [queue.get(timeout=90) for _ in procs] + [mine]
            for p in procs:
                p.join(timeout=30)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
        _check_totals(cache, results)
