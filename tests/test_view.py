"""Zero-copy views: read-only arrays and memoryviews over the segment, pinned while anything can read them, revoked
after their with block, and released by the kernel when the pinning process dies."""

from __future__ import annotations

import gc
import itertools
import mmap
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
import warnings
import contextlib
from contextlib import contextmanager

import numpy as np
import pytest
import xxhash

from shmcache import POLICIES, CacheLimits, ClosedError, CorruptionError, SharedCache, View, core
from shmcache.block import value_at
from shmcache.codec import TAG_ARRAY, TAG_BYTES, encode_key, fingerprint
from shmcache.core import _core
from shmcache.layout.dtypes import H_DIRTY
from tests.workers import entry_of, pinned, reap, versioned

JOIN_S = 60
ctx = mp.get_context("fork")


def test_view_array_is_the_stored_array_read_only_without_a_copy(cache):
    stored = np.arange(12, dtype=np.float32).reshape(3, 4)
    cache.put("a", stored)
    with cache.view("a") as arr, cache.view("a") as again:
        assert arr.dtype == stored.dtype and arr.shape == (3, 4) and np.array_equal(arr, stored)
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0, 0] = 1
        with pytest.raises(ValueError):
            arr.flags.writeable = True
        # Two views of one entry are the same bytes of shared memory.
        assert arr.__array_interface__["data"][0] == again.__array_interface__["data"][0]
        assert float(arr.sum()) == float(stored.sum())
    s = cache.stats()
    assert (s.hits, s.misses) == (2, 0)


@pytest.mark.parametrize("stored", [np.zeros((0, 3)), np.array(7.5), np.arange(5, dtype=">i8"),
                                    np.array([1 + 2j, 3j]), np.arange(6).reshape(2, 3).T])
def test_view_array_shapes_and_dtypes(cache, stored):
    cache.put("a", stored)
    with cache.view("a") as arr:
        assert arr.dtype == stored.dtype and arr.shape == stored.shape and np.array_equal(arr, stored)


def test_view_bytes_is_a_read_only_memoryview_released_after_the_block(cache):
    cache.put("b", b"\x00payload\xff")
    with cache.view("b") as mv:
        assert isinstance(mv, memoryview) and mv.readonly and bytes(mv) == b"\x00payload\xff"
    with pytest.raises(ValueError):
        bytes(mv)


def test_view_array_is_its_export_valid_and_pinned_until_its_name_goes(cache):
    """A view is its export: the array bound after the block reads the stored bytes and keeps its entry pinned until
    the name goes; a put meanwhile succeeds (the old entry held aside), and the array still reads what it was
    given."""
    cache.put("a", np.arange(4.0))
    with cache.view("a") as arr:
        pass
    assert np.array_equal(arr, np.arange(4.0)) and not arr.flags.writeable and pinned(cache, "a")
    cache.put("a", np.zeros(4))
    assert np.array_equal(cache.get("a"), np.zeros(4)) and np.array_equal(arr, np.arange(4.0))
    assert cache.stats().held_entries == 1
    del arr  # the pin goes with the last reference
    cache.put("b", 1)
    assert cache.stats().held_entries == 0 and cache.verify().ok


def test_view_of_other_values_or_absent_keys(cache):
    cache.put("m", {"not": "an array"})
    with pytest.raises(TypeError, match="get()"):
        cache.view("m")
    with pytest.raises(KeyError):
        cache.view("absent")
    cache.put("m", 1)  # a refused view leaves no pin
    s = cache.stats()
    assert (s.hits, s.misses) == (0, 1)  # a view refused for its value's type counts nothing


def test_view_keys_encode_as_get_keys_do(cache):
    """view() encodes a key as get() does: the same entry for the same key, the same refusal."""
    for key in ("k", "clé", 7, ("k", 1), b"k", "x" * 240, "x" * 241):  # (beyond 240 bytes xxhash hashes the key)
        cache.put(key, np.arange(3) + len(repr(key)))
        with cache.view(key) as arr:
            assert np.array_equal(arr, cache.get(key))
    with pytest.raises(TypeError, match="cannot encode key"):
        cache.view("\ud800")  # a lone surrogate is no key, for get() and view() alike
    with pytest.raises(TypeError, match="cannot encode key"):
        cache.get("\ud800")


def test_view_blocks_no_put_delete_pop_replace_cas_or_clear(cache):
    """Each succeeds on a key a view pins (the old entry held aside), and the view reads its bytes throughout."""
    cache.put("a", np.arange(100))
    cache.put("other", 1)
    with cache.view("a") as arr:
        cache.put("a", np.zeros(3))
        assert np.array_equal(cache.get("a"), np.zeros(3))
        with cache.view("a") as again:  # a view of the new value, held aside in turn
            assert cache.delete("a") and "a" not in cache
            assert np.array_equal(again, np.zeros(3))
        cache.put("a", 1)
        assert cache.pop("a") == 1 and "a" not in cache
        cache.put("a", 2)
        assert cache.replace("a", 3) and cache.get("a") == 3
        assert cache.cas("a", 4, cache.get_with_version("a")[1]) and cache.get("a") == 4
        cache.clear()
        assert "a" not in cache and "other" not in cache and len(cache) == 0
        assert np.array_equal(arr, np.arange(100)) and cache.stats().held_entries >= 1
        assert cache.verify(deep=True).ok
    del arr, again  # (the arrays hold their pins until they go)
    cache.put("a", 0)
    assert cache.get("a") == 0 and cache.stats().recoveries == 0 and cache.stats().held_entries == 0


def _derived(cache, key):
    """A slice of a view, taken inside its with block (the array itself goes as this returns)."""
    with cache.view(key) as arr:
        tail = arr[5:]
    return tail


def _shared(cache, key, how):
    """Something that holds the view's array itself: a memoryview of it, a list, or a tensor."""
    with cache.view(key) as arr:
        held = how(arr)
    return held


def test_view_pin_lasts_while_a_derived_array_lives(cache):
    cache.put("a", np.arange(10))
    tail = _derived(cache, "a")
    assert pinned(cache, "a")
    assert np.array_equal(tail, np.arange(5, 10))
    del tail
    cache.put("a", 0)
    assert cache.get("a") == 0


def test_view_pin_lasts_while_anything_holds_the_array_itself(cache):
    cache.put("a", np.arange(10))
    mv = _shared(cache, "a", memoryview)
    assert list(mv.cast("B").cast("q")) == list(range(10))  # the export keeps the memory, and the pin
    assert pinned(cache, "a")
    del mv
    cache.put("a", 0)
    cache.put("b", np.arange(3))
    held = _shared(cache, "b", lambda arr: [arr])
    assert np.array_equal(held[0], np.arange(3))  # a plain reference reads the array, which keeps the pin
    assert pinned(cache, "b")
    del held
    cache.put("b", 0)


def test_view_pin_lasts_while_a_tensor_shares_the_array(cache):
    torch = pytest.importorskip("torch")
    cache.put("a", np.arange(10.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the array is read-only
        tensor = _shared(cache, "a", torch.from_numpy)
    assert tensor.tolist() == [float(i) for i in range(10)]
    assert pinned(cache, "a")
    del tensor
    cache.put("a", 0)


def test_view_pin_ends_as_the_name_is_rebound_or_its_frame_returns(cache):
    """The usual loop and the usual function: a name rebound to the next view, or a frame that returns, ends the
    pin of what it held, with no reading of any frame."""
    cache.put("a", np.arange(10))
    for _ in range(3):
        with cache.view("a") as arr:
            assert int(arr.sum()) == 45
    assert pinned(cache, "a")  # the last one, still bound
    del arr
    assert not pinned(cache, "a")

    def total() -> int:
        with cache.view("a") as arr:
            return int(arr.sum())

    assert total() == 45 and not pinned(cache, "a")


def test_view_in_every_kind_of_frame_and_through_an_exit_stack(cache):
    """A module's or class body's namespace, a closure's cell, an ExitStack: whatever holds the array holds the
    pin, and nothing else does."""
    cache.put("a", np.arange(10))
    for source in ("with cache.view('a') as arr:\n    total = int(arr.sum())\n",  # a module's namespace
                   "class Body:\n    with cache.view('a') as arr:\n        total = int(arr.sum())\n"):
        namespace = {"cache": cache, "int": int}
        exec(compile(source, "<frame>", "exec"), namespace)
        assert pinned(cache, "a")
        held = namespace["Body"].arr if "Body" in namespace else namespace["arr"]
        assert int(held.sum()) == 45
        del held, namespace
        gc.collect()  # (a class is in reference cycles of its own: its dict goes with a collection)
        assert not pinned(cache, "a")

    def closure():
        with cache.view("a") as arr:
            def read():
                return arr
        return read

    read = closure()
    assert int(read().sum()) == 45 and pinned(cache, "a")  # the cell holds it
    del read
    assert not pinned(cache, "a")
    with contextlib.ExitStack() as stack:
        arr = stack.enter_context(cache.view("a"))
        total = int(arr.sum())
    assert total == 45 and pinned(cache, "a")
    del arr
    assert not pinned(cache, "a")


class _Interrupted(Exception):
    pass


@pytest.mark.timeout(60)
def test_view_cut_short_by_a_signal_pins_exactly_while_its_array_lives(name):
    """A signal's exception at any bytecode of a with block or its release: once the array (if one was bound) and
    what the exception left are gone, no pin is left, and the array read the stored bytes. Half the handlers read
    every frame's locals first, as a sampling profiler or an error reporter does (before 3.13 that leaves each frame
    a snapshot of its names, which holds the array until the frame is gone)."""
    rng = np.random.default_rng(23)
    calls = itertools.count()
    # Whether the handler raises: cleared as the round's cancellation begins. A signal that arrived just before it
    # may have its handler run later, at the next call that checks for handlers (in other.put, below), which must
    # not raise.
    armed = [False]

    def interrupt(signum, frame):
        if not armed[0]:
            return
        if next(calls) % 2:
            while frame is not None:
                _ = frame.f_locals  # materialised, as a debugger's look would
                frame = frame.f_back
        raise _Interrupted()

    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as c, \
            SharedCache(name, create=False) as other:
        c.put("a", np.arange(64))
        old = signal.signal(signal.SIGALRM, interrupt)
        # A signal landing in a finalizer that a garbage collection runs mid-block makes an unraisable exception,
        # whose traceback's frames (f_back up to the block's) hold the derived arrays they were computing with, and
        # so the pin: pytest's hook keeps it until the test ends. What that hook keeps is not an array the block
        # revoked, so here the exception is counted and dropped, as Python's own hook does after printing it.
        unraisable = []
        old_hook, sys.unraisablehook = sys.unraisablehook, lambda u: unraisable.append(u.exc_type)
        cut = 0
        try:
            for _ in range(1500):
                if _one_view_under_a_timer(c, rng, armed):
                    cut += 1
                if pinned(other, "a"):
                    gc.collect()  # what an exception cut short is garbage, in a cycle: its pin goes with it
                assert not pinned(other, "a")
                other.put("a", np.arange(64))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            sys.unraisablehook = old_hook
        assert set(unraisable) <= {_Interrupted}  # nothing else went wrong unseen
        assert cut > 0  # the scenario happened (how often: no criterion)
        assert c.verify().ok and c.stats().held_entries == 0


def _one_view_under_a_timer(c, rng, armed) -> bool:
    """One view of "a" with a one-shot timer running from inside the pin to well past the release; whether its
    handler's exception cut the round short. The array goes as this returns, with this frame."""
    arr = None
    try:  # (the timer is one-shot: once its handler has raised, no other signal comes this round)
        try:
            armed[0] = True
            signal.setitimer(signal.ITIMER_REAL, float(rng.uniform(5e-6, 300e-6)))
            with c.view("a") as arr:
                # Why no assert: pytest's rewriting would keep arr[:4] in a hidden local.
                if int(arr[:4].sum()) != 6:
                    raise AssertionError(f"the view shows {arr[:4]}")
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Interrupted:
        armed[0] = False  # (raised in the finally above, before it disarmed)
        return True
    if arr is not None and int(arr[:4].sum()) != 6:
        raise AssertionError("the array read other bytes after its block")
    return False


def test_view_pinned_entries_survive_eviction_and_compaction(name):
    big = np.arange(2000, dtype=np.int64)  # 16 KB of a 64 KB cache
    # lru: where 100 new keys age out the unpinned entry for certain (auto's filter may keep a key it read)
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True, policy="lru") as c:
        c.put("pinned", big)
        with c.view("pinned") as arr:
            for i in range(3000):  # churn the arena round many times, with values of varied size
                c.put(f"k{i}", bytes([i % 251]) * (100 + (i * 37) % 3000))
                if i % 500 == 0:
                    assert c.verify().ok
            assert np.array_equal(arr, big) and "pinned" in c
            assert c.stats().evictions > 0 and c.verify(deep=True).ok
        del arr  # the pin goes with the array
        for i in range(3000, 3100):
            c.put(f"k{i}", b"x" * 2000)
        assert "pinned" not in c  # unpinned, it ages out like any entry


@pytest.mark.parametrize("policy", POLICIES)
def test_view_put_not_admitted_when_all_room_is_pinned(name, policy):
    """A put whose room is all pinned stores nothing and says so (False, ``not_admitted``), raising nothing; one that
    replaces a viewed key leaves it absent (its old value held for the view), never the old value served."""
    with SharedCache(name, capacity_bytes=4096, max_entries=2, create=True, policy=policy) as c:
        c.put("a", b"a")
        c.put("b", b"b")
        with c.view("a") as va, c.view("b") as vb:
            assert c.put("c", b"c") is False
            assert len(c) == 2 and "c" not in c and c.verify().ok and c.stats().not_admitted == 1
            assert c.put("a", b"A") is False  # the old "a" is held for the view; the new one finds no room
            assert "a" not in c and c.get("a") is None and bytes(va) == b"a" and bytes(vb) == b"b"
            s = c.stats()
            assert (s.not_admitted, s.held_entries, s.entries) == (2, 1, 1) and c.verify(deep=True).ok
        assert c.put("c", b"c") is True
        assert c.get("c") == b"c" and c.stats().held_entries == 0 and c.stats().recoveries == 0


def test_view_outlives_its_cache_handle(name):
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as owner:
        owner.put("a", np.arange(8))
        c = SharedCache(name)
        v = c.view("a")
        arr = v.__enter__()
        c.close()  # the mapping stays while the array lives, and so does the pin
        assert np.array_equal(arr, np.arange(8))
        assert pinned(owner, "a")
        v.__exit__(None, None, None)
        del v
        gc.collect()
        owner.put("a", 0)


def test_view_of_an_expired_key_is_a_key_error(name):
    now = [0]
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True, clock=lambda: now[0]) as c:
        c.put("a", b"x", ttl=1)
        now[0] = 10**9
        with pytest.raises(KeyError):
            c.view("a")


# ---------------------------------------------------------------------------------------------------- processes


def _hold_view(name, key, ready, done, result):
    """Pin ``key`` and hold it until ``done``; then report whether the bytes were intact throughout."""
    try:
        with SharedCache(name, create=False) as c, c.view(key) as arr:
            first = xxhash.xxh3_64_intdigest(arr.tobytes())
            ready.set()
            done.wait(JOIN_S)
            result.put(("ok", xxhash.xxh3_64_intdigest(arr.tobytes()) == first
                        and int(arr[0]) == 7 and len(arr) == 4096))
    except BaseException as exc:
        ready.set()
        result.put(("error", repr(exc)))


@contextmanager
def _held_by_a_child(c, name):
    """Put an array under "held" and have a child process pin it with a view: yields (child, done, result); the
    child lets go when ``done`` is set, and is reaped at the end of the block whatever happened."""
    c.put("held", np.full(4096, 7, dtype=np.int32))
    ready, done, result = ctx.Event(), ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_hold_view, args=(name, "held", ready, done, result), daemon=True)
    p.start()
    try:
        assert ready.wait(JOIN_S)
        yield p, done, result
    finally:
        if p.is_alive():
            # Never for a child killed while waiting on it: setting an Event waits for its sleepers to wake.
            done.set()
        reap([p], JOIN_S)


@pytest.mark.timeout(120)
def test_view_pin_of_another_process_survives_pressure(name):
    with SharedCache(name, capacity_bytes=256 * 1024, max_entries=128, create=True) as c:
        with _held_by_a_child(c, name) as (_, done, result):
            for i in range(2000):
                c.put(f"k{i}", np.full(1000 + i % 500, i, dtype=np.int32))
            assert "held" in c and c.verify(deep=True).ok
            assert pinned(c, "held")
            done.set()
            assert result.get(timeout=JOIN_S) == ("ok", True)
        c.put("held", 0)  # the child closed its view: the pin is gone
        assert c.get("held") == 0


@pytest.mark.timeout(120)
def test_view_sigkill_of_the_pinning_process_releases_its_pins(name):
    # lru: where 20 new keys age the entry out for certain, and a view pins through a description
    with SharedCache(name, capacity_bytes=256 * 1024, max_entries=8, create=True, policy="lru") as c:
        with _held_by_a_child(c, name) as (p, _, _):
            assert pinned(c, "held")
            os.kill(p.pid, signal.SIGKILL)
            p.join(JOIN_S)
            assert p.exitcode == -signal.SIGKILL
        c.put("held", 0)  # nothing was written when it died: the kernel dropped the pin
        for i in range(20):
            c.put(f"k{i}", i)  # and the entry ages out again
        assert "held" not in c and c.verify(deep=True).ok and c.stats().recoveries == 0


def test_view_pinned_blocks_that_split_the_arena_refuse_a_put_cleanly(name):
    with SharedCache(name, capacity_bytes=8192, max_entries=8, create=True) as c:
        for k in "abc":
            c.put(k, bytes([ord(k)]) * 2000)
        with c.view("a"), c.view("c"):
            c.delete("b")  # a 2 KB hole between two pinned blocks
            assert c.put("d", b"d" * 3500) is False  # fits the limits, not between or around the pinned blocks
            assert c.verify(deep=True).ok and "d" not in c and c.stats().recoveries == 0
            assert c.stats().not_admitted == 1
            c.put("e", b"e" * 1500)  # what fits somewhere still goes in
            assert c.get("e") == b"e" * 1500
        c.put("d", b"d" * 3500)  # unpinned, the ring is compacted round them
        assert c.get("d") == b"d" * 3500 and c.verify(deep=True).ok


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("lowered", ["entries", "bytes"])
def test_view_set_limits_below_the_pinned_entries_holds_the_excess(name, policy, lowered):
    """Limits lowered below what views pin take effect at once: the pinned entries over them leave the index, held
    for their views, which read their bytes unchanged; puts that need their room are not admitted until the views
    end, and then the cache is within the new limits."""
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True, policy=policy) as c:
        for i in range(4):
            c.put(i, bytes([i]) * 100)
        limits = CacheLimits(1, 65536) if lowered == "entries" else CacheLimits(8, 150)
        with c.view(2) as v2, c.view(3) as v3:
            c.set_limits(limits)
            s = c.stats()
            assert c.limits() == limits and (s.entries, s.held_entries) == (1, 1) and c.verify(deep=True).ok
            assert [k for k in range(4) if k in c] in ([2], [3]) and 0 not in c and 1 not in c
            assert bytes(v2) == bytes([2]) * 100 and bytes(v3) == bytes([3]) * 100
            assert c.put("new", b"n") is False and "new" not in c
        for k in range(4):
            c.delete(k)  # (keep evicts nothing to admit a key)
        assert c.put("new", b"n") is True and c.get("new") == b"n"
        s = c.stats()
        assert (s.entries, s.held_entries, s.recoveries) == (1, 0, 0) and c.verify(deep=True).ok


def test_view_a_put_refused_for_room_leaves_only_pinned_entries(name):
    """Puts not admitted for room evict every unpinned entry first: fragmentation by pins is fought by evicting."""
    rng = np.random.default_rng(3)
    refused = 0
    # lru: the seed's sequence of puts and views meets a refusal there (the scenario is checked below)
    with SharedCache(name, capacity_bytes=6144, max_entries=16, create=True, policy="lru") as c:
        views = {}
        for i in range(400):
            if views and rng.random() < 0.3:
                key = list(views)[rng.integers(len(views))]
                views.pop(key).close()
            elif len(views) < 3 and rng.random() < 0.3:
                key = f"k{rng.integers(40)}"
                if key in c and key not in views:
                    views[key] = c.view(key)
                    views[key].__enter__()
            key = f"k{rng.integers(40)}"
            if key in views:
                continue
            if not c.put(key, bytes([i % 251]) * int(rng.integers(500, 3000))):
                refused += 1
                resident = {f"k{j}" for j in range(40) if f"k{j}" in c}
                assert resident <= set(views), (resident, set(views))
            assert c.verify().ok
        for v in views.values():
            v.close()
    assert refused > 0  # the scenario happened


def test_view_a_forked_child_never_drops_its_parents_pin(name):
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as c:
        c.put("k", np.arange(1000))
        v = c.view("k")
        arr = v.__enter__()
        pid = os.fork()
        if pid == 0:  # the child leaves the view it inherited, collects it, and exits
            try:
                v.__exit__(None, None, None)
                del arr, v
                gc.collect()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert pinned(c, "k")
        assert np.array_equal(arr, np.arange(1000))
        v.__exit__(None, None, None)
        del arr, v
        gc.collect()
        c.put("k", 1)


@pytest.mark.timeout(120)
def test_view_a_forked_childs_inherited_view_keeps_its_pin_after_the_parents_ends(name):
    """The parent's end of a view must not unlock the description the child inherited: the child's copy of the
    view keeps the entry pinned until the child drops it or exits, so it never reads bytes reused under it."""
    seven = np.full(4096, 7, dtype=np.uint8)
    with SharedCache(name, capacity_bytes=256 * 1024, max_entries=64, create=True) as c:
        c.put("k", seven)
        go_r, go_w = os.pipe()
        with c.view("k") as arr:
            pid = os.fork()
            if pid == 0:  # the child stays inside its copy of the block until told to read
                code = 2
                try:
                    os.close(go_w)
                    os.read(go_r, 1)
                    code = 0 if np.array_equal(arr, seven) else 1
                finally:
                    os._exit(code)
        os.close(go_r)
        try:
            assert pinned(c, "k")  # the child's pin: another writer must still be refused
            for i in range(3000):  # churn the arena around the pinned block
                c.put(f"other{i}", np.full(4096, 9, dtype=np.uint8))
            assert c.verify().ok
        finally:
            os.write(go_w, b"x")
            os.close(go_w)
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # the child read its 7s, never the 9s written since
        c.put("k", np.full(4096, 9, dtype=np.uint8))  # the child is gone, and its pin with it



@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", ["put", "delete"])
def test_view_a_fork_inside_a_view_leaves_no_pin_once_its_slice_goes(name, op):
    """A slice that outlives its block, and a fork inside the block: the parent's pin ends as the slice goes (the
    child's copy of the description went with the child), as the compiled Lease's does; not at the handle's end.
    (The slice is kept in a list: before 3.13 the pure path's reading of this frame's locals leaves a snapshot
    of them, which a ``del`` of the name would not clear.)"""
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as c:
        c.put("k", np.arange(1000))
        with c.view("k") as arr:
            kept = [arr[100:110]]
            pid = os.fork()
            if pid == 0:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert kept[0].tolist() == list(range(100, 110))
        assert pinned(c, "k")  # pinned while the slice lives
        kept.clear()
        if op == "put":
            assert c.put("k", 2) and c.get("k") == 2
        else:
            assert c.delete("k") and "k" not in c
        c.put("k", np.arange(5))
        assert c.delete("k")  # nothing left pinned
        assert c.verify().ok


def _fork_a_sleeper() -> int:
    """Fork a child that sleeps, once its fork hooks have run. Why wait for them: until then the child holds a copy of
    every description of its parent's, the parent's reader slot's too (readers.py), and a view the parent pins by
    the slot's word would outlive the parent for as long as the child had not closed that copy."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, b"x")
        os.close(w)
        time.sleep(JOIN_S)
        os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"x"
    finally:
        os.close(r)
    return pid


def _hold_the_lock(held, seconds: float) -> None:
    held.set()
    time.sleep(seconds)


def _pin_fork_and_pin_again(name, ready, queue, when):
    """Fork a grandchild while a view of "a" is open (``when`` "waiting": while another thread's view of it waits
    for the lock, its description taken), let that view end, open one of "b", then wait to be killed."""
    with SharedCache(name, create=False) as c:
        if when == "open":
            with c.view("a"):
                grandchild = _fork_a_sleeper()
        else:
            held = threading.Event()
            holder = threading.Thread(target=c._guard.run, args=(_hold_the_lock, held, 1.0))
            holder.start()
            held.wait(JOIN_S)
            viewer = threading.Thread(target=lambda: c.view("a").close())
            waits = None if c._core is None else c._core.waits
            viewer.start()
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline and (waits is None or c._core.waits == waits):
                time.sleep(0.01)  # until the compiled view says it waits (the Python path's: half a second)
            grandchild = _fork_a_sleeper()
            holder.join(JOIN_S)
            viewer.join(JOIN_S)
        queue.put(grandchild)
        with c.view("b"):
            ready.set()
            time.sleep(JOIN_S)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["open", "waiting"])
def test_view_a_pin_dies_with_its_process_even_after_a_fork(name, when):
    """A description the child may hold a copy of is never lent again: the pin taken through it would outlive the
    process that took it. Also one taken by a view that was still waiting for the lock when the process forked."""
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as c:
        c.put("a", b"a")
        c.put("b", b"b")
        ready, queue = ctx.Event(), ctx.Queue()
        p = ctx.Process(target=_pin_fork_and_pin_again, args=(name, ready, queue, when), daemon=True)
        p.start()
        grandchild = None
        try:
            grandchild = queue.get(timeout=JOIN_S)
            assert ready.wait(JOIN_S)
            assert pinned(c, "b")
            os.kill(p.pid, signal.SIGKILL)
            deadline = time.monotonic() + JOIN_S  # not join(): the grandchild holds the sentinel pipe open
            while p.exitcode is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert p.exitcode == -signal.SIGKILL
            # The grandchild still holds copies of what its parent had open when it forked; not "b"'s pin.
            assert not pinned(c, "b")
            c.put("b", b"x")
            if when == "open":  # ...but it inherited the open view of "a", which keeps its pin while it lives
                assert pinned(c, "a")
                os.kill(grandchild, signal.SIGKILL)
                grandchild = None
                deadline = time.monotonic() + JOIN_S  # P's child, reaped by init: wait for its pin to go
                while pinned(c, "a") and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert not pinned(c, "a")
            c.put("a", b"x")
        finally:
            if grandchild:
                os.kill(grandchild, signal.SIGKILL)  # P's child, reaped by init: P is gone
            if p.is_alive():
                p.kill()
                p.join(5)


def _flip_value_byte(cache: SharedCache, key, at: int) -> None:
    """Damage one byte of ``key``'s stored value through a mapping of the segment of its own, as another program
    could (the entry's value starts ``at`` bytes before the byte flipped)."""
    voff = value_at(cache._seg.records, cache._base, entry_of(cache, key))
    fd = os.open(f"/dev/shm/shmcache.{cache.name}", os.O_RDWR)
    try:
        with mmap.mmap(fd, len(cache._mm)) as mm:
            mm[voff + at] ^= 0x01
    finally:
        os.close(fd)


def test_view_checks_each_stored_value_once_per_handle(cache, name):
    """The view's checksum policy (docs/usage.md, "Zero-copy reads of large values"): a handle checks a stored value
    on its first view of it; a value stored anew is checked again; another handle checks for itself. A get checks
    every time."""
    cache.put("a", np.arange(1000.0))
    with cache.view("a") as arr:
        assert arr[10] == 10.0
    _flip_value_byte(cache, "a", 200)  # after this handle's check: its later views trust it
    with cache.view("a") as arr:
        assert arr.shape == (1000,)
    other = SharedCache(name)
    try:
        with pytest.raises(CorruptionError):
            with other.view("a"):
                pass  # a handle that never checked this value does
    finally:
        other.close()
    cache.put("b", np.arange(1000.0))
    with cache.view("b"):
        pass
    cache.put("b", np.arange(1000.0) + 1)  # a new store: checked again on its first view
    _flip_value_byte(cache, "b", 200)
    with pytest.raises(CorruptionError):
        with cache.view("b"):
            pass


def _set_value_byte(cache: SharedCache, key, at: int, byte: int) -> None:
    """Write ``byte`` at ``at`` bytes into ``key``'s stored value (0: its tag), as _flip_value_byte writes."""
    e = entry_of(cache, key)
    voff = value_at(cache._seg.records, cache._base, e)
    fd = os.open(f"/dev/shm/shmcache.{cache.name}", os.O_RDWR)
    try:
        with mmap.mmap(fd, len(cache._mm)) as mm:
            mm[voff + at] = byte
    finally:
        os.close(fd)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("value", [np.arange(100.0), b"payload" * 20], ids=["array", "bytes"])
@pytest.mark.parametrize("tag", [0, ord("Z"), 0xFF])
def test_issue_view_of_a_damaged_tag_raises_corruption_error(name, policy, value, tag):
    """A value's tag byte damaged to one no encoder writes made view() raise TypeError (as for a value it does not
    serve) and left the entry in place: it is damage, so CorruptionError, the entry dropped by the repair and the
    lookup counted as a miss, as get does; the key then reads as absent, never as another value."""
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=16, create=True, policy=policy) as c:
        c.put("k", value)
        c.put("other", b"fine")
        _set_value_byte(c, "k", 0, tag)
        before = c.stats()
        with pytest.raises(CorruptionError):
            c.view("k")
        after = c.stats()
        assert (after.hits, after.misses, after.entries) == (before.hits, before.misses + 1, before.entries - 1)
        assert after.recoveries == before.recoveries + 1
        with pytest.raises(KeyError):
            c.view("k")
        assert c.get("k", "miss") == "miss" and "k" not in c
        with c.view("other") as mv:
            assert bytes(mv) == b"fine"
        assert c.verify(deep=True).ok
        c.put("k", value)  # stored anew, it is served again
        with c.view("k") as got:
            assert bytes(got) == bytes(memoryview(value).cast("B"))


# ---------------------------------------------------------------------------------------------- the compiled build's
# Core.view and _view.c: the pin taken in C, a stored value this handle checked before viewed without Python code.

compiled = pytest.mark.skipif(core.Core is None, reason="the compiled section is not built (or not wanted)")


def _segment_fds(name: str) -> set[int]:
    """This process's descriptors open on cache ``name``'s segment."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(f"/shmcache.{name}"):
                out.add(int(fd))
        except FileNotFoundError:
            pass  # (the listing's own descriptor, closed since)
    return out


def _core_view(c, key):
    """Core.view's own answer for ``key`` (a Lease, a View, None, -1 or HANDOVER, as a Core bound without a fallback
    gives them), through ``c``'s pins; ``c``'s versions column switched on first (a view carries its version)."""
    if not c._seg.versions_shown:
        versioned(c)
    kb = encode_key(key)
    bare = core.bind(c._seg, 1.0)
    try:
        return bare.view(kb, fingerprint(kb), -1, c._pins)
    finally:
        bare.release()


@compiled
def test_view_compiled_a_first_look_then_the_view_built_in_c(cache):
    cache.put("a", np.arange(6.0).reshape(2, 3))
    cache.put("m", {"not": "viewable"})
    lease = _core_view(cache, "a")
    assert type(lease) is _core.Lease and lease.fd >= 0  # a first look: checked in Python (view.first_look)
    raw = bytes(memoryview(lease))
    assert raw[0] == TAG_ARRAY and np.array_equal(cache.get("a"), np.arange(6.0).reshape(2, 3))
    assert pinned(cache, "a")  # the lease holds the pin
    del lease
    cache.put("a", np.arange(6.0).reshape(2, 3))
    with cache.view("a") as arr:  # checked, and recorded
        assert arr.shape == (2, 3)
    v = _core_view(cache, "a")
    assert type(v) is View is _core.View
    with v as arr:
        assert np.array_equal(arr, np.arange(6.0).reshape(2, 3)) and not arr.flags.writeable
        assert pinned(cache, "a")
    del arr
    assert not pinned(cache, "a")
    before = cache.stats()
    assert _core_view(cache, "absent") is None
    assert _core_view(cache, "m") == -1
    after = cache.stats()
    assert (after.hits - before.hits, after.misses - before.misses) == (0, 1)  # a refused view counts nothing
    cache.put("a", 1)  # nothing pinned any more


@compiled
def test_view_compiled_reuses_its_descriptions_and_closes_them_with_the_handle(name):
    # lru: every view pins through a description (the policies that read without the lock pin in a reader slot)
    c = SharedCache(name, capacity_bytes=1 << 20, max_entries=64, create=True, policy="lru")
    try:
        handle_fds = _segment_fds(name)
        c.put("a", np.arange(100))
        c.put("b", b"bytes")
        for _ in range(200):
            with c.view("a") as arr, c.view("b") as mv:
                assert int(arr[99]) == 99 and bytes(mv) == b"bytes"
        del arr  # (its pin, and its description, go with it)
        pin_fds = _segment_fds(name) - handle_fds
        assert c._pins.idle == 2 and len(pin_fds) == 2  # two descriptions, lent again and again
        kept = c.view("a")  # a view outliving its handle keeps its description until it goes
        c.close()
        assert len(_segment_fds(name) & pin_fds) == 1
        with kept as arr:
            assert int(arr.sum()) == sum(range(100))
        del kept, arr
        assert not _segment_fds(name) & pin_fds
    finally:
        c.close()
        SharedCache.unlink_name(name)
    with pytest.raises(ClosedError):
        c.view("a")


@compiled
def test_view_compiled_hands_over_to_the_python_path_which_pins_through_a_lease(cache):
    cache.put("a", np.arange(10))
    with cache.view("a"):
        pass  # recorded: the next view would be built in C, but the dirty word hands it over
    cache._h[H_DIRTY] = 1
    assert _core_view(cache, "a") is core.HANDOVER and cache._pins.idle == 1  # its description given back
    with cache.view("a") as arr:  # the Python path repairs, pins, and arms a lease with what it pinned
        assert np.array_equal(arr, np.arange(10))
        cache.put("a", 1)  # the old entry held aside for the view
        assert cache.stats().held_entries == 1 and np.array_equal(arr, np.arange(10))
    assert cache._h[H_DIRTY] == 0
    del arr
    cache.put("a", 0)
    assert cache.get("a") == 0 and cache.stats().held_entries == 0


@compiled
def test_view_compiled_a_lease_checks_what_it_is_given(cache):
    lease = cache._pins.lease()
    fd = lease.fd
    os.fstat(fd)
    with pytest.raises(BufferError):
        memoryview(lease)  # not armed: no memory yet
    arena = cache._seg.geometry.arena_nbytes
    for slot, off, length in ((1, arena, 8), (1, 0, arena + 8), (1, -8, 8), (-1, 0, 8), (1, 0, 0)):
        with pytest.raises(ValueError):
            lease.arm(slot, off, length, 0, 0)
    del lease  # dropped unarmed: its description is closed (a lock taken through it would go with it)
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(TypeError):
        cache._core.view(encode_key("a"), 0, -1, object())


@compiled
def test_view_compiled_a_lease_ended_before_any_view_unpins_at_once(cache):
    cache.put("a", b"payload")
    lease = _core_view(cache, "a")
    assert pinned(cache, "a")
    lease.end()
    lease.end()  # at most once
    raw = bytes(memoryview(lease))  # (its memory stays valid: the lease still holds the mapping)
    assert lease.fd == -1 and raw[0] == TAG_BYTES and raw[1:] == b"payload"
    assert cache.delete("a")


@compiled
def test_view_compiled_pins_refuse_what_they_were_not_made_for(cache):
    bare = _core.Pins.__new__(_core.Pins)  # __init__ never ran: every view through it fails cleanly
    assert dict(bare.viewed) == {} and bare.idle == 0
    with pytest.raises(OSError):
        bare.lease()
    with pytest.raises(OSError):
        cache._core.view(encode_key("a"), fingerprint(encode_key("a")), -1, bare)
    cache.put("a", np.arange(3.0))
    lease = _core_view(cache, "a")
    with pytest.raises(TypeError):
        cache._pins.viewed[lease.slot] = (0, 0, 0, 0, ())  # read-only: only a built view records its value
    with pytest.raises(TypeError):
        cache._pins.build(lease, (TAG_ARRAY, "no such dtype", (3,), 8, 3))
    assert lease.slot not in cache._pins.viewed  # a layout that built nothing is not trusted later
    del lease
    for _ in range(2):  # a first look, then a view built in C
        with cache.view("a") as arr:
            assert arr.tolist() == [0.0, 1.0, 2.0]
    v = cache.view("a")
    ref = weakref.ref(v)  # as view.PyView can be
    del v
    assert ref() is None
    cache.put("a", 0)  # nothing pinned


@compiled
def test_view_compiled_closed_from_no_python_frame(name):
    """close() called by the interpreter itself (an atexit hook: no Python frame) lets go as from code: the array
    still bound reads on, and a memoryview is released."""
    script = (
        "import atexit, sys, numpy as np\n"
        "from shmcache import SharedCache\n"
        f"c = SharedCache({name!r}, create=False)\n"
        "v, w = c.view('a'), c.view('b')\n"
        "arr, mv = v.__enter__(), w.__enter__()\n"
        "assert arr.sum() == 45\n"
        "def report():\n"
        "    try:\n"
        "        released = not bytes(mv)\n"
        "    except ValueError:\n"
        "        released = True\n"
        "    print('read', arr.sum() == 45, 'released', released, flush=True)\n"
        "atexit.register(report)\n"  # (runs after the next ones)
        "atexit.register(w.close)\n"
        "atexit.register(v.close)\n"
    )
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as c:
        c.put("a", np.arange(10))
        c.put("b", b"bytes")
        with c.view("a"), c.view("b"):
            pass
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=JOIN_S,
                              env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))})
        assert done.returncode == 0 and done.stdout.split() == ["read", "True", "released", "True"], (
            done.stdout + done.stderr)
        assert not done.stderr
        c.put("a", 0)


def test_view_dev_mode_warns_at_close_of_arrays_that_outlived_their_blocks(name):
    """Under ``python -X dev`` a handle's close() warns (ResourceWarning) of its views' arrays still alive, each still
    pinning its entry; none for those dropped, for memoryviews (released at the block's end) or without ``-X dev``."""
    script = (
        "import warnings, numpy as np\n"
        "from shmcache import SharedCache\n"
        "warnings.simplefilter('always')\n"
        f"c = SharedCache({name!r}, create=False)\n"
        "with c.view('a') as kept:\n"
        "    pass\n"
        "with c.view('a') as dropped:\n"
        "    pass\n"
        "del dropped\n"
        "with c.view('b') as mv:\n"
        "    pass\n"
        "c.close()\n"
        "assert int(kept.sum()) == 45\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    with SharedCache(name, capacity_bytes=65536, max_entries=8, create=True) as c:
        c.put("a", np.arange(10))
        c.put("b", b"bytes")
        for dev in (True, False):
            done = subprocess.run([sys.executable, *(["-X", "dev"] if dev else []), "-c", script],
                                  capture_output=True, text=True, timeout=JOIN_S, env=env)
            assert done.returncode == 0, done.stderr
            # (the pure path's description of the array kept alive to the end is closed at exit, which -X dev
            # reports too, as an unclosed file: that one is left out here)
            warned = [line for line in done.stderr.splitlines() if "outlived their with blocks" in line]
            if dev:
                assert len(warned) == 1 and "1 array(s)" in warned[0], done.stderr
            else:
                assert warned == [], done.stderr
        c.unlink()
