"""sweep: segments nobody has open are orphans and may be removed; a segment a live process has open never is."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys

import pytest

from shmcache import SharedCache, sweep
from shmcache.cli import main

JOIN_S = 60
ctx = mp.get_context("fork")


def _exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/shmcache.{name}")


def _state(name: str) -> str:
    (found,) = sweep(names=[name])
    return found["state"]


def _hold(name, ready, queue):
    with SharedCache(name, create=False) as c:
        queue.put(c.get("k"))
        ready.set()
        signal.pause()  # until killed


def test_sweep_removes_a_segment_nobody_has_open(name):
    SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True).close()  # closed, never unlinked
    assert _state(name) == "orphan" and _exists(name)  # listing removes nothing
    (found,) = sweep(remove=True, names=[name])
    assert found["state"] == "orphan" and found["removed"] and not _exists(name)


def test_sweep_never_removes_a_segment_open_here(name):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True) as c:
        c.put("k", 1)
        (found,) = sweep(remove=True, names=[name])
        assert found["state"] == "in use" and not found.get("removed") and c.get("k") == 1
    assert _state(name) == "orphan"
    sweep(remove=True, names=[name])


@pytest.mark.timeout(120)
def test_sweep_live_child_keeps_it_in_use_until_killed(name):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True) as c:
        c.put("k", "v")
    ready, queue = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_hold, args=(name, ready, queue), daemon=True)
    child.start()
    try:
        assert ready.wait(JOIN_S) and queue.get(timeout=JOIN_S) == "v"
        (found,) = sweep(remove=True, names=[name])
        assert found["state"] == "in use" and _exists(name)
        os.kill(child.pid, signal.SIGKILL)
        child.join(JOIN_S)
        (found,) = sweep(remove=True, names=[name])  # the kernel dropped the dead child's hold
        assert found["state"] == "orphan" and found["removed"] and not _exists(name)
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)


@pytest.mark.timeout(120)
def test_sweep_forked_child_inherits_the_hold(name):
    c = SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True)
    go = ctx.Event()
    child = ctx.Process(target=go.wait, args=(JOIN_S,), daemon=True)  # inherits the open handle
    child.start()
    try:
        c.close()
        assert _state(name) == "in use"  # the child still has it open
    finally:
        go.set()
        child.join(JOIN_S)
    assert _state(name) == "orphan"
    sweep(remove=True, names=[name])


def test_sweep_cli_lists_then_removes(capsys, name):
    SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True).close()
    assert main(["sweep", name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["state"] == "orphan" and _exists(name)
    assert main(["sweep", name]) == 0
    assert "shmcache sweep --yes" in capsys.readouterr().out
    assert main(["sweep", name, "--yes"]) == 0
    assert "removed" in capsys.readouterr().out and not _exists(name)


def test_sweep_reattach_after_a_sweep_works(name):
    SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True).close()
    sweep(remove=True, names=[name])
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=16) as c:  # created anew under the same name
        c.put("k", 2)
        assert c.get("k") == 2
        c.unlink()


def test_sweep_cli_hint_removes_exactly_what_it_found(capsys, name):
    # The hint names the caches listed: run as printed, it removes this orphan and nothing else on the host.
    SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True).close()
    assert main(["sweep", name]) == 0
    out = capsys.readouterr().out
    hint = out.split("Remove them with `")[1].split("`")[0]
    assert hint == f"shmcache sweep --yes {name}"
    assert main(hint.split()[1:]) == 0 and not _exists(name)


def test_sweep_cli_names_a_cache_that_does_not_exist(capsys, name):
    assert main(["sweep", name]) == 1
    out, err = capsys.readouterr()
    assert f"no cache named {name!r}" in err and "no shmcache caches on this host" not in out


def test_sweep_skips_a_name_that_is_not_utf8(name):
    # Another user may name a file in bytes that are not UTF-8: it is reported as skipped, and the sweep goes on.
    weird = name + "\udcff"  # how os.listdir gives the byte 0xff
    path = os.fsencode(f"/dev/shm/shmcache.{weird}")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True).close()
        found = {f["name"]: f for f in sweep(names=[weird, name])}
        assert found[weird]["state"] == "skipped" and "UTF-8" in found[weird]["reason"]
        assert found[name]["state"] == "orphan"
    finally:
        os.unlink(path)


def test_sweep_rm_never_blocks_on_a_fifo_at_the_name(name):
    path = f"/dev/shm/shmcache.{name}"
    os.mkfifo(path, 0o600)
    try:
        proc = subprocess.run([sys.executable, "-m", "shmcache", "rm", name], capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 0 and "warning" not in proc.stderr
        assert not os.path.lexists(path)
    finally:
        if os.path.lexists(path):
            os.unlink(path)


def test_sweep_cli_escapes_control_codes_in_names(capsys, name):
    odd = name + "\x1b[2J"
    os.close(os.open(f"/dev/shm/shmcache.{odd}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        assert main(["sweep", odd]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and name in out
        hint = out.split("Remove them with `")[1].split("`")[0]  # names that very file, in ANSI-C quoting
        proc = subprocess.run(["bash", "-c", f"printf '%s' {hint.split()[-1]}"], capture_output=True, timeout=30)
        assert proc.stdout == odd.encode()
    finally:
        os.unlink(f"/dev/shm/shmcache.{odd}")
