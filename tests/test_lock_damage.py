"""Garbage in the mutex's own bytes: no abort inside glibc, no call blocked for ever, no wrong value.

Each damage is written into the lock's bytes of a filled cache that nobody holds; then a fresh process (so that an
abort fails the test instead of killing pytest) attaches with a short lock timeout and must get, put and read back
correctly within the subprocess timeout. Values read are either the ones put or gone (a repair may empty the cache),
never another key's or torn."""

from __future__ import annotations

import mmap
import os
import pathlib
import struct
import subprocess
import sys

import pytest

from shmcache import SharedCache
from shmcache.layout.dtypes import H_LOCK_OFF
from tests.workers import check_value, make_value

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
SMALL = dict(capacity_bytes=1 << 16, max_entries=64)
ROOT = pathlib.Path(__file__).resolve().parents[1]
KEYS = 20
PI, PP = 32, 64  # glibc's PTHREAD_MUTEX_PRIO_INHERIT_NP / PRIO_PROTECT_NP bits of the kind word
WAITERS = 0x80000000
ROBUST = 16  # PTHREAD_MUTEX_ROBUST_NORMAL_NP in the kind word
OWNER_DIED = 0x40000000  # FUTEX_OWNER_DIED in the futex word


def _gone_tid() -> int:
    """The pid of a process that has exited and been reaped: a thread id no thread has."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _word(b: bytearray, off: int, value: int, fmt: str = "<I") -> None:
    struct.pack_into(fmt, b, off, value & 0xFFFFFFFF if fmt == "<I" else value)


def _damage(kind: str, b: bytearray, live_pid: int) -> None:
    """Write one damage into ``b``, the mutex's 40 bytes (glibc: __lock 0, __count 4, __owner 8, __nusers 12,
    __kind 16, spins 20, list 24)."""
    init_kind = _kind(b)  # what init_mutex wrote
    if kind == "pi-kind-dead-owner":  # glibc asserts in its PI code (ESRCH from the kernel for a robust mutex)
        _word(b, 16, init_kind | PI)
        _word(b, 0, _gone_tid())
    elif kind == "pi-kind-not-robust-owner-died":  # glibc asserts inside trylock itself (the fast path)
        _word(b, 16, (init_kind & ~ROBUST) | PI)
        _word(b, 0, _gone_tid() | OWNER_DIED)
    elif kind == "spins-word":  # the rest of the kind's 64-bit word, which the fast path compares whole
        _word(b, 20, 0x7FFF0001)
    elif kind == "pi-kind-free":
        _word(b, 16, init_kind | PI)
    elif kind == "pp-kind":
        _word(b, 16, init_kind | PP)
    elif kind == "garbage-kind":
        _word(b, 16, 0x5A5A5A5A)
    elif kind == "dead-owner":
        _word(b, 0, _gone_tid())
    elif kind == "waiters-bit-no-owner":
        _word(b, 0, WAITERS)
    elif kind == "live-owner-not-mapping":  # a thread id reused by a process that has nothing to do with the cache
        _word(b, 0, live_pid)
    elif kind == "count-owner-nusers":
        _word(b, 4, 0xDEADBEEF)
        _word(b, 8, 0x12345678)
        _word(b, 12, 0xFFFFFFFF)
    elif kind == "owner-notrecoverable":
        _word(b, 8, 0x7FFFFFFF)
    elif kind == "list-pointers":
        b[24:40] = bytes(range(0xA0, 0xB0))
    elif kind == "all-ff":
        b[:] = b"\xff" * len(b)
    elif kind == "all-zero":  # a free, plain (non-robust, process-private) mutex
        b[:] = bytes(len(b))
    elif kind == "all-zero-held":  # a plain mutex held by nobody that will ever unlock it
        b[:] = bytes(len(b))
        _word(b, 0, 1)
    elif kind == "plain-word-gone-owner":  # taken through a foreign kind's path, its holder killed before giving
        _word(b, 0, 1)                       # it back: a plain lock's word, the owner field naming the dead holder
        _word(b, 8, _gone_tid())
    else:
        raise AssertionError(kind)


def _kind(b) -> int:
    return struct.unpack_from("<i", b, 16)[0]


DAMAGES = ["pi-kind-dead-owner", "pi-kind-not-robust-owner-died", "spins-word", "pi-kind-free", "pp-kind",
           "garbage-kind", "dead-owner", "waiters-bit-no-owner",
           "live-owner-not-mapping", "count-owner-nusers", "owner-notrecoverable", "list-pointers", "all-ff",
           "all-zero", "all-zero-held", "plain-word-gone-owner"]

# Run in a fresh process: attach, read every key (right or gone), write and read back, with two handles contending.
_AFTER_DAMAGE = r"""
import sys, threading
from shmcache import SharedCache
from tests.workers import check_value, make_value

name, keys = sys.argv[1], int(sys.argv[2])
c = SharedCache(name, create=False, lock_timeout=1.0)
found = 0
for i in range(keys):
    v = c.get(f"k{i}")
    if v is not None:
        check_value(f"k{i}", v)
        found += 1
errors = []
def work(t):
    try:
        with SharedCache(name, create=False, lock_timeout=1.0) as mine:
            for i in range(200):
                key = f"t{t}-{i % 10}"
                mine.put(key, make_value(key, i, 100))
                check_value(key, mine.get(key))
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
assert not errors, errors
assert c.verify().ok
print("ok", found)
"""


@pytest.mark.parametrize("damage", DAMAGES)
def test_lock_damaged_bytes_are_repaired_not_fatal(name, damage):
    with SharedCache(name, **SMALL) as c:
        for i in range(KEYS):
            c.put(f"k{i}", make_value(f"k{i}", i, 80))
    bystander = subprocess.Popen(["sleep", "60"])  # a live process that does not map the cache
    try:
        with open(f"/dev/shm/shmcache.{name}", "r+b") as f, mmap.mmap(f.fileno(), 4096) as mm:
            b = bytearray(mm[H_LOCK_OFF : H_LOCK_OFF + 40])
            kind = _kind(b)  # what init_mutex wrote
            _damage(damage, b, bystander.pid)
            mm[H_LOCK_OFF : H_LOCK_OFF + 40] = bytes(b)
        run = subprocess.run([sys.executable, "-c", _AFTER_DAMAGE, name, str(KEYS)], cwd=ROOT, capture_output=True,
                             text=True, timeout=90)
    finally:
        bystander.kill()
        bystander.wait(10)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-3000:]}"
    assert run.stdout.startswith("ok")
    with SharedCache(name, create=False, lock_timeout=1.0) as c:
        assert c.verify().ok
        assert _kind(c._seg.lock_mm[H_LOCK_OFF : H_LOCK_OFF + 40]) == kind
        for i in range(KEYS):
            v = c.get(f"k{i}")
            if v is not None:
                check_value(f"k{i}", v)


_HOLD_IN_NAMESPACE = r"""
import sys, threading, time
from shmcache import SharedCache
name, tid = sys.argv[1], int(sys.argv[2])
with open("/proc/sys/kernel/ns_last_pid", "w") as f:  # the next thread made in this namespace gets thread id tid
    f.write(str(tid - 1))
def hold():
    c = SharedCache(name, create=False)
    c._guard.enter()
    print("held", threading.get_native_id(), flush=True)
    time.sleep(60)
threading.Thread(target=hold).start()
"""


def test_lock_holder_in_another_pid_namespace_is_never_judged_gone(name):
    """A thread id is only meaningful in its own PID namespace: a holder in another one, whose thread id names no
    thread of ours, must time the waiters out, not be taken for a garbage owner and have its lock reset."""
    import shutil

    from shmcache import LockTimeout

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) to make a PID namespace")
    with SharedCache(name, lock_timeout=0.3, **SMALL) as c:
        c.put("k", 1)
        tid = _gone_tid()  # no thread of this namespace has it
        holder = subprocess.Popen(["unshare", "-p", "-f", "--kill-child", "--mount-proc", sys.executable, "-c",
                                   _HOLD_IN_NAMESPACE, name, str(tid)], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            line = holder.stdout.readline()
            if not line.startswith("held"):
                pytest.skip(f"cannot make a PID namespace here: {holder.stderr.read()[-500:]}")
            assert line.split()[1] == str(tid)  # in its namespace
            for _ in range(2):
                with pytest.raises(LockTimeout):
                    c.get("k")
        finally:
            holder.kill()  # unshare, which takes the namespace's init with it (--kill-child)
            holder.wait(10)
        for _ in range(100):  # the holder dies a moment after unshare: then taken over through the robust list
            try:
                assert c.get("k") == 1
                break
            except LockTimeout:
                continue
        assert c.get("k") == 1 and c.verify().ok


def _wait_and_use(name: str, i: int, queue) -> None:
    try:
        with SharedCache(name, create=False, lock_timeout=1.0) as c:
            v = c.get("k0")
            if v is not None:
                check_value("k0", v)
            key = f"w{i}"
            c.put(key, make_value(key, i, 50))
            check_value(key, c.get(key))
        queue.put("ok")
    except BaseException as exc:
        queue.put(repr(exc))


def test_lock_gone_owner_with_many_waiters_lets_every_one_through(name):
    """Several processes block on an owner no thread has: one re-initialises the lock, and the others, asleep on
    the old futex word (which a re-initialisation does not wake), still get it instead of timing out."""
    import multiprocessing as mp

    from tests.workers import start_and_collect

    with SharedCache(name, **SMALL) as c:
        c.put("k0", make_value("k0", 0, 80))
    with open(f"/dev/shm/shmcache.{name}", "r+b") as f, mmap.mmap(f.fileno(), 4096) as mm:
        b = bytearray(mm[H_LOCK_OFF : H_LOCK_OFF + 40])
        _word(b, 0, WAITERS | _gone_tid())
        mm[H_LOCK_OFF : H_LOCK_OFF + 40] = bytes(b)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    results = start_and_collect([ctx.Process(target=_wait_and_use, args=(name, i, queue)) for i in range(4)], queue)
    assert results == ["ok"] * 4
    with SharedCache(name, create=False) as c:
        assert c.verify().ok
        for i in range(4):
            check_value(f"w{i}", c.get(f"w{i}"))


_DAMAGED_WHILE_HELD = r"""
import mmap, struct, sys
from shmcache import SharedCache
from shmcache.layout.dtypes import H_LOCK_OFF
from shmcache.lock import KIND_OFF

name, kind = sys.argv[1], int(sys.argv[2])
c = SharedCache(name, create=False, lock_timeout=1.0)

def damage():  # another process writing the kind word while this one holds the lock
    with open(f"/dev/shm/shmcache.{name}", "r+b") as f, mmap.mmap(f.fileno(), 4096) as mm:
        struct.pack_into("<i", mm, H_LOCK_OFF + KIND_OFF, kind)

c._guard.run(damage)   # the unlock after it must not reach glibc with that kind (it asserts, and aborts)
c.put("after", 1)
assert c.get("after") == 1 and c.verify().ok
c.close()
print("ok")
"""


@pytest.mark.parametrize("kind", [0x40, 0x20, 0x5A5A5A5A])  # priority protect, priority inherit, garbage
def test_lock_kind_damaged_while_held_never_aborts_the_holder(name, kind):
    SharedCache(name, **SMALL).close()
    run = subprocess.run([sys.executable, "-c", _DAMAGED_WHILE_HELD, name, str(kind)], cwd=ROOT, capture_output=True,
                         text=True, timeout=90)
    assert run.returncode == 0 and run.stdout.startswith("ok"), f"exit {run.returncode}: {run.stderr[-3000:]}"


# A kind word damaged in the nanoseconds between the lock's check of it and glibc's own read (docs/operations.md):
# glibc then takes the foreign kind's path, which holds the mutex without queueing it on the holder's robust list,
# or releases it without taking it off. Each case is made here without a race, by writing the foreign kind around a
# direct glibc call, in a fresh process (a crash fails the test, not pytest).
_FOREIGN_PATHS = r"""
import ctypes, errno, sys
from shmcache import SharedCache
from shmcache import lock as L

name, case = sys.argv[1], sys.argv[2]
c = SharedCache(name, create=False, lock_timeout=0.5)
g = c._guard
lock = g.lock
kind = ctypes.c_int.from_address(lock.address + L.KIND_OFF)
right = kind.value
first = L.robust.me.first
assert first is not None, "no robust list to look at"
before = first[0]

if case in ("plain", "pi"):  # a hold taken through the foreign kind's path
    kind.value = 0 if case == "plain" else 0x20
    rc = L._mutex_trylock(lock.address)
    kind.value = right
    assert rc == 0 and first[0] == before, (rc, first[0], before)  # held, not queued
    assert lock.futex.value == (1 if case == "plain" else L.robust.me.tid), hex(lock.futex.value)
    assert lock.foreign_hold()
    assert lock.checked(rc) == errno.EBUSY  # given back
    assert lock.futex.value == 0 and lock.owner.value == 0 and L.MENDS[0] == 1
elif case == "unlock-plain":  # a right hold released through the plain kind's path: still listed
    assert lock.try_checked() == 0 and first[0] & L.ENTRY_MASK == lock.entry
    kind.value = 0
    L.hot_unlock(lock.handle)
    kind.value = right
    assert lock.futex.value == 0 and first[0] & L.ENTRY_MASK == lock.entry  # released, still listed
    lock.settle_release(before)
    assert first[0] == before and L.MENDS[1] == 1, (first[0], before)
elif case == "waiter-wrote-2":  # a waiter that read the plain kind wrote 2 over the holder's id
    def overwrite():
        lock.futex.value = 2
    g.run(overwrite)  # its unlock puts the holder's id back first: without that, glibc refuses it (EPERM)
    assert lock.futex.value == 0 and first[0] == before, hex(lock.futex.value)

c.put("after", 1)  # the lock is free and every later hold queues and unqueues as glibc's robust path does
assert c.get("after") == 1 and lock.futex.value == 0 and first[0] == before
c.close()
other = ctypes.create_string_buffer(64)  # a robust lock after the unmap writes through no entry of the segment
L.init_mutex(ctypes.addressof(other))
assert L._mutex_trylock(ctypes.addressof(other)) == 0 and L._mutex_unlock(ctypes.addressof(other)) == 0
print("ok")
"""


@pytest.mark.parametrize("case", ["plain", "pi", "unlock-plain", "waiter-wrote-2"])
def test_lock_foreign_kind_paths_are_given_back_and_unlisted(name, case):
    SharedCache(name, **SMALL).close()
    run = subprocess.run([sys.executable, "-c", _FOREIGN_PATHS, name, case], cwd=ROOT, capture_output=True,
                         text=True, timeout=90)
    assert run.returncode == 0 and run.stdout.startswith("ok"), f"exit {run.returncode}: {run.stderr[-3000:]}"
    with SharedCache(name, create=False, lock_timeout=0.5) as c:  # and another process uses it at once
        c.put("x", 2)
        assert c.get("x") == 2
