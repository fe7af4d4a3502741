"""The Flask backend under real gunicorn workers (examples/flask_app.py): a value stored through one worker is read
through others, and a memoized result and a cached view are computed once for all the workers, those gunicorn
recycles (``--max-requests``) included."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from .gunicorn import serving

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
    with serving("flask_app:app", name, "/get/ping", max_requests=MAX_REQUESTS) as url:
        yield url


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
