"""The Redis fixtures start real servers on loopback: a standalone server answers over TCP, refuses connections once
stopped and answers again on the same port once started; a 3-node cluster serves keys of every node's slots."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from tests.servers import REDIS_BINARY, RedisServer
from tests.conftest import _need_redis

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError:
    if os.environ.get("SHMCACHE_REQUIRE_REDIS") == "1":
        pytest.fail("SHMCACHE_REQUIRE_REDIS=1: the Redis tests need redis-py (pip install redis)", pytrace=False)
    pytest.skip("redis-py is not installed (pip install redis)", allow_module_level=True)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]
CLUSTER_KEYS = 50


@pytest.fixture
def has_redis_server() -> None:
    """For the tests that start a RedisServer themselves: skip (or fail) as the fixtures do without redis-server."""
    _need_redis(REDIS_BINARY)


def _client(url: str) -> redis.Redis:
    """A client that fails at once on a refused connection, instead of retrying with back-off."""
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0))


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_redis_url_answers_over_tcp(redis_url):
    assert redis_url.startswith("redis://127.0.0.1:") and redis_url.endswith("/0")
    key = f"t-{uuid.uuid4().hex}"
    with _client(redis_url) as client:
        assert client.ping()
        assert client.set(key, b"v") and client.get(key) == b"v"
        client.delete(key)


def test_redis_server_stops_and_starts_again_on_the_same_port(redis_server):
    port, url = redis_server.port, redis_server.url
    assert url == f"redis://127.0.0.1:{port}/0"
    with _client(url) as client:
        assert client.ping() and client.set("k", b"v")

        redis_server.stop(keep_directory=True)
        assert not redis_server.running and _refused(port)
        with pytest.raises(redis.ConnectionError):
            client.ping()

        redis_server.start()
        assert redis_server.port == port
        assert client.ping()  # the same client connects again
        assert client.get("k") is None  # nothing persisted across the restart

        redis_server.stop()  # the directory goes too; start() makes a new one, on the same port still
        assert redis_server.directory is None and _refused(port)
        redis_server.start()
        assert redis_server.port == port and client.ping()


def test_redis_server_stop_leaves_no_process_and_no_directory(has_redis_server):
    with RedisServer(tcp=True) as server:
        pid, directory = server.pid, server.directory
        assert os.path.isdir(directory)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # waited for, so not even a zombie answers
    assert not os.path.exists(directory)
    server.stop()  # idempotent


def test_redis_server_on_a_taken_port_raises_with_its_log(has_redis_server):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(RuntimeError, match="Address already in use"):
            RedisServer(port=holder.getsockname()[1])


def test_redis_cluster_serves_keys_of_every_node(redis_cluster_url):
    assert redis_cluster_url.startswith("redis://127.0.0.1:")
    keys = [f"t-{uuid.uuid4().hex}-{i}" for i in range(CLUSTER_KEYS)]
    with redis.RedisCluster.from_url(redis_cluster_url, socket_timeout=5) as client:
        assert client.cluster_info()["cluster_state"] == "ok"
        assert len(client.get_primaries()) == 3
        assert len({client.get_node_from_key(k).name for k in keys}) == 3  # the keys fall in every node's slots
        for i, k in enumerate(keys):
            assert client.set(k, i)
        try:
            assert [client.get(k) for k in keys] == [str(i).encode() for i in range(CLUSTER_KEYS)]
        finally:
            for k in keys:
                client.delete(k)
