"""The cross-process lock: dead holders are taken over, live ones time out, waiting does not spin, threads and
processes are excluded from each other."""

from __future__ import annotations

import multiprocessing as mp
import os
import pathlib
import re
import signal
import threading
import time

import pytest

from shmcache import ClosedError, LockTimeout, ReentrantCallError, SharedCache, ShmCacheError
from tests.workers import check_value, half_put_then_die, hold_lock, make_value, repair_slowly

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(60)]
# lru: every get and view takes the lock there, so that a read can show how the lock is waited for (under the
# policies that read without it, a read waits for nothing: tests/test_unlocked.py).
SMALL = dict(capacity_bytes=1 << 16, max_entries=64, policy="lru")


def _start(target, *args, method="fork"):
    ctx = mp.get_context(method)
    ready = ctx.Event()
    p = ctx.Process(target=target, args=(*args[:1], ready, *args[1:]))
    p.start()
    assert ready.wait(timeout=30), "child never took the lock"
    return p, ctx


def _reap(p) -> None:
    if p.is_alive():
        p.kill()
    p.join(timeout=10)


def test_lock_holder_killed_is_taken_over(name):
    with SharedCache(name, **SMALL) as c:
        c.put("k", make_value("k", 1, 50))
        p, _ = _start(hold_lock, name)
        try:
            os.kill(p.pid, signal.SIGKILL)
            p.join(timeout=10)
            # The kernel reports the dead holder to the very first trylock, so even a handle that gives up on a
            # busy lock almost at once gets it: no waiting, hence no timing in this test.
            with SharedCache(name, lock_timeout=0.001) as impatient:
                check_value("k", impatient.get("k"))
            assert c.verify().ok
        finally:
            _reap(p)


def test_lock_holder_exiting_without_release_is_taken_over(name):
    with SharedCache(name, **SMALL) as c:
        p, _ = _start(hold_lock, name, None, "exit")
        try:
            p.join(timeout=10)
            c.put("after", 1)
            assert c.get("after") == 1 and c.verify().ok
        finally:
            _reap(p)


def test_lock_holder_killed_mid_put_is_repaired(name):
    with SharedCache(name, **SMALL) as c:
        for i in range(10):
            c.put(f"k{i}", make_value(f"k{i}", i, 40))
        p, _ = _start(half_put_then_die, name)
        try:
            p.join(timeout=10)
            assert p.exitcode == -signal.SIGKILL
            assert c.get("torn") is None  # the half-made entry is gone, never half-returned
            for i in range(10):
                check_value(f"k{i}", c.get(f"k{i}"))
            s = c.stats()
            assert s.recoveries == 1 and s.entries == 10
            assert c.verify().ok
        finally:
            _reap(p)


def test_lock_dead_holder_thread_is_detected_while_its_pid_lives(name):
    """Liveness is tracked per holder by the kernel, not by PID: a holder thread that ends without releasing is
    detected even though its process (same PID) is alive -- the situation PID reuse would otherwise fake."""
    with SharedCache(name, **SMALL) as c:
        c.put("k", 1)
        t = threading.Thread(target=c._guard.enter)
        t.start()
        t.join(timeout=10)
        assert c.get("k") == 1  # this thread takes over the dead thread's lock
        assert c.verify().ok


def test_lock_live_holder_times_out(name):
    with SharedCache(name, lock_timeout=0.3, **SMALL) as c:
        ctx = mp.get_context("fork")
        release = ctx.Event()
        p, _ = _start(hold_lock, name, release)
        try:
            t0 = time.monotonic()
            with pytest.raises(LockTimeout) as info:
                c.get("k")
            assert isinstance(info.value, TimeoutError)
            assert time.monotonic() - t0 >= 0.29
            assert str(p.pid) in str(info.value) or "holds it" in str(info.value)
        finally:
            release.set()
            p.join(timeout=10)
            _reap(p)
        assert c.get("k") is None  # usable again once the holder let go


@pytest.mark.parametrize("op", ["get", "put", "delete", "view", "get_many", "put_many"])
def test_lock_timeout_is_waited_once(name, op):
    """A call the compiled section hands over after waiting the whole lock_timeout is judged by the Python path at
    once, not waited for again (it took twice the timeout before). The bound is generous: a wait of two timeouts
    fails it, a slow machine does not."""
    with SharedCache(name, lock_timeout=1.0, **SMALL) as c:
        c.put("k", b"v")
        calls = {"get": lambda: c.get("k"), "put": lambda: c.put("k", b"w"), "delete": lambda: c.delete("k"),
                 "view": lambda: c.view("k"), "get_many": lambda: c.get_many(["k", "j"]),
                 "put_many": lambda: c.put_many({"k": b"w", "j": b"x"})}
        p, _ = _start(hold_lock, name)
        try:
            t0 = time.monotonic()
            with pytest.raises(LockTimeout):
                calls[op]()
            assert 0.99 <= time.monotonic() - t0 < 1.8
        finally:
            _reap(p)


def test_lock_waiting_does_not_spin(name):
    with SharedCache(name, lock_timeout=1.0, **SMALL) as c:
        p, _ = _start(hold_lock, name)
        try:
            cpu0 = time.process_time()
            with pytest.raises(LockTimeout):
                c.get("k")
            assert time.process_time() - cpu0 < 0.5  # a spinning waiter would burn the whole second
        finally:
            _reap(p)


def test_lock_reentry_from_same_thread_is_an_error_not_a_hang(name):
    with SharedCache(name, **SMALL) as c:
        c._guard.hold()
        try:
            for call in (lambda: c.get("k"), lambda: c.put("k", 1), lambda: c.delete("k"), c.stats, c.clear):
                with pytest.raises(RuntimeError, match="already holds"):
                    call()
                assert c._guard.lock.owned()  # the inner call left the lock to the call it interrupted
        finally:
            c._guard.let_go()
        assert c.get("k") is None


def test_lock_reentry_from_a_signal_handler_is_a_reentrant_call_error(name):
    # A handler that runs while this thread holds the lock (taken here by hand, as an interrupted call holds it).
    seen = []

    def handler(signum, frame):
        try:
            c.put("k", 2)
        except BaseException as exc:
            seen.append(exc)

    with SharedCache(name, **SMALL) as c:
        c.put("k", 1)
        old = signal.signal(signal.SIGUSR1, handler)
        try:
            c._guard.hold()
            try:
                signal.raise_signal(signal.SIGUSR1)
            finally:
                c._guard.let_go()
        finally:
            signal.signal(signal.SIGUSR1, old)
        assert len(seen) == 1, seen
        exc = seen[0]
        assert isinstance(exc, ReentrantCallError) and isinstance(exc, ShmCacheError)
        assert isinstance(exc, RuntimeError)  # what ``except RuntimeError`` caught before
        assert exc.what == "lock" and "signal handler" in exc.hint
        assert c.get("k") == 1  # the refused put changed nothing


def test_lock_threads_share_one_handle(name):
    with SharedCache(name, **SMALL) as c:
        errors = []

        def work(t: int) -> None:
            try:
                for i in range(400):
                    key = f"k{(i * 7 + t) % 40}"
                    if i % 3:
                        v = c.get(key)
                        if v is not None:
                            check_value(key, v)
                    else:
                        c.put(key, make_value(key, i, 100 + t))
            except Exception as exc:  # collected: an assertion in a thread would otherwise vanish
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors and c.verify().ok
        s = c.stats()
        assert s.hits + s.misses == 6 * 400 - 6 * 134


_SIGNAL_STORM = r"""
import json, signal, sys, time
from shmcache import SharedCache
from tests.workers import check_value, make_value

class Interrupt(Exception):
    pass

in_call = False  # the handler raises only while a cache call runs, so this script's own steps are never cut

def handler(signum, frame):
    global in_call
    if in_call:
        in_call = False  # first: a second signal before the except clause runs must not raise outside a call
        raise Interrupt()

interrupted = i = 0
wrong = []
c = SharedCache(sys.argv[1], capacity_bytes=1 << 16, max_entries=64)
deadline = time.monotonic() + 3
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.00013)
while time.monotonic() < deadline:
    i += 1
    key = f"k{i % 50}"
    v = None
    try:
        in_call = True
        if i % 3:
            v = c.get(key)
        else:
            c.put(key, make_value(key, i, 200 + i % 300))
        in_call = False
    except Interrupt:
        in_call = False
        interrupted += 1
    if v is not None:
        try:
            check_value(key, v)
        except AssertionError as exc:
            wrong.append(str(exc))
signal.setitimer(signal.ITIMER_REAL, 0)
owned = c._guard.lock.owned()
print(json.dumps({"interrupted": interrupted, "calls": i, "owned": owned, "wrong": wrong, "ok": c.verify().ok}))
c.close()
"""


def test_lock_signal_at_any_bytecode_never_leaks_the_lock_or_half_an_update(name):
    """A Python signal handler that raises can land anywhere in a call, also right after the lock was taken or in
    the middle of an update: the lock is never left held and no half-made update survives. (A call that kept the
    lock would make every later call of that thread fail as a re-entry.)"""
    import json
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _SIGNAL_STORM, name], cwd=root, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["interrupted"] > 50 and r["calls"] > r["interrupted"]
    assert not r["owned"] and not r["wrong"] and r["ok"], r
    with SharedCache(name, create=False) as c:
        assert c.verify().ok
        for k in range(50):
            v = c.get(f"k{k}")
            if v is not None:
                check_value(f"k{k}", v)


def test_lock_close_while_other_threads_call_is_safe(name):
    with SharedCache(name, **SMALL) as owner:
        c = SharedCache(name)
        c.put("k", make_value("k", 1, 50))
        errors, stop = [], threading.Event()

        def work() -> None:
            while not stop.is_set():
                try:
                    v = c.get("k")
                    if v is not None:
                        check_value("k", v)
                    c.put("k", make_value("k", 2, 60))
                except ClosedError:
                    return
                except Exception as exc:
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        c.close()
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert not errors, errors
        check_value("k", owner.get("k"))  # the lock was not left held
        assert owner.verify().ok


def test_lock_close_in_a_child_forked_while_a_thread_was_inside_a_call(name):
    """A child forked while another thread of the parent was inside a call inherits the record of it (the threads
    close() waits for): that thread does not exist in the child, and the child's close() must not wait for it."""
    with SharedCache(name, lock_timeout=3.0, **SMALL) as c:
        inside, leave = threading.Event(), threading.Event()

        def call() -> None:
            c._guard.run(lambda: (inside.set(), leave.wait(10)))

        t = threading.Thread(target=call)
        t.start()
        assert inside.wait(10)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: waits until the parent's call is over (the lock free), then closes its handle
            code = 1
            try:
                os.close(w)
                os.read(r, 1)
                # Guard.close returns False when a thread it waits for is still inside after the lock timeout.
                code = 0 if c._guard.close() else 3
            finally:
                os._exit(code)
        os.close(r)
        leave.set()
        t.join(10)
        os.write(w, b"x")
        os.close(w)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # closed, not given up after the lock timeout
        assert c.get("k") is None and c.verify().ok


def test_lock_close_waits_for_compiled_calls_waiting_for_the_lock(name):
    """A call of the compiled section waiting for the lock (the GIL released) when another thread closes the handle:
    close() returns once it has left, as it waits for the Python path's (the waiter judges the lock's holder
    through the segment's descriptors, which the close then closes)."""
    c = SharedCache(name, lock_timeout=5.0, **SMALL)
    compiled = c._core
    if compiled is None:
        c.close()
        pytest.skip("the compiled section is not built")
    c.put("k", 1)
    got, after_close = [], []

    def get() -> None:
        try:
            got.append(c.get("k"))
        except ClosedError as exc:
            got.append(exc)

    def close() -> None:
        c.close()
        after_close.append(compiled.users)

    c._guard.hold()
    waiter = threading.Thread(target=get)
    waiter.start()
    time.sleep(0.2)  # waiting in C for the lock
    closer = threading.Thread(target=close)
    closer.start()
    time.sleep(0.2)
    c._guard.let_go()
    for t in (waiter, closer):
        t.join(30)
    assert after_close == [0] and got and (got[0] == 1 or isinstance(got[0], ClosedError)), (after_close, got)


def test_lock_waiters_are_patient_with_a_long_repair(name):
    """A repair of a large segment takes time under the lock: waiters extend their timeout while its walk moves the
    progress word, instead of failing."""
    with SharedCache(name, lock_timeout=0.3, **SMALL) as c:
        c.put("k", 1)
        p, _ = _start(repair_slowly, name, 1.0)
        try:
            assert c.get("k") == 1  # waited past its 0.3 s timeout, because the holder was repairing
        finally:
            p.join(timeout=10)
            _reap(p)


def test_lock_a_stray_repairing_word_without_progress_is_waited_one_timeout(name):
    """The dirty word at its repairing value proves nothing (a stray write, a repairer stopped): without progress,
    a waiter waits one timeout, not eleven, and its message states the time it actually waited."""
    with SharedCache(name, lock_timeout=0.5, **SMALL) as c:
        c.put("k", 1)
        p, _ = _start(repair_slowly, name, 30.0, False)
        try:
            begun = time.monotonic()
            with pytest.raises(LockTimeout) as info:
                c.get("k")
            elapsed = time.monotonic() - begun
        finally:
            _reap(p)
    found = re.search(r"in ([0-9.e+-]+) s of waiting \(lock_timeout=0.5 s, extended (\d+) times", str(info.value))
    assert found, str(info.value)
    stated, extended = float(found.group(1)), int(found.group(2))
    assert extended == 0, str(info.value)  # no progress: one timeout, not 11 (a stray "repairing" word buys none)
    assert 0.5 <= stated <= elapsed + 0.01, (stated, elapsed, str(info.value))  # the message's figure is true


def test_lock_a_repair_longer_than_eleven_timeouts_is_waited_while_it_progresses(name):
    """However long a live repair takes, a waiter waits while its walk moves the progress word (a fixed number of
    extended timeouts failed healthy waiters during the recovery of a large segment)."""
    with SharedCache(name, lock_timeout=0.4, **SMALL) as c:
        c.put("k", 1)
        p, _ = _start(repair_slowly, name, 5.0)  # 12.5 timeouts of 0.4 s, progress every 10 ms
        try:
            assert c.get("k") == 1
        finally:
            p.join(timeout=10)
            _reap(p)
