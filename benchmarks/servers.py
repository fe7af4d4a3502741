"""The Redis server the redis peer talks to: started on a unix socket in a private temporary directory, stopped always.

The server listens on no TCP port (``--port 0``), persists nothing (``--save '' --appendonly no``), and is asked by
the kernel to exit if the benchmark process dies (``PR_SET_PDEATHSIG``), so no server outlives a run. ``stop()``
terminates it, waits, and removes the directory with the socket and the log.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

REDIS_BINARY = "redis-server"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.02
_PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    """Run in the child between fork and exec: receive SIGTERM when the benchmark process dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def redis_version() -> str | None:
    """The version string of the redis-server on PATH, or None if there is none."""
    binary = shutil.which(REDIS_BINARY)
    if binary is None:
        return None
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    words = [w for w in out.split() if w.startswith("v=")]
    return words[0][2:] if words else out.strip()


def _ping(path: str) -> bool:
    """True when a Redis server answers PING on the unix socket ``path``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            s.connect(path)
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A private redis-server process; ``socket_path`` is where clients connect.

    :raises FileNotFoundError: if redis-server is not on PATH.
    :raises RuntimeError: if it does not answer within START_TIMEOUT_S (its log is in the message).
    """

    _proc: subprocess.Popen | None = None

    def __init__(self) -> None:
        binary = shutil.which(REDIS_BINARY)
        if binary is None:
            raise FileNotFoundError(f"{REDIS_BINARY} is not on PATH")
        self.directory = tempfile.mkdtemp(prefix="benchmarks-redis-")
        self.socket_path = os.path.join(self.directory, "redis.sock")
        self._log_path = os.path.join(self.directory, "redis.log")
        try:
            self._start(binary)
        except BaseException:
            self.stop()
            raise

    def _start(self, binary: str) -> None:
        args = [binary, "--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--dir", self.directory, "--daemonize", "no",
                "--databases", "1"]
        with open(self._log_path, "wb") as log:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ping(self.socket_path):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {self._log_tail()}")
            time.sleep(_POLL_S)

    def _log_tail(self) -> str:
        try:
            with open(self._log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace").strip() or "(empty log)"
        except OSError as exc:
            return f"(no log: {exc})"

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after STOP_TIMEOUT_S) and remove its directory; idempotent."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(STOP_TIMEOUT_S)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
