"""Hammer a TieredCache fleet -- simulated hosts, each a local SharedCache in front of one shared Redis -- while Redis
goes down and comes back and workers are SIGKILLed, and check every value read, the counters, and that every host
ends up agreeing with Redis.

--hosts hosts share one namespace; each host is a local cache of its own (a unique name), used by --procs worker
processes, each with its own TieredCache handle. The workers run a random mix for --seconds: get, put (values that
name their key and carry a checksum, 16 B to --max-value-bytes, a share of them numpy arrays; see stress/common.py),
put with a time to live, add, replace, cas, delete, pop, touch, contains, get_or_compute (whose function takes a
little time, so computations overlap and hosts wait on each other's lock) and incr on COUNTERS counter keys. Every
value read is checked. Each worker counts its increments that certainly reached Redis, and those that may have (a
Redis call failed during the incr, or the worker was killed in it).

With --chaos (the default; off with --no-chaos or --redis-url), the parent stops Redis --outages times, for
OUTAGE_SECONDS each, and starts it again on the same port; a restarted Redis is empty. With --cluster, an outage
stops one node (--victims any), or one of those the hosts' listeners are not subscribed on (--victims unsubscribed:
the listeners see no gap, so nothing tells the hosts that the keys the node held are gone). With --kills N, the
parent SIGKILLs N workers at random instants and starts a replacement in the same slot; a kill is aimed at a
host's listener (listener takeover), at a worker computing in get_or_compute while it holds the fleet's compute lock
(lock lease takeover, with a short --lock-lease), or at a random worker. With --stops N, the parent SIGSTOPs N
workers computing in get_or_compute (a random one if none is) for STOP_LEASES leases each, then SIGCONTs them: the
stopped worker keeps its host's claim and its fleet lock lapses, so another host computes and the stopped host's
waiters take that value from Redis.

At the end the workers stop operating but keep listening, and the parent checks, for up to CONVERGE_SECONDS, that
every host's local copy of every key is absent or equal to what Redis holds (read by an observer TieredCache on a
local cache of its own). A copy that differs is excused when it is the very copy (same local version) that a
write of the host left while Redis was unavailable (a local-only write, kept by design for up to --max-age seconds),
made within the last --max-age seconds; any other is divergent. Every value left, in Redis or in a host's cache,
must also be intact. Without chaos, each counter in Redis must lie between the increments that certainly reached
it and those plus the uncertain ones (with chaos, a restarted Redis lost them: only values are checked).

Reading the summary line:

    tiered: ops=N ops_s=R wrong=0 divergent=0 excused=X errors=0 refused=F counters=ok hangs=0 crashes=0 kills=K
            stops=T outages=O remote_errors=.. local_only_puts=.. invalidations=.. stale_fills=.. listener_starts=..
            lock_waits=.. takeovers=.. computations=.. settling=.. converged_s=.. seconds=S hosts=H procs=P
            redis=server

ops             operations completed by all workers (killed ones included); ops_s: per second
wrong           values read (get, pop, get_with_version, get_or_compute, incr) not put under that key; must be 0
divergent       (host, key) pairs whose local copy still differed from Redis after CONVERGE_SECONDS; must be 0
excused         differing copies left by local-only writes while Redis was unavailable (by design, up to max_age)
errors          exceptions raised by operations (a non-strict TieredCache contains Redis failures); must be 0
refused         RemoteError raised by a fleet-wide operation (add, replace, cas, incr) while Redis was unavailable
counters        ok, FAILED (a counter outside its bounds; must not be), or skipped (chaos runs)
hangs           stalls of HANG_SECONDS without progress, workers that did not stop when told; must be 0
crashes         workers that died without being killed; must be 0
kills           workers SIGKILLed (listener/compute/random: on stderr); outages: Redis stops and restarts
stops           workers SIGSTOPped and continued later (compute/random: on stderr)
remote_errors .. computations: the hosts' TierStats summed (takeovers: lock_takeovers)
settling        copies that differed from Redis at the first look after the stop (invalidations still in flight,
                copies expiring a moment after Redis's key); converged_s: seconds until none differed (or gave up)

The exit status is 1 when any "must be" above does not hold.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import traceback
from typing import Any
import uuid

import numpy as np

from tests.servers import RedisClusterServers, RedisServer
from shmcache import ComputeTimeout, PinnedError, RemoteError, SharedCache, TieredCache, TooLargeError
from shmcache.codec import KindKey, encode_key
from shmcache.tier import host_stats
from shmcache.tier.layout import C_LOCAL_ONLY_PUTS, C_REMOTE_ERRORS
from shmcache.tier.stats import segment_name

from .common import MAX_REPORTS, check_value, exit_on_sigterm, finish, make_value, reap, start, unlink_quietly

DEFAULT_SECONDS = 30.0
DEFAULT_HOSTS = 2
DEFAULT_PROCS = 2  # worker processes per host
DEFAULT_SEED = 1
DEFAULT_KEYS = 500
DEFAULT_CAPACITY_BYTES = 4 << 20  # each host's local cache
DEFAULT_MAX_ENTRIES = 2048
DEFAULT_MAX_VALUE_BYTES = 64 * 1024
MIN_VALUE_BYTES = 16
DEFAULT_OUTAGES = 3
DEFAULT_KILLS = 0
DEFAULT_STOPS = 0
STOP_LEASES = 3  # a stop lasts this many --lock-lease: one for the lock to lapse, then room for another host
DEFAULT_MAX_AGE = 60.0  # longer than a run: a copy that is stale at the end was not merely old
DEFAULT_TIMEOUT = 0.25
DEFAULT_RETRY_INTERVAL = 0.25
DEFAULT_LOCK_LEASE = 1.0
COUNTERS = 4  # counter keys, written by incr only
MIX = {"get": 38, "put": 17, "put_ttl": 5, "add": 3, "replace": 2, "cas": 3, "delete": 5, "pop": 1, "touch": 3,
       "contains": 2, "get_or_compute": 9, "incr": 7, "get_counter": 2}
WRITES = ("put", "put_ttl", "add", "replace", "cas", "touch", "get_or_compute", "incr")  # may go local-only
# The fleet-wide operations: with Redis unavailable they may raise RemoteError rather than act locally (counted as
# refused); a RemoteError from any other operation of a non-strict TieredCache is an error.
ATOMIC = ("add", "replace", "cas", "incr")
TTLS = (0.01, 0.1, 1.0, 5.0)
HOT_SHARE = 0.8  # share of key draws from a heavy-tailed distribution; the rest are uniform
COMPUTE_KEYS = 8  # get_or_compute draws among the first keys only, so hosts often wait on each other's computation
COMPUTE_SECONDS = 0.02  # a get_or_compute function sleeps up to this long
COMPUTE_TIMEOUT = 10.0  # get_or_compute's timeout: far above the lock lease, so reaching it is an error
OUTAGE_SECONDS = (1.0, 2.0)  # each Redis outage lasts this long, drawn uniformly
OUTAGE_SPAN = (0.1, 0.8)  # outages fall in this part of the run; the listeners have the rest to resubscribe
KILL_SPAN = (0.1, 0.9)
KILL_AIMS = {"listener": 0.4, "compute": 0.3, "random": 0.3}
AIM_WAIT = 1.0  # seconds a compute-aimed kill waits for a worker to be computing before killing a random one
HANG_SECONDS = 10.0
QUIESCE_SECONDS = 15.0  # time the workers get to finish their operation when told to stop
CONVERGE_SECONDS = 10.0
JOIN_SECONDS = 10.0
POLL_SECONDS = 0.05

FIELDS = ("ops", "wrong", "errors", "refused", "idle", "leading", "computing", "pending", "pending_op")
OPS, WRONG, ERRORS, REFUSED, IDLE, LEADING, COMPUTING, PENDING, PENDING_OP = range(len(FIELDS))
INCR_OK = len(FIELDS)  # COUNTERS words: increments that certainly reached Redis
INCR_UNSURE = INCR_OK + COUNTERS  # COUNTERS words: increments that may have
NF = INCR_UNSURE + COUNTERS
OP_NAMES = list(MIX)
RUN, QUIESCE, EXIT = range(3)


def key_names(nkeys: int) -> list[str]:
    """Index i < nkeys: ordinary key ``k<i>``; the COUNTERS after them: counter ``ctr<j>``."""
    return [f"k{i}" for i in range(nkeys)] + [f"ctr{j}" for j in range(COUNTERS)]


def same_value(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def leading(tier: TieredCache) -> bool:
    """Whether this process is its host's listener (read from the handle's listener thread object)."""
    listener = tier._listener_box[0]
    return bool(listener is not None and listener.leading)


def describe(v) -> str:
    """A short description of a value for a report: its sequence number (which worker wrote it, and when)."""
    if v is None:
        return "absent"
    if isinstance(v, dict):
        return f"dict seq={v.get('n')}"
    if isinstance(v, np.ndarray):
        return f"array seq={int(v[1]) if len(v) > 1 else '?'}"
    if isinstance(v, bytes):
        rest = v.partition(b"\0")[2]
        return f"bytes seq={int.from_bytes(rest[:8], 'little')}"
    return f"{type(v).__name__} {v!r:.40}"


class TierWorkload:
    """Random operations on one TieredCache by one process, every value read checked, counted in ``row``."""

    def __init__(self, tier: TieredCache, rng: random.Random, counts, row: int, local_only, host: int,
                 incarnation: int, cfg: dict) -> None:
        self.tier, self.rng, self.c, self.base = tier, rng, counts, row * NF
        (self.lo_at, self.lo_ver), self.nkeys = local_only, cfg["keys"]
        self.names = key_names(self.nkeys)
        self.lo_base = host * len(self.names)
        self.max_nbytes = cfg["max_value_bytes"]
        self.ops, self.weights = OP_NAMES, list(MIX.values())
        self.seq = (row << 40) | (incarnation << 32)
        self.reports = 0

    def key_index(self) -> int:
        if self.rng.random() < HOT_SHARE:
            return int((self.rng.paretovariate(1.2) - 1) * self.nkeys / 20) % self.nkeys
        return self.rng.randrange(self.nkeys)

    def value(self, key: str):
        r = self.rng.random()
        if r < 0.6:
            n = self.rng.randint(MIN_VALUE_BYTES, 512)
        elif r < 0.92:
            n = self.rng.randint(512, 8192)
        else:
            n = self.rng.randint(8192, max(8192, self.max_nbytes))
        self.seq += 1
        return make_value(key, self.seq, self.rng, min(n, self.max_nbytes))

    def report(self, field: int, msg: str) -> None:
        self.c[self.base + field] += 1
        if self.reports < MAX_REPORTS:
            self.reports += 1
            print(f"[pid {os.getpid()}] {FIELDS[field]}: {msg}", file=sys.stderr, flush=True)

    def check(self, what: str, key: str, v) -> None:
        why = None if v is None else check_value(key, v)
        if why:
            self.report(WRONG, f"{what}({key!r}) returned a wrong value: {why}")

    def step(self) -> None:
        op = self.rng.choices(self.ops, self.weights)[0]
        if op in ("incr", "get_counter"):
            i = self.nkeys + self.rng.randrange(COUNTERS)
        elif op == "get_or_compute":
            i = self.rng.randrange(min(COMPUTE_KEYS, self.nkeys))
        else:
            i = self.key_index()
        key, c, b = self.names[i], self.c, self.base
        row = self.tier._row
        local_only = row[C_LOCAL_ONLY_PUTS]
        c[b + PENDING_OP] = OP_NAMES.index(op)
        c[b + PENDING] = i + 1
        try:
            getattr(self, "_" + op)(key, i)
        except (TooLargeError, PinnedError):
            pass  # documented refusals of the local cache
        except RemoteError as exc:
            if op in ATOMIC:
                self.c[self.base + REFUSED] += 1
            else:
                self.report(ERRORS, f"{op}({key!r}) raised though the TieredCache is not strict: {exc!r}")
        except ComputeTimeout as exc:
            self.report(ERRORS, f"{op}({key!r}): {exc!r}")
        except Exception:
            self.report(ERRORS, f"{op}({key!r}): {traceback.format_exc()}")
        if self.tier._row[C_LOCAL_ONLY_PUTS] != local_only:  # kept locally only: may differ from Redis, by design
            self.lo_at[self.lo_base + i] = time.monotonic()
            self.lo_ver[self.lo_base + i] = self.tier.local.get_with_version(KindKey(self.tier._n, key))[1] or 0
        c[b + PENDING] = 0
        c[b + LEADING] = int(leading(self.tier))
        c[b + OPS] += 1

    def _get(self, key, i) -> None:
        self.check("get", key, self.tier.get(key))

    def _put(self, key, i) -> None:
        self.tier.put(key, self.value(key))

    def _put_ttl(self, key, i) -> None:
        self.tier.put(key, self.value(key), ttl=self.rng.choice(TTLS))

    def _add(self, key, i) -> None:
        self.tier.add(key, self.value(key), ttl=self.rng.choice((None, None) + TTLS))

    def _replace(self, key, i) -> None:
        self.tier.replace(key, self.value(key))

    def _cas(self, key, i) -> None:
        v, version = self.tier.get_with_version(key)
        self.check("get_with_version", key, v)
        if version is not None:
            self.tier.cas(key, self.value(key), version)

    def _delete(self, key, i) -> None:
        self.tier.delete(key)

    def _pop(self, key, i) -> None:
        self.check("pop", key, self.tier.pop(key, None))

    def _touch(self, key, i) -> None:
        self.tier.touch(key, self.rng.choice((0,) + TTLS))

    def _contains(self, key, i) -> None:
        _ = key in self.tier

    def _get_or_compute(self, key, i) -> None:
        def compute():
            self.c[self.base + COMPUTING] = 1
            try:
                time.sleep(self.rng.uniform(0, COMPUTE_SECONDS))
                return self.value(key)
            finally:
                self.c[self.base + COMPUTING] = 0

        ttl = self.rng.choice((None, None, None, 1.0))
        # (with a ttl, half the calls serve stale while one refreshes: a refresher killed mid-computation leaves its
        # lease to run out and the next stale call, on any host, to refresh)
        stale = self.rng.choice((None, 2.0)) if ttl else None
        self.check("get_or_compute", key, self.tier.get_or_compute(key, compute, timeout=COMPUTE_TIMEOUT, ttl=ttl,
                                                                  stale_ttl=stale))

    def _incr(self, key, i) -> None:
        row, j = self.tier._row, i - self.nkeys
        errors, local_only = row[C_REMOTE_ERRORS], row[C_LOCAL_ONLY_PUTS]
        try:
            v = self.tier.incr(key)
        except RemoteError:
            if self.tier._row[C_REMOTE_ERRORS] != errors:  # a call failed: it may have been applied (a timeout)
                self.c[self.base + INCR_UNSURE + j] += 1
            raise
        if type(v) is not int or v < 1:
            self.report(WRONG, f"incr({key!r}) returned {v!r}")
        row = self.tier._row
        if row[C_REMOTE_ERRORS] != errors:  # a call failed: it may have been applied (a timeout) or not
            self.c[self.base + INCR_UNSURE + j] += 1
        elif row[C_LOCAL_ONLY_PUTS] == local_only:  # not incremented locally only instead
            self.c[self.base + INCR_OK + j] += 1

    def _get_counter(self, key, i) -> None:
        v = self.tier.get(key)
        if v is not None and (type(v) is not int or v < 1):
            self.report(WRONG, f"get({key!r}) of a counter returned {describe(v)}")


def open_tier(cfg: dict, local: SharedCache, **kwargs) -> TieredCache:
    return TieredCache(local, cfg["url"], namespace=cfg["namespace"], max_age=cfg["max_age"],
                       timeout=cfg["timeout"], retry_interval=cfg["retry_interval"], lock_lease=cfg["lock_lease"],
                       cluster=cfg["cluster"], **kwargs)


def worker(cfg: dict, host: int, row: int, incarnation: int, seed: int, counts, local_only, phase) -> None:
    """Random operations until the parent says stop (or is gone); then keep listening until it says exit."""
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1)  # the parent asks for a stack dump when progress stalls
    if not cfg["verbose"]:  # Redis outages are expected: keep the per-outage warnings quiet
        logging.getLogger("shmcache.tiered").setLevel(logging.ERROR)
    parent = os.getppid()
    base = row * NF
    local = SharedCache(cfg["hosts"][host], create=False)
    tier = open_tier(cfg, local)
    try:
        w = TierWorkload(tier, random.Random(seed), counts, row, local_only, host, incarnation, cfg)
        while phase.value == RUN and os.getppid() == parent:
            w.step()
        counts[base + IDLE] = 1
        while phase.value == QUIESCE and os.getppid() == parent:  # the host's listener keeps applying messages
            time.sleep(0.02)
    finally:
        tier.close()
        local.close()


class Fleet:
    """The parent's view of the workers: start, kill and replace them, watch their progress."""

    def __init__(self, ctx, cfg: dict, rng: random.Random, counts, local_only, phase, chaos: bool) -> None:
        self.ctx, self.cfg, self.rng, self.counts, self.phase = ctx, cfg, rng, counts, phase
        self.local_only, self.chaos = local_only, chaos
        self.nhosts, self.procs_per_host = len(cfg["hosts"]), cfg["procs"]
        self.nkeys = cfg["keys"]
        self.unsure = [0] * COUNTERS  # increments in flight in killed or hung workers
        self.procs: list = [None] * (self.nhosts * self.procs_per_host)
        self.incarnations = [0] * len(self.procs)
        self.born = [0] * len(self.procs)  # the slot's op count when its worker started
        self.dead: list = []
        self.kills = {aim: 0 for aim in KILL_AIMS}
        self.stops = {"compute": 0, "random": 0}
        self.stopped: dict[int, tuple[Any, float]] = {}  # row -> (its process, when to continue it)
        self.crashes = 0
        self.last_ops, self.since = -1, time.monotonic()

    def host_of(self, row: int) -> int:
        return row // self.procs_per_host

    def spawn(self, row: int) -> None:
        c, b = self.counts, row * NF
        for f in (IDLE, LEADING, COMPUTING, PENDING):
            c[b + f] = 0
        self.born[row] = c[b + OPS]
        self.incarnations[row] += 1
        seed = (self.cfg["seed"] * 1_000_003 + row) * 1009 + self.incarnations[row]
        self.procs[row] = start(self.ctx, worker, (self.cfg, self.host_of(row), row, self.incarnations[row], seed,
                                                   c, self.local_only, self.phase))

    def settle(self, row: int) -> None:
        """Account for the operation a worker killed in ``row`` was in the middle of."""
        c, b = self.counts, row * NF
        pending = c[b + PENDING]
        if pending:
            i = pending - 1
            if i >= self.nkeys:
                self.unsure[i - self.nkeys] += 1
            if self.chaos and OP_NAMES[c[b + PENDING_OP]] in WRITES:  # it may have kept a copy locally only
                at, ver = self.local_only
                j = self.host_of(row) * (self.nkeys + COUNTERS) + i
                at[j], ver[j] = time.monotonic(), -1  # -1: whatever copy the host holds
        c[b + PENDING] = 0

    def kill(self, row: int) -> None:
        p = self.procs[row]
        self.stopped.pop(row, None)  # (SIGKILL ends a stopped process too)
        os.kill(p.pid, signal.SIGKILL)
        p.join(5)
        self.dead.append(p)
        self.settle(row)

    def replace_crashed(self) -> None:
        for row, p in enumerate(self.procs):
            if p.exitcode is not None:
                self.crashes += 1
                print(f"worker {p.pid} (host {self.host_of(row)}) exited with status {p.exitcode}", file=sys.stderr)
                self.dead.append(p)
                self.settle(row)
                self.spawn(row)

    def running(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if p.is_alive() and self.counts[r * NF + OPS] > self.born[r]]

    def kill_one(self) -> None:
        aim = self.rng.choices(list(KILL_AIMS), list(KILL_AIMS.values()))[0]
        rows = []
        if aim == "listener":
            rows = [r for r in self.running() if self.counts[r * NF + LEADING]]
        elif aim == "compute":
            until = time.monotonic() + AIM_WAIT
            while not rows and time.monotonic() < until:
                rows = [r for r in self.running() if self.counts[r * NF + COMPUTING]]
                if not rows:
                    time.sleep(0.001)
        if not rows:
            aim, rows = "random", self.running()
        if rows:
            row = self.rng.choice(rows)
            self.kill(row)
            self.kills[aim] += 1
            self.spawn(row)

    def stop_one(self, seconds: float) -> None:
        """SIGSTOP a worker computing in get_or_compute (waiting AIM_WAIT for one; else a random one), to be
        continued ``seconds`` later (``continue_due``)."""
        aim, until = "compute", time.monotonic() + AIM_WAIT
        rows: list[int] = []
        while not rows and time.monotonic() < until:
            rows = [r for r in self.running() if self.counts[r * NF + COMPUTING] and r not in self.stopped]
            if not rows:
                time.sleep(0.001)
        if not rows:
            aim, rows = "random", [r for r in self.running() if r not in self.stopped]
        if rows:
            row = self.rng.choice(rows)
            p = self.procs[row]
            os.kill(p.pid, signal.SIGSTOP)
            self.stopped[row] = (p, time.monotonic() + seconds)
            self.stops[aim] += 1

    def continue_due(self, every: bool = False) -> None:
        """SIGCONT the stopped workers whose stop is over (``every``: all of them)."""
        now = time.monotonic()
        for row, (p, until) in list(self.stopped.items()):
            if every or now >= until:
                del self.stopped[row]
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def total(self, field: int) -> int:
        return sum(self.counts[r * NF + field] for r in range(len(self.procs)))

    def stalled(self) -> bool:
        n, now = self.total(OPS), time.monotonic()
        if n != self.last_ops:
            self.last_ops, self.since = n, now
        return now - self.since > HANG_SECONDS

    def dump_stacks(self, rows=None) -> None:
        for r, p in enumerate(self.procs):
            if p.is_alive() and (rows is None or r in rows):
                os.kill(p.pid, signal.SIGUSR1)
        time.sleep(1.0)

    def quiesce(self) -> int:
        """Tell the workers to stop operating and wait until each has; kill (and count) those that do not."""
        self.phase.value = QUIESCE
        deadline = time.monotonic() + QUIESCE_SECONDS
        while time.monotonic() < deadline:
            waiting = [r for r, p in enumerate(self.procs) if p.is_alive() and not self.counts[r * NF + IDLE]]
            if not waiting:
                break
            time.sleep(POLL_SECONDS)
        stuck = [r for r, p in enumerate(self.procs) if p.is_alive() and not self.counts[r * NF + IDLE]]
        if stuck:
            print(f"{len(stuck)} workers did not stop within {QUIESCE_SECONDS:g} s; stacks follow", file=sys.stderr)
            self.dump_stacks(stuck)
            for r in stuck:
                self.kill(r)
        for r, p in enumerate(self.procs):  # died on their own meanwhile
            if p.exitcode is not None and r not in stuck and p not in self.dead:
                self.crashes += 1
                print(f"worker {p.pid} exited with status {p.exitcode}", file=sys.stderr)
                self.dead.append(p)
        return len(stuck)


def subscribed_port(url: str, namespace: str) -> int:
    """The port of the cluster node the listeners subscribe on: redis-py's ClusterPubSub picks the node serving the
    channel's slot."""
    import redis

    from shmcache.tier.remote import KEY_PREFIX

    client = redis.RedisCluster.from_url(url)
    try:
        return client.get_node_from_key(KEY_PREFIX + namespace.encode()).port
    finally:
        client.close()


def outage_schedule(rng: random.Random, seconds: float, n: int) -> list[tuple[float, float]]:
    """(start, end) of ``n`` outages, one in each of ``n`` equal slices of OUTAGE_SPAN of the run (fewer if the
    run is too short to fit them)."""
    a, b = seconds * OUTAGE_SPAN[0], seconds * OUTAGE_SPAN[1]
    while n and (b - a) / n < OUTAGE_SECONDS[0] + 0.5:
        n -= 1
    out = []
    for k in range(n):
        lo, hi = a + (b - a) * k / n, a + (b - a) * (k + 1) / n
        d = min(rng.uniform(*OUTAGE_SECONDS), hi - lo - 0.5)
        s = rng.uniform(lo, hi - d)
        out.append((s, s + d))
    return out


def divergences(observer: TieredCache, locals_: list, names: list[str]) -> list[tuple]:
    """(host, key index, local copy, its version, Redis's value, its version) of every copy that differs from
    Redis; RemoteError if Redis cannot be read."""
    kinds = [local.kind(f"tier:{observer.namespace}")._n for local in locals_]
    out = []
    for i, key in enumerate(names):
        truth, tv = observer.get_with_version(key)
        for h, local in enumerate(locals_):
            copy, cv = local.get_with_version(KindKey(kinds[h], key))
            if cv is not None and (truth is None or not same_value(copy, truth)):
                out.append((h, i, copy, cv, truth, tv))
    return out


def converge(observer: TieredCache, locals_: list, names: list[str]) -> tuple[list, int, float]:
    """Poll until no copy differs from Redis or CONVERGE_SECONDS pass: the differing copies left, how many differed
    at the first look, and how long it took."""
    t0 = time.monotonic()
    first = None
    while True:
        try:
            left = divergences(observer, locals_, names)
        except RemoteError as exc:
            left = [(-1, -1, None, None, f"Redis unreadable: {exc}", None)]
        first = len(left) if first is None else first
        if not left or time.monotonic() - t0 > CONVERGE_SECONDS:
            return left, first, time.monotonic() - t0
        time.sleep(0.1)


def judge(left: list, local_only, names: list[str], max_age: float, wall0: float, cluster_observer) -> tuple:
    """(divergent, excused) among the copies ``left`` differing from Redis; the divergent ones are printed."""
    divergent = excused = 0
    now = time.monotonic()
    for h, i, copy, cv, truth, tv in left:
        if h < 0:
            divergent += 1
            print(f"final check: {truth}", file=sys.stderr)
            continue
        j = h * len(names) + i
        age, lo_ver = now - local_only[0][j], local_only[1][j]
        if lo_ver in (-1, cv) and age < max_age + 1.0:  # the very copy a local-only write left, not too old
            excused += 1
            continue
        divergent += 1
        if divergent > 20:
            continue
        # A version is Redis's clock in µs when the write happened (the host's cache clock just past the newest
        # Redis version it saw, for a copy written locally only): shown in seconds from the start of the run.
        last = f"{age:.1f} s ago (copy version {lo_ver})" if local_only[0][j] else "never"
        since = f"{cv / 1e6 - wall0:+.2f} s" + (f", Redis's at {tv / 1e6 - wall0:+.2f} s" if tv else "")
        where = ""
        if cluster_observer is not None:
            remote = cluster_observer._remote
            where = f" on node :{remote.client.get_node_from_key(remote.key(encode_key(names[i]))).port}"
        print(f"divergent: host {h} holds {names[i]!r} = {describe(copy)} (version {cv}), Redis{where} holds "
              f"{describe(truth)} (version {tv}) [copy written at {since}]; the host's last local-only write of "
              f"it: {last}", file=sys.stderr)
    return divergent, excused


def intact(observer: TieredCache, locals_: list, names: list[str], nkeys: int) -> int:
    """How many values held at the end, in Redis or in a host's cache, are not intact values of their key."""
    kinds = [local.kind(f"tier:{observer.namespace}")._n for local in locals_]
    wrong = 0
    for i, key in enumerate(names):
        try:
            values = [("Redis", observer.get_with_version(key)[0])]
        except RemoteError:
            values = []  # already counted as divergent by converge()
        except ValueError as exc:  # shmcache.tier.remote.unpack_value: a damaged blob
            values = [("Redis", f"undecodable: {exc}")]
        values += [(f"host {h}", local.get(KindKey(kinds[h], key))) for h, local in enumerate(locals_)]
        for where, v in values:
            if v is None:
                continue
            why = check_value(key, v) if i < nkeys else None if type(v) is int and v > 0 else "not a count"
            if why:
                wrong += 1
                print(f"final check: {where} holds a wrong value under {key!r}: {why}", file=sys.stderr)
    return wrong


def check_counters(observer: TieredCache, fleet: Fleet, names: list[str]) -> bool:
    ok = True
    for j in range(COUNTERS):
        key = names[fleet.nkeys + j]
        value = observer.get_with_version(key)[0] or 0
        sure, unsure = fleet.total(INCR_OK + j), fleet.total(INCR_UNSURE + j) + fleet.unsure[j]
        if not sure <= value <= sure + unsure:
            ok = False
            print(f"counter {key!r}: Redis holds {value}, the workers made {sure} certain increments and {unsure} "
                  f"uncertain ones", file=sys.stderr)
    return ok


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="how long to run (default %(default)s)")
    p.add_argument("--hosts", type=int, default=DEFAULT_HOSTS, help="simulated hosts, each with a local cache of "
                   "its own (default %(default)s)")
    p.add_argument("--procs", type=int, default=DEFAULT_PROCS, help="worker processes per host (default "
                   "%(default)s)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of every random choice (default "
                   "%(default)s)")
    p.add_argument("--keys", type=int, default=DEFAULT_KEYS, help="distinct keys, besides the counters (default "
                   "%(default)s)")
    p.add_argument("--capacity-bytes", type=int, default=DEFAULT_CAPACITY_BYTES, help="each local cache's "
                   "capacity_bytes (default %(default)s)")
    p.add_argument("--max-entries", type=int, default=DEFAULT_MAX_ENTRIES, help="each local cache's max_entries "
                   "(default %(default)s)")
    p.add_argument("--max-value-bytes", type=int, default=DEFAULT_MAX_VALUE_BYTES, help="largest value (default "
                   "%(default)s)")
    p.add_argument("--redis-url", help="use this Redis (a namespace of its own, cleared at the end) instead of "
                   "starting one; no chaos")
    p.add_argument("--cluster", action="store_true", help="start a 3-node Redis Cluster instead of one server (with "
                   "--redis-url: the URL is a cluster's)")
    p.add_argument("--chaos", action=argparse.BooleanOptionalAction, default=True, help="stop and restart Redis "
                   "during the run (default: on)")
    p.add_argument("--outages", type=int, default=DEFAULT_OUTAGES, help="Redis outages with --chaos (default "
                   "%(default)s; fewer if the run is too short)")
    p.add_argument("--victims", choices=("any", "unsubscribed"), default="any", help="with --cluster: the nodes "
                   "the outages stop: any, or only those the hosts' listeners are not subscribed on, whose restart "
                   "they cannot notice (default %(default)s)")
    p.add_argument("--kills", type=int, default=DEFAULT_KILLS, help="workers to SIGKILL and replace during the run "
                   "(default %(default)s)")
    p.add_argument("--stops", type=int, default=DEFAULT_STOPS, help="workers to SIGSTOP for STOP_LEASES leases "
                   "during the run, aimed at computing ones (default %(default)s)")
    p.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE, help="TieredCache max_age (default "
                   "%(default)s)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="TieredCache timeout (default "
                   "%(default)s)")
    p.add_argument("--retry-interval", type=float, default=DEFAULT_RETRY_INTERVAL, help="TieredCache "
                   "retry_interval (default %(default)s)")
    p.add_argument("--lock-lease", type=float, default=DEFAULT_LOCK_LEASE, help="TieredCache lock_lease (default "
                   "%(default)s)")
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), default="fork",
                   help="multiprocessing start method (default %(default)s)")
    p.add_argument("--verbose", action="store_true", help="let the workers log Redis failures")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.hosts < 1 or args.procs < 1 or args.keys < 1:
        raise SystemExit("--hosts, --procs and --keys must be at least 1")
    exit_on_sigterm()
    rng = random.Random(args.seed)
    ctx = mp.get_context(args.start_method)
    chaos = args.chaos and not args.redis_url
    tag = f"stress-tiered-{os.getpid()}"
    names = key_names(args.keys)
    host_names = [f"{tag}-h{h}" for h in range(args.hosts)]
    namespace = f"stress-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    counts = ctx.RawArray("q", args.hosts * args.procs * NF)
    # Per host and key: when a worker of the host last wrote the key locally only, and the version of the copy
    # that left (-1: unknown, the worker was killed in the write).
    local_only = (ctx.RawArray("d", args.hosts * len(names)), ctx.RawArray("q", args.hosts * len(names)))
    phase = ctx.RawValue("b", RUN)
    server = cluster = observer = obs_local = fleet = None
    locals_: list[SharedCache] = []
    down: list = []
    hangs = outages = 0
    wrong_final = divergent = excused = 0
    counters, settling, converged_in, elapsed = "skipped", 0, 0.0, 0.0
    stats: dict = {}
    redis_kind = "url" if args.redis_url else "cluster" if args.cluster else "server"
    try:
        if args.redis_url:
            url = args.redis_url
        elif args.cluster:
            cluster = RedisClusterServers()
            url = cluster.url
        else:
            server = RedisServer(tcp=True)
            url = server.url
        nodes = cluster.nodes if cluster else [server] if server else []
        if cluster and args.victims == "unsubscribed":
            nodes = [n for n in nodes if n.port != subscribed_port(url, namespace)]
        cfg = dict(url=url, cluster=args.cluster, namespace=namespace, hosts=host_names, procs=args.procs,
                   keys=args.keys, max_value_bytes=args.max_value_bytes, max_age=args.max_age, timeout=args.timeout,
                   retry_interval=args.retry_interval, lock_lease=args.lock_lease, seed=args.seed,
                   verbose=args.verbose)
        for name in host_names:
            locals_.append(SharedCache(name, capacity_bytes=args.capacity_bytes, max_entries=args.max_entries,
                                       create=True))
        events = []
        for s, e in outage_schedule(rng, args.seconds, args.outages if chaos else 0):
            events += [(s, "down"), (e, "up")]
        events += [(rng.uniform(*KILL_SPAN) * args.seconds, "kill") for _ in range(args.kills)]
        events += [(rng.uniform(*KILL_SPAN) * args.seconds, "stop") for _ in range(args.stops)]
        events.sort()
        fleet = Fleet(ctx, cfg, rng, counts, local_only, phase, chaos)
        for row in range(len(fleet.procs)):
            fleet.spawn(row)
        t0, wall0 = time.monotonic(), time.time()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(POLL_SECONDS)
            fleet.continue_due()
            fleet.replace_crashed()
            if fleet.stalled():
                hangs += 1
                print(f"no progress for {HANG_SECONDS:g} s; worker stacks follow", file=sys.stderr, flush=True)
                fleet.dump_stacks()
                break
            while events and events[0][0] <= time.monotonic() - t0:
                _, what = events.pop(0)
                if what == "down":
                    node = rng.choice(nodes)
                    node.stop(keep_directory=True)
                    down.append(node)
                    outages += 1
                    print(f"outage {outages}: Redis :{node.port} stopped at +{time.monotonic() - t0:.2f} s",
                          file=sys.stderr, flush=True)
                elif what == "up":
                    while down:
                        node = down.pop()
                        node.start()
                        print(f"outage {outages}: Redis :{node.port} started again at +{time.monotonic() - t0:.2f} s",
                              file=sys.stderr, flush=True)
                elif what == "stop":
                    fleet.stop_one(STOP_LEASES * args.lock_lease)
                else:
                    fleet.kill_one()
        fleet.continue_due(every=True)
        elapsed = time.monotonic() - t0
        while down:
            down.pop().start()
        hangs += fleet.quiesce()
        # Workers idle but listening: the invalidations in flight land; then every copy must agree with Redis.
        obs_local = SharedCache(f"{tag}-observer", capacity_bytes=1 << 20, max_entries=256, create=True)
        observer = open_tier(cfg, obs_local, strict=True)
        left, settling, converged_in = converge(observer, locals_, names)
        divergent, excused = judge(left, local_only, names, args.max_age, wall0, observer if cluster else None)
        wrong_final = intact(observer, locals_, names, args.keys)
        if not chaos:
            try:
                counters = "ok" if check_counters(observer, fleet, names) else "FAILED"
            except RemoteError as exc:
                counters = "FAILED"
                print(f"counters unreadable: {exc}", file=sys.stderr)
        phase.value = EXIT
        stuck = reap(fleet.procs, JOIN_SECONDS)
        hangs += len(stuck)
        for p in fleet.procs:
            if p not in stuck and p.exitcode != 0:
                fleet.crashes += 1
                print(f"worker {p.pid} exited with status {p.exitcode}", file=sys.stderr)
        for name in host_names:
            s = host_stats(name, namespace)
            for f in ("remote_errors", "local_only_puts", "invalidations", "stale_fills", "listener_starts",
                      "lock_waits", "lock_takeovers", "computations"):
                stats[f] = stats.get(f, 0) + getattr(s, f)
    finally:
        phase.value = EXIT
        if fleet is not None:
            reap([p for p in fleet.procs if p is not None] + fleet.dead, 5.0)
        for node in down:
            try:
                node.start()
            except Exception:
                pass
        if observer is not None:
            if args.redis_url:
                try:
                    observer.clear()  # leave nothing of this run in someone else's Redis
                except RemoteError as exc:
                    print(f"could not clear namespace {namespace!r}: {exc}", file=sys.stderr)
            observer.close()
            observer.unlink()
        if obs_local is not None:
            obs_local.close()
            unlink_quietly(obs_local.name)
        for local in locals_:
            local.close()
        for name in host_names:
            unlink_quietly(name)
            try:
                os.unlink(f"/dev/shm/{segment_name(name, namespace)}")
            except FileNotFoundError:
                pass
        if cluster is not None:
            cluster.stop()
        if server is not None:
            server.stop()
    ops = fleet.total(OPS)
    wrong = fleet.total(WRONG) + wrong_final
    errors = fleet.total(ERRORS)
    if any(fleet.kills.values()):
        print("kills: " + " ".join(f"{aim}={n}" for aim, n in fleet.kills.items()), file=sys.stderr)
    if any(fleet.stops.values()):
        print("stops: " + " ".join(f"{aim}={n}" for aim, n in fleet.stops.items()), file=sys.stderr)
    return finish("tiered", {
        "ops": ops, "ops_s": round(ops / elapsed) if elapsed else 0, "wrong": wrong, "divergent": divergent,
        "excused": excused, "errors": errors, "refused": fleet.total(REFUSED), "counters": counters,
        "hangs": hangs, "crashes": fleet.crashes, "kills": sum(fleet.kills.values()),
        "stops": sum(fleet.stops.values()), "outages": outages,
        "remote_errors": stats.get("remote_errors", 0), "local_only_puts": stats.get("local_only_puts", 0),
        "invalidations": stats.get("invalidations", 0), "stale_fills": stats.get("stale_fills", 0),
        "listener_starts": stats.get("listener_starts", 0), "lock_waits": stats.get("lock_waits", 0),
        "takeovers": stats.get("lock_takeovers", 0),
        "computations": stats.get("computations", 0), "settling": settling, "converged_s": round(converged_in, 1),
        "seconds": round(elapsed, 1), "hosts": args.hosts, "procs": args.procs, "redis": redis_kind,
    }, args.json, failed=bool(wrong or divergent or errors or hangs or fleet.crashes
                              or counters == "FAILED"))


if __name__ == "__main__":
    sys.exit(main())
