"""Functions run in child processes by the multi-process tests (module level, so every start method can import
them), and the self-checking values they exchange."""

from __future__ import annotations

import functools
import os
import random
import signal
import time

import numpy as np
import xxhash

from shmcache import SharedCache, core, index
from shmcache.codec import encode_key, fingerprint
from shmcache.guard import Guard
from shmcache.layout.dtypes import D_IDLE_ON, S_OPEN, STRIPE_WORDS
from shmcache.view import PinDescriptions


def python_path(cache: SharedCache) -> SharedCache:
    """Run handle ``cache`` on the pure-Python path from now on, whatever is built (the reference the compiled
    section is held to): no Core, and views pinned through view.PinDescriptions, as in a build without _core."""
    if cache._core is not None:
        cache._core.release()
        cache._core = None
        cache._pins.close()
        cache._pins = PinDescriptions(cache._seg.fd)
        cache._path = core.Reference(cache._guard, cache._store, cache._seg.arena, cache._seg.geometry.arena_off)
    return cache


class FakeClock:
    """A CLOCK_MONOTONIC stand-in the test moves by hand (ns): conftest's ``clock`` fixture, given to the handles a
    test opens as their ``clock``."""

    def __init__(self) -> None:
        self.now = 1_000 * 10**9

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * 10**9)


def laid_out_as(monkeypatch, version: int) -> None:
    """Segments created from here on are laid out as layout ``version`` laid them out (their version word says it
    too), as a process of that release made them; ``monkeypatch.undo()`` ends it."""
    from shmcache import layout

    made = layout.Geometry.for_capacity.__func__

    def as_version(cls, capacity_bytes, max_entries, policy=0, version=version):
        return made(cls, capacity_bytes, max_entries, policy, version)

    monkeypatch.setattr(layout.Geometry, "for_capacity", classmethod(as_version))


def stripes_at_rest(cache: SharedCache) -> tuple[int, int]:
    """The byte range of ``cache``'s stripes' words, for a comparison of two segments to leave out, after checking
    that they are at rest: no stripe open and every word even. Their values are generations, which differ between
    the paths where the compiled section hands a call over (two holds where the reference makes one), as ``seq``'s
    do."""
    g, words = cache._seg.geometry, cache._seg.stripe_words
    if words is not None:
        w = np.frombuffer(words, dtype=np.int64)
        assert w[S_OPEN] == 0 and not (w[STRIPE_WORDS::STRIPE_WORDS] & 1).any(), "a stripe left open"
    return g.stripes_off, g.stripes_off + g.stripes_nbytes


def versioned(cache: SharedCache) -> SharedCache:
    """``cache`` with its versions column switched on now (layout 16 backs it once a caller asks for a version),
    so that its views run the compiled path from the first, and twins that compare byte for byte both have it."""
    cache._guard.run(cache._store.show_versions)
    return cache


def switch_word_damage_is_repaired(name: str, word: int, key, value, **kw) -> None:
    """A handle of its own on cache ``name`` damages word ``word`` of the idle region (layout 16's D_IDLE_ON or
    D_VERSIONS_ON, a lazy column's switch) to a value other than 0 and 1: verify reports it, the repair sets it to 1
    (the column in use), and ``key`` still reads ``value``."""
    with SharedCache(name, create=False, **kw) as c:
        c._seg.idle_words[word] = 7
        report = c.verify()
        assert not report.ok and any("is 7, not 0 or 1" in p for p in report.problems), report.problems
        c.verify(repair_damage=True)
        assert c._seg.idle_words[word] == 1 and c.verify().ok and c[key] == value
        # (and the repair shows each lazy column only where its own word says it is in use)
        assert c._seg.idle_shown == bool(c._seg.idle_words[D_IDLE_ON])


def entry_of(cache: SharedCache, key) -> int:
    """The entry slot that holds ``key`` in ``cache``'s segment (layout.EMPTY if none): found by the index, as a
    lookup finds it, so that a test can reach one key's entry whatever order the policy keeps."""
    kb = encode_key(key)
    xo = index.of(cache._seg.geometry)
    return xo.find(cache._ix, cache._seg.records, cache._mm, cache._base, cache._mask, fingerprint(kb), kb)


def pinned(cache: SharedCache, key) -> bool:
    """Whether a view (of any process) pins the entry that holds ``key`` now, asked as a writer asks
    (``Table.pinned_now``: the flag, then the kernel's lock and the reader slots' words). A test's probe of a pin
    that writes nothing: from layout version 12 a put of a pinned key succeeds (the entry is held aside)."""
    e = entry_of(cache, key)
    return e != index.EMPTY and cache._table.pinned_now(e)


def reap(procs, timeout: float = 60) -> None:
    """Join each child, killing any still running after ``timeout`` s: no child outlives its test."""
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join(5)


def start_and_collect(procs, queue, timeout: float = 60) -> list:
    """Start the children, take one result from each off ``queue`` (each within ``timeout`` s), then reap them, also
    when a result does not come."""
    for p in procs:
        p.start()
    try:
        return [queue.get(timeout=timeout) for _ in procs]
    finally:
        reap(procs, timeout)


class CountingCore:
    """A handle's compiled section (``SharedCache._path``, a Core) with its batch calls listed in ``calls``: each
    takes the lock once, in C, where the Python path's batch goes through ``Guard.run`` once."""

    def __init__(self, core, calls: list) -> None:
        self.core, self.calls = core, calls

    def __getattr__(self, name):  # get, put, delete, release: as they are
        return getattr(self.core, name)

    def get_many(self, *args):
        self.calls.append("Core.get_many")
        return self.core.get_many(*args)

    def put_many(self, *args):
        self.calls.append("Core.put_many")
        return self.core.put_many(*args)


def count_lock_holds(monkeypatch, handle: SharedCache) -> list:
    """A list that each hold of ``handle``'s lock appends to from now on (every ``Guard.run``, and each batch call into
    the compiled section, which takes the lock once), for the test's ``monkeypatch`` to undo."""
    holds: list = []
    real = Guard.run

    def counted(self, fn, *args, **kwargs):
        holds.append(fn)
        return real(self, fn, *args, **kwargs)

    monkeypatch.setattr(Guard, "run", counted)
    if handle._core is not None:
        monkeypatch.setattr(handle, "_path", CountingCore(handle._path, holds))
    return holds


def make_value(key: str, seq: int, nbytes: int):
    """A value that names its key and carries a checksum, so a wrong or torn read is caught."""
    pad = bytes((seq + i) % 251 for i in range(nbytes))
    body = f"{key}|{seq}".encode() + pad
    if seq % 5 == 0:
        arr = np.frombuffer(pad, dtype=np.uint8).copy()
        return {"key": key, "seq": seq, "arr": arr, "sum": xxhash.xxh3_64_intdigest(body)}
    return {"key": key, "seq": seq, "pad": pad, "sum": xxhash.xxh3_64_intdigest(body)}


def check_value(key: str, value) -> None:
    """Raise AssertionError unless ``value`` is one that make_value built for ``key``."""
    assert isinstance(value, dict) and value["key"] == key, f"value for {value.get('key')!r} under key {key!r}"
    pad = value["arr"].tobytes() if "arr" in value else value["pad"]
    body = f"{key}|{value['seq']}".encode() + pad
    assert xxhash.xxh3_64_intdigest(body) == value["sum"], f"torn value under key {key!r}"
    assert pad == bytes((value["seq"] + i) % 251 for i in range(len(pad))), f"wrong bytes under key {key!r}"


def make_varied_value(key: str, seq: int):
    """A value of many shapes (nested dicts, lists, tuples, arrays, strings) that names its key and carries a
    checksum of its contents: what a store from a signal handler must not mix up with the value being encoded."""
    n = seq % 9
    shapes = (
        lambda: {"t": tuple(range(n)), "rows": [{"i": i, "s": str(i) * n} for i in range(n + 2)]},
        lambda: [(i, (i, (str(i),))) for i in range(n + 3)],
        lambda: "x" * (seq % 500) + key,
        lambda: {"a": np.arange(n + 5, dtype=np.int32), "b": [np.full(3, seq, dtype=np.float64), (n, "t")]},
        lambda: ((((seq,),),), [(), (1,), {"k": (key, n)}]),
        lambda: [np.arange(n, dtype=np.uint8).reshape(1, n), {"d": {"e": [n, (n,)]}}],
    )
    payload = shapes[seq % len(shapes)]()
    return {"key": key, "seq": seq, "payload": payload, "sum": xxhash.xxh3_64_intdigest(_canonical(payload))}


def _canonical(x) -> bytes:
    """Bytes that differ whenever two payloads of make_varied_value differ (types, dtypes and shapes included)."""
    if isinstance(x, np.ndarray):
        return b"A" + x.dtype.str.encode() + repr(x.shape).encode() + x.tobytes()
    if isinstance(x, (list, tuple)):
        return (b"L" if isinstance(x, list) else b"T") + b"".join(_canonical(i) + b"," for i in x) + b"]"
    if isinstance(x, dict):
        return b"D" + b"".join(_canonical(k) + b":" + _canonical(v) + b"," for k, v in x.items()) + b"}"
    return type(x).__name__.encode() + repr(x).encode()


def check_varied_value(key: str, value, seq: int | None = None) -> None:
    """Raise AssertionError unless ``value`` is what make_varied_value built for ``key`` (and ``seq``, if given)."""
    assert isinstance(value, dict) and value.get("key") == key, f"value {value!r:.200} under key {key!r}"
    assert seq is None or value["seq"] == seq, f"seq {value['seq']} under key {key!r}, expected {seq}"
    want = make_varied_value(key, value["seq"])
    assert xxhash.xxh3_64_intdigest(_canonical(value["payload"])) == value["sum"] == want["sum"], \
        f"torn value under key {key!r}"
    assert _canonical(value["payload"]) == _canonical(want["payload"]), f"wrong payload under key {key!r}"


def mixed_workload(cache, worker: int, ops: int, keys: int, seed: int) -> dict:
    """Random get/put/delete on shared keys, checking every value read; returns this worker's own counts."""
    rng = random.Random(seed * 1000 + worker)
    counts = dict(hits=0, misses=0, puts=0, deletes=0, wrong=0)
    for i in range(ops):
        key = f"k{rng.randrange(keys)}"
        r = rng.random()
        if r < 0.6:
            v = cache.get(key)
            if v is None:
                counts["misses"] += 1
            else:
                counts["hits"] += 1
                try:
                    check_value(key, v)
                except AssertionError:
                    counts["wrong"] += 1
        elif r < 0.95:
            cache.put(key, make_value(key, worker * ops + i, rng.randrange(0, 600)))
            counts["puts"] += 1
        else:
            counts["deletes"] += cache.delete(key)
    return counts


def workload_child(name: str, worker: int, ops: int, keys: int, seed: int, queue) -> None:
    with SharedCache(name, create=False) as cache:
        queue.put(mixed_workload(cache, worker, ops, keys, seed))


def workload_on_handle(cache, worker: int, ops: int, keys: int, seed: int, queue) -> None:
    """Same, on a handle inherited through fork or pickled to a spawned child."""
    queue.put(mixed_workload(cache, worker, ops, keys, seed))
    cache.close()


def open_and_put(name: str, worker: int, barrier, queue, mode: int = 0o600) -> None:
    """Wait at the barrier, then race the other workers to open-or-create the cache and write one entry."""
    barrier.wait(timeout=30)
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=64, mode=mode) as cache:
        cache.put(f"w{worker}", worker)
        queue.put(worker)


def stop_mid_put(name: str, key: str, value) -> None:
    """Put ``key`` on the Python path, and SIGSTOP this process in the middle of it: just after the store opened
    its first stripe (the key's: the cache has room, so nothing is evicted), the lock held and ``dirty`` raised.
    Once continued, the put goes on to its end."""
    from shmcache import table

    cache = python_path(SharedCache(name, create=False))
    opened = table.open_stripe

    def then_stop(*args) -> None:
        opened(*args)
        table.open_stripe = opened
        os.kill(os.getpid(), signal.SIGSTOP)

    table.open_stripe = then_stop
    cache.put(key, value)
    cache.close()


def hold_lock(name: str, ready, release=None, then: str = "sleep") -> None:
    """Take the cache lock and keep it: sleep forever (to be killed), or release when told, or die holding it."""
    cache = SharedCache(name, create=False)
    cache._guard.hold()
    ready.set()
    if then == "exit":
        os._exit(0)  # dies holding the lock, without any cleanup
    if release is not None:
        release.wait(timeout=60)
        cache._guard.let_go()
        cache.close()
        return
    time.sleep(120)


def half_put_then_die(name: str, ready) -> None:
    """Take the lock and leave a put half done: the entry is in the index and the arena but not on the LRU list,
    and the counters were not updated; then get SIGKILLed."""
    from shmcache import index
    from shmcache.codec import checksum, encode_key, encode_value, fingerprint
    from shmcache.arena import block_nbytes
    from shmcache.layout.dtypes import H_DIRTY, H_FREE_HEAD, H_UNUSED_NEXT

    cache = SharedCache(name, create=False)
    rec = cache._seg.records
    cache._guard.hold()
    cache._h[H_DIRTY] = 1  # as put() does before its first write
    kb, vb = encode_key("torn"), encode_value("half-written")
    e = cache._h[H_FREE_HEAD] or cache._h[H_UNUSED_NEXT]  # the slot Table.insert would take
    if e == cache._h[H_FREE_HEAD]:
        cache._h[H_FREE_HEAD] = rec.next[e]
    else:
        cache._h[H_UNUSED_NEXT] = e + 1
    off = cache._table.ring.alloc(block_nbytes(len(kb) + len(vb)), e)
    if rec.fp is not None:  # (a narrow record keeps no fingerprint: the index slot's tag, written below, holds it)
        rec.fp[e] = fingerprint(kb)
    rec.off[e] = off >> rec.osh
    rec.klen[e] = len(kb)
    rec.vlen[e] = len(vb)
    rec.check[e] = checksum(vb)
    index.of(cache._seg.geometry).insert(cache._ix, rec, cache._mask, fingerprint(kb), e)
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def repair_slowly(name: str, ready, seconds: float, progress: bool = True) -> None:
    """Hold the lock as a long repair does (dirty word at its repairing value; with ``progress``, the progress word
    moved every 10 ms, as the repair's walk moves it), then finish cleanly."""
    from shmcache.guard import _REPAIRING
    from shmcache.layout.dtypes import H_DIRTY, H_PROGRESS

    cache = SharedCache(name, create=False)
    cache._guard.hold()
    cache._h[H_DIRTY] = _REPAIRING
    ready.set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
        if progress:
            cache._h[H_PROGRESS] += 1
    cache._h[H_DIRTY] = 0
    cache._guard.let_go()
    cache.close()


def memo_slow_square(name: str, x: int) -> int:
    """A Pool task: x * x through a memoized function of the cache ``name`` (opened here, in the worker)."""
    with SharedCache(name, create=False) as cache:
        return cache.memoize(_slow_square)(x)


def _slow_square(x: int) -> int:
    time.sleep(0.05)  # long enough for other workers to ask for the same x meanwhile
    return x * x


def memo_partial(name: str, x: int) -> tuple[bytes, int, tuple]:
    """A memoized ``functools.partial(scaled_sum, 2, scale=10)`` of the cache ``name``, called with ``x``: the call's
    encoded key, its result and the wrapper's ``cache_info()`` (a key made here must be the parent's)."""
    with SharedCache(name, create=False) as cache:
        f = cache.memoize(functools.partial(scaled_sum, 2, scale=10))
        return encode_key(f.key_of((x,), {})), f(x), tuple(f.cache_info())


def scaled_sum(a: int, b: int, scale: int = 1) -> int:
    return (a + b) * scale


def put_and_die_at(name: str, func: str, marker: str, key: str, value, ttl) -> None:
    """``put(key, value, ttl)``, SIGKILLed when ``shmcache.table.Table.<func>`` reaches its first line containing
    ``marker``: a store cut short at an exact point of its crash window."""
    import inspect
    import sys

    from shmcache.table import Table

    fn = getattr(Table, func)
    lines, first = inspect.getsourcelines(fn)
    target = first + next(i for i, line in enumerate(lines) if marker in line)
    code = fn.__code__

    def trace(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == target:
            os.kill(os.getpid(), signal.SIGKILL)
        return trace

    # The Python path's crash windows are the ones traced (the compiled section has its own tests).
    cache = python_path(SharedCache(name, create=False))
    sys.settrace(trace)
    cache.put(key, value, ttl=ttl)
    sys.settrace(None)
    os._exit(3)  # the marker was never reached


def _get_set_in_child(cache, parent_handle, queue) -> None:
    try:
        value = cache.get("from-parent")
        queue.put(("value", value, cache._cache is not parent_handle, os.getpid()))
        cache.set("from-child", {"pid": os.getpid()})
    except BaseException as exc:  # reported, not lost
        queue.put(("error", repr(exc), False, os.getpid()))


def check_backend_reopens_after_fork(cache) -> None:
    """A framework backend (contrib/django, contrib/flask) used in a forked child: the child reads the parent's value
    through a handle of its own and writes one back; the parent keeps its handle."""
    import multiprocessing as mp

    cache.set("from-parent", "hello")
    parent_handle = cache._cache
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_get_set_in_child, args=(cache, parent_handle, queue))
    child.start()
    try:
        kind, value, reopened, pid = queue.get(timeout=30)
    finally:
        reap([child], 30)
    assert (kind, value, reopened) == ("value", "hello", True)
    assert cache.get("from-child") == {"pid": pid} and cache._cache is parent_handle
