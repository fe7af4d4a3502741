"""sweep: segments nobody has open are orphans and may be removed; a segment a live process has open never is."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal

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
