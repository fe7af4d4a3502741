"""Shared memory that runs out: every file the package sizes and maps fails with a clear ENOSPC, never SIGBUS; and a
cache occupies what it holds, not its capacity (its arena is backed as it fills: shmcache/arena.py).

The tests of a full /dev/shm run in a private mount namespace with a small tmpfs on /dev/shm (root and ``unshare``
needed; skipped otherwise), so filling it up touches nothing of the host's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from shmcache import SharedCache

from .workers import python_path

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The scripts' common part: /dev/shm filled to its last page by a file of its own (in the namespace's tmpfs).
FILL_SHM = textwrap.dedent("""
    import errno


    def fill_shm() -> None:
        with open("/dev/shm/filler", "wb", buffering=0) as f:
            for chunk in (65536, 4096):  # large writes first, then the last pages
                try:
                    while True:
                        f.write(b"x" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
""")

# Run inside the namespace: a cache that fits, then /dev/shm filled to the last byte, then each file made after.
FULL_SHM = FILL_SHM + textwrap.dedent("""
    import errno, os
    from shmcache import SharedCache, TieredCache

    local = SharedCache("local", capacity_bytes=64 * 1024, max_entries=64, create=True)
    fill_shm()
    for what, make in (
        ("tier", lambda: TieredCache(local, "redis://127.0.0.1:1", namespace="ns")),  # Redis is reached lazily
        ("cache", lambda: SharedCache("more", capacity_bytes=64 * 1024, max_entries=64, create=True)),
    ):
        try:
            make()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            assert "MiB" in str(exc) and "shm-size" in str(exc), exc
            print(what, "ENOSPC:", exc.strerror)
        else:
            raise SystemExit(f"{what}: made on a full /dev/shm")
    left = sorted(os.listdir("/dev/shm"))
    assert left == ["filler", "shmcache.local"], left  # nothing half-made stays behind
    print("done")
""")


def _namespace_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs in a private mount namespace")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to make a private mount namespace")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")


def test_space_full_shm_is_a_clear_enospc_not_sigbus():
    _namespace_or_skip()
    shell = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} -c \"$SCRIPT\""
    env = {**os.environ, "PYTHONPATH": ROOT, "SCRIPT": FULL_SHM}
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", shell], env=env,
                         capture_output=True, text=True, timeout=90)
    assert run.returncode != -signal.SIGBUS and run.returncode != 128 + signal.SIGBUS, "died of SIGBUS"
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert "tier ENOSPC: the TieredCache stats segment" in run.stdout
    assert "cache ENOSPC: cache 'more'" in run.stdout
    assert run.stdout.rstrip().endswith("done")


# Run under an address-space limit just above what the interpreter has mapped: the segment cannot be mapped.
NO_ADDRESS_SPACE = textwrap.dedent("""
    import errno, os, resource, sys
    from shmcache import SharedCache

    name = sys.argv[1]
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 64 * 2**20, resource.RLIM_INFINITY))
    try:
        SharedCache(name, capacity_bytes=256 * 2**20, max_entries=1000, create=True)
    except OSError as exc:
        assert exc.errno == errno.ENOMEM, exc
        print("ENOMEM:", exc.strerror)
    else:
        raise SystemExit("mapped past the limit")
    assert not os.path.exists("/dev/shm/shmcache." + name)  # nothing half-made stays behind
    print("done")
""")


def test_space_no_address_space_is_a_clear_enomem_naming_the_cache(name):
    st = os.statvfs("/dev/shm")
    if st.f_bavail * st.f_frsize < 512 * 2**20:
        pytest.skip("needs 512 MiB free in /dev/shm (the segment is reserved before it is mapped)")
    run = subprocess.run([sys.executable, "-c", NO_ADDRESS_SPACE, name], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert run.returncode == 0 and "done" in run.stdout, run.stdout + run.stderr
    assert f"cache {name!r} needs" in run.stdout and "MiB of address space" in run.stdout, run.stdout


# Run inside the namespace, on a 64 MiB /dev/shm (a container's default): a default cache is made, occupies little
# empty, holds 20 MiB of values (each carrying its key and a checksum); then /dev/shm is filled, and the stores that
# need more of the arena fail with NoSpaceError while every value stays readable and the cache usable.
CONTAINER = FILL_SHM + textwrap.dedent("""
    import errno, hashlib, os, sys
    from shmcache import NoSpaceError, SharedCache

    def value(i, n=2000):
        key = f"k{i}"
        body = (hashlib.blake2b(key.encode()).digest() * (n // 64 + 1))[:n]
        return key, body, hashlib.blake2b(body).hexdigest()

    def sound(cache, i):
        key, body, check = cache[f"k{i}"]
        assert key == f"k{i}" and hashlib.blake2b(body).hexdigest() == check, i

    path = "/dev/shm/shmcache.default"
    cache = SharedCache("default")
    reads = SharedCache("reads", capacity_bytes=2**20, max_entries=64, policy="s3fifo")  # gets without the lock
    if sys.argv[1] == "python":
        sys.path.insert(0, os.environ["TESTS"])
        from workers import python_path
        python_path(cache)
        python_path(reads)
    print("empty", os.stat(path).st_blocks * 512)
    for i in range(32):
        reads[f"k{i}"] = value(i, 100)
    n = 20 * 2**20 // 2000
    for i in range(n):
        cache[f"k{i}"] = value(i)
    assert len(cache) == n, len(cache)
    for i in range(n):
        sound(cache, i)
    print("held", os.stat(path).st_blocks * 512)
    fill_shm()
    i = n
    try:
        while True:  # the rest of the backed arena, then a growth that cannot be backed
            cache[f"k{i}"] = value(i)
            i += 1
    except NoSpaceError as exc:
        assert exc.errno == errno.ENOSPC and "shm-size" in str(exc), exc
        print("refused", i - n, exc)
    assert f"k{i}" not in cache and len(cache) == i
    for j in range(i):
        sound(cache, j)
    assert cache.verify().ok, cache.verify().problems
    for j in range(0, n, 2):  # half deleted: their room is reused without growing
        del cache[f"k{j}"]
    for j in range(0, n // 2, 2):
        cache[f"k{j}"] = value(j, 1500)
    for j in range(1, i, 2):
        sound(cache, j)
    for j in range(0, n // 2, 2):
        sound(cache, j)
    assert cache.verify().ok, cache.verify().problems
    # Damage aimed past what the arena has backed, /dev/shm full: every entry's offset moved there. A read finds
    # zeros (its checksum fails: a miss, or CorruptionError, and a repair), never a page that faults with SIGBUS.
    from shmcache import CorruptionError
    for c, n in ((cache, i), (reads, 32)):
        seg = c._seg
        hidden = (seg.shown[0] + 65536) & ~7
        assert hidden < seg.geometry.arena_nbytes - 65536
        rec = seg.records
        for e in range(1, seg.geometry.entry_slots):
            if rec.check[e]:
                rec.off[e] = hidden >> rec.osh
        for j in range(0, n, 7):
            try:
                assert c.get(f"k{j}") is None
            except CorruptionError:
                pass
        c.verify(repair_damage=True)
        assert c.verify().ok, c.verify().problems
    cache.close()
    reads.close()
    SharedCache.unlink_name("default")
    SharedCache.unlink_name("reads")
    print("done", i)
""")


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_space_default_cache_fits_a_container_shm_and_a_full_one_refuses_stores(path):
    """A default SharedCache in a 64 MiB /dev/shm: made, at most 8 MiB empty (st_blocks), holds 20 MiB of values;
    on a full /dev/shm a store that needs more of the arena raises NoSpaceError (never SIGBUS), and every value
    stays readable, room freed by deletes is stored into again, verify() passes; then every entry's offset damaged
    to point past what the arena backed is read as damage, never SIGBUS (with the lock, and without: s3fifo)."""
    _namespace_or_skip()
    shell = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} -c \"$SCRIPT\" {path}"
    env = {**os.environ, "PYTHONPATH": ROOT, "SCRIPT": CONTAINER, "TESTS": os.path.join(ROOT, "tests")}
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", shell], env=env,
                         capture_output=True, text=True, timeout=90)
    assert run.returncode != -signal.SIGBUS and run.returncode != 128 + signal.SIGBUS, "died of SIGBUS"
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert int(lines["empty"]) <= 8 * 2**20, lines
    # 20 MiB of values, their keys, block headers, the tables, and at most a growth's eighth more
    assert int(lines["held"]) <= 32 * 2**20, lines
    assert "done" in lines, run.stdout


def _footprint(cache: SharedCache) -> int:
    return os.fstat(cache._seg.fd).st_blocks * 512


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_space_cache_occupies_what_it_holds_not_its_capacity(name, path):
    """A 64 MiB cache whose 1,000 keys are rewritten 20 times at other sizes (dead blocks everywhere): its arena is
    backed a little past what it holds, never towards its capacity; every value read back is the one last stored."""
    from shmcache.layout import Geometry
    from shmcache.layout.geometry import extent_step

    with SharedCache(name, capacity_bytes=64 * 2**20, max_entries=4096, create=True) as cache:
        if path == "python":
            python_path(cache)
        g = cache._seg.geometry
        assert isinstance(g, Geometry)
        tables = g.arena_off
        empty = _footprint(cache) - tables
        step = extent_step(cache._seg.ring())
        assert empty <= step, empty
        last = {}
        for r in range(20):
            for i in range(1000):
                n = 500 + (i * 7 + r * 131) % 1500  # 500 to 2,000 bytes: about 1.2 MiB held
                last[i] = (f"k{i}", r, bytes([r]) * n)
                cache[f"k{i}"] = last[i]
        for i in range(1000):
            assert cache[f"k{i}"] == last[i]
        held = sum(len(v[2]) for v in last.values())
        arena = _footprint(cache) - tables
        assert arena <= 2 * held + step, (arena, held)
        assert cache.verify().ok


def _grower(name: str, start: int, n: int) -> None:
    from .workers import make_value

    with SharedCache(name, create=False) as c:
        for i in range(start, start + n):
            c[f"k{i}"] = make_value(f"k{i}", i, 3000)


@pytest.mark.parametrize("path,policy", [("compiled", "lru"), ("compiled", "s3fifo"), ("python", "s3fifo")])
def test_space_what_another_process_grew_is_read_by_every_handle(name, path, policy):
    """Another process grows the arena far past what this handle's mapping showed when it opened: every value it
    stored is read back here, checked, on each path (s3fifo: without the lock too), with no repair made; and this
    handle's own stores go on past it."""
    import multiprocessing as mp

    from .workers import check_value, make_value, reap

    with SharedCache(name, capacity_bytes=16 * 2**20, max_entries=8192, policy=policy, create=True) as c:
        if path == "python":
            python_path(c)
        c["k0"] = make_value("k0", 0, 3000)
        shown = c._seg.shown[0]
        ctx = mp.get_context("fork")
        for start in (1, 1001):
            p = ctx.Process(target=_grower, args=(name, start, 1000))
            p.start()
            reap([p], 60)
            assert p.exitcode == 0
            for i in range(start + 1000):
                check_value(f"k{i}", c[f"k{i}"])
        assert c._seg.shown[0] > shown + 4 * 2**20  # shown as it was found grown
        for i in range(2001, 2500):
            c[f"k{i}"] = make_value(f"k{i}", i, 3000)
        for i in range(2500):
            check_value(f"k{i}", c[f"k{i}"])
        assert c.stats().recoveries == 0 and c.verify().ok
