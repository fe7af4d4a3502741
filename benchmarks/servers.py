"""The servers the benchmarks run: the private Redis servers of the tests (``tests/servers.py``: ``RedisServer``,
``RedisClusterServers``), imported from there, and ``MemcachedServer``, a memcached on a free loopback port for the
application benchmarks that compare against it, which only the benchmarks need.

Like the Redis servers, a memcached stores nothing on disk, is asked by the kernel to exit if the thread that started
it dies (``PR_SET_PDEATHSIG``), and is waited for, with a timeout, when it starts and when it stops.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

from tests.servers import (_POLL_S, LOOPBACK, PORT_ATTEMPTS, REDIS_BINARY, START_TIMEOUT_S,
                           RedisClusterServers, RedisServer, _binary, _die_with_parent, _free_port, _tail, halt)

__all__ = ["MEMCACHED_BINARY", "MemcachedServer", "RedisClusterServers", "RedisServer", "redis_version"]

MEMCACHED_BINARY = "memcached"


def redis_version() -> str | None:
    """The version string of the redis-server on PATH, or None if there is none."""
    binary = shutil.which(REDIS_BINARY)
    if binary is None:
        return None
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    words = [w for w in out.split() if w.startswith("v=")]
    return words[0][2:] if words else out.strip()


class MemcachedServer:
    """A private memcached process on 127.0.0.1:``port`` (a free port it picks), for benchmarks that need a real one.

    ``memory_mb`` is its item memory (``-m``). It stores nothing on disk; like the Redis servers it is asked by the
    kernel to exit if the thread that started it dies, and ``stop()`` terminates and waits for it.

    :raises FileNotFoundError: if memcached is not on PATH.
    :raises RuntimeError: if it does not answer within START_TIMEOUT_S (its output is in the message).
    """

    def __init__(self, *, memory_mb: int = 64, threads: int = 4) -> None:
        binary = _binary(MEMCACHED_BINARY)
        self._proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()
        try:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                self.port = _free_port(with_bus=False)
                self._log.seek(0)
                self._log.truncate()
                # Why -u: memcached refuses to run as root unless told which user to be; it stays that user.
                user = ["-u", "root"] if os.geteuid() == 0 else []
                args = [binary, "-l", LOOPBACK, "-p", str(self.port), "-U", "0", "-m", str(memory_mb),
                        "-t", str(threads), *user]
                self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                              stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
                if self._wait_served():
                    return
                self._halt()
                if attempt == PORT_ATTEMPTS or b"Address already in use" not in self._output():
                    raise RuntimeError(f"memcached did not start within {START_TIMEOUT_S} s: "
                                       f"{_tail(self._output())}")
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int | None:
        """The server's process id while it is started, else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def location(self) -> str:
        """``127.0.0.1:PORT``, as Django's memcached backends take it."""
        return f"{LOOPBACK}:{self.port}"

    def command(self, line: str) -> list[str]:
        """Send one text-protocol command (``stats``, ``flush_all``) and return its reply's lines, up to END or OK."""
        with socket.create_connection((LOOPBACK, self.port), timeout=2.0) as s, s.makefile("rb") as f:
            s.sendall(line.encode() + b"\r\n")
            lines = []
            while True:
                reply = f.readline()
                if not reply.endswith(b"\r\n"):
                    raise ConnectionError("memcached closed the connection before its reply ended")
                reply = reply[:-2].decode(errors="replace")
                if reply in ("END", "OK") or reply.startswith(("ERROR", "CLIENT_ERROR", "SERVER_ERROR")):
                    return lines + [reply]
                lines.append(reply)

    def stats(self) -> dict[str, str]:
        """The server's ``stats``: curr_items, bytes, get_hits, get_misses..."""
        return {w[1]: w[2] for w in (line.split(" ", 2) for line in self.command("stats")) if len(w) == 3}

    def _wait_served(self) -> bool:
        """True once this process (its pid, not another's on the same port) answers; False if it exited or timed out."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._proc.poll() is None and time.monotonic() < deadline:
            try:
                if self.stats().get("pid") == str(self._proc.pid):
                    return True
            except OSError:
                pass
            time.sleep(_POLL_S)
        return False

    def _output(self) -> bytes:
        self._log.seek(0)
        return self._log.read()

    def _halt(self) -> None:
        proc, self._proc = self._proc, None
        halt(proc)

    def stop(self) -> None:
        """Stop the server and wait for it to exit; idempotent."""
        try:
            self._halt()
        finally:
            self._log.close()

    def __enter__(self) -> MemcachedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
