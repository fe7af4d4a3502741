"""The benchmark tools still run and report what they claim: a smoke test, never a timing check."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest


@pytest.mark.timeout(300)
def test_benchmarks_run_quick_reports_every_shmcache_row(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--only", "W1,W3,W4", "--peers", "shmcache",
         "--json", str(out)],
        capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    cases = {(r["workload"], r["case"]) for r in results if r["peer"] == "shmcache"}
    for op in ("put", "get hit", "get miss"):
        for kind in ("small dict", "64 KiB bytes", "224x224x3 uint8"):
            assert ("W1", f"{kind}: {op}") in cases
    assert ("W1", "224x224x3 uint8: view (zero-copy)") in cases and ("W1", "64 KiB bytes: view (zero-copy)") in cases
    assert any(w == "W3" for w, _ in cases) and any(w == "W4" for w, _ in cases)
    assert not [r for r in results if r["case"] == "(error)" or "wrong" in r["note"]]
    failed = [r for r in results if r["case"].startswith("failed puts")]
    assert failed and all(r["value"] == 0 for r in failed)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["get", "get-miss", "put-new", "put-update", "put-evict", "get-many", "put-many",
                                  "loop"])
def test_benchmarks_instructions_child_runs_each_case(case):
    # The child is what valgrind measures; it must run its case and clean up without valgrind too. It names its cache
    # after its own pid: only that name is looked at (other programs may own caches on this host).
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.instructions", "--child", case, "200"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=100)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert not os.path.exists(f"/dev/shm/shmcache.benchmarks-instructions-{proc.pid}")


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an exited worker that init has yet to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_benchmarks_memcached_server_starts_answers_and_stops():
    from benchmarks.servers import MEMCACHED_BINARY, MemcachedServer

    if shutil.which(MEMCACHED_BINARY) is None:
        pytest.skip("memcached is not installed (Debian: apt-get install memcached)")
    server = MemcachedServer(memory_mb=8)
    try:
        pid, port = server.pid, server.port
        assert server.stats()["pid"] == str(pid)  # this server answers on its port, not another one
        assert server.command("flush_all") == ["OK"]
    finally:
        server.stop()
    assert server.pid is None and not _running(pid)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the port is free again


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_benchmarks_django_site_runs_briefly_and_cleans_up(tmp_path):
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (Debian: apt-get install wrk)")
    pytest.importorskip("django", reason="Django is in the test extra")
    pytest.importorskip("gunicorn", reason="gunicorn is in the test extra")
    out = tmp_path / "site.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.apps.django_site", "--backends", "shmcache,locmem", "--seconds", "1",
         "--rounds", "1", "--workers", "2", "--connections", "4", "--threads", "1", "--warmup-requests", "20",
         "--sessions", "4", "--capacity-mb", "16", "--max-entries", "2000", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=100)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["backend"] for r in runs] == ["shmcache", "locmem"]
    for r in runs:
        assert r["requests"] > 0 and r["wrong"] == 0 and 0 <= r["computed"] <= r["served"], r
        assert r["served"] >= r["requests"]  # the workers served every response wrk counted (and maybe more)
        assert r["workers_pss_bytes"] > 0 and len(r["gunicorn_pids"]) == 3, r  # the master and 2 workers
        assert not [pid for pid in r["gunicorn_pids"] if _running(pid)], r  # gunicorn's process group is stopped
    shm = runs[0]
    assert shm["lost_sessions"] == 0  # sessions live in the one shared cache: every worker finds them
    assert shm["segment_bytes"] >= 16 * 2**20
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"shmcache.djbench-{proc.pid}-")]


def test_benchmarks_resize_measures_what_it_made():
    """benchmarks/resize.py on a small run: nothing lost on the way up, no wrong value or error in either phase, the
    resizes timed; its cache gone."""
    from benchmarks import resize

    args = argparse.Namespace(capacity=1 << 20, grown=8 << 20, workers=2, seconds=1.0, pause=0.1, keys=4000,
                              value_bytes=1000, policy="lru")
    out = resize.measure(args)
    assert out["up"]["lost"] == 0 and out["up"]["wrong"] == 0 and out["up"]["entries"] > 500, out
    for phase in ("steady", "resizing"):
        assert out[phase]["gets"] > 0 and out[phase]["wrong"] == 0 and out[phase]["errors"] == 0, out
    assert out["resizing"]["resizes"] >= 2 and out["verify_ok"], out
    assert out["down"]["evicted"] > 0 and out["down"]["wrong"] == 0, out["down"]
    assert not [n for n in os.listdir("/dev/shm") if f"bench-resize-{os.getpid()}" in n]


def test_benchmarks_footprint_measures_what_it_made():
    """benchmarks/footprint.py's figures on a small run: every entry resident, the arena backed a little past the
    live blocks and no further than its bound, the default cache within a container's /dev/shm; its caches gone."""
    from benchmarks import footprint

    out = footprint.measure(2000, 100, 2, "lru")
    fill = out["fill"]
    assert fill["resident"] == 2000
    assert 1.0 < fill["arena_over_retained"] < 1.5, fill
    # the two splits of the same bytes: an entry's own (tables, a header word at least) and the ring's free space
    assert fill["entry_per_entry"] >= fill["tables_per_entry"] + 8 and fill["ring_free_per_entry"] >= 0, fill
    assert abs(fill["entry_per_entry"] + fill["ring_free_per_entry"] - fill["beyond_key_value_per_entry"]) < 1e-6
    assert 1.0 < out["churn"]["arena_over_retained"] < 1.6, out["churn"]
    assert out["empty_default_mib"] <= 8 and out["default_full"]["occupied_mib"] < 64, out
    assert not [n for n in os.listdir("/dev/shm") if "bench-footprint-" in n and f"-{os.getpid()}" in n]


def test_benchmarks_probes_measures_what_it_made():
    """benchmarks/probes.py's figures on a small run: each version's index as full as its rule lets it be, the
    probes those loads give linear probing (a miss probes more than a hit, both more at 0.7 than under one half),
    every lookup timed; its caches gone."""
    from benchmarks import probes

    v16, v17 = probes.measure(3000, 500, 1)["rows"]
    assert (v16["version"], v16["index_slots"], v17["version"], v17["index_slots"]) == (16, 8192, 17, 4288)
    assert v16["load"] <= 0.5 and 0.69 < v17["load"] <= 0.7
    assert 1 <= v16["hit_probes"] < v17["hit_probes"] < v17["miss_probes"] and v16["miss_probes"] < v17["miss_probes"]
    assert all(r["get_hit_us"] > 0 and r["get_miss_us"] > 0 for r in (v16, v17))
    assert not [n for n in os.listdir("/dev/shm") if "bench-probes-" in n and f"-{os.getpid()}" in n]


def test_benchmarks_retries_measures_what_it_made():
    """benchmarks/retries.py on a short run: the reader read, every value right, the writer wrote; its cache gone."""
    from benchmarks import retries

    out = retries.measure(argparse.Namespace(readers=1, keys=2000, seconds=0.5, policy="auto"))
    assert out["gets_per_s"] > 0 and out["wrong"] == 0 and out["puts_per_s"] > 0 and out["verify_ok"], out
    assert 0 <= out["retried"] < 1 and 0 <= out["to_the_lock"] < 1, out
    assert not [n for n in os.listdir("/dev/shm") if n == f"shmcache.bench-retries-{os.getpid()}"]
