"""The Django backend under real gunicorn workers (examples/django_app.py): a value stored through one worker is
read through others, and a session carries on across workers that gunicorn recycles (``--max-requests``)."""

from __future__ import annotations

import hashlib
import http.cookiejar
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from .gunicorn import serving

pytest.importorskip("django", reason="Django is in the test extra")
pytest.importorskip("gunicorn", reason="gunicorn is in the test extra")
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]
MAX_REQUESTS = 5  # each worker exits after this many requests and gunicorn forks a fresh one


def _digest(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


@pytest.fixture
def site(name):
    """The example site under gunicorn, 3 workers recycled every MAX_REQUESTS requests; its base URL."""
    with serving("django_app:application", name, "/get/ping", max_requests=MAX_REQUESTS) as url:
        yield url


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


def test_django_gunicorn_gthread_workers_share_one_handle_across_their_threads(name):
    """gunicorn's threaded workers: the threads of a worker share its one handle; concurrent requests, some served
    by the same worker's threads at once, all read what was stored."""
    with serving("django_app:application", name, "/get/ping", max_requests=1000, threads=4) as site:
        keys = [f"t{i}" for i in range(8)]
        for k in keys:
            _json(urllib.request.build_opener(), f"{site}/set/{k}/v-{k}")
        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(lambda k: (k, _json(urllib.request.build_opener(), f"{site}/get/{k}")),
                                    keys * 12))
    threads: dict = {}
    for k, reply in replies:
        assert reply["found"] == {"key": k, "value": f"v-{k}", "sum": _digest(k, f"v-{k}")}, (k, reply)
        threads.setdefault(reply["pid"], set()).add(reply["thread"])
    assert len(threads) <= 3 and max(len(t) for t in threads.values()) > 1, threads  # a worker served on threads


def test_django_asgi_under_uvicorn_async_views_share_the_cache(name):
    """Django's ASGI app under uvicorn with 3 workers: async views (``await cache.aset``/``aget``) and sync ones
    share one cache; a value set through one worker is read through the others."""
    pytest.importorskip("uvicorn", reason="uvicorn is in the test extra")
    from .gunicorn import serving_uvicorn

    with serving_uvicorn("django_app:asgi_application", name, "/aget/ping", max_requests=1000) as site:
        keys = [f"a{i}" for i in range(4)]
        setters = {k: _json(urllib.request.build_opener(), f"{site}/aset/{k}/v-{k}")["pid"] for k in keys}
        readers: dict = {}
        with ThreadPoolExecutor(4) as pool:
            for _ in range(20):  # rounds, until a key was read by a worker other than its setter (bounded)
                for k, path, reply in pool.map(
                        lambda kp: (kp[0], kp[1], _json(urllib.request.build_opener(), f"{site}/{kp[1]}/{kp[0]}")),
                        [(k, p) for k in keys for p in ("aget", "get")] * 2):
                    assert reply["found"] == {"key": k, "value": f"v-{k}", "sum": _digest(k, f"v-{k}")}, (path, reply)
                    readers.setdefault(k, set()).add(reply["pid"])
                if any(readers[k] - {setters[k]} for k in keys):
                    break
        assert any(readers[k] - {setters[k]} for k in keys), (setters, readers)
