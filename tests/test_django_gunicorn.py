"""The Django backend under real gunicorn workers (examples/django_app.py): a value stored through one worker is
read through others, and a session carries on across workers that gunicorn recycles (``--max-requests``)."""

from __future__ import annotations

import hashlib
import http.cookiejar
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

pytest.importorskip("django", reason="Django is in the test extra")
pytest.importorskip("gunicorn", reason="gunicorn is in the test extra")
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]
MAX_REQUESTS = 5  # each worker exits after this many requests and gunicorn forks a fresh one


def _digest(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


@pytest.fixture
def site(name):
    """The example site under gunicorn, 3 workers recycled every MAX_REQUESTS requests; its base URL."""
    port = _free_port()
    # Why no --max-requests-jitter: a worker serves at most MAX_REQUESTS requests, so N requests need N / MAX_REQUESTS
    # workers at least: the count of distinct pids below follows from that, not from timing.
    cmd = [sys.executable, "-m", "gunicorn", "-w", "3", "-b", f"127.0.0.1:{port}", "--chdir", str(EXAMPLES),
           "--timeout", "60", "--graceful-timeout", "10", "--max-requests", str(MAX_REQUESTS), "django_app:application"]
    server = subprocess.Popen(cmd, env={**os.environ, "SHMCACHE_NAME": name}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                _json(urllib.request.build_opener(), f"{url}/get/ping")
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


def _json(opener, url: str) -> dict:
    with opener.open(url, timeout=30) as r:
        return json.loads(r.read())


def test_django_gunicorn_value_set_by_one_worker_is_read_by_others(site):
    opener = urllib.request.build_opener()
    keys = [f"k{i}" for i in range(6)]
    setters = {}
    for k in keys:
        setters[k] = _json(opener, f"{site}/set/{k}/v-{k}")["pid"]
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda k: (k, _json(urllib.request.build_opener(), f"{site}/get/{k}")), keys * 6))
    readers = {}
    for k, reply in replies:
        assert reply["found"] == {"key": k, "value": f"v-{k}", "sum": _digest(k, f"v-{k}")}, (k, reply)
        readers.setdefault(k, set()).add(reply["pid"])
    # Each key was read 6 times, more than the MAX_REQUESTS its setter can serve in all: by other workers too.
    # And the 42 requests needed 42 / MAX_REQUESTS workers at least.
    assert all(readers[k] - {setters[k]} for k in keys), (setters, readers)
    assert len(set(setters.values()) | set().union(*readers.values())) >= 42 // MAX_REQUESTS


def test_django_gunicorn_session_survives_worker_recycling(site):
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    pids = []
    for n in range(1, 31):
        reply = _json(opener, f"{site}/visit")
        assert reply["visits"] == n, (n, reply)  # the session carried on, whichever worker served it
        pids.append(reply["pid"])
    assert len(set(pids)) >= 30 // MAX_REQUESTS  # workers recycled: the session outlived the ones that made it
