"""Shared memory that runs out: every file the package sizes and maps fails with a clear ENOSPC, never SIGBUS.

The test runs in a private mount namespace with a tiny tmpfs on /dev/shm (root and ``unshare`` needed; skipped
otherwise), so filling it up touches nothing of the host's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run inside the namespace: a cache that fits, then /dev/shm filled to the last byte, then each file made after.
FULL_SHM = textwrap.dedent("""
    import errno, os
    from shmcache import SharedCache, TieredCache

    local = SharedCache("local", capacity_bytes=64 * 1024, max_entries=64, create=True)
    with open("/dev/shm/filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
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
