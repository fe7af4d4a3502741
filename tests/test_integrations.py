"""The pools shmcache serves, run for real: gunicorn workers behind HTTP, a multiprocessing.Pool."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from shmcache import SharedCache

from .gunicorn import EXAMPLES, serving


def _get(url: str, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _expected_digest(text: str, rounds: int) -> str:
    d = text.encode()
    for _ in range(rounds):
        d = hashlib.sha256(d).digest()
    return d.hex()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("preload", [False, True], ids=["attach-per-worker", "preload"])
def test_gunicorn_workers_compute_each_key_once(name, preload):
    pytest.importorskip("gunicorn", reason="gunicorn is in the test extra")
    cache = SharedCache(name, capacity_bytes=16 * 2**20, max_entries=10_000, create=True)
    # --max-requests 5: each worker exits after five requests and gunicorn forks a fresh one, so the 40 requests
    # are served by at least eight worker processes, most of which find values computed by workers long gone.
    try:
        with serving("gunicorn_app:app", name, "/metrics", max_requests=5, preload=preload) as url:
            texts = [f"k{i % 5}" for i in range(40)]  # five keys, each asked for eight times, concurrently
            with ThreadPoolExecutor(8) as pool:
                replies = [json.loads(b) for b in pool.map(lambda t: _get(f"{url}/transform/{t}"), texts)]
            for text, reply in zip(texts, replies):
                assert reply["text"] == text and reply["digest"] == _expected_digest(text, reply["rounds"])
            computed_by = {r["text"]: r["computed_by"] for r in replies}
            assert all(r["computed_by"] == computed_by[r["text"]] for r in replies)  # one computation per key
            assert len({r["served_by"] for r in replies}) >= 8  # spread over workers, recycled ones included
            s = cache.stats()
            assert s.computations == 5 and s.misses == 5 and s.hits == 35  # global, whichever worker answered
            metrics = _get(f"{url}/metrics").decode()
            assert f'shmcache_computations_total{{cache="{name}"}} 5' in metrics
    finally:
        cache.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pool_example_runs_and_computes_each_item_once(name, method):
    proc = subprocess.run([sys.executable, str(EXAMPLES / "pool.py"), "--name", name, "--start-method", method,
                           "--json"], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["results_ok"] and report["items"] == 64 and report["distinct"] == 16
    assert report["computations"] == 16  # each distinct item once, across all pool workers


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_torch_dataloader_second_epoch_is_served_from_the_cache(name, method):
    pytest.importorskip("torch", reason="torch is optional (pip install torch); CI installs the CPU build")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "dataloader.py"), "--name", name, "--samples", "48",
                           "--workers", "2", "--epochs", "2", "--start-method", method, "--json"],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["values_ok"]  # every sample of every batch equals its decode, and each epoch saw each index once
    first, second = report["epochs"]
    assert first["computations"] == 48 and first["hits"] == 0  # each sample decoded once, by one of the workers
    assert second["computations"] == 48 and second["hits"] == 48  # the second epoch decoded nothing
