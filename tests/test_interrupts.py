"""An exception delivered at any bytecode (Ctrl-C, or whatever a signal handler raises) inside view, get_or_compute,
memoize, put or a TieredCache fill leaks no pin, no claim and no descriptor, and closes none it does not own.

Each storm runs in a child process (so the storm never reaches pytest): a timer raises KeyboardInterrupt every
~100 us while the child loops over one kind of operation; afterwards, while the child is still alive, this process
checks that no byte of the child's is still locked (claims, pins) and that every key can be written, then the child
closes its handle and compares its descriptors (count, and its own files by (st_dev, st_ino)) with before. A lazy
column's switch (layout 16) is cut at each of its lines in turn instead, in this process, by a trace function.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from shmcache import SharedCache, ofd
from shmcache.codec import KIND_PREFIX, encode_key, fingerprint
from shmcache.errors import ComputeTimeout

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
ROOT = pathlib.Path(__file__).resolve().parents[1]
KEYS = 40

_STORM = r"""
import faulthandler, gc, json, os, signal, sys, tempfile, time
faulthandler.enable()  # a crash prints where it happened (the test shows the end of stderr)
import numpy as np
from shmcache import SharedCache

name, op, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
KEYS = 40
files = [tempfile.TemporaryFile() for _ in range(4)]  # this process's own files: must stay open, and the same
own = {f.fileno(): (os.fstat(f.fileno()).st_dev, os.fstat(f.fileno()).st_ino) for f in files}
def fd_targets():
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # (the listing's own descriptor, closed since)
    return out

fds_start = len(os.listdir("/proc/self/fd"))
targets_start = fd_targets()
c = SharedCache(name, create=False)
t = None
if op == "tiered":
    from shmcache import TieredCache
    t = TieredCache(c, sys.argv[4], namespace="storm")

def value(i):
    return np.full(64, i, dtype=np.int64)

def check(i, a):
    if a.shape != (64,) or int(a[0]) != i or int(a[-1]) != i:
        raise AssertionError(f"wrong value for k{i}")

@(c.memoize(name="storm-f"))
def f(i):
    return value(i)

def one(n):
    i = n % KEYS
    k = f"k{i}"
    if op == "view":
        try:
            with c.view(k) as a:
                check(i, a)
        except KeyError:
            c.put(k, value(i))
    elif op == "compute":
        if n % 3 == 0:
            c.delete(k)
        check(i, c.get_or_compute(k, lambda: value(i)))
    elif op == "memoize":
        if n % 50 == 0:
            f.cache_clear()
        check(i, f(i))
    elif op == "put":
        c.put(k, value(i), ttl=30)
        with c.view(k) as a:
            check(i, a)
    elif op == "tiered":
        if n % 4 == 0:
            t.local.delete(k)
        if n % 2:
            check(i, t.get_or_compute(k, lambda: value(i)))
            return
        v = t.get(k)
        if v is None:
            t.put(k, value(i))
        else:
            check(i, v)

for n in range(KEYS):  # every key present once, so each is checked afterwards
    c.put(f"k{n}", value(n))
one(0); one(1); one(KEYS)  # warm: pooled descriptions, connections
fds_before = len(os.listdir("/proc/self/fd"))
in_call = False
def handler(signum, frame):
    global in_call
    if in_call:
        in_call = False  # first: a second signal before the except clause runs must not raise outside a call
        raise KeyboardInterrupt()

signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)
calls = interrupted = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    calls += 1
    try:
        in_call = True
        one(calls)
        in_call = False
    except KeyboardInterrupt:
        in_call = False
        interrupted += 1
    except SystemError as exc:
        # CPython 3.10: an interrupt raised while a frame returns reaches the caller as "SystemError:
        # _PyEval_EvalFrameDefault returned a result with an exception set", caused by the KeyboardInterrupt (later
        # versions raise the KeyboardInterrupt). Anything else is a failure.
        if not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        in_call = False
        interrupted += 1
signal.setitimer(signal.ITIMER_REAL, 0)
signal.signal(signal.SIGALRM, signal.SIG_IGN)
print(json.dumps({"calls": calls, "interrupted": interrupted}), flush=True)
sys.stdin.readline()  # alive while the test checks the segment's bytes from outside
import gc; gc.collect()  # claims and views dropped in reference cycles with their tracebacks
fds_after = len(os.listdir("/proc/self/fd"))
lost = 0
if op == "tiered":
    # redis-py's pool loses a connection (counted in use, never given back) when an interrupt lands between its
    # get_connection and the try that releases it; closing the client closes them (fds_end below). Counted apart
    # from this code's descriptors (the listener holds one connection in use for its subscription).
    in_use = getattr(t._remote.client.connection_pool, "_in_use_connections", None)  # (redis-py's own name)
    lost = 0 if in_use is None else max(len(in_use) - 1, 0)
    fds_after -= lost
if op == "tiered":
    t.close()
    t.unlink()
c.close()
del c, f, one, t  # the lock's page stays mapped (its descriptor open) until the handle is collected
gc.collect()
import threading
for thread in threading.enumerate():  # a closed TieredCache's listener closes its descriptors as it ends
    if thread is not threading.main_thread():
        thread.join(10)  # (one that never ends fails the count below)
fds_end = len(os.listdir("/proc/self/fd"))
leaked = sorted(f"{fd}: {target}" for fd, target in fd_targets().items() if targets_start.get(fd) != target)
closed = []
for fd, ident in own.items():
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != ident:
            closed.append(fd)
    except OSError:
        closed.append(fd)
print(json.dumps({"fds_before": fds_before, "fds_after": fds_after, "fds_start": fds_start, "fds_end": fds_end,
                  "own_closed": closed, "leaked": leaked, "redis_connections_lost": lost}), flush=True)
"""


def _locked_bytes(c: SharedCache) -> list[str]:
    """The claim and pin bytes of the storm's keys, and every pin byte, that another description holds."""
    held = [f"claim k{i}" for i in range(KEYS)
            if ofd.held_elsewhere(c._seg.fd, fingerprint(encode_key(f"k{i}")) >> 1)]
    tier = c.kind("tier:storm")._n  # a TieredCache's claims are on its kind's key bytes
    held += [f"tier claim k{i}" for i in range(KEYS)
             if ofd.held_elsewhere(c._seg.fd, fingerprint(bytes((KIND_PREFIX, tier)) + encode_key(f"k{i}")) >> 1)]
    held += [f"memo claim {i}" for i in range(KEYS)
             if ofd.held_elsewhere(c._seg.fd, fingerprint(encode_key(["shmcache.memoize", "storm-f", (i,), {}])) >> 1)]
    held += [f"pin {e}" for e in range(c._table.slots) if ofd.held_elsewhere(c._seg.fd, ofd.PIN_BASE + e)]
    return held


def storm(name: str, op: str, *extra: str, seconds: float = 2.0) -> dict:
    """Run the storm of ``op`` in a child; check from here that it left no lock, then collect its descriptors."""
    errors = tempfile.TemporaryFile("w+")  # not a pipe: GC callbacks cut short print a lot, which must not block
    proc = subprocess.Popen([sys.executable, "-c", _STORM, name, op, str(seconds), *extra], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        first = proc.stdout.readline()
        assert first, _tail(proc, errors)
        report = json.loads(first)
        with SharedCache(name, create=False) as c:
            report["held"] = _locked_bytes(c)
            for i in range(KEYS):
                assert c.put(f"k{i}", i)
            assert c.stats().held_entries == 0, "the storm left a pin: a key's old value is held for it"
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, _tail(proc, errors)
        report.update(json.loads(out))
        return report
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        errors.close()


def _tail(proc, errors) -> str:
    """The child's exit status and the end of its stderr, without the reports of interrupts that landed in a
    finaliser (``Exception ignored in ...: KeyboardInterrupt``, printed by the thousand): what is left is what
    failed."""
    proc.wait(60)
    errors.seek(0)
    blocks = re.split(r"(?m)^(?=Exception ignored in|Traceback )", errors.read())
    kept = [b for b in blocks
            if not (b.startswith("Exception ignored in") and b.rstrip().endswith("KeyboardInterrupt:"))]
    return f"exit status {proc.returncode} ({len(blocks) - len(kept)} interrupted finalisers not shown)\n" + \
        "".join(kept)[-3000:]


def _assert_clean(r: dict) -> None:
    assert r["interrupted"] > 100, r  # the storm happened
    assert r["held"] == [], r
    assert r["own_closed"] == [], r
    assert r["fds_after"] <= r["fds_before"] + 2, r  # idle pooled descriptions aside
    assert r["fds_end"] == r["fds_start"], r["leaked"]  # what each descriptor left open is


@pytest.fixture
def cache(name):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=256, create=True) as c:
        yield c


@pytest.mark.parametrize("op", ["view", "compute", "memoize", "put"])
def test_interrupts_storm_leaks_nothing(cache, op):
    if sys.version_info < (3, 11) and op in ("compute", "memoize"):
        # Seen once in CI on 3.10.13: the storm's KeyboardInterrupt, raised while get_or_compute's claim looked at
        # its description, came back as "SystemError: _PyEval_EvalFrameDefault returned a result with an exception
        # set", an error of the interpreter's own frame evaluation, and the child died of the next SIGALRM. The
        # other ops, and these on 3.11 and later, run the storm.
        pytest.skip("Python 3.10's frame evaluation can turn a handler's exception into SystemError in this storm")
    _assert_clean(storm(cache.name, op))


def test_interrupts_tiered_fill_leaks_nothing(cache, redis_url):
    if sys.version_info < (3, 11):
        # Seen once in CI on 3.10.13 (not in 30 runs here since): the storm's child, interrupted at every bytecode
        # of TieredCache.get_or_compute and of the finalisers it runs (redis-py's connections, a Claim), died of
        # SIGSEGV. The same storm over get_or_compute alone is skipped on 3.10 for an error of the interpreter's
        # own frame evaluation (above); this one runs on 3.11 and later, where that evaluation was rewritten.
        pytest.skip("Python 3.10's frame evaluation fails under this storm of get_or_compute (see above)")
    try:
        r = storm(cache.name, "tiered", redis_url)
    finally:  # the child unlinks the namespace's stats segment, unless it failed first
        pathlib.Path(f"/dev/shm/shmcache-tier.{cache.name}.storm").unlink(missing_ok=True)
    _assert_clean(r)
    with SharedCache(cache.name, create=False) as c:
        assert c.verify().ok


# ------------------------------------------------------------------------------------------- fork


def _other_process_gets(name: str, key: str, queue) -> None:
    with SharedCache(name, create=False) as c:
        try:
            queue.put(("value", c.get_or_compute(key, lambda: "recomputed", timeout=2.0)))
        except ComputeTimeout:
            queue.put(("timeout", None))
        byte = fingerprint(encode_key(key)) >> 1
        queue.put(("held", ofd.held_elsewhere(c._seg.fd, byte)))


def test_interrupts_fork_during_a_computation_carries_no_claim(cache):
    started, finish = threading.Event(), threading.Event()
    results = []

    def compute():
        started.set()
        finish.wait(30)
        return "stored"

    t = threading.Thread(target=lambda: results.append(cache.get_or_compute("k", compute)))
    t.start()
    child = None
    try:
        assert started.wait(30)
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        finish.set()
        t.join(30)
        assert results == ["stored"]
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        p = ctx.Process(target=_other_process_gets, args=(cache.name, "k", queue), daemon=True)
        p.start()
        try:
            got = [queue.get(timeout=60), queue.get(timeout=60)]
        finally:
            p.join(30)
            if p.is_alive():
                p.kill()
        assert got == [("value", "stored"), ("held", False)], got
    finally:
        finish.set()
        if child:
            os.kill(child, 9)
            os.waitpid(child, 0)


def test_interrupts_waiter_returns_a_value_stored_while_a_stray_claim_stays(cache):
    # A stray description (a forked child's copy, say) holds the key's claim; the value is stored meanwhile.
    stray = os.open(f"/proc/self/fd/{cache._seg.fd}", os.O_RDWR | os.O_CLOEXEC)
    try:
        assert ofd.lock(stray, fingerprint(encode_key("k")) >> 1, ofd.WRITE, wait=False)
        results = []
        t = threading.Thread(target=lambda: results.append(
            _or_timeout(lambda: cache.get_or_compute("k", lambda: "recomputed", timeout=10.0))))
        t.start()
        time.sleep(0.2)  # the waiter is polling the claim
        cache.put("k", "stored")
        t.join(30)
        assert results == ["stored"]
    finally:
        os.close(stray)


def _or_timeout(fn):
    try:
        return fn()
    except ComputeTimeout:
        return "timeout"


class _Cut(Exception):
    """What the test raises where a signal's handler could."""


@pytest.mark.parametrize("column", ["idle", "versions", "expires"])
def test_interrupts_a_lazy_column_switch_cut_at_any_line_heals(name, column):
    """Layout 16's switch of a lazy column (Store.show_idle, Store.show_versions; 18's Store.show_expires) cut by an
    exception at each of its lines in turn: the call that switched fails or completes, and the next calls of this
    handle and of another one attached before it end with both mapping the column and every entry's words in
    agreement (verify), every version asked for valid and the same from both handles, every value as stored."""
    from shmcache import store

    code = {"idle": store.Store.show_idle, "versions": store.Store.show_versions,
            "expires": store.Store.show_expires}[column].__code__
    lines = sorted({line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno})
    cuts: list[int] = []
    for target in lines:
        with SharedCache(name, capacity_bytes=2**20, max_entries=64, create=True) as c, \
                SharedCache(name, create=False) as other:
            try:
                for i in range(10):
                    c[f"k{i}"] = i
                fired = []

                def trace(frame, event, arg):
                    if frame.f_code is not code:
                        return None

                    def line(f, ev, a):
                        if ev == "line" and f.f_lineno == target and not fired:
                            fired.append(target)
                            raise _Cut()
                        return line
                    return line

                sys.settrace(trace)
                try:
                    if column == "idle":
                        c.put("t", 1, tti=100)
                    elif column == "expires":
                        c.put("t", 1, ttl=100)
                    else:
                        c.get_with_version("k1")
                except _Cut:
                    pass
                finally:
                    sys.settrace(None)
                cuts += fired
                other["k2"], c["k3"] = 22, 33
                c.put("t2", 2, tti=100)
                other.put("t3", 3, tti=50)
                if column != "versions":
                    assert c._seg.idle_shown and other._seg.idle_shown, target
                    assert c._seg.expires_shown and other._seg.expires_shown, target
                    assert c.get("t") in (None, 1) and other.get("t3") == 3 and c.get("k0") == 0, target
                else:
                    mine = [c.get_with_version(f"k{i}")[1] for i in range(10)]
                    theirs = [other.get_with_version(f"k{i}")[1] for i in range(10)]
                    assert mine == theirs and len(set(mine)) == 10 and all(mine), (target, mine, theirs)
                report = c.verify(deep=True)
                assert report.ok, (target, report.problems)
            finally:
                c.unlink()
    assert len(cuts) >= 5 and cuts[-1] == lines[-1]  # (each line that runs was cut once, the last one too)
