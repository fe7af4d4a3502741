"""Celery prefork workers sharing one shmcache: a task's expensive step is computed once for the whole host, whichever
worker runs the task, and every other worker reads its result from shared memory.

    CELERY_BROKER=redis://127.0.0.1:6379/1 SHMCACHE_NAME=features \\
        celery --workdir examples -A celery_app worker --pool=prefork --concurrency=4

``score(doc, weight)`` needs ``features(doc)``, the expensive step (here: 0.2 s and a digest), through
``get_or_compute``: concurrent tasks of one document on several workers wait for the one computing it, and later
tasks hit. The cache is opened when the worker imports this module, before the pool forks its children: each child
inherits the handle (shmcache handles are fork-safe), and so do the children that replace those recycled by
``--max-tasks-per-child``. ``("runs", doc)`` counts how often the step really ran on the host.
"""

from __future__ import annotations

import hashlib
import os
import time

from celery import Celery

from shmcache import SharedCache

NAME = os.environ.get("SHMCACHE_NAME", "celery-example")
BROKER = os.environ.get("CELERY_BROKER", "redis://127.0.0.1:6379/1")

app = Celery("celery_app", broker=BROKER, backend=BROKER)
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
cache = SharedCache(NAME, capacity_bytes=16 * 2**20, max_entries=10_000)


def digest(doc: str) -> str:
    return hashlib.sha256(f"features of {doc}".encode()).hexdigest()


def features(doc: str) -> dict:
    """The expensive step: what every task of ``doc`` needs, worth computing once per host."""
    cache.incr(("runs", doc))
    time.sleep(0.2)
    return {"doc": doc, "digest": digest(doc)}


@app.task
def score(doc: str, weight: int) -> dict:
    f = cache.get_or_compute(("features", doc), lambda: features(doc), ttl=3600)
    return {"doc": f["doc"], "digest": f["digest"], "score": int(f["digest"][:8], 16) * weight, "pid": os.getpid()}
