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
