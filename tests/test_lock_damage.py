"""Stray writes into the lock's words (shmcache/lock.py): no crash, no abort, no hang past the lock timeout, no wrong
value, and nothing written outside the segment.

The lock's shared state is three 32-bit words (the futex word, the holder slot, the wake count); nothing in them is
a pointer or a C library's field. Each test writes one 4-byte value of a class into one of them -- at rest, or
during a hold by another process that then gives the lock back or dies -- and a fresh handle must then get, put
and read back correctly within a bounded time. Values read are the ones put or gone (a repair may drop entries),
never another key's or torn."""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import subprocess
import threading
import time

import pytest

from shmcache import SharedCache
from shmcache.layout.dtypes import H_LOCK_OFF
from tests.workers import check_value, make_value

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
# lru: every get and view takes the lock there, so that a read can show how the lock is waited for (under the
# policies that read without it, a read waits for nothing: tests/test_unlocked.py).
SMALL = dict(capacity_bytes=1 << 16, max_entries=64, policy="lru")
KEYS = 20
WAITERS = 0x80000000


def _gone_tid() -> int:
    """The pid of a process that has exited and been reaped: a thread id no thread has."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _fill(c: SharedCache) -> None:
    for i in range(KEYS):
        c.put(f"k{i}", make_value(f"k{i}", i, 40 + i))


def _write(c: SharedCache, off: int, value: int) -> None:
    c._seg.lock_mm[H_LOCK_OFF + off : H_LOCK_OFF + off + 4] = struct.pack("<I", value & 0xFFFFFFFF)


def _use(name: str, lock_timeout: float = 2.0) -> None:
    """Open the cache afresh, read back every key (intact or gone), write and read one, and verify."""
    with SharedCache(name, create=False, lock_timeout=lock_timeout) as c:
        for i in range(KEYS):
            v = c.get(f"k{i}")
            if v is not None:
                check_value(f"k{i}", v)
        c.put("after", make_value("after", 1, 64))
        check_value("after", c.get("after"))
        assert c.verify().ok
        assert not c._guard.lock.owned()


def _values(stranger: int) -> dict[str, int]:
    """The value classes written: a free word, thread ids of no thread, of a live thread that does not map the
    cache (``stranger``), of this test's own thread (a live thread of the cache, holding nothing), and garbage."""
    return {"zero": 0, "gone": _gone_tid(), "gone-waiters": _gone_tid() | WAITERS, "stranger": stranger,
            "this-thread": threading.get_native_id(), "waiters-only": WAITERS, "all-ones": 0xFFFFFFFF,
            "max-tid": 0x3FFFFFFF, "slot-range": 2**20 + 1}


@pytest.fixture
def stranger():
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


@pytest.mark.parametrize("off", [0, 4, 8, 12])
@pytest.mark.parametrize("value", ["zero", "gone", "gone-waiters", "stranger", "this-thread", "waiters-only",
                                   "all-ones", "max-tid", "slot-range"])
def test_lock_word_damaged_at_rest_is_repaired_or_harmless(name, stranger, off, value):
    with SharedCache(name, **SMALL) as c:
        _fill(c)
        _write(c, off, _values(stranger)[value])
        start = time.monotonic()
        _use(name)
        assert time.monotonic() - start < 10  # within the lock timeout and its judgement, never a hang
        _use(name)


def _hold_and_damage(name: str, off: int, value: int, then: str, ready) -> None:
    """In a child: take the lock, write ``value`` at ``off`` of its words, then give it back or die holding it."""
    c = SharedCache(name, create=False)
    c._guard.hold()
    c.put  # noqa: B018  (the handle stays referenced while held)
    _write(c, off, value)
    ready.set()
    if then == "die":
        os._exit(0)
    time.sleep(0.05)
    c._guard.let_go()
    c.close()
    os._exit(0)


@pytest.mark.parametrize("then", ["release", "die"])
@pytest.mark.parametrize("off", [0, 4, 8])
@pytest.mark.parametrize("value", ["zero", "gone", "stranger", "this-thread", "waiters-only", "all-ones",
                                   "slot-range"])
def test_lock_word_damaged_during_a_hold_ends_in_a_repair(name, stranger, off, value, then):
    """A stray write of each value class into each word while another process holds the lock: the holder's unlock
    (or its death) is never a crash, and the next call gets the lock and a consistent segment."""
    with SharedCache(name, **SMALL) as c:
        _fill(c)
        ctx = mp.get_context("fork")
        ready = ctx.Event()
        p = ctx.Process(target=_hold_and_damage, args=(name, off, _values(stranger)[value], then, ready))
        p.start()
        try:
            assert ready.wait(timeout=30)
            start = time.monotonic()
            _use(name)
            assert time.monotonic() - start < 10
            p.join(timeout=30)
            assert p.exitcode == 0, p.exitcode  # the holder's unlock of a damaged word never crashed it
            _use(name)
        finally:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)


def _hold_forever(name: str, ready) -> None:
    c = SharedCache(name, create=False)
    c._guard.hold()
    ready.set()
    time.sleep(120)


def test_lock_dead_holder_is_taken_over_by_sleeping_waiters(name):
    """Waiters already asleep when the holder is SIGKILLed: one takes over, the others follow, values intact."""
    with SharedCache(name, **SMALL) as c:
        _fill(c)
        ctx = mp.get_context("fork")
        ready = ctx.Event()
        p = ctx.Process(target=_hold_forever, args=(name, ready))
        p.start()
        try:
            assert ready.wait(timeout=30)
            errors: list = []

            def wait_and_use() -> None:
                try:
                    _use(name, lock_timeout=30)
                except BaseException as exc:  # collected: an assertion in a thread would vanish
                    errors.append(exc)

            threads = [threading.Thread(target=wait_and_use) for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(0.2)
            p.kill()
            for t in threads:
                t.join(timeout=60)
            assert not any(t.is_alive() for t in threads) and not errors, errors
        finally:
            p.kill()
            p.join(timeout=10)


def test_lock_word_naming_a_live_holder_of_the_cache_times_out_clearly(name):
    """The documented limit: a word and holder slot naming a live handle that holds nothing cannot be told from
    a stuck holder by another process: calls fail with LockTimeout, and the named thread's own next call clears
    it (it knows it holds nothing)."""
    from shmcache.errors import LockTimeout

    with SharedCache(name, **SMALL) as c:
        _fill(c)
        _write(c, 0, threading.get_native_id())
        _write(c, 4, c._guard.slot.number)
        ctx = mp.get_context("fork")

        def other() -> None:  # its exit status says what it met: 0 LockTimeout, 1 none, 2 another error
            try:
                with SharedCache(name, create=False, lock_timeout=0.3) as o:
                    o.get("k1")
                os._exit(1)
            except LockTimeout:
                os._exit(0)
            except BaseException:
                os._exit(2)

        p = ctx.Process(target=other)
        p.start()
        p.join(timeout=60)
        try:
            assert p.exitcode == 0, p.exitcode
        finally:
            if p.is_alive():
                p.kill()
                p.join(10)
        check_value("k1", c.get("k1"))  # this thread judges its own id: damage, taken over and repaired
        _use(name)


_SWEEP = r"""
import os, struct, subprocess, sys, threading
from shmcache import SharedCache
from shmcache.layout.dtypes import H_LOCK_OFF
from tests.workers import check_value, make_value

name = sys.argv[1]
p = subprocess.Popen(["sleep", "60"])  # a live thread id of a process that does not map the cache
gone = subprocess.Popen(["true"])
gone.wait()
values = [0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x40000000, gone.pid, p.pid, threading.get_native_id(),
          threading.get_native_id() | 0x80000000, 2**20 + 1, 0xDEADBEEF]
c = SharedCache(name, capacity_bytes=1 << 16, max_entries=64, lock_timeout=0.5)
take, give = c._guard.hold, c._guard.let_go
served = 0
try:
    for off in range(0, 61):
        for value in values:
            key = f"k{off}-{value}"
            c.put(key, make_value(key, off, 30))
            take()
            c._seg.lock_mm[H_LOCK_OFF + off : H_LOCK_OFF + off + 4] = struct.pack("<I", value)
            give()
            c.put("after", make_value("after", off, 40))
            check_value("after", c.get("after"))
            v = c.get(key)
            if v is not None:
                check_value(key, v)
            served += 1
    assert c.verify().ok
finally:
    p.kill()
    p.wait()
    c.close()
print(served)
"""


def test_lock_every_byte_of_its_line_written_during_a_hold_never_crashes(name):
    """A 4-byte write of each value class at every byte offset of the lock's line (64 bytes) while this process
    holds the lock, then its unlock and the next calls: run in a child process, so a crash (as glibc's unlock
    writing through list pointers in the segment) or an abort fails the test instead of killing the run."""
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _SWEEP, name], cwd=root, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert int(out.stdout.strip()) == 61 * 12
