"""A gunicorn (or uvicorn) server of one of examples/ for the tests that run the pools for real: started on a free
loopback port, waited for, and stopped with its whole process group whatever the test did."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
START_S = 60  # seconds a server has to answer its first request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app: str, cache_name: str, ready_path: str, *, max_requests: int, preload: bool = False,
            threads: int = 0) -> Iterator[str]:
    """``gunicorn app`` (``module:callable`` in examples/) with 3 workers, each recycled after ``max_requests``
    requests, the cache name in ``SHMCACHE_NAME``; ``threads``: gthread workers of that many threads. Yields its
    base URL once ``ready_path`` answers."""
    port = free_port()
    # Why no --max-requests-jitter: a worker serves at most max_requests requests, so N requests need
    # N / max_requests workers at least: counts of distinct pids follow from that, not from timing.
    cmd = [sys.executable, "-m", "gunicorn", "-w", "3", "-b", f"127.0.0.1:{port}", "--chdir", str(EXAMPLES),
           "--timeout", "60", "--graceful-timeout", "10", "--max-requests", str(max_requests),
           *(["--preload"] if preload else []), *(["-k", "gthread", "--threads", str(threads)] if threads else []),
           app]
    with _running(cmd, port, {"SHMCACHE_NAME": cache_name}, ready_path, "gunicorn") as url:
        yield url


@contextlib.contextmanager
def serving_uvicorn(app: str, cache_name: str, ready_path: str, *, max_requests: int,
                    env: dict | None = None) -> Iterator[str]:
    """``uvicorn app`` with 3 workers, each ending after ``max_requests`` requests (uvicorn's supervisor starts a
    fresh one), the cache name in ``SHMCACHE_NAME`` and ``env`` added; yields its base URL once ``ready_path``
    answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--workers", "3", "--host", "127.0.0.1", "--port", str(port),
           "--app-dir", str(EXAMPLES), "--limit-max-requests", str(max_requests), "--no-access-log", app]
    with _running(cmd, port, {"SHMCACHE_NAME": cache_name, **(env or {})}, ready_path, "uvicorn") as url:
        yield url


@contextlib.contextmanager
def _running(cmd: list, port: int, env: dict, ready_path: str, what: str) -> Iterator[str]:
    server = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                with urllib.request.urlopen(url + ready_path, timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{what} did not start: {server.stderr.read().decode()[-2000:]}")
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
