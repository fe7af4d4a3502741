"""FastAPI under real uvicorn workers (examples/fastapi_app.py): a value stored through one worker is read through
others, and a rate limit counted in the shared cache holds exactly across the pool, workers recycled meanwhile."""

from __future__ import annotations

import hashlib
import http.client
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from .gunicorn import serving_uvicorn

pytest.importorskip("fastapi", reason="FastAPI is in the test extra")
pytest.importorskip("uvicorn", reason="uvicorn is in the test extra")
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]
MAX_REQUESTS = 25  # each worker ends after this many requests and uvicorn starts a fresh one
LIMIT = 10


def _digest(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


def _get(url: str) -> tuple[int, dict]:
    """The status and JSON of ``GET url``. A connection a worker closed unserved as it reached its request limit
    (uvicorn serves the requests under way, then closes the connections that have sent none) is made again."""
    for attempt in range(50):
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except (http.client.RemoteDisconnected, ConnectionResetError):
            time.sleep(0.05 * attempt)
    raise AssertionError(f"{url}: no worker answered")


@pytest.fixture
def api(name):
    # A window of 10**9 s: the test never crosses into the next one, so the count it checks is the whole story.
    with serving_uvicorn("fastapi_app:app", name, "/get/ping", max_requests=MAX_REQUESTS,
                         env={"RATE_LIMIT": str(LIMIT), "RATE_WINDOW_S": "1e9"}) as url:
        yield url


def test_fastapi_uvicorn_workers_share_values_and_one_exact_rate_limit(api):
    keys = [f"k{i}" for i in range(4)]
    setters = {k: _get(f"{api}/set/{k}/v-{k}")[1]["pid"] for k in keys}
    readers: dict = {}
    with ThreadPoolExecutor(4) as pool:
        # Read in rounds until some key was read by a worker other than the one that set it (uvicorn's workers
        # share one listening socket, so concurrent connections spread over them; the rounds are bounded).
        for _ in range(20):
            for k, (status, reply) in pool.map(lambda k: (k, _get(f"{api}/get/{k}")), keys * 3):
                assert status == 200 and reply["found"] == {"key": k, "value": f"v-{k}", "sum": _digest(k, f"v-{k}")}
                readers.setdefault(k, set()).add(reply["pid"])
            if any(readers[k] - {setters[k]} for k in keys):
                break
    assert any(readers[k] - {setters[k]} for k in keys), (setters, readers)

    # Rounds, each a client of its own, until one round's requests were served by more than one worker (uvicorn
    # ends a worker near its request limit, not exactly at it, so one round may fall to one worker); every round
    # must be exact.
    served_by = set()
    for round_ in range(10):
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda _: _get(f"{api}/limited/client-a{round_}"), range(3 * LIMIT)))
        allowed = [r for status, r in outcomes if status == 200]
        refused = [r for status, r in outcomes if status == 429]
        assert len(allowed) == LIMIT and len(refused) == 2 * LIMIT  # exact for the pool, not once per worker
        assert sorted(r["n"] for _, r in outcomes) == list(range(1, 3 * LIMIT + 1))  # every count once: atomic
        served_by = {r["pid"] for _, r in outcomes}
        if len(served_by) > 1:
            break
    assert len(served_by) > 1  # one limit counted by several workers
    status, first = _get(f"{api}/limited/client-b")  # another client has a count of its own
    assert status == 200 and first["n"] == 1 and first["allowed"] is True
