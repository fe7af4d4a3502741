"""A FastAPI app whose async endpoints share one shmcache across every uvicorn worker, with a rate limit that is
exact across them.

    SHMCACHE_NAME=api uvicorn --workers 3 --app-dir examples fastapi_app:app

``GET /set/{key}/{value}`` stores ``{"key", "value", "sum"}`` (``sum``: a digest of key and value, so a torn or
misplaced read is caught) and ``GET /get/{key}`` reads it back, through ``await cache.aput`` and ``await
cache.aget``; ``GET /limited/{client}`` allows ``RATE_LIMIT`` requests per client per window of ``RATE_WINDOW_S``
seconds, counted in the shared cache (``aadd`` makes the window's counter with its time to live, ``aincr`` counts
atomically): the limit holds for the whole pool, whichever worker serves a request, where a limiter in each worker's
memory would allow the limit once per worker. Every reply names the worker that served it (``pid``).
"""

from __future__ import annotations

import hashlib
import os
import time

from fastapi import FastAPI, Response

from shmcache import SharedCache

NAME = os.environ.get("SHMCACHE_NAME", "fastapi-example")
RATE_LIMIT = int(os.environ.get("RATE_LIMIT", "10"))
RATE_WINDOW_S = float(os.environ.get("RATE_WINDOW_S", "60"))

# Each worker opens the cache by name when it imports this module: the first creates it, the others attach.
cache = SharedCache(NAME, capacity_bytes=16 * 2**20, max_entries=10_000)
app = FastAPI()


def digest(key: str, value: str) -> str:
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


@app.get("/set/{key}/{value}")
async def set_value(key: str, value: str) -> dict:
    await cache.aput(("kv", key), {"key": key, "value": value, "sum": digest(key, value)})
    return {"pid": os.getpid()}


@app.get("/get/{key}")
async def get_value(key: str) -> dict:
    return {"pid": os.getpid(), "found": await cache.aget(("kv", key))}


@app.get("/limited/{client}")
async def limited(client: str, response: Response) -> dict:
    window = int(time.time() // RATE_WINDOW_S)
    counter = ("rate", client, window)
    await cache.aadd(counter, 0, ttl=2 * RATE_WINDOW_S)  # the window's counter, if no request made it yet
    n = await cache.aincr(counter)  # atomic across every worker (the counter keeps its time to live)
    if n > RATE_LIMIT:
        response.status_code = 429
    return {"pid": os.getpid(), "n": n, "allowed": n <= RATE_LIMIT}
