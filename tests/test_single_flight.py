"""get_or_compute: one computation per key across processes and threads, takeover when the computer raises or
dies, bounded waits. Every child reports what it got; values carry their key and a checksum."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
import struct
import sys
import threading
import time

import pytest

from shmcache import ComputeTimeout, ReentrantCallError, SharedCache, TooLargeWarning

from .workers import check_value, make_value

JOIN_S = 60
ctx = mp.get_context("fork")


def _patch_sleep_to_signal(event) -> None:
    """In a child: set ``event`` when get_or_compute first pauses to wait for another caller's claim (it waits by
    sleeping between polls), so the parent knows the child is waiting, without guessing a delay. Only the flight
    module's clock is replaced: other sleeps (a concurrent attach polls its flock) must not set the event."""
    from types import SimpleNamespace

    from shmcache import flight

    def sleep(seconds):
        event.set()
        time.sleep(seconds)

    flight.time = SimpleNamespace(sleep=sleep, monotonic=time.monotonic)


def _child_compute(name, key, started, go, outcome, queue, waiting=None, timeout=None):
    """get_or_compute(key) whose function announces ``started``, waits for ``go``, then returns a checkable value
    (``outcome == "value"``), raises ValueError (``"raise"``) or never returns (``"hang"``)."""
    if waiting is not None:
        _patch_sleep_to_signal(waiting)

    def fn():
        started.set()
        if outcome == "hang":
            while True:
                time.sleep(1)
        go.wait(JOIN_S)
        if outcome == "raise":
            raise ValueError("computation failed")
        return make_value(key, os.getpid() % 1000, 64)

    try:
        with SharedCache(name, create=False) as c:
            value = c.get_or_compute(key, fn, timeout=timeout)
        check_value(key, value)
        queue.put(("value", os.getpid(), value["seq"]))
    except BaseException as exc:
        queue.put((type(exc).__name__, os.getpid(), str(exc)))


def _start(target, *args):
    p = ctx.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def _reap(procs):
    for p in procs:
        p.join(JOIN_S)
        if p.is_alive():
            p.kill()
            p.join(5)
            pytest.fail(f"process {p.pid} did not finish")


@pytest.fixture
def shared(name):
    c = SharedCache(name, capacity_bytes=1 << 20, max_entries=64, create=True)
    yield c
    c.close()


def _stats(c):
    s = c.stats()
    return dict(computations=s.computations, waits=s.waits, takeovers=s.takeovers, hits=s.hits, misses=s.misses)


def _computer(name, key, outcome):
    """A child inside the computation of ``key`` (``outcome`` as in _child_compute), held there until ``go``."""
    started, go, queue = ctx.Event(), ctx.Event(), ctx.Queue()
    computer = _start(_child_compute, name, key, started, go, outcome, queue)
    assert started.wait(JOIN_S)
    return computer, go, queue


@pytest.mark.timeout(120)
def test_flight_many_processes_compute_once(name, shared):
    n = 4
    waiting = [ctx.Event() for _ in range(n - 1)]
    computer, go, queue = _computer(name, "k", "value")
    waiters = [_start(_child_compute, name, "k", ctx.Event(), go, "value", queue, w) for w in waiting]
    for w in waiting:
        assert w.wait(JOIN_S)  # every waiter is waiting before the computation is allowed to finish
    go.set()
    results = [queue.get(timeout=JOIN_S) for _ in range(n)]
    _reap([computer, *waiters])
    assert {r[0] for r in results} == {"value"}
    assert len({r[2] for r in results}) == 1  # everyone got the one computed value
    assert _stats(shared) == dict(computations=1, waits=n - 1, takeovers=0, hits=n - 1, misses=1)


def _computer_and_waiter(name, outcome):
    """A child computing "k" (``outcome`` as in _child_compute) and a second child already waiting for it."""
    waiting = ctx.Event()
    computer, go, queue = _computer(name, "k", outcome)
    waiter = _start(_child_compute, name, "k", ctx.Event(), go, "value", queue, waiting)
    assert waiting.wait(JOIN_S)
    return computer, waiter, go, queue


@pytest.mark.timeout(120)
def test_flight_computer_raises_and_a_waiter_takes_over(name, shared):
    computer, waiter, go, queue = _computer_and_waiter(name, "raise")
    go.set()
    results = {r[1]: r for r in (queue.get(timeout=JOIN_S) for _ in range(2))}
    _reap([computer, waiter])
    assert results[computer.pid][0] == "ValueError"  # the computer gets its own exception
    assert results[waiter.pid][0] == "value"
    assert _stats(shared)["computations"] == 2 and _stats(shared)["takeovers"] == 1
    check_value("k", shared.get("k"))


@pytest.mark.timeout(120)
def test_flight_computer_killed_and_a_waiter_takes_over(name, shared):
    computer, waiter, go, queue = _computer_and_waiter(name, "hang")
    os.kill(computer.pid, signal.SIGKILL)
    go.set()
    kind, pid, _ = queue.get(timeout=JOIN_S)  # bounded: the kernel freed the key when the computer died
    _reap([computer, waiter])
    assert (kind, pid) == ("value", waiter.pid)
    s = _stats(shared)
    assert s["takeovers"] == 1 and s["computations"] == 2
    check_value("k", shared.get("k"))


@pytest.mark.timeout(120)
def test_flight_wait_times_out_with_a_clear_error(name, shared):
    computer, go, queue = _computer(name, "k", "value")
    try:
        with pytest.raises(ComputeTimeout, match="computing this key") as info:
            shared.get_or_compute("k", lambda: pytest.fail("the key is claimed"), timeout=0.2)
        assert isinstance(info.value, TimeoutError)
    finally:
        go.set()
    assert queue.get(timeout=JOIN_S)[0] == "value"
    _reap([computer])


@pytest.mark.timeout(120)
def test_flight_other_keys_are_not_blocked(name, shared):
    computer, go, queue = _computer(name, "slow", "value")
    try:
        # "slow" is being computed and cannot finish before go is set: another key goes through meanwhile.
        assert shared.get_or_compute("other", lambda: 42) == 42
        assert shared.get("other") == 42 and not go.is_set()
        assert _stats(shared)["waits"] == 0
    finally:
        go.set()
    assert queue.get(timeout=JOIN_S)[0] == "value"
    _reap([computer])


def test_flight_hit_does_not_call_the_function(shared):
    shared.put("k", 1)
    assert shared.get_or_compute("k", lambda: pytest.fail("must not run")) == 1
    assert _stats(shared) == dict(computations=0, waits=0, takeovers=0, hits=1, misses=0)


def test_flight_miss_computes_stores_and_counts(shared):
    assert shared.get_or_compute("k", lambda: {"v": [1, 2]}) == {"v": [1, 2]}
    assert shared.get("k") == {"v": [1, 2]}
    assert _stats(shared) == dict(computations=1, waits=0, takeovers=0, hits=1, misses=1)


def test_flight_exception_propagates_and_nothing_is_stored(shared):
    with pytest.raises(KeyError):
        shared.get_or_compute("k", lambda: {}["missing"])
    assert "k" not in shared
    assert shared.get_or_compute("k", lambda: 7) == 7  # the claim was released


def test_flight_recursive_same_key_is_refused_other_keys_work(shared):
    def outer():
        inner = shared.get_or_compute("inner", lambda: 1)
        with pytest.raises(RuntimeError, match="same key") as info:
            shared.get_or_compute("outer", lambda: 2)
        assert isinstance(info.value, ReentrantCallError) and info.value.what == "get_or_compute"
        return inner + 10

    assert shared.get_or_compute("outer", outer) == 11


def test_flight_too_large_result_is_returned_not_stored(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=4, create=True) as c:
        big = b"x" * 10_000
        with pytest.warns(TooLargeWarning, match=r"a value of 10,004 bytes .* capacity_bytes is 4,096 bytes"):
            assert c.get_or_compute("big", lambda: big) == big
        assert "big" not in c
        assert c.stats().too_large == 1


@pytest.mark.timeout(60)
def test_flight_threads_of_one_process_compute_once(shared):
    calls = []
    barrier = threading.Barrier(6)
    release = threading.Event()
    results = []

    def fn():
        calls.append(1)
        release.wait(30)
        return make_value("k", 3, 32)

    def worker():
        barrier.wait(30)
        results.append(shared.get_or_compute("k", fn, timeout=30))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not calls and time.monotonic() < deadline:  # wait until one thread is inside fn
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert len(calls) == 1 and len(results) == 6
    for v in results:
        check_value("k", v)


def test_flight_counters_reset_by_clear(shared):
    shared.get_or_compute("k", lambda: 1)
    shared.clear()
    assert _stats(shared)["computations"] == 0


@pytest.mark.timeout(120)
def test_flight_racing_close_raises_closed_error_and_never_touches_a_reused_descriptor(name, tmp_path):
    """close() in another thread while get_or_compute misses: the call raises ClosedError, never an OSError, and
    never opens (nor locks) a file the application opened since under the closed handle's descriptor number."""
    errors: dict = {}
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the window is a few bytecodes
    try:
        for trial in range(150):
            c = SharedCache(name, capacity_bytes=65536, max_entries=64, create=trial == 0)
            started = threading.Event()

            def miss_until_closed() -> None:
                i = 0
                started.set()
                while True:
                    try:
                        c.get_or_compute(f"t{trial}-{i}", lambda: i)
                    except Exception as exc:
                        errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                        return
                    i += 1

            worker = threading.Thread(target=miss_until_closed)
            worker.start()
            started.wait(10)
            time.sleep(0.0002 * (trial % 7))
            c.close()
            decoys = [open(tmp_path / f"decoy{j}", "w+b") for j in range(8)]  # take the freed numbers
            worker.join(30)
            assert not worker.is_alive()
            for f in decoys:  # nobody holds an OFD lock on any decoy
                probe = os.open(f.name, os.O_RDWR | os.O_CLOEXEC)
                try:
                    lk = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
                    got = struct.unpack("hhqqi", fcntl.fcntl(probe, fcntl.F_OFD_GETLK, lk))
                finally:
                    os.close(probe)
                f.close()
                assert got[0] == fcntl.F_UNLCK, f"a claim locked {f.name}"
    finally:
        sys.setswitchinterval(old)
    assert set(errors) == {"ClosedError"}, errors


@pytest.mark.timeout(60)
def test_a_claim_registry_left_held_delays_claims_and_forks_never_hangs_them(cache, monkeypatch):
    """The registry of claim descriptions (flight._REGISTRY), held by a thread that never lets go (as an exception
    from a signal handler can leave a lock on CPython 3.14: memo.Tally says how), delays another thread's claims and
    forks by flight._REGISTRY_WAIT_S at most: they go on without it, every value right, the claims released."""
    from shmcache import flight

    monkeypatch.setattr(flight, "_REGISTRY_WAIT_S", 0.2)
    monkeypatch.setattr(flight, "_REGISTRY", threading.RLock())  # (a waited-for registry is replaced: ours goes)
    held, done = threading.Event(), threading.Event()
    registry = flight._REGISTRY

    def hold() -> None:
        registry.acquire()  # and never released while the test runs
        held.set()
        done.wait(30)
        registry.release()

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        assert cache.get_or_compute("k", lambda: make_value("k", 1, 100)) is not None
        check_value("k", cache.get("k"))
        pid = os.fork()
        if pid == 0:  # (the child: the hooks ran, nothing waited for ever; a hang here dies with the alarm)
            signal.alarm(20)
            os._exit(0 if cache.get("k") is not None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert time.monotonic() - started < 10
        # every claim's description closed (its lock with it), though opened without the registry's lock
        assert all(ref() is None or ref().closed for ref in list(flight._HELD.values()))
    finally:
        done.set()
        t.join(10)
    assert cache.get_or_compute("j", lambda: make_value("j", 2, 100)) is not None  # and the registry works again


def test_flight_a_registry_left_held_costs_one_wait_not_one_per_claim(name, monkeypatch):
    """A claim registry an interrupt left held (simulated: a thread took it and ended without giving it back) is
    waited for once, for _REGISTRY_WAIT_S (made short here), then replaced: the claims after it take the new one,
    and every get_or_compute computes and stores as before. (Each open is made under the cache lock, so a registry
    waited for at every claim would stall every process of the host.)"""
    from shmcache import flight

    monkeypatch.setattr(flight, "_REGISTRY", threading.RLock())
    monkeypatch.setattr(flight, "_REGISTRY_WAIT_S", 0.05)
    left = flight._REGISTRY
    taker = threading.Thread(target=left.acquire)
    taker.start()
    taker.join()
    with SharedCache(name, capacity_bytes=1 << 20, create=True) as c:
        try:
            assert c.get_or_compute("a", lambda: make_value("a", 1, 64)) == make_value("a", 1, 64)
            fresh = flight._REGISTRY
            assert fresh is not left  # replaced after one wait
            for i in range(5):
                check_value(f"k{i}", c.get_or_compute(f"k{i}", lambda i=i: make_value(f"k{i}", i, 64)))
            assert flight._REGISTRY is fresh  # (not replaced again: each later claim had the new one at once)
            assert c.stats().computations == 6 and c.verify().ok
        finally:
            c.unlink()
