"""A one-file Flask app whose cache lives in one shmcache shared by every gunicorn worker, through Flask-Caching.

    SHMCACHE_NAME=site gunicorn -w 3 --chdir examples flask_app:app

``GET /set/<key>/<value>`` stores ``{"key", "value", "sum"}`` through Flask-Caching (``sum``: a digest of key and
value, so a torn or misplaced read is caught); ``GET /get/<key>`` reads it back; ``GET /square/<n>`` is memoized
(``@cache.memoize``) and ``GET /page`` a cached view (``@cache.cached``): both say which worker computed them, once for
the whole host. Every reply names the worker that served it (``pid``).
"""

from __future__ import annotations

import hashlib
import os

from flask import Flask, jsonify
from shmcache.contrib.flask import Cache  # flask_caching.Cache, its decorators single-flight

app = Flask(__name__)
app.config.update(
    CACHE_TYPE="shmcache.contrib.flask.SharedMemoryCache",
    CACHE_SHMCACHE_NAME=os.environ.get("SHMCACHE_NAME", "flask-example"),
    CACHE_DEFAULT_TIMEOUT=300,
    CACHE_OPTIONS={"capacity_bytes": 16 * 2**20, "max_entries": 10_000},
)
cache = Cache(app)


def digest(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


@app.route("/set/<key>/<value>")
def set_value(key: str, value: str):
    stored = cache.set(key, {"key": key, "value": value, "sum": digest(key, value)})
    return jsonify(pid=os.getpid(), stored=stored)


@app.route("/get/<key>")
def get_value(key: str):
    return jsonify(pid=os.getpid(), found=cache.get(key))


@cache.memoize(300)
def square(n: int) -> dict:
    return {"n": n, "square": n * n, "by": os.getpid()}


@app.route("/square/<int:n>")
def square_view(n: int):
    return jsonify(pid=os.getpid(), result=square(n))


@app.route("/page")
@cache.cached(300)
def page():
    return f"rendered by {os.getpid()}"
