"""One small adapter per store compared with shmcache, all with the same ``get`` / ``put`` / ``fill`` / ``close``.

``Peer(sizing)`` creates a store of its own and ``close()`` removes everything it made (segment, directory, server,
manager process); ``attach()`` gives a forked child process a handle on the same store, and that handle's
``close()`` releases only itself. Around forking workers the owner calls ``suspend()`` and ``resume()`` (LMDB
forbids a child to reopen an environment that its parent has open). Stores bounded by their own memory use
(diskcache, Redis) start unbounded; ``bound_to_current_size()`` then caps them at what they use once filled, so that
they hold about as many entries as shmcache holds under ``max_entries``. ``available()`` says why a peer cannot run
here (None when it can), so a missing package or binary skips the peer instead of failing the run. Where a store
needs no encoding, ``get`` and ``put`` are bound straight to the library's own methods, so timings measure the
library and not the adapter.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import itertools
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass

from shmcache import SharedCache

from .servers import RedisServer, redis_version

SHM_DIR = "/dev/shm"  # diskcache and lmdb keep their files here, in memory like shmcache's segment
FILL_CHUNK = 10_000  # entries per transaction, pipeline or update() when filling a store untimed
# lmdb never evicts: room for the largest workload (a sparse file on tmpfs, where unused pages cost nothing)
LMDB_MAP_NBYTES = 2 * 2**30
PICKLE_PROTOCOL = 5
UNBOUNDED_NBYTES = 2**40  # diskcache's size_limit until bound_to_current_size()
REDIS_CLIENT_SLACK = 256 * 1024  # maxmemory headroom for the clients' buffers, which Redis counts as used memory


@dataclass(frozen=True)
class Sizing:
    """What a store may hold: ``max_entries`` entries and ``capacity_bytes`` of encoded keys and values."""

    max_entries: int
    capacity_bytes: int


def _chunks(items, n: int = FILL_CHUNK):
    it = iter(items)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


class Peer:
    """The adapter interface; subclasses set the class attributes and bind ``get`` and ``put``."""

    name = ""
    module = ""  # import name, checked by available()
    package = ""  # distribution name, for the version
    codec = ""  # how a value gets into the store and back
    bound = ""  # what bounds the store, and how it evicts
    shared = True  # False: every process has a private store
    owner = True

    @classmethod
    def available(cls) -> str | None:
        try:
            importlib.import_module(cls.module)
        except ImportError as exc:
            return f"package {cls.package!r} is not installed ({exc})"
        return None

    @classmethod
    def version(cls) -> str:
        return importlib.metadata.version(cls.package)

    def get(self, key, default=None):
        raise NotImplementedError

    def put(self, key, value) -> None:
        raise NotImplementedError

    def fill(self, items) -> None:
        """Store every ``(key, value)`` of ``items``, as fast as the store allows (untimed set-up)."""
        for k, v in items:
            self.put(k, v)

    def bound_to_current_size(self) -> None:
        """Cap the store at the memory it uses now (no-op for stores bounded by entries, or unbounded)."""

    def suspend(self) -> None:
        """Release this process's handle while forked children use the store (most stores need not)."""

    def resume(self) -> None:
        """Take back the handle released by ``suspend()``."""

    def attach(self) -> Peer:
        """A handle for a forked child process; its ``close()`` leaves the store in place."""
        child = copy.copy(self)
        child.owner = False
        return child

    def close(self) -> None:
        pass

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShmcachePeer(Peer):
    name = module = package = "shmcache"
    codec = "msgpack (shmcache's codec; numpy arrays raw)"
    bound = "LRU by max_entries and bytes, global to all processes"
    _serial = itertools.count()

    def __init__(self, sizing: Sizing | None, *, attach_to: str | None = None) -> None:
        self.owner = attach_to is None
        if self.owner:
            self.cache_name = f"benchmarks-{os.getpid()}-{next(self._serial)}"
            self.cache = SharedCache(self.cache_name, capacity_bytes=sizing.capacity_bytes,
                                     max_entries=sizing.max_entries, create=True)
        else:
            self.cache_name = attach_to
            self.cache = SharedCache(attach_to, create=False)
        self.get, self.put = self.cache.get, self.cache.put

    def attach(self) -> ShmcachePeer:
        return ShmcachePeer(None, attach_to=self.cache_name)

    def close(self) -> None:
        try:
            self.cache.close()
        finally:
            if self.owner:
                try:
                    SharedCache.unlink_name(self.cache_name)
                except FileNotFoundError:
                    pass


class CachetoolsPeer(Peer):
    name = module = package = "cachetools"
    codec = "none: the value object itself is kept"
    bound = "LRU by max_entries, private to each process"
    shared = False

    def __init__(self, sizing: Sizing) -> None:
        import cachetools

        self.cache = cachetools.LRUCache(maxsize=sizing.max_entries)
        self.get, self.put = self.cache.get, self.cache.__setitem__


class ManagerDictPeer(Peer):
    name = "manager.dict"
    module = "multiprocessing"
    codec = "pickle (multiprocessing's proxy, to a server process)"
    bound = "none: unbounded, never evicts"

    @classmethod
    def version(cls) -> str:
        import platform

        return f"Python {platform.python_version()}"

    def __init__(self, sizing: Sizing) -> None:
        self.manager = mp.get_context("fork").Manager()
        self.dict = self.manager.dict()
        self.get, self.put = self.dict.get, self.dict.__setitem__

    def fill(self, items) -> None:
        for chunk in _chunks(items):
            self.dict.update(chunk)

    def close(self) -> None:
        if self.owner:
            self.manager.shutdown()


class DiskcachePeer(Peer):
    name = module = package = "diskcache"
    codec = "pickle (diskcache's Disk; bytes kept raw; values over 32 KiB in files)"
    bound = "LRU by size_limit = its volume (SQLite pages plus files) once filled; culls at most 10 per put"

    def __init__(self, sizing: Sizing) -> None:
        import diskcache

        self.directory = tempfile.mkdtemp(prefix="benchmarks-diskcache-", dir=SHM_DIR)
        try:
            self.cache = diskcache.Cache(self.directory, size_limit=UNBOUNDED_NBYTES,
                                         eviction_policy="least-recently-used")
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._bind()

    def _bind(self) -> None:
        self.get, self.put = self.cache.get, self.cache.set

    def fill(self, items) -> None:
        for chunk in _chunks(items):
            with self.cache.transact():
                for k, v in chunk:
                    self.cache.set(k, v)

    def bound_to_current_size(self) -> None:
        self.cache.reset("size_limit", self.cache.volume())

    def attach(self) -> DiskcachePeer:
        import diskcache

        child = super().attach()
        child.cache = diskcache.Cache(self.directory)  # settings (size_limit, policy) are stored in the database
        child._bind()
        return child

    def close(self) -> None:
        try:
            self.cache.close()
        finally:
            if self.owner:
                shutil.rmtree(self.directory, ignore_errors=True)


class LmdbPeer(Peer):
    name = module = package = "lmdb"
    codec = f"pickle protocol {PICKLE_PROTOCOL}"
    bound = "none: holds every key (one environment, map_size 2 GiB), never evicts"

    def __init__(self, sizing: Sizing) -> None:
        self.directory = tempfile.mkdtemp(prefix="benchmarks-lmdb-", dir=SHM_DIR)
        try:
            self._open()
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def _open(self) -> None:
        import lmdb

        # Why: sync/metasync off, as nothing here is durable either; writemap writes pages in place.
        self.env = lmdb.open(self.directory, map_size=LMDB_MAP_NBYTES, writemap=True, sync=False, metasync=False,
                             readahead=False, max_readers=256)

    def get(self, key, default=None):
        with self.env.begin() as txn:
            raw = txn.get(key.encode())
        return default if raw is None else pickle.loads(raw)

    def put(self, key, value) -> None:
        raw = pickle.dumps(value, protocol=PICKLE_PROTOCOL)
        with self.env.begin(write=True) as txn:
            txn.put(key.encode(), raw)

    def fill(self, items) -> None:
        for chunk in _chunks(items):
            with self.env.begin(write=True) as txn:
                for k, v in chunk:
                    txn.put(k.encode(), pickle.dumps(v, protocol=PICKLE_PROTOCOL))

    def suspend(self) -> None:
        self.env.close()

    def resume(self) -> None:
        self._open()

    def attach(self) -> LmdbPeer:
        child = super().attach()
        child._open()  # an environment must not cross fork(): the child opens its own
        return child

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            if self.owner:
                shutil.rmtree(self.directory, ignore_errors=True)


class RedisPeer(Peer):
    name = "redis"
    module = package = "redis"
    codec = f"pickle protocol {PICKLE_PROTOCOL}"
    bound = "allkeys-lru (sampled) by maxmemory = its used memory once filled (+256 KiB for client buffers)"

    @classmethod
    def available(cls) -> str | None:
        if redis_version() is None:
            return "redis-server is not on PATH"
        return super().available()

    @classmethod
    def version(cls) -> str:
        try:
            hiredis = f", hiredis {importlib.metadata.version('hiredis')}"
        except importlib.metadata.PackageNotFoundError:
            hiredis = ""
        return f"redis-py {importlib.metadata.version('redis')}{hiredis}, redis-server {redis_version()}"

    def __init__(self, sizing: Sizing) -> None:
        self.server = RedisServer()
        try:
            self._connect()
        except BaseException:
            self.server.stop()
            raise

    def _connect(self) -> None:
        import redis

        self.client = redis.Redis(unix_socket_path=self.server.socket_path)

    def get(self, key, default=None):
        raw = self.client.get(key)
        return default if raw is None else pickle.loads(raw)

    def put(self, key, value) -> None:
        self.client.set(key, pickle.dumps(value, protocol=PICKLE_PROTOCOL))

    def fill(self, items) -> None:
        for chunk in _chunks(items):
            self.client.mset({k: pickle.dumps(v, protocol=PICKLE_PROTOCOL) for k, v in chunk})

    def bound_to_current_size(self) -> None:
        used = int(self.client.info("memory")["used_memory"])
        self.client.config_set("maxmemory", used + REDIS_CLIENT_SLACK)
        self.client.config_set("maxmemory-policy", "allkeys-lru")

    def attach(self) -> RedisPeer:
        child = super().attach()
        child._connect()  # one connection per process
        return child

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            if self.owner:
                self.server.stop()


ALL_PEERS = (ShmcachePeer, CachetoolsPeer, ManagerDictPeer, DiskcachePeer, LmdbPeer, RedisPeer)
PEERS_BY_NAME = {p.name: p for p in ALL_PEERS}
