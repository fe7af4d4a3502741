"""A WSGI app for gunicorn whose handler runs an expensive transform through one shmcache shared by every worker.

    SHMCACHE_NAME=web gunicorn -w 4 --chdir examples gunicorn_app:app            # each worker attaches
    SHMCACHE_NAME=web gunicorn -w 4 --preload --chdir examples gunicorn_app:app  # opened once, before the fork

``GET /transform/<text>`` returns the transform of ``<text>``, computed once on the whole host however many workers
are asked for it at the same moment (``get_or_compute``); ``GET /metrics`` returns the cache's global stats in the
Prometheus text format, the same from whichever worker answers.
"""

from __future__ import annotations

import hashlib
import json
import os

from shmcache import SharedCache, prometheus_text

CACHE_NAME = os.environ.get("SHMCACHE_NAME", "gunicorn-example")
ROUNDS = 20_000  # sha256 rounds: a few milliseconds, standing in for real work (a model, a resize, a query)

# Opened at import: under --preload that is once, in the master, and the forked workers inherit the handle; without
# it, every worker imports this module and attaches by name. Both are supported.
cache = SharedCache(CACHE_NAME, capacity_bytes=16 * 2**20, max_entries=10_000)


def transform(text: str) -> dict:
    digest = text.encode()
    for _ in range(ROUNDS):
        digest = hashlib.sha256(digest).digest()
    return {"text": text, "rounds": ROUNDS, "digest": digest.hex(), "computed_by": os.getpid()}


def app(environ, start_response):
    path = environ.get("PATH_INFO", "/")
    if path == "/metrics":
        body = prometheus_text({CACHE_NAME: cache.stats()}).encode()
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4"), ("Content-Length", str(len(body)))])
        return [body]
    if path.startswith("/transform/"):
        text = path[len("/transform/"):]
        result = dict(cache.get_or_compute(("transform", text), lambda: transform(text), timeout=30))
        result["served_by"] = os.getpid()
        body = json.dumps(result).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"not found\n"]
