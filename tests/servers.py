"""Private Redis servers for the tests (and for the stress scripts and benchmarks, which import them from here):
started on demand, stopped always, never left behind.

``RedisServer()`` listens on a unix socket in a private temporary directory and on no TCP port; the benchmarks'
redis peer uses it. ``RedisServer(tcp=True)`` (or ``port=...``) listens on 127.0.0.1 instead, on a free port, so that
clients connect by URL as they would to a real deployment; ``stop()`` and ``start()`` take it down and bring it back on
the same port, for tests of clients that must reconnect. ``RedisClusterServers()`` starts three cluster-enabled
nodes on loopback and joins them into one Redis Cluster that serves every slot. (The memcached of the application
benchmarks is ``benchmarks.servers.MemcachedServer``, built on the helpers here.)

Every server persists nothing (``--save '' --appendonly no``) and is asked by the kernel to exit if the thread that
started it dies (``PR_SET_PDEATHSIG``), so no server outlives its run. Every wait has a timeout: a server or a
cluster that does not come up raises RuntimeError with the tail of its log. ``stop()`` terminates, waits, and
removes the directory with the socket, the log and a cluster node's table. Every class is also a context manager.
Nothing here needs redis-py (nor anything outside the standard library): the few commands these helpers send are
spoken in raw RESP.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

# The server the fixtures run: redis-server, or another of the same protocol and options (SHMCACHE_REDIS_SERVER:
# valkey-server, the maintained fork, which CI's Debian sid stage runs the tier's tests against).
REDIS_BINARY = os.environ.get("SHMCACHE_REDIS_SERVER", "redis-server")
REDIS_CLI_BINARY = "redis-cli"
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
CLUSTER_TIMEOUT_S = 30.0
CLUSTER_BUS_OFFSET = 10000  # a cluster node also listens on port + 10000, for the other nodes
CLUSTER_SLOTS = 16384
PORT_ATTEMPTS = 5  # servers started on a port another process took first, before giving up
_FIRST_PORT = 10000  # lowest port drawn: well above the ports system services use
_POLL_S = 0.02
_PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
_LIBC = ctypes.CDLL(None, use_errno=True)
_RANDOM = random.SystemRandom()  # forked or seeded processes must not all draw the same ports


def _die_with_parent() -> None:
    """Run in the child between fork and exec: receive SIGTERM when the thread that started it dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _binary(name: str) -> str:
    """The path of ``name`` on PATH; FileNotFoundError if there is none."""
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} is not on PATH")
    return path


def _tail(text: str | bytes | None, nchars: int = 2000) -> str:
    """The end of a log or of a command's output, for an error message."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = text or ""
    if len(text) > nchars:
        head, newline, rest = text[-nchars:].partition("\n")
        text = rest if newline else head  # from the first whole line, if there is one
    return text.strip() or "(no output)"


# Ports ----------------------------------------------------------------------------------------------------------------


def _bindable(port: int) -> bool:
    """True when nothing holds ``port`` on the loopback address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range, where outgoing connections take their local ports."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _free_port(with_bus: bool) -> int:
    """A random loopback port that nothing holds now, nor port + 10000 when ``with_bus`` (a cluster node's bus).

    Ports are drawn below the ephemeral range, so that no client's connection can take the port as its local end
    while a test has the server stopped. Another process may still take it before the server binds it:
    RedisServer.start() then draws again.
    """
    reserve = CLUSTER_BUS_OFFSET if with_bus else 0
    top = _ephemeral_low() - reserve
    if top - _FIRST_PORT < 1000:  # an unusual ephemeral range: draw from all the ports instead
        top = 65536 - reserve
    for _ in range(200):
        port = _RANDOM.randrange(_FIRST_PORT, top)
        if _bindable(port) and (not with_bus or _bindable(port + CLUSTER_BUS_OFFSET)):
            return port
    raise RuntimeError(f"no free loopback port found in [{_FIRST_PORT}, {top})")


# A few commands in raw RESP -------------------------------------------------------------------------------------------



def halt(proc: subprocess.Popen | None) -> None:
    """End a server process, if any: SIGTERM, then SIGKILL after STOP_TIMEOUT_S; wait for it (no zombie is left)."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)

class _ReplyError(Exception):
    """The server answered with an error (such as LOADING or CLUSTERDOWN)."""


def _encode(args: tuple[str, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode()
        parts += [b"$%d\r\n" % len(data), data, b"\r\n"]
    return b"".join(parts)


def _read_reply(f) -> str | int | None:
    """One reply that is not an array, read from the socket file ``f``."""
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("the connection closed before a reply")
    kind, body = line[:1], line[1:-2].decode(errors="replace")
    if kind == b"+":
        return body
    if kind == b"-":
        raise _ReplyError(body)
    if kind == b":":
        return int(body)
    if kind == b"$":
        n = int(body)
        if n < 0:
            return None
        data = f.read(n + 2)
        if len(data) != n + 2:
            raise ConnectionError("the connection closed mid-reply")
        return data[:-2].decode(errors="replace")
    raise ConnectionError(f"unexpected reply {line[:80]!r}")


def _command(address: str | tuple[str, int], *args: str, timeout: float = 1.0) -> str | int | None:
    """Send one command to the server at ``address`` (a unix socket path, or a (host, port) pair) and return its reply.

    :raises OSError: if the server cannot be reached or closes the connection.
    :raises _ReplyError: if it answers with an error.
    """
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(address)
        s.sendall(_encode(args))
        with s.makefile("rb") as f:
            return _read_reply(f)


def _fields(text) -> dict[str, str]:
    """The ``key:value`` lines of an INFO or CLUSTER INFO reply."""
    lines = str(text or "").splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line and not line.startswith("#"))


def _served_by(address: str | tuple[str, int], pid: int) -> bool:
    """True when the server answering at ``address`` is process ``pid``.

    A bare PING would not do: on a port that another process took first, another server could answer it.
    """
    try:
        return _fields(_command(address, "INFO", "server")).get("process_id") == str(pid)
    except (OSError, _ReplyError):
        return False


# Servers --------------------------------------------------------------------------------------------------------------


class _PortTaken(Exception):
    """redis-server exited because another process holds its port (or its cluster bus port)."""


class RedisServer:
    """A private redis-server process; ``url`` is how clients find it.

    ``RedisServer()`` listens on the unix socket ``socket_path`` only (``port`` is None). ``RedisServer(tcp=True)``
    listens on 127.0.0.1:``port``, a free port it picks; ``port=`` picks it instead. ``cluster_node=True`` turns
    cluster mode on (TCP only, with the cluster bus on port + 10000, free too); RedisClusterServers joins such nodes.
    The server keeps its port across ``stop()`` and ``start()``.

    :raises FileNotFoundError: if redis-server is not on PATH.
    :raises RuntimeError: if it does not answer within START_TIMEOUT_S (its log is in the message).
    """

    def __init__(self, *, tcp: bool = False, port: int | None = None, cluster_node: bool = False) -> None:
        self._binary = _binary(REDIS_BINARY)
        self.tcp = tcp or port is not None or cluster_node
        self.cluster_node = cluster_node
        self.port = port
        self.directory: str | None = None
        self.socket_path: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log_offset = 0
        self._may_move = self.tcp and port is None  # a port this object picked, until it first starts on it
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id while it is started, else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def address(self) -> str | tuple[str, int]:
        """Where the server listens: ``(host, port)`` over TCP, else the unix socket's path."""
        return (LOOPBACK, self.port) if self.tcp else self.socket_path

    @property
    def url(self) -> str:
        """The server's URL, database 0: ``redis://127.0.0.1:PORT/0``, or ``unix://PATH?db=0``."""
        return f"redis://{LOOPBACK}:{self.port}/0" if self.tcp else f"unix://{self.socket_path}?db=0"

    def start(self) -> None:
        """Start the server, on the same port if it ran before, in a new directory if stop() removed the old one;
        nothing happens while it runs.

        :raises RuntimeError: if it does not answer within START_TIMEOUT_S, or its port is taken (on a restart, or
            PORT_ATTEMPTS times running on a first start, where it draws another port each time).
        """
        if self.running:
            return
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="shmcache-redis-")
            self.socket_path = None if self.tcp else os.path.join(self.directory, "redis.sock")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if self.tcp and self.port is None:
                self.port = _free_port(with_bus=self.cluster_node)
            try:
                self._launch()
                break
            except _PortTaken:
                if not self._may_move or attempt == PORT_ATTEMPTS:
                    raise RuntimeError(f"redis-server could not bind its port: {self._log_tail()}") from None
                self.port = None
        self._may_move = False

    def _args(self) -> list[str]:
        args = [self._binary, "--save", "", "--appendonly", "no", "--dir", self.directory, "--daemonize", "no"]
        if self.tcp:
            args += ["--bind", LOOPBACK, "--port", str(self.port)]
        else:
            args += ["--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700", "--databases", "1"]
        if self.cluster_node:
            # nodes.conf is the node's own table of the cluster, written in --dir: a restart keeping the directory
            # comes back as the same node, with the same slots.
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "5000"]
        return args

    def _launch(self) -> None:
        """Run redis-server and wait until it answers as itself.

        :raises _PortTaken: if it exited because its port was taken.
        :raises RuntimeError: if it exited otherwise, or did not answer within START_TIMEOUT_S.
        """
        log_path = self._log_path()
        self._log_offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        with open(log_path, "ab") as log:  # appended to: a restart's log follows the previous run's
            self._proc = subprocess.Popen(self._args(), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._proc.poll() is None and time.monotonic() < deadline:
            if _served_by(self.address, self._proc.pid):
                return
            time.sleep(_POLL_S)
        self._halt()
        if "Address already in use" in self._log_tail(since_launch=True):
            raise _PortTaken()
        raise RuntimeError(f"redis-server did not start within {START_TIMEOUT_S} s: {self._log_tail()}")

    def _log_path(self) -> str:
        return os.path.join(self.directory, "redis.log")

    def _log_tail(self, since_launch: bool = False) -> str:
        """The end of the server's log (only what the last launch wrote, if ``since_launch``)."""
        if self.directory is None:
            return "(no log: the directory is removed)"
        try:
            with open(self._log_path(), "rb") as f:
                f.seek(self._log_offset if since_launch else 0)
                return _tail(f.read())
        except OSError as exc:
            return f"(no log: {exc})"

    def _halt(self) -> None:
        proc, self._proc = self._proc, None
        halt(proc)

    def stop(self, *, keep_directory: bool = False) -> None:
        """Stop the server and wait for it to exit; idempotent.

        Unless ``keep_directory``, also remove its directory (socket, log, a cluster node's table), so that nothing
        is left; ``start()`` may still follow, in a new directory. With ``keep_directory`` the log carries on across
        the restart, and a cluster node comes back as the same member of its cluster.
        """
        try:
            self._halt()
        finally:
            if not keep_directory and self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = self.socket_path = None

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class RedisClusterServers:
    """``size`` cluster-enabled redis-server nodes on loopback, joined into one Redis Cluster serving all 16384 slots.

    Masters only (``--cluster-replicas 0``). ``nodes`` are the RedisServer of each node, ``ports`` their ports, and
    ``url`` the first node's URL, all that a cluster client needs to find the others (a cluster has database 0 only).

    :raises FileNotFoundError: if redis-server or redis-cli is not on PATH.
    :raises RuntimeError: if a node does not start, or the cluster is not ok within CLUSTER_TIMEOUT_S.
    """

    def __init__(self, size: int = 3) -> None:
        if size < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters")
        cli = _binary(REDIS_CLI_BINARY)
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(size):
                self.nodes.append(RedisServer(cluster_node=True))
            self._create(cli)
            self._wait_until_ok()
        except BaseException:
            self.stop()
            raise

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """The first node's URL: ``redis://127.0.0.1:PORT/0``."""
        return self.nodes[0].url

    def _create(self, cli: str) -> None:
        """Join the nodes, with redis-cli assigning the slots evenly to them."""
        args = [cli, "--cluster", "create", *(f"{LOOPBACK}:{port}" for port in self.ports),
                "--cluster-replicas", "0", "--cluster-yes"]
        try:
            done = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=CLUSTER_TIMEOUT_S, preexec_fn=_die_with_parent)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"redis-cli --cluster create did not finish within {CLUSTER_TIMEOUT_S} s: "
                               f"{_tail(exc.stdout)}") from None
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed ({done.returncode}): "
                               f"{_tail(done.stdout + done.stderr)}")

    def _cluster_info(self, node: RedisServer) -> dict[str, str]:
        try:
            return _fields(_command(node.address, "CLUSTER", "INFO"))
        except (OSError, _ReplyError) as exc:
            return {"error": str(exc)}

    def _node_ok(self, node: RedisServer) -> bool:
        """True when ``node`` sees the cluster ok, every slot served, and every node."""
        info = self._cluster_info(node)
        return (info.get("cluster_state") == "ok" and info.get("cluster_slots_ok") == str(CLUSTER_SLOTS)
                and info.get("cluster_known_nodes") == str(len(self.nodes)))

    def _wait_until_ok(self) -> None:
        """Wait until every node agrees that the cluster is ok, as clients may ask any of them."""
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while not all(self._node_ok(node) for node in self.nodes):
            dead = [node for node in self.nodes if not node.running]
            if dead or time.monotonic() > deadline:
                node = dead[0] if dead else next((n for n in self.nodes if not self._node_ok(n)), self.nodes[0])
                raise RuntimeError(f"the cluster is not ok within {CLUSTER_TIMEOUT_S} s; node {node.port} "
                                   f"(running: {node.running}) says {self._cluster_info(node)}, and logs: "
                                   f"{node._log_tail()}")
            time.sleep(5 * _POLL_S)

    def stop(self) -> None:
        """Stop every node and remove its directory; idempotent. The first error is raised after all are stopped."""
        errors = []
        for node in self.nodes:
            try:
                node.stop()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> RedisClusterServers:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
