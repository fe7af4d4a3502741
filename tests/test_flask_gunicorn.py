"""The Flask backend under real gunicorn workers (examples/flask_app.py): a value stored through one worker is read
through others, and a memoized result and a cached view are computed once for all the workers, those gunicorn
recycles (``--max-requests``) included."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from .test_integrations import EXAMPLES, START_S, _free_port

pytest.importorskip("flask_caching", reason="Flask-Caching is in the test extra")
pytest.importorskip("gunicorn", reason="gunicorn is in the test extra")
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]
MAX_REQUESTS = 5  # each worker exits after this many requests and gunicorn forks a fresh one


def _digest(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def _json(url: str) -> dict:
    return json.loads(_get(url))


@pytest.fixture
def site(name):
    """The example app under gunicorn, 3 workers recycled every MAX_REQUESTS requests; its base URL."""
    port = _free_port()
    # Why no --max-requests-jitter: a worker serves at most MAX_REQUESTS requests, so N requests need N / MAX_REQUESTS
    # workers at least: the count of distinct pids below follows from that, not from timing.
    cmd = [sys.executable, "-m", "gunicorn", "-w", "3", "-b", f"127.0.0.1:{port}", "--chdir", str(EXAMPLES),
           "--timeout", "60", "--graceful-timeout", "10", "--max-requests", str(MAX_REQUESTS), "flask_app:app"]
    server = subprocess.Popen(cmd, env={**os.environ, "SHMCACHE_NAME": name}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                _json(f"{url}/get/ping")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"gunicorn did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        server.stderr.close()


def test_flask_gunicorn_value_set_by_one_worker_is_read_by_others(site):
    keys = [f"k{i}" for i in range(6)]
    setters = {}
    for k in keys:
        reply = _json(f"{site}/set/{k}/v-{k}")
        assert reply["stored"] is True, reply
        setters[k] = reply["pid"]
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda k: (k, _json(f"{site}/get/{k}")), keys * 6))
    readers = {}
    for k, reply in replies:
        assert reply["found"] == {"key": k, "value": f"v-{k}", "sum": _digest(k, f"v-{k}")}, (k, reply)
        readers.setdefault(k, set()).add(reply["pid"])
    # Each key was read 6 times, more than the MAX_REQUESTS its setter can serve in all: by other workers too.
    # And the 42 requests needed 42 / MAX_REQUESTS workers at least.
    assert all(readers[k] - {setters[k]} for k in keys), (setters, readers)
    assert len(set(setters.values()) | set().union(*readers.values())) >= 42 // MAX_REQUESTS


def test_flask_gunicorn_memoize_and_cached_view_compute_once_for_all_workers(site):
    first = _json(f"{site}/square/7")
    page = _get(f"{site}/page")
    assert first["result"] == {"n": 7, "square": 49, "by": first["pid"]} and page.startswith(b"rendered by ")
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: _json(f"{site}/square/7"), range(20)))
        pages = list(pool.map(lambda _: _get(f"{site}/page"), range(10)))
    # Every worker, recycled ones included, got the one result computed by the first (its pid, not theirs).
    assert all(r["result"] == first["result"] for r in replies), replies
    assert set(pages) == {page}
    assert len({r["pid"] for r in replies}) >= 20 // MAX_REQUESTS
