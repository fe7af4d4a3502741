"""Celery's prefork workers for real (examples/celery_app.py), over the session's Redis as broker and result backend:
concurrent tasks of one document on several workers compute its expensive step once for the host, every result
carries the right digest, and children recycled meanwhile keep sharing the cache."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from shmcache import SharedCache

from .gunicorn import EXAMPLES

celery = pytest.importorskip("celery", reason="Celery is in the test extra")
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]
MAX_TASKS = 4  # each child ends after this many tasks and the pool forks a fresh one


@contextlib.contextmanager
def worker(broker: str, queue: str, cache_name: str):
    """``celery worker --pool=prefork`` of examples/celery_app.py, 3 children, consuming ``queue``; stopped with its
    whole process group however the test ends."""
    cmd = [sys.executable, "-m", "celery", "--workdir", str(EXAMPLES), "-A", "celery_app", "worker",
           "--pool=prefork", "--concurrency=3", f"--max-tasks-per-child={MAX_TASKS}", "-Q", queue,
           "-n", f"{queue}@%h", "--loglevel=WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    env = {**os.environ, "CELERY_BROKER": broker, "SHMCACHE_NAME": cache_name}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # a warm shutdown: the children finish what they run
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a child left behind, if any
        proc.stderr.close()


def _digest(doc: str) -> str:
    """What examples/celery_app.py's expensive step computes for ``doc`` (the value carries its key: a result with
    another document's digest is caught)."""
    return hashlib.sha256(f"features of {doc}".encode()).hexdigest()


def test_celery_prefork_workers_compute_a_step_once_for_the_host(redis_url, name):
    import redis

    broker = redis_url.rsplit("/", 1)[0] + "/1"  # a database of its own on the session's server, flushed after
    client = celery.Celery("client", broker=broker, backend=broker)
    client.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
    docs = [f"doc{i}" for i in range(4)]
    try:
        with worker(broker, name, name) as proc:
            # Each document asked by 6 tasks at once, spread over the pool's children.
            calls = [(doc, w) for w in range(1, 7) for doc in docs]
            pending = [client.send_task("celery_app.score", args=[doc, w], queue=name) for doc, w in calls]
            deadline = time.monotonic() + 180
            results = []
            for r in pending:
                try:
                    results.append(r.get(timeout=max(1.0, deadline - time.monotonic())))
                except celery.exceptions.TimeoutError:
                    pytest.fail(f"no result (the worker's stderr: {_stderr(proc)})")
            for (doc, w), got in zip(calls, results):
                d = _digest(doc)
                assert got["doc"] == doc and got["digest"] == d and got["score"] == int(d[:8], 16) * w
            # 24 tasks, at most MAX_TASKS per child: 6 children at least, recycled ones included.
            assert len({got["pid"] for got in results}) >= len(calls) // MAX_TASKS
            with SharedCache(name, create=False) as cache:
                assert {doc: cache.get(("runs", doc)) for doc in docs} == dict.fromkeys(docs, 1)  # once each
                s = cache.stats()
                assert s.computations == len(docs) and s.hits + s.misses >= len(calls)
    finally:
        redis.Redis.from_url(broker).flushdb()
        SharedCache.unlink_name(name)


def _stderr(proc) -> str:
    if proc.poll() is None:
        return "(still running)"
    return proc.stderr.read().decode(errors="replace")[-2000:]
