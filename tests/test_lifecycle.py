"""Create, attach, close, unlink, permissions, bad input, pickling and racing creators."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing as mp
import os
import pickle
import shutil
import stat
import subprocess
import sys

import pytest

from shmcache import AttachTimeout, SharedCache, ShmCacheError, segment
from tests.conftest import unique_name
from tests.workers import open_and_put

SMALL = dict(capacity_bytes=4096, max_entries=8)


def test_lifecycle_create_true_refuses_existing(name):
    with SharedCache(name, create=True, **SMALL):
        with pytest.raises(FileExistsError):
            SharedCache(name, create=True, **SMALL)


def test_lifecycle_create_false_needs_existing(name):
    with pytest.raises(FileNotFoundError):
        SharedCache(name, create=False)


def test_lifecycle_create_none_attaches_or_creates(name):
    with SharedCache(name, **SMALL) as a, SharedCache(name) as b:
        a.put("k", "v")
        assert b.get("k") == "v"
        assert b.stats() == a.stats()


def test_lifecycle_attach_to_a_segment_still_being_created_is_an_attach_timeout(name):
    # A creator holds the segment file's flock while it initialises; this one never finishes.
    path = "/dev/shm/" + segment.shm_name(name)[1:]
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for create in (None, False):
            with pytest.raises(TimeoutError) as info:
                SharedCache(name, create=create, attach_timeout=0.2, **({} if create is False else SMALL))
            exc = info.value
            assert isinstance(exc, AttachTimeout) and isinstance(exc, ShmCacheError)
            assert exc.what == "attach" and "attach_timeout" in exc.hint
            assert os.fstat(fd).st_size == 0  # the waiter wrote nothing
    finally:
        os.close(fd)
        os.unlink(path)


def test_lifecycle_attach_with_matching_parameters(name):
    with SharedCache(name, create=True, **SMALL), SharedCache(name, create=False, **SMALL) as b:
        assert b.limits().max_entries == 8


@pytest.mark.parametrize("param", [{"max_capacity_bytes": 8192}, {"max_entries": 16 * 8 + 1}, {"policy": "keep"}])
def test_lifecycle_attach_with_other_parameters_raises(name, param):
    """(Another capacity_bytes, or a max_entries within the tables, 16 times those of creation, resizes the cache:
    tests/test_resize.py.)"""
    with SharedCache(name, create=True, **SMALL):
        with pytest.raises(ValueError, match="exists with"):
            SharedCache(name, **param)


@pytest.mark.parametrize("bad", ["", "a/b", "a\0b", "x" * 300])
def test_lifecycle_invalid_names(bad):
    with pytest.raises(ValueError):
        SharedCache(bad, **SMALL)


def test_lifecycle_name_must_be_str():
    with pytest.raises(TypeError):
        SharedCache(b"bytes-name", **SMALL)


@pytest.mark.parametrize("param", [
    {"capacity_bytes": 0}, {"capacity_bytes": -1}, {"max_entries": 0}, {"max_entries": -5},
    {"create": "yes"}, {"mode": 0o1777}, {"mode": -1}, {"lock_timeout": 0},
])
def test_lifecycle_invalid_parameters_create_nothing(name, param):
    with pytest.raises(ValueError):
        SharedCache(name, **{**SMALL, **param})
    assert not os.path.exists(f"/dev/shm/shmcache.{name}")


def test_lifecycle_size_beyond_shared_memory_fails_at_once(name):
    """A capacity /dev/shm could never hold is refused at creation, though the arena is backed only as it fills."""
    st = os.statvfs("/dev/shm")
    with pytest.raises(OSError) as info:
        SharedCache(name, capacity_bytes=st.f_blocks * st.f_frsize * 2, max_entries=8)
    assert info.value.errno == errno.ENOSPC
    assert "MiB" in str(info.value) and "shm-size" in str(info.value)
    assert not os.path.exists(f"/dev/shm/shmcache.{name}")


def test_lifecycle_default_mode_is_owner_only(name):
    with SharedCache(name, **SMALL):
        assert stat.S_IMODE(os.stat(f"/dev/shm/shmcache.{name}").st_mode) == 0o600


def test_lifecycle_mode_widens_on_purpose_despite_umask(name):
    old = os.umask(0o077)
    try:
        with SharedCache(name, mode=0o660, **SMALL):
            assert stat.S_IMODE(os.stat(f"/dev/shm/shmcache.{name}").st_mode) == 0o660
    finally:
        os.umask(old)


def test_lifecycle_unlink_lets_attached_processes_finish(name):
    a = SharedCache(name, **SMALL)
    b = SharedCache(name)
    a.put("k", 1)
    a.unlink()
    assert b.get("k") == 1  # still mapped
    b.put("k2", 2)
    with SharedCache(name, **SMALL) as fresh:  # same name, new segment
        assert len(fresh) == 0 and fresh.get("k") is None
        fresh.unlink()
    a.close()
    b.close()


def test_lifecycle_unlink_missing_raises(name):
    with pytest.raises(FileNotFoundError):
        SharedCache.unlink_name(name)


def test_lifecycle_pickles_by_name(name):
    with SharedCache(name, **SMALL) as a:
        a.put("k", "v")
        data = pickle.dumps(a)
        assert len(data) < 200  # a name, not the contents
        with pickle.loads(data) as b:
            assert b.get("k") == "v" and b.name == name


def test_lifecycle_half_initialised_segment_is_initialised_by_next_creator(name):
    fd = os.open(f"/dev/shm/shmcache.{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)  # a creator that died right after creating the object: size 0, no magic
    with SharedCache(name, **SMALL) as c:
        c.put("k", 1)
        assert c.get("k") == 1 and c.verify().ok


def test_lifecycle_attach_only_to_uninitialised_segment_gives_up(name):
    fd = os.open(f"/dev/shm/shmcache.{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    with pytest.raises(segment.LayoutError, match="never initialised"):
        SharedCache(name, create=False, attach_timeout=0.2)


def test_lifecycle_errors_about_an_existing_cache_name_its_removal_and_loss(name):
    """Every refusal of an existing cache says how to remove it (``shmcache rm NAME``, the name given) and what that
    loses, besides how to use it as it is."""
    from shmcache import SerializerMismatch

    removal = f"`shmcache rm {name}`"
    with SharedCache(name, **SMALL):
        refusals = []
        for make, error in ((lambda: SharedCache(name, max_capacity_bytes=2 * SMALL["capacity_bytes"]), ValueError),
                            (lambda: SharedCache(name, max_entries=17 * SMALL["max_entries"]), ValueError),
                            (lambda: SharedCache(name, policy="keep"), ValueError),
                            (lambda: SharedCache(name, create=True), FileExistsError),
                            (lambda: SharedCache(name, serializer="pickle"), SerializerMismatch)):
            with pytest.raises(error) as raised:
                make().close()
            refusals.append(str(raised.value))
        for message in refusals:
            assert removal in message and "every entry it holds is lost, for every process" in message, message
        assert "omit max_capacity_bytes" in refusals[0] and "create=None" in refusals[3]
        assert "serializer='msgpack'" in refusals[4] and "serializer='pickle'" in refusals[4]
    SharedCache.unlink_name(name)
    fd = os.open(f"/dev/shm/shmcache.{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    with pytest.raises(segment.LayoutError, match="never initialised") as raised:
        SharedCache(name, create=False, attach_timeout=0.2)
    assert removal in str(raised.value) and "holds nothing" in str(raised.value)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("method, mode", [("fork", 0o600), ("spawn", 0o600), ("fork", 0o660)])
def test_lifecycle_racing_creators_share_one_segment(method, mode):
    """Also with a group mode: an opener that finds the segment still owner-only (the creator widens it after
    creating it) accepts it, as a mode narrower than asked."""
    name = unique_name("race")
    ctx = mp.get_context(method)
    n = 6
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=open_and_put, args=(name, i, barrier, queue, mode)) for i in range(n)]
    try:
        for p in procs:
            p.start()
        done = sorted(queue.get(timeout=30) for _ in range(n))
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert done == list(range(n))
        with SharedCache(name, create=False, mode=mode) as c:
            assert sorted(c.get(f"w{i}") for i in range(n)) == list(range(n))
            assert c.stats().puts == n
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        try:
            SharedCache.unlink_name(name)
        except FileNotFoundError:
            pass


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_lifecycle_exiting_spawned_worker_leaves_segment_alone(name):
    """Python's resource_tracker must neither unlink our segment nor warn about it when a worker exits."""
    with SharedCache(name, **SMALL) as c:
        c.put("k", 1)
        code = (
            "import sys; from shmcache import SharedCache\n"
            f"c = SharedCache({name!r}, create=False); c.put('child', 2); c.close()\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "resource_tracker" not in out.stderr and "leaked" not in out.stderr
        assert c.get("child") == 2 and os.path.exists(f"/dev/shm/shmcache.{name}")


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_lifecycle_attach_touches_no_page_of_a_large_cache(name):
    """Attaching maps the segment but reads only the header: a pool of any size starts fast."""
    with SharedCache(name, capacity_bytes=128 * 2**20, max_entries=200_000) as c:
        c.put("k", 1)
        code = (
            "import re\nfrom shmcache import SharedCache\n"
            "def shm_kib():\n"
            "    return int(re.search(r'RssShmem:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
            "before = shm_kib()\n"
            f"c = SharedCache({name!r}, create=False)\n"
            "assert c.get('k') == 1\n"
            "print(shm_kib() - before)\n"
            "c.close()\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        touched_kib = int(out.stdout.strip())
        total_mib = c._seg.geometry.total_nbytes >> 20
        assert touched_kib < 1024, f"attaching touched {touched_kib} KiB of a {total_mib} MiB segment"


def test_lifecycle_unlinked_and_recreated_meanwhile_joins_the_new_segment(name, monkeypatch):
    """An opener that attached to a segment just unlinked (and recreated) by others joins what the name holds now."""
    with SharedCache(name, **SMALL) as first:
        first.put("old", 1)
        real_init = segment.Segment._init_or_attach
        state = {"done": False}

        def racing_init(self, shm, geometry, mode):
            ok = real_init(self, shm, geometry, mode)
            if not state["done"]:  # between our attach and our check, the name is unlinked and recreated
                state["done"] = True
                first.unlink()
                SharedCache(name, **SMALL).close()
            return ok

        monkeypatch.setattr(segment.Segment, "_init_or_attach", racing_init)
        with SharedCache(name) as late, SharedCache(name) as later:
            assert late.get("old") is None  # the new segment, not the unlinked one
            late.put("new", 2)
            assert later.get("new") == 2


_IMPORT_WITHOUT_CORE = """
import sys, warnings
if {hide}:
    sys.modules["shmcache._core"] = None  # as if it were not built: its import raises ImportError
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    import shmcache
    import shmcache.core, shmcache.cache, shmcache.view  # the submodules: no second warning
    c = shmcache.SharedCache({name!r}, capacity_bytes=1 << 20, max_entries=16, create=True)
    c.put("k", 1)
    assert c.get("k") == 1
    c.close()
    c.unlink()
print(shmcache.core.PATH)
for w in seen:
    print(w.category.__name__, issubclass(w.category, Warning), str(w.message)[:80])
"""


@pytest.mark.parametrize("case", ["hidden", "pure asked", "built"])
def test_lifecycle_a_missing_compiled_section_warns_once_unless_the_pure_path_was_asked(name, case):
    env = {k: v for k, v in os.environ.items() if k != "SHMCACHE_PURE_PYTHON"}
    if case == "pure asked":
        env["SHMCACHE_PURE_PYTHON"] = "1"
    code = _IMPORT_WITHOUT_CORE.format(hide=case != "built", name=name)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    if case == "built" and lines[0] == "compiled":
        assert lines[1:] == []
    elif case == "built":
        pytest.skip("the compiled section is not built here")
    elif case == "pure asked":
        assert lines == ["pure Python"]  # asked for: no warning
    else:
        assert lines[0] == "pure Python" and len(lines) == 2, lines
        assert lines[1].startswith("CompiledSectionMissing True shmcache's compiled section (shmcache._core) is not")


def test_lifecycle_an_extension_built_from_other_sources_is_refused(tmp_path):
    """A checkout pulled or edited since its last build: the compiled section does not match the C beside it, so it
    is not run against Python code it was not built for; the import warns and takes the Python path."""
    from shmcache import core

    if core.PATH != "compiled" or not core._core.SOURCES:
        pytest.skip("the compiled section is not built here (or not by setup.py)")
    package = os.path.dirname(core.__file__)
    copy = tmp_path / "shmcache"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = "import shmcache.core as k; print(k.PATH)"
    env = {k: v for k, v in os.environ.items() if k != "SHMCACHE_PURE_PYTHON"}
    same = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert same.stdout.strip() == "compiled" and "CompiledSectionMissing" not in same.stderr, same.stderr
    with open(copy / "_core_lru.c", "a") as f:
        f.write("/* an edit since the build */\n")
    edited = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert edited.stdout.strip() == "pure Python"
    assert "CompiledSectionMissing" in edited.stderr and "built from other C sources" in edited.stderr


def test_lifecycle_a_handle_in_a_reference_cycle_is_collected(name):
    """A handle reachable from its own clock (a closure over it): the compiled section's Core holds its fallback,
    which holds the store and its clock, so the cycle runs through the Core, which the GC must walk too."""
    import gc
    import time
    import weakref

    def make():
        box: dict = {}
        c = SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True,
                        clock=lambda: time.monotonic_ns() + 0 * len(box))
        box["cache"] = c
        c.put("k", 1)
        assert c.get("k") == 1
        return weakref.ref(c)

    try:
        ref = make()
        for _ in range(3):  # (CPython 3.15 frees a cycle whose objects have finalizers a collection after it runs them)
            if not gc.collect():
                break
        assert ref() is None  # collected, cycle and all
    finally:
        SharedCache.unlink_name(name)


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_lifecycle_a_handle_dropped_open_closes_what_it_opened(name, policy):
    """A handle collected without close() closes its descriptors (the segment's, its LIVE_BYTE hold's, its reader
    slot's) and unmaps, as its last reference goes: no cycle keeps it for the collector, so the collector is off."""
    import gc

    with SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True, policy=policy) as c:
        c.put("k", -1)
    gc.collect()
    gc.disable()
    try:
        before = _descriptors()
        for i in range(40):
            h = SharedCache(name, create=False)
            h.put("k", i)
            assert h.get("k") == i
            del h
        assert _descriptors() == before
    finally:
        gc.enable()
    (found,) = segment.sweep(names=[name])
    assert found["state"] == "orphan"  # nobody holds it open any more


@pytest.mark.timeout(120)
def test_lifecycle_handles_dropped_open_never_run_out_of_descriptors(name):
    """A handle made per request and dropped: more requests than the descriptor limit allows open files."""
    code = (
        "import resource, sys\n"
        "from shmcache import SharedCache\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))\n"
        "for i in range(200):\n"
        "    h = SharedCache(sys.argv[1], create=False)\n"
        "    h.put('k', i)\n"
        "    assert h.get('k') == i\n"
        "print('served', i + 1)\n"
    )
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True, policy="s3fifo"):
        done = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["served", "200"]
    (found,) = segment.sweep(names=[name])
    assert found["state"] == "orphan"


def _slice_of_a_dropped_handle(name):
    """A slice of a view whose handle is gone, and a weak reference to that handle (a function of its own: the
    pure path's view reads its caller's locals, which before 3.13 leaves a snapshot of them with the frame)."""
    import weakref

    import numpy as np

    h = SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True)
    h.put("a", np.arange(100))
    with h.view("a") as arr:
        part = arr[10:20]
    return part, weakref.ref(h)


def test_lifecycle_a_view_outlives_its_dropped_handle(name):
    """The mapping a live view reads stays mapped, and its entry pinned, after its handle is collected; the pin goes
    when the view does."""
    from .workers import pinned

    kept, handle = _slice_of_a_dropped_handle(name)
    assert handle() is None
    with SharedCache(name, create=False) as other:
        assert pinned(other, "a")
        assert kept.tolist() == list(range(10, 20))
        del kept
        assert other.delete("a")
