"""The ``shmcache`` command, driven through its own main() and as a console script; data parsed from --json."""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import os
import signal
import subprocess
import sys
import time

import pytest

from shmcache import CacheLimits, SharedCache, TooLargeError
from shmcache.cli import main

_REAL_SLEEP = time.sleep  # (tests of --watch replace time.sleep)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def filled(name):
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True) as c:
        for i in range(10):
            c.put(i, b"x" * 100)
        c.get(1)
        c.get("missing")
        yield c


def test_cli_ls_lists_the_cache(capsys, filled, name, monkeypatch):
    import shmcache.cli as cli

    # Every cache on the host, as `ls` with no pattern finds them: this test's alone, so that it opens (and takes the
    # lock of) no other test's cache.
    monkeypatch.setattr(cli, "segment_names", lambda: [name])
    rc, out, _ = run(capsys, "ls", "--json")
    mine = [c for c in json.loads(out) if c["name"] == name]
    assert rc == 0 and len(mine) == 1
    assert mine[0]["entries"] == 10 and mine[0]["hit_ratio"] == 0.5 and mine[0]["max_entries"] == 64
    assert mine[0]["owner"] and mine[0]["creator_pid"] == os.getpid()
    rc, out, _ = run(capsys, "ls")
    assert rc == 0 and name in out


def test_cli_ls_lists_only_the_caches_its_patterns_match(capsys, name):
    made = [SharedCache(f"{name}-{x}", capacity_bytes=4096, max_entries=8, create=True) for x in "ab"]
    try:
        rc, out, _ = run(capsys, "ls", f"{name}-a*", "--json")
        assert rc == 0 and [r["name"] for r in json.loads(out)] == [f"{name}-a"]
        rc, out, _ = run(capsys, "ls", f"{name}-b", f"{name}-?", "--json")
        assert rc == 0 and [r["name"] for r in json.loads(out)] == [f"{name}-a", f"{name}-b"]
        rc, out, _ = run(capsys, "ls", f"{name}-z*")
        assert rc == 0 and out.startswith("no shmcache caches on this host match\n")
    finally:
        for c in made:
            c.close()
            c.unlink()


def test_cli_opens_a_pickle_cache_without_unpickling(capsys, name, monkeypatch):
    import pickle

    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True, serializer="pickle") as c:
        c.put("k", {1, 2})

        def refuse(*args, **kwargs):
            raise AssertionError("the command unpickled a value")

        monkeypatch.setattr(pickle, "loads", refuse)
        rc, out, _ = run(capsys, "stats", name, "--json")
        assert rc == 0 and json.loads(out)["entries"] == 1
        rc, out, _ = run(capsys, "inspect", name, "--json")
        assert rc == 0 and json.loads(out)["verify"]["ok"]
        rc, out, _ = run(capsys, "ls", name, "--json")
        assert [r["state"] for r in json.loads(out) if r["name"] == name] == ["ok"]


def test_cli_stats_json_matches_the_api(capsys, filled, name):
    rc, out, _ = run(capsys, "stats", name, "--json")
    assert rc == 0 and json.loads(out) == filled.stats().as_dict()


def test_cli_stats_prometheus_parses_and_matches_the_api(capsys, filled, name):
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is in the test extra")
    rc, out, _ = run(capsys, "stats", name, "--prometheus")
    assert rc == 0
    samples = {s.name: s for family in parser.text_string_to_metric_families(out) for s in family.samples}
    stats = filled.stats()
    assert samples["shmcache_hits_total"].value == stats.hits == 1
    assert samples["shmcache_misses_total"].value == stats.misses == 1
    assert samples["shmcache_entries"].value == stats.entries == 10
    assert samples["shmcache_hit_ratio"].value == stats.hit_ratio
    assert samples["shmcache_policy_info"].labels == {"cache": name, "policy": "auto"}  # the default
    assert samples["shmcache_admitted_total"].value == stats.admitted == 10
    assert all(s.labels == {"cache": name} for n, s in samples.items() if n != "shmcache_policy_info")
    kinds = {f.name: f.type for f in parser.text_string_to_metric_families(out)}
    assert kinds["shmcache_hits"] == "counter" and kinds["shmcache_entries"] == "gauge"


def test_cli_stats_shows_the_values_refused_as_too_large(capsys, filled, name):
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is in the test extra")
    for _ in range(3):
        with pytest.raises(TooLargeError):
            filled.put("big", b"x" * 100_000)
    rc, out, _ = run(capsys, "stats", name, "--json")
    assert rc == 0 and json.loads(out)["too_large"] == 3
    rc, out, _ = run(capsys, "stats", name)
    assert rc == 0 and re.search(r"^too_large +3$", out, re.M), out
    rc, out, _ = run(capsys, "stats", name, "--prometheus")
    samples = {s.name: s for family in parser.text_string_to_metric_families(out) for s in family.samples}
    assert samples["shmcache_too_large_total"].value == 3


def test_cli_stats_shows_each_kind(capsys, filled, name):
    filled.kind("jvp").put("k", 1)
    rc, out, _ = run(capsys, "stats", name)
    assert rc == 0 and re.search(r"kind 'jvp'\s+1 entry, \d+ bytes", out) and re.search(r"expired\s+0", out)
    with pytest.raises(SystemExit) as exc:  # one format at a time, refused before any output
        run(capsys, "stats", name, "--json", "--prometheus")
    out = capsys.readouterr()
    assert exc.value.code == 2 and out.out == "" and "not allowed with" in out.err
    rc, out, _ = run(capsys, "stats", name, "--json")
    retained = filled.kind("jvp").stats().retained_bytes
    assert json.loads(out)["kinds"] == {"jvp": {"entries": 1, "retained_bytes": retained}}
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is in the test extra")
    rc, out, _ = run(capsys, "stats", name, "--prometheus")
    samples = [s for family in parser.text_string_to_metric_families(out) for s in family.samples]
    assert [s.value for s in samples if s.name == "shmcache_kind_entries" and s.labels == {"cache": name,
                                                                                          "kind": "jvp"}] == [1]


def test_prometheus_text_escapes_labels_and_lists_every_cache(filled):
    from shmcache import prometheus_text

    text = prometheus_text({'a"b\\c\nd': filled.stats(), "plain": filled.stats()})
    assert 'cache="a\\"b\\\\c\\nd"' in text and 'cache="plain"' in text
    assert text.count("# TYPE shmcache_hits_total counter") == 1


def test_cli_inspect_reports_layout_and_verify(capsys, filled, name):
    rc, out, _ = run(capsys, "inspect", name, "--json")
    data = json.loads(out)
    assert rc == 0 and data["verify"]["ok"] and data["verify"]["entries"] == 10
    assert data["layout"]["arena_off"] % 4096 == 0 and data["limits"]["capacity_entries"] == 16 * 64
    assert data["layout"]["index_in_force"] == 93 and data["layout"]["entry_slots_shown"] >= 65  # (65 / 0.7)
    arena = data["arena"]
    assert arena["dead_bytes"] == 0 and arena["fragmentation"] == 0.0  # nothing deleted yet
    assert arena["used_bytes"] + arena["contiguous_free_bytes"] == arena["bytes"]


def test_cli_stats_and_inspect_show_the_policy_and_its_counters(capsys, name):
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=4, create=True, policy="keep") as c:
        for i in range(6):
            c.put(i, i)
        rc, out, _ = run(capsys, "inspect", name, "--json")
        policy = json.loads(out)["policy"]
        assert rc == 0 and policy == {"name": "keep", "ghost_slots": 0, "admitted": 4, "not_admitted": 2,
                                      "small_entries": 0, "promoted": 0, "ghost_hits": 0, "window_target": 0,
                                      "filter_admitted": 0, "filter_refused": 0}
        rc, out, _ = run(capsys, "stats", name)
        assert rc == 0 and re.search(r"policy\s+keep", out) and re.search(r"not_admitted\s+2", out)
        rc, out, _ = run(capsys, "ls", name, "--json")
        assert [r["policy"] for r in json.loads(out) if r["name"] == name] == ["keep"]
        c.unlink()


def test_cli_inspect_shows_what_auto_is_doing(capsys, name):
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=200, create=True, policy="auto") as c:
        for i in range(1000):  # a loop over 250 keys: the sketch turns window entries away
            k = i % 250
            if c.get(k) is None:
                c.put(k, k)
        s = c.stats()
        rc, out, _ = run(capsys, "inspect", name, "--json")
        policy = json.loads(out)["policy"]
        assert rc == 0 and policy["name"] == "auto" and policy["window_target"] == s.window_target == 2
        assert policy["filter_refused"] == s.filter_refused > 0 and policy["ghost_slots"] == c._seg.geometry.ghost_slots
        rc, out, _ = run(capsys, "stats", name)
        assert rc == 0 and re.search(rf"window_target\s+{s.window_target}\b", out)
        c.unlink()


def test_cli_inspect_counts_dead_blocks_as_fragmentation(capsys, filled, name):
    for i in range(0, 10, 2):
        filled.delete(i)  # five dead blocks inside the ring
    rc, out, _ = run(capsys, "inspect", name, "--json")
    arena = json.loads(out)["arena"]
    assert rc == 0 and arena["dead_bytes"] > 0 and 0 < arena["fragmentation"] < 1
    assert arena["used_bytes"] + arena["dead_bytes"] + arena["contiguous_free_bytes"] == arena["bytes"]


def test_cli_set_limits_evicts(capsys, filled, name):
    rc, out, _ = run(capsys, "set-limits", name, "--max-entries", "4", "--json")
    assert rc == 0 and json.loads(out)["entries"] == 4 and len(filled) == 4


def test_cli_set_limits_above_capacity_is_a_clear_error(capsys, filled, name):
    rc, _, err = run(capsys, "set-limits", name, "--max-entries", "2000")  # (the tables reach 16 x 64)
    assert rc == 1 and "grow to" in err


def test_cli_resize(capsys, filled, name):
    cap = filled.capacity_bytes
    rc, out, _ = run(capsys, "resize", name, str(4 * cap), "--json")
    got = json.loads(out)
    assert rc == 0 and got["capacity_bytes"] == 4 * cap == filled.capacity_bytes and got["resizes"] == 1
    rc, out, _ = run(capsys, "resize", name, "1KiB", "--max-entries", "4")
    assert rc == 0 and f"{name}: capacity" in out and filled.capacity_bytes == 1024 and len(filled) <= 4
    rc, _, err = run(capsys, "resize", name, str(filled.max_capacity_bytes + 1))
    assert rc == 1 and "max_capacity_bytes" in err


def test_cli_clear_and_rm(capsys, filled, name):
    filled.kind("jvp").put("k", 1)  # a kind's entries go too: 11 in all
    rc, out, _ = run(capsys, "clear", name)
    assert rc == 0 and out == f"cleared {name}: 11 entries removed, counters reset\n"
    assert len(filled) == 0 and filled.stats().clears == 1 and filled.stats().entries == 0
    filled.put("k", 1)
    rc, out, _ = run(capsys, "clear", name, "--json")
    assert rc == 0 and json.loads(out) == {"name": name, "removed": 1}
    rc, out, _ = run(capsys, "clear", name)
    assert rc == 0 and out == f"cleared {name}: 0 entries removed, counters reset\n"
    assert run(capsys, "rm", name)[0] == 0
    rc, _, err = run(capsys, "rm", name)
    assert rc == 1 and "no cache" in err


def test_cli_missing_cache_is_a_clear_error(capsys, name):
    rc, _, err = run(capsys, "stats", name)
    assert rc == 1 and name in err


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_cli_bench_demo_runs_as_a_console_script():
    out = subprocess.run(
        [sys.executable, "-m", "shmcache", "bench", "--seconds", "3", "--workers", "2", "--keys", "2000", "--json"],
        capture_output=True, text=True, timeout=100,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["ops_per_s"] > 0 and 0 < r["hit_ratio"] <= 1 and r["wrong_values"] == 0 and r["verify_ok"]
    assert len(r["per_worker_ops"]) == 2 and all(n > 0 for n in r["per_worker_ops"])
    assert 0 < r["computations"] <= 2000 and r["takeovers"] == 0  # each key computed at most once
    assert r["timeline"] and r["timeline"][-1]["lookups"] > 0
    from shmcache import core

    assert r["hot_path"] == core.PATH
    # The same key streams through 2 private caches: in the same memory (half the entries each), and each as large.
    same, larger = r["private"]
    assert r["capacity_entries"] > 2000 and r["evictions"] == 0  # every key fits, in the private caches too
    assert same == {"caches": 2, "entries_each": r["capacity_entries"] // 2, "memory_bytes": r["capacity_bytes"],
                    "computations": same["computations"], "hit_ratio": 1 - same["computations"] / r["ops"]}
    assert larger["entries_each"] == r["capacity_entries"] and larger["memory_bytes"] == 2 * r["capacity_bytes"]
    # Neither evicts: each computes every key its worker drew, once; the shared cache each key any worker drew.
    assert larger["computations"] == same["computations"] >= r["computations"]
    assert r["computations_saved"] == same["computations"] - r["computations"]


def test_cli_bench_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is in the cli extra")
    png = tmp_path / "bench.png"
    out = subprocess.run(
        [sys.executable, "-m", "shmcache", "bench", "--seconds", "1", "--workers", "2", "--keys", "500",
         "--plot", str(png)],
        capture_output=True, text=True, timeout=100,
    )
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "chart written" in out.stdout
    from shmcache import core

    assert f"hot path: {core.PATH}" in out.stdout  # the report's first line says which path the workers ran
    assert re.search(r"^  one shared cache .* computed  hit ratio", out.stdout, re.M)
    assert re.search(r"^  2 private caches .* entries each .* computed  hit ratio", out.stdout, re.M)
    assert re.search(r"^  sharing saved -?[\d,]+ computations", out.stdout, re.M)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_cli_bench_private_cache_of_one_worker_is_the_shared_cache():
    """One worker: its private LRU cache of the shared cache's capacity is the shared cache under lru, so the
    simulation must give the computations the cache counted, evictions and all (the replay is exact, and so is the
    capacity)."""
    out = subprocess.run(
        [sys.executable, "-m", "shmcache", "bench", "--seconds", "1", "--workers", "1", "--keys", "2000",
         "--capacity-mib", "0.25", "--policy", "lru", "--json"],
        capture_output=True, text=True, timeout=100,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["evictions"] > 0 and r["entries"] == r["capacity_entries"]  # full: the capacity binds
    assert [p["computations"] for p in r["private"]] == [r["computations"]] * 2 and r["computations_saved"] == 0


@pytest.mark.parametrize("capacity", [1, 2, 3, 50, 10_000])
def test_bench_private_misses_count_as_an_lru_cache_does(capacity):
    import functools
    import random

    from shmcache.demo import private_misses

    assert private_misses([[1, 2, 3, 1, 2, 3]], [2, 3]) == [6, 3]  # a loop one longer than the cache misses always
    rng = random.Random(capacity)
    chunks = [[int(rng.paretovariate(1.0)) for _ in range(500)] for _ in range(8)]
    lru = functools.lru_cache(maxsize=capacity)(lambda k: k)
    for k in (k for chunk in chunks for k in chunk):
        lru(k)
    assert private_misses(chunks, [capacity]) == [lru.cache_info().misses]


@pytest.mark.parametrize("text, value", [
    ("4096", 4096), ("100_000", 100_000), ("1e3", 1000), ("1.5e3", 1500), ("128MiB", 128 * 2**20),
    ("64k", 64 * 2**10), ("2 GiB", 2 * 2**30), ("2GB", 2 * 10**9), ("10B", 10), ("0", 0),
])
def test_cli_parse_size_accepts_what_people_write(text, value):
    from shmcache.cli import parse_size

    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MiB", "1.5", "-1", "1e400", "nan", "12 parsecs", "0x10", "1e-3"])
def test_cli_parse_size_refuses_what_is_not_a_size(text):
    import argparse

    from shmcache.cli import parse_size

    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_cli_set_limits_takes_units(capsys, filled, name):
    rc, out, _ = run(capsys, "set-limits", name, "--max-entries", "5", "--max-retained-bytes", "32KiB", "--json")
    assert rc == 0 and json.loads(out)["max_retained_bytes"] == 32 * 1024 and filled.limits().max_entries == 5
    rc, out, _ = run(capsys, "set-limits", name, "--max-entries", "1e1", "--json")
    assert rc == 0 and filled.limits() == CacheLimits(max_entries=10, max_retained_bytes=32 * 1024)


def test_cli_broken_pipe_exits_quietly(filled, name):
    # A reader that closes at once: the command must not print a traceback or "Exception ignored" on stderr.
    proc = subprocess.run(f"{sys.executable} -m shmcache stats {name} --watch 0.01 --json | head -n 1",
                          shell=True, capture_output=True, text=True, timeout=60, executable="/bin/bash")
    assert proc.returncode == 0 and json.loads(proc.stdout)["entries"] == 10
    assert proc.stderr == ""
    proc = subprocess.run(f"set -o pipefail; {sys.executable} -m shmcache stats {name} --watch 0.01 | head -c 1",
                          shell=True, capture_output=True, text=True, timeout=60, executable="/bin/bash")
    assert proc.returncode == 141 and proc.stderr == ""


def test_cli_watch_off_a_terminal_writes_no_control_codes(filled, name):
    proc = subprocess.Popen([sys.executable, "-m", "shmcache", "stats", name, "--watch", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(100)]
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    text = "".join(lines)
    assert "\033" not in text
    assert text.count("--- ") >= 2 and "entries" in text


def test_cli_watch_json_writes_json_lines(filled, name):
    proc = subprocess.Popen([sys.executable, "-m", "shmcache", "stats", name, "--watch", "0.05", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        frames = [json.loads(proc.stdout.readline()) for _ in range(3)]
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert all(f["entries"] == 10 and f["max_entries"] == 64 for f in frames)
    assert frames[0]["time"] <= frames[1]["time"] <= frames[2]["time"]


def test_cli_rm_warns_about_a_cache_still_open(capsys, name):
    c = SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True)
    try:
        rc, out, err = run(capsys, "rm", name)
        assert rc == 0 and f"removed {name}" in out
        assert "warning" in err and "still have" in err
    finally:
        c.close()
    SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True).close()
    rc, out, err = run(capsys, "rm", name)  # nobody has it open: no warning
    assert rc == 0 and err == ""


def test_cli_tier_says_when_the_cache_does_not_exist(capsys, name):
    rc, out, err = run(capsys, "tier", name)
    assert rc == 1 and f"no cache named {name!r}" in err
    rc, out, err = run(capsys, "tier", name, "ns")
    assert rc == 1 and f"no cache named {name!r}" in err


def test_cli_tier_names_the_namespaces_of_a_cache_without_one(capsys, filled, name):
    rc, out, err = run(capsys, "tier", name)
    assert rc == 1 and "fronts 0 TieredCache namespaces (none)" in err and "name one" not in err
    rc, out, err = run(capsys, "tier", name, "ns")
    assert rc == 1 and "fronts no namespace 'ns'" in err


def test_cli_tier_reads_a_pickle_cache_namespace_without_unpickling(capsys, name):
    from shmcache.tier.stats import Rows

    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True, serializer="pickle") as c:
        c.kind("tier:ns").put("k", {"a": 1})
        rows = Rows(name, "ns")  # the namespace's stats segment, as a TieredCache makes it
        try:
            rc, out, err = run(capsys, "tier", name, "ns", "--json")
        finally:
            rows.close()
    assert rc == 0, err
    assert json.loads(out)["local_entries"] == 1


def _hold_lock_and_stop(name: str) -> None:
    """Take the cache lock, then stop: a live holder that will never let go until killed."""
    cache = SharedCache(name, create=False)
    cache._guard.enter()
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(120)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_cli_ls_shows_a_stuck_cache_as_busy_and_goes_on(name):
    """One cache whose lock a stopped process holds: ``ls`` marks it busy instead of stalling on it, and lists the
    others as usual (``stats`` and ``tier`` give up on it as quickly)."""
    healthy_name = name + "-ok"
    stuck = SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True)
    healthy = SharedCache(healthy_name, capacity_bytes=64 * 1024, max_entries=64, create=True)
    child = mp.get_context("fork").Process(target=_hold_lock_and_stop, args=(name,))
    try:
        healthy.put("k", 1)
        child.start()
        for _ in range(3000):
            if _stopped(child.pid):
                break
            time.sleep(0.01)
        assert _stopped(child.pid), "the child never stopped holding the lock"
        env = {**os.environ, "PYTHONPATH": ROOT}
        ls = subprocess.run([sys.executable, "-m", "shmcache", "ls", name, healthy_name, "--json"], capture_output=True,
                            text=True, timeout=60, env=env)
        assert ls.returncode == 0, ls.stderr
        mine = {c["name"]: c for c in json.loads(ls.stdout) if c["name"] in (name, healthy_name)}
        assert mine[name]["state"] == "busy" and "entries" not in mine[name]
        assert mine[name]["creator_pid"] == os.getpid()  # what needs no lock is still shown
        assert mine[healthy_name]["state"] == "ok" and mine[healthy_name]["entries"] == 1
        table = subprocess.run([sys.executable, "-m", "shmcache", "ls", name, healthy_name], capture_output=True,
                               text=True, timeout=60,
                               env=env)
        assert table.returncode == 0, table.stderr
        rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:]}
        assert rows[name][1] == "busy" and rows[healthy_name][1] == "ok"
        stats = subprocess.run([sys.executable, "-m", "shmcache", "stats", name], capture_output=True, text=True,
                               timeout=60, env=env)
        assert stats.returncode == 1 and "could not lock" in stats.stderr
    finally:
        if child.pid is not None:
            child.kill()
            child.join(10)
        stuck.close()
        healthy.close()
        SharedCache.unlink_name(healthy_name)


def test_cli_ls_shows_a_never_initialised_segment_as_damaged(capsys, name):
    """A segment whose creator died before writing it: listed at once as damaged, not waited for."""
    os.close(os.open(f"/dev/shm/shmcache.{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    rc, out, _ = run(capsys, "ls", name, "--json")
    mine = [c for c in json.loads(out) if c["name"] == name]
    assert rc == 0 and len(mine) == 1
    assert mine[0]["state"] == "damaged" and "never initialised" in mine[0]["error"]


def test_cli_ls_says_which_hot_path_runs(capsys, filled, name):
    from shmcache import core

    rc, out, _ = run(capsys, "ls", name)
    want = "hot path: compiled (shmcache._core)" if core.PATH == "compiled" else "hot path: pure Python ("
    assert rc == 0 and out.rstrip().splitlines()[-1].startswith(want)


def test_cli_stats_says_which_hot_path_runs(capsys, filled, name, monkeypatch):
    from shmcache import core

    rc, out, _ = run(capsys, "stats", name)  # `ls` ends with the same line, but reads every cache of the host
    want = "hot path: compiled (shmcache._core)" if core.PATH == "compiled" else "hot path: pure Python ("
    assert rc == 0 and out.rstrip().splitlines()[-1].startswith(want)
    monkeypatch.setattr(core, "PATH", "pure Python")
    monkeypatch.setenv("SHMCACHE_PURE_PYTHON", "1")
    rc, out, _ = run(capsys, "stats", name)
    assert rc == 0 and out.rstrip().splitlines()[-1] == "hot path: pure Python (SHMCACHE_PURE_PYTHON=1)"


@pytest.mark.parametrize("how", ["rm", "unlink", "sweep"])
def test_cli_tier_stats_segments_go_with_their_cache_in_a_process_that_never_named_the_tier(name, how):
    """``shmcache rm``, ``SharedCache.unlink()`` and ``sweep`` find a cache's TieredCache stats segments in a
    process that never imported the tier (``import shmcache`` leaves it out)."""
    from shmcache.tier.stats import Rows

    stats_path = f"/dev/shm/shmcache-tier.{name}.ns"
    SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True).close()
    Rows(name, "ns").close()  # the namespace's stats segment, as a TieredCache makes it; now nobody's
    assert os.path.exists(stats_path)
    script = {
        "rm": "import sys; from shmcache.cli import main; sys.exit(main(['rm', NAME]))",
        "unlink": "import shmcache; shmcache.SharedCache(NAME, create=False).unlink()",
        "sweep": "import shmcache; found = shmcache.sweep(remove=True, names=[NAME]);"
                 "assert sorted(f['name'] for f in found) == sorted([NAME, 'shmcache-tier.' + NAME + '.ns']), found",
    }[how]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    done = subprocess.run([sys.executable, "-c", f"NAME = {name!r}\n{script}\n"
                           "import sys; assert 'shmcache.tier.tiered' not in sys.modules"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(stats_path)
    assert not os.path.exists(f"/dev/shm/shmcache.{name}")


@pytest.mark.parametrize("command", ["stats", "tier"])
@pytest.mark.parametrize("seconds", ["0", "-1", "-0.5", "nan", "inf", "-inf", "abc", "", "1s"])
def test_cli_watch_refuses_what_is_no_interval(capsys, name, command, seconds):
    # Refused by the parser: exit code 2, the reason on stderr, nothing on stdout (the cache is never opened: the
    # name does not even exist).
    with pytest.raises(SystemExit) as exc:
        main([command, name, f"--watch={seconds}"])
    out = capsys.readouterr()
    assert exc.value.code == 2 and out.out == ""
    assert "--watch" in out.err and repr(seconds) in out.err


def test_cli_watch_refusal_as_a_console_script(name):
    proc = subprocess.run([sys.executable, "-m", "shmcache", "stats", name, "--watch", "-1"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "positive, finite number of seconds" in proc.stderr


@pytest.mark.parametrize("text, value", [("1", 1.0), ("0.05", 0.05), ("2e-1", 0.2), (" 3 ", 3.0)])
def test_cli_parse_watch_accepts_seconds(text, value):
    from shmcache.cli import parse_watch

    assert parse_watch(text) == value


def _watched(monkeypatch, capsys, argv: list[str], between: list) -> str:
    """Run ``shmcache *argv`` (a --watch) in this process for ``len(between) + 1`` refreshes, calling
    ``between[i]()`` in place of the i-th sleep: a known number of operations between two frames. Interrupted
    as Ctrl-C does."""
    sleeps = iter(between)

    def sleep(seconds: float) -> None:
        step = next(sleeps, None)
        if step is None:
            raise KeyboardInterrupt
        step()

    monkeypatch.setattr(time, "sleep", sleep)
    rc = main(argv)
    monkeypatch.undo()
    out = capsys.readouterr()
    assert rc == 130 and out.err == ""
    return out.out


def test_cli_stats_watch_json_gives_rates_of_the_operations_between_two_frames(monkeypatch, capsys, filled, name):
    def lookups():
        for _ in range(6):
            filled.get(1)
        filled.get("absent")
        filled.get("absent")
        for i in range(3):
            filled.put(f"new{i}", i)

    def no_lookup():
        filled.put("one more", 1)

    def clear_then_two_hits():
        filled.clear()
        filled.put("k", 1)
        filled.get("k")
        filled.get("k")

    out = _watched(monkeypatch, capsys, ["stats", name, "--watch", "0.01", "--json"],
                   [lookups, no_lookup, clear_then_two_hits])
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) == 4 and frames[0]["rates"] is None  # nothing to compare the first refresh to
    for before, after in zip(frames, frames[1:]):
        rates = after["rates"]
        assert rates["interval_s"] > 0 and set(rates) >= {"hits", "misses", "puts", "evictions", "hit_ratio"}
        if after["clears"] == before["clears"]:  # no reset: each rate is the increase over the interval printed
            for k in ("hits", "misses", "puts", "updates", "deletes", "evictions", "expired", "computations"):
                assert rates[k] == (after[k] - before[k]) / rates["interval_s"]
    one, two, three = (f["rates"] for f in frames[1:])
    assert frames[1]["hits"] - frames[0]["hits"] == 6 and frames[1]["misses"] - frames[0]["misses"] == 2
    assert one["hit_ratio"] == 0.75 and frames[1]["hit_ratio"] == 7 / 10  # the interval's, and since the start
    assert one["puts"] == 3 / one["interval_s"]
    assert two["hit_ratio"] is None and two["hits"] == 0.0 and two["puts"] == 1 / two["interval_s"]
    # clear() set the counters back to zero: what they count since is the interval's increase (as Prometheus's
    # rate() takes a reset), never a negative rate.
    assert frames[3]["hits"] == 2 and three["hits"] == 2 / three["interval_s"] and three["misses"] == 0.0
    assert three["clears"] == 1 / three["interval_s"] and three["hit_ratio"] == 1.0


def test_cli_stats_watch_text_shows_rates_after_the_first_frame(monkeypatch, capsys, filled, name):
    def lookups():
        for _ in range(3):
            filled.get(1)
        filled.get("absent")
        _REAL_SLEEP(0.05)  # an interval long enough to print

    out = _watched(monkeypatch, capsys, ["stats", name, "--watch", "0.01"], [lookups])
    first, second = out.split("--- ")[1:]
    assert "/s" not in first and "in the last" not in first and re.search(r"^hits\s+1$", first, re.M)
    hits = re.search(r"^hits\s+4\s+([\d,.]+)/s$", second, re.M)
    interval = re.search(r"^hit_ratio\s+0\.6667\s+0\.7500 in the last ([\d.]+) s$", second, re.M)
    assert hits and interval, second
    assert re.search(r"^entries\s+10$", second, re.M)  # a gauge: no rate
    # The rate printed is the increase over the interval printed (both rounded for the eye).
    assert float(hits.group(1).replace(",", "")) == pytest.approx(3 / float(interval.group(1)), rel=0.05, abs=0.1)
    assert second.rstrip().splitlines()[-1].startswith("hot path: ")


def test_cli_tier_watch_gives_rates_of_the_host_counts(monkeypatch, capsys, name):
    from shmcache.tier.layout import C_LOCAL_HITS, C_LOCAL_MISSES, C_REMOTE_CALLS, C_REMOTE_HITS, C_REMOTE_NS
    from shmcache.tier.stats import Rows

    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True):
        rows = Rows(name, "ns")  # the namespace's stats segment, as a TieredCache makes it, and a row of it
        try:
            def counted():  # 8 lookups: 5 local hits, 3 misses, of which 2 found in Redis (30 us each)
                rows.row[C_LOCAL_HITS] += 5
                rows.row[C_LOCAL_MISSES] += 3
                rows.row[C_REMOTE_HITS] += 2
                rows.row[C_REMOTE_CALLS] += 2
                rows.row[C_REMOTE_NS] += 60_000

            out = _watched(monkeypatch, capsys, ["tier", name, "ns", "--watch", "0.01", "--json"], [counted])
            text = _watched(monkeypatch, capsys, ["tier", name, "ns", "--watch", "0.01"], [counted])
        finally:
            rows.close()
    before, after = (json.loads(line) for line in out.splitlines())
    assert before["rates"] is None
    rates = after["rates"]
    assert after["local_hits"] - before["local_hits"] == 5
    assert rates["local_hits"] == 5 / rates["interval_s"] and rates["remote_hits"] == 2 / rates["interval_s"]
    assert rates["hit_ratio"] == 7 / 8 and rates["remote_mean_us"] == 30.0 and "remote_ns" not in rates
    second = text.split("--- ")[2]
    assert re.search(r"^local_hits\s+10\s+[\d,.]+/s$", second, re.M)
    assert re.search(r"^hit_ratio\s+\S+\s+0\.8750 in the last [\d.]+ s$", second, re.M)
    assert re.search(r"^remote_mean_us\s+\S+\s+30\.0000 in the last", second, re.M)


def test_cli_tier_lists_each_namespace_with_its_state(capsys, name):
    from shmcache.tier.stats import Rows

    gone = name + "-gone"
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True):
        used, also = Rows(name, "used"), Rows(name, "used")  # two handles counting in it, as two TieredCaches do
        Rows(name, "idle").close()  # its counts kept, nobody has it open
        orphan = Rows(gone, "ns")  # a namespace whose cache was removed
        orphan.close()
        try:
            rc, out, _ = run(capsys, "tier", "--json")
            assert rc == 0
            mine = {(f["cache"], f["namespace"]): f for f in json.loads(out) if f["cache"] in (name, gone)}
            assert mine == {
                (name, "used"): {"cache": name, "namespace": "used", "cache_exists": True, "state": "in use",
                                 "handles": 2},
                (name, "idle"): {"cache": name, "namespace": "idle", "cache_exists": True, "state": "idle",
                                 "handles": 0},
                (gone, "ns"): {"cache": gone, "namespace": "ns", "cache_exists": False, "state": "idle", "handles": 0},
            }
            rc, out, _ = run(capsys, "tier")
            rows = {tuple(line.split(None, 2)[:2]): line.split(None, 2)[2] for line in out.splitlines()[1:]}
            assert out.splitlines()[0].split() == ["CACHE", "NAMESPACE", "STATE"]
            assert rows[(name, "used")] == "in use (2 TieredCache handles)"
            assert rows[(name, "idle")] == "idle: no TieredCache has it open"
            assert rows[(gone, "ns")] == "cache removed: `shmcache sweep` cleans up"
            used.close()
            rc, out, _ = run(capsys, "tier", "--json")
            assert [f["handles"] for f in json.loads(out) if (f["cache"], f["namespace"]) == (name, "used")] == [1]
        finally:
            used.close()
            also.close()
            orphan.unlink()


def _families(text: str) -> dict[str, int]:
    """Each metric family of a Prometheus text: how many samples follow its TYPE line."""
    counts: dict[str, int] = {}
    family = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
            counts[family] = 0
        elif line and not line.startswith("#"):
            counts[family] += 1
    return counts


def test_cli_tier_prometheus_prints_no_family_without_samples(capsys, name):
    from shmcache.tier.stats import Rows

    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True) as c:
        c.kind("tier:ns").put("k", 1)
        rows = Rows(name, "ns")
        try:
            rc, out, _ = run(capsys, "tier", name, "ns", "--prometheus")
        finally:
            rows.close()
    assert rc == 0
    families = _families(out)
    assert families and all(n > 0 for n in families.values()), families
    assert "shmcache_hits_total" not in families  # the cache's own families are `stats --prometheus`'s
    assert families["shmcache_tier_local_hits_total"] == 1 and families["shmcache_tier_local_entries"] == 1
    assert families["shmcache_tier_remote_latency_seconds"] == 5  # three quantiles, _sum and _count
    parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is in the test extra")
    parsed = list(parser.text_string_to_metric_families(out))
    assert parsed and all(f.samples for f in parsed)


def test_cli_stats_prometheus_leaves_out_the_kind_families_of_a_cache_without_kinds(capsys, filled, name):
    rc, out, _ = run(capsys, "stats", name, "--prometheus")
    families = _families(out)
    assert rc == 0 and all(n == 1 for n in families.values()), families
    assert "shmcache_kind_entries" not in families and families["shmcache_hits_total"] == 1
    filled.kind("jvp").put("k", 1)
    rc, out, _ = run(capsys, "stats", name, "--prometheus")
    assert rc == 0 and _families(out)["shmcache_kind_entries"] == 1


@pytest.fixture
def assorted(name):
    """A cache holding one value of each sort, keys of three types, one key of kind 'jvp', one with a TTL."""
    import numpy as np

    # lru: `keys` and `dump` list its keys most recent first
    with SharedCache(name, capacity_bytes=256 * 1024, max_entries=64, create=True, policy="lru") as c:
        c.put("text", "hello")
        c.put("blob", b"\x00\xffraw")
        c.put("doc", {"a": [1, 2.5, None, True], "b": "x"})
        c.put("pair", (1, "a"))
        c.put("image", np.arange(6, dtype=np.float32).reshape(2, 3))
        c.put(42, "an int key")
        c.put(("user", 7), "a tuple key")
        c.put("session:1", "s1", ttl=100)
        c.put("session:2", "s2")
        c.kind("jvp").put("text", "of a kind")
        c.get("text")  # the most recent, and a hit: hits=1
        yield c


def _untouched(c: SharedCache):
    """The state a command that only looks must leave as it is: the counters and the LRU order."""
    return c.stats(), list(c), list(c.kind("jvp"))


def test_cli_get_prints_each_sort_of_value_without_counting_a_lookup(capsys, assorted, name):
    before = _untouched(assorted)
    assert before[0].hits == 1 and before[0].misses == 0
    for argv, printed in [
        (("text",), "hello"),
        (("blob",), r"b'\x00\xffraw'"),  # bytes as repr (--raw writes them)
        (("doc",), '{"a": [1, 2.5, null, true], "b": "x"}'),  # plain data as JSON
        (("pair",), "(1, 'a')"),  # a tuple is no JSON: its repr
        (("image",), "array([[0., 1., 2.],\n       [3., 4., 5.]], dtype=float32)"),
        (("--literal", "42"), "an int key"),
        (("--literal", "('user', 7)"), "a tuple key"),
        (("text", "--kind", "jvp"), "of a kind"),
    ]:
        rc, out, err = run(capsys, "get", name, *argv)
        assert (rc, out, err) == (0, printed + "\n", ""), argv
    rc, out, _ = run(capsys, "get", name, "session:1", "--json")
    entry = json.loads(out)
    assert rc == 0 and entry["key"] == "session:1" and entry["value"] == "s1" and 0 < entry["ttl_s"] <= 100
    assert _untouched(assorted) == before  # no hit counted, nothing moved in the LRU order


def test_cli_get_of_an_absent_key_exits_1(capsys, assorted, name):
    before = _untouched(assorted)
    rc, out, err = run(capsys, "get", name, "nope")
    assert rc == 1 and out == ""
    assert err == f"shmcache: no key 'nope' in cache {name!r} (it also holds keys of kind 'jvp' (1 entry): " \
                  "--kind NAME reads one)\n"
    rc, out, err = run(capsys, "get", name, "42")  # the str '42', not the int key
    assert rc == 1 and out == "" and "no key '42'" in err
    rc, out, err = run(capsys, "get", name, "text", "--kind", "nokind")
    assert rc == 1 and out == "" and "has no kind 'nokind' (its kinds: 'jvp')" in err
    assert "nokind" not in assorted.stats().kinds  # looking never makes a kind
    rc, out, err = run(capsys, "get", name, "--literal", "(1,")
    assert rc == 1 and out == "" and "not a Python literal" in err
    assert _untouched(assorted) == before  # no miss counted either


def test_cli_get_keys_dump_of_a_missing_cache_exit_1(capsys, name):
    for argv in (["get", name, "k"], ["keys", name], ["dump", name]):
        rc, out, err = run(capsys, *argv)
        assert (rc, out) == (1, "") and err == f"shmcache: no cache named {name!r}\n", argv
    assert not os.path.exists(f"/dev/shm/shmcache.{name}")  # opened only, never created


def test_cli_get_leaves_an_expired_entry_absent_and_in_place(capsys, name):
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True) as c:
        c.put("brief", 1, ttl=0.05)
        time.sleep(0.1)
        rc, out, err = run(capsys, "get", name, "brief")
        assert rc == 1 and "no key 'brief'" in err
        rc, out, _ = run(capsys, "keys", name)
        assert rc == 0 and out == ""
        s = c.stats()
        assert s.entries == 1 and s.expired == 0 and s.misses == 0  # nothing dropped, nothing counted


def test_cli_get_raw_writes_the_bytes(assorted, name):
    import numpy as np

    def raw(*argv):
        done = subprocess.run([sys.executable, "-m", "shmcache", "get", name, *argv, "--raw"], capture_output=True,
                              timeout=60)
        return done.returncode, done.stdout, done.stderr

    assert raw("blob") == (0, b"\x00\xffraw", b"")
    assert raw("text") == (0, b"hello", b"")  # no newline added
    assert raw("image") == (0, np.arange(6, dtype=np.float32).tobytes(), b"")
    rc, out, err = raw("doc")
    assert rc == 1 and out == b"" and b"--raw writes a bytes, str or array value" in err


def test_cli_keys_lists_keys_most_recent_first(capsys, assorted, name):
    before = _untouched(assorted)
    rc, out, err = run(capsys, "keys", name)
    assert rc == 0 and out.splitlines() == ["text", "session:2", "session:1", "('user', 7)", "42", "image", "pair",
                                            "doc", "blob"]
    assert err == f"shmcache: cache {name!r} also holds keys of kind 'jvp' (1 entry): --kind NAME reads one\n"
    rc, out, _ = run(capsys, "keys", name, "session:*")
    assert rc == 0 and out.splitlines() == ["session:2", "session:1"]
    rc, out, _ = run(capsys, "keys", name, "(*")  # a key that is not a str is matched as it is printed
    assert rc == 0 and out.splitlines() == ["('user', 7)"]
    rc, out, _ = run(capsys, "keys", name, "[bd]*")
    assert rc == 0 and out.splitlines() == ["doc", "blob"]
    rc, out, err = run(capsys, "keys", name, "--kind", "jvp")
    assert (rc, out, err) == (0, "text\n", "")
    rc, out, _ = run(capsys, "keys", name, "*", "--json")
    listed = json.loads(out)
    assert rc == 0 and len(listed) == 9 and listed[3] == {"key": "('user', 7)", "key_encoding": "repr"}
    assert listed[4] == {"key": 42} and listed[0] == {"key": "text"}
    assert _untouched(assorted) == before


def test_cli_dump_writes_one_json_line_per_entry(capsys, assorted, name):
    import base64

    import numpy as np

    before = _untouched(assorted)
    rc, out, err = run(capsys, "dump", name)
    assert rc == 0 and "--kind NAME" in err
    lines = [json.loads(line) for line in out.splitlines()]
    by_key = {(d["key"], d.get("key_encoding")): d for d in lines}
    assert [d["key"] for d in lines][:3] == ["text", "session:2", "session:1"] and len(lines) == 9
    assert by_key["text", None] == {"key": "text", "value": "hello", "ttl_s": None}
    assert by_key["doc", None]["value"] == {"a": [1, 2.5, None, True], "b": "x"}
    blob = by_key["blob", None]
    assert blob["encoding"] == "base64" and base64.b64decode(blob["value"]) == b"\x00\xffraw"
    image = by_key["image", None]
    assert image["encoding"] == "ndarray" and image["dtype"] == "<f4" and image["shape"] == [2, 3]
    rebuilt = np.frombuffer(base64.b64decode(image["value"]), image["dtype"]).reshape(image["shape"])
    assert (rebuilt == np.arange(6, dtype=np.float32).reshape(2, 3)).all()
    assert by_key["pair", None] == {"key": "pair", "encoding": "repr", "value": "(1, 'a')", "ttl_s": None}
    assert by_key[42, None]["value"] == "an int key"
    assert by_key["('user', 7)", "repr"]["value"] == "a tuple key"
    assert 0 < by_key["session:1", None]["ttl_s"] <= 100 and by_key["session:2", None]["ttl_s"] is None
    rc, out, _ = run(capsys, "dump", name, "--summary")
    summary = {d["key"]: d for d in map(json.loads, out.splitlines())}
    assert rc == 0 and summary["image"]["nbytes"] == 24 and "value" not in summary["image"]
    assert summary["blob"] == {"key": "blob", "encoding": "base64", "nbytes": 5, "ttl_s": None}
    rc, out, err = run(capsys, "dump", name, "--kind", "jvp")
    assert rc == 0 and err == "" and [json.loads(x) for x in out.splitlines()] == [
        {"key": "text", "value": "of a kind", "ttl_s": None}]
    assert _untouched(assorted) == before


def test_cli_dump_and_get_report_a_damaged_entry_and_leave_it(capsys, assorted, name):
    from shmcache import block
    from shmcache.cache import parts
    from shmcache.codec import fingerprint

    p = parts(assorted)
    s = p.store
    e = s.table.index.find(s.ix, s.rec, s.mm, s.base, s.mask, fingerprint(b"doc"), b"doc")
    s.mm[block.value_at(s.rec, s.base, e) + 3] ^= 0xFF  # a byte of the value: its checksum no longer holds
    rc, out, err = run(capsys, "dump", name)
    assert rc == 1 and len(out.splitlines()) == 8 and "doc" not in {json.loads(x)["key"] for x in out.splitlines()}
    assert "1 damaged entry" in err and "shmcache inspect" in err
    rc, out, err = run(capsys, "get", name, "doc")
    assert rc == 1 and out == "" and "1 damaged entry" in err
    assert assorted.stats().recoveries == 0 and assorted.stats().entries == 10  # reported, never repaired here


def test_cli_get_and_dump_unpickle_nothing_unless_asked(capsys, name, monkeypatch):
    import base64
    import pickle

    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True, serializer="pickle") as c:
        c.put("set", {1, 2})
        c.put("raw", b"kept as bytes")
        loads = pickle.loads

        def refuse(*args, **kwargs):
            raise AssertionError("the command unpickled a value")

        monkeypatch.setattr(pickle, "loads", refuse)
        rc, out, err = run(capsys, "get", name, "set")
        assert rc == 1 and out == "" and "is pickled" in err and "--unpickle" in err
        rc, out, _ = run(capsys, "get", name, "raw")  # bytes are not pickled in a pickle cache
        assert rc == 0 and out == "b'kept as bytes'\n"
        rc, out, _ = run(capsys, "dump", name)
        dumped = {d["key"]: d for d in map(json.loads, out.splitlines())}
        assert rc == 0 and dumped["set"]["encoding"] == "pickle"
        monkeypatch.undo()
        assert loads(base64.b64decode(dumped["set"]["value"])) == {1, 2}
        rc, out, _ = run(capsys, "get", name, "set", "--unpickle")
        assert rc == 0 and out == "{1, 2}\n"
        rc, out, _ = run(capsys, "dump", name, "--unpickle")
        assert rc == 0 and {d["key"]: d for d in map(json.loads, out.splitlines())}["set"] == {
            "key": "set", "encoding": "repr", "value": "{1, 2}", "ttl_s": None}


def test_prometheus_text_leaves_out_families_without_samples(name):
    """No HELP and TYPE lines with nothing under them: a cache without kinds has no kind family, and no cache none."""
    from shmcache import prometheus_text

    assert prometheus_text({}) == ""
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=16, create=True) as c:
        c.put("a", 1)
        text = prometheus_text({name: c.stats()})
        assert "shmcache_kind_entries" not in text and 'shmcache_entries{cache="' + name + '"} 1' in text
        c.kind("k").put("x", 2)
        text = prometheus_text({name: c.stats()})
        assert f'shmcache_kind_entries{{cache="{name}",kind="k"}} 1' in text
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    samples = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    assert set(helps) == samples


# ------------------------------------------------------------------------------------------- set, del


def test_cli_set_stores_a_str_unless_type_says_otherwise(capsys, cache, name, monkeypatch):
    import io

    for argv, key, value in [
        (("k", "42"), "k", "42"),  # a str, though it reads as a number
        (("k", "007"), "k", "007"),
        (("i", "42", "--type", "int"), "i", 42),
        (("f", "2.5", "--type", "float"), "f", 2.5),
        (("j", '{"a": [1, null, true]}', "--type", "json"), "j", {"a": [1, None, True]}),
        (("t", "(1, b'x')", "--type", "literal"), "t", (1, b"x")),
        (("b", "raw", "--type", "bytes"), "b", b"raw"),
        (("--literal", "42", "an int key"), 42, "an int key"),
    ]:
        rc, out, err = run(capsys, "set", name, *argv)
        assert (rc, err) == (0, "") and out.startswith(f"stored {key!r} in cache {name!r} ({type(value).__name__};")
        assert cache.get(key) == value and type(cache.get(key)) is type(value), argv
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\x00\xff bytes\n")))
    rc, out, _ = run(capsys, "set", name, "s", "--stdin", "--type", "bytes", "--json")
    assert rc == 0 and cache.get("s") == b"\x00\xff bytes\n"  # stdin's bytes as they are, the newline kept
    assert json.loads(out) == {"name": name, "kind": None, "key": "s", "value_type": "bytes", "stored": True,
                               "ttl_s": None}
    rc, out, _ = run(capsys, "get", name, "k")  # the str '007', printed bare: no value of another type reads so
    assert (rc, out) == (0, "007\n")
    cache.put("k", "42")
    assert run(capsys, "get", name, "k")[:2] == (0, "'42'\n")  # the str: its repr, not to be taken for the int
    assert run(capsys, "get", name, "i")[:2] == (0, "42\n")
    assert run(capsys, "get", name, "k", "--raw")[0] == 0


def test_cli_set_refuses_what_it_cannot_read(capsys, cache, name):
    for argv, said in [
        (("i", "4.0", "--type", "int"), "--type int: '4.0' is not an integer"),
        (("j", "{'a': 1}", "--type", "json"), "is not JSON"),
        (("j", "NaN", "--type", "json"), "NaN is not JSON"),
        (("t", "open('x')", "--type", "literal"), "is not a Python literal"),
        (("k",), "give VALUE, or --stdin to read it"),
        (("k", "v", "--stdin"), "give VALUE or --stdin, not both"),
        (("--literal", "(1,", "v"), "--literal: '(1,' is not a Python literal"),
    ]:
        rc, out, err = run(capsys, "set", name, *argv)
        assert (rc, out) == (1, "") and said in err, argv
    assert len(cache) == 0
    for ttl in ("-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit) as exc:
            run(capsys, "set", name, "k", "v", "--ttl", ttl)
        assert exc.value.code == 2 and "--ttl" in capsys.readouterr().err
    rc, out, err = run(capsys, "set", "no-such-cache-" + name, "k", "v")
    assert rc == 1 and "no cache named" in err and not os.path.exists(f"/dev/shm/shmcache.no-such-cache-{name}")


def test_cli_set_ttl_expires_and_nx_xx_store_once(capsys, name):
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True, default_ttl=300) as c:
        rc, out, _ = run(capsys, "set", name, "brief", "v", "--ttl", "0.2")
        assert rc == 0 and "expires in 0.2 s" in out and c.get("brief") == "v"
        rc, out, _ = run(capsys, "set", name, "default", "v")
        assert rc == 0 and "expires in 300 s, the cache's default" in out
        rc, out, _ = run(capsys, "set", name, "kept", "v", "--ttl", "0", "--json")
        assert rc == 0 and json.loads(out)["ttl_s"] is None  # 0: never, whatever the default
        entries = {json.loads(x)["key"]: json.loads(x)["ttl_s"] for x in run(capsys, "dump", name)[1].splitlines()}
        assert entries["kept"] is None and 299 < entries["default"] <= 300 and 0 < entries["brief"] <= 0.2
        time.sleep(0.3)
        assert c.get("brief") is None and run(capsys, "get", name, "brief")[0] == 1
        rc, _, err = run(capsys, "set", name, "kept", "other", "--nx")
        assert rc == 1 and "not stored" in err and "the key is present (--nx)" in err and c.get("kept") == "v"
        rc, out, _ = run(capsys, "set", name, "absent", "v", "--xx", "--json")
        assert rc == 1 and json.loads(out)["stored"] is False and "absent" not in c
        assert run(capsys, "set", name, "kept", "new", "--xx")[0] == 0 and c.get("kept") == "new"
        assert run(capsys, "set", name, "fresh", "v", "--nx")[0] == 0 and c.get("fresh") == "v"
        rc, out, _ = run(capsys, "set", name, "x", "1", "--type", "int", "--kind", "jvp")
        assert rc == 0 and f"kind 'jvp' of cache {name!r}" in out and c.kind("jvp").get("x") == 1


def test_cli_del_says_whether_each_key_existed(capsys, assorted, name):
    rc, out, err = run(capsys, "del", name, "text")
    assert (rc, out, err) == (0, f"deleted 'text' from cache {name!r}\n", "") and "text" not in assorted
    rc, out, err = run(capsys, "del", name, "text")  # gone: exit code 1, as redis-cli DEL answers 0
    assert (rc, out) == (1, "") and err == f"shmcache: no key 'text' in cache {name!r}\n"
    rc, out, err = run(capsys, "del", name, "42")  # the str '42': absent; the int key stays
    assert rc == 1 and assorted.get(42) == "an int key"
    rc, out, _ = run(capsys, "del", name, "--literal", "42", "('user', 7)", "'nope'", "--json")
    assert rc == 1 and json.loads(out) == {"name": name, "kind": None, "deleted": 2, "keys": [
        {"key": 42, "deleted": True}, {"key": "('user', 7)", "key_encoding": "repr", "deleted": True},
        {"key": "nope", "deleted": False}]}
    assert 42 not in assorted and ("user", 7) not in assorted
    rc, _, err = run(capsys, "del", name, "text", "--kind", "nokind")
    assert rc == 1 and "has no kind 'nokind'" in err and "nokind" not in assorted.stats().kinds
    assert run(capsys, "del", name, "text", "--kind", "jvp")[0] == 0 and "text" not in assorted.kind("jvp")
    assert assorted.stats().deletes == 4
    assorted.put("brief", 1, ttl=0.05)
    time.sleep(0.1)
    assert run(capsys, "del", name, "brief")[0] == 1  # expired: absent, as get finds it


def test_cli_keys_and_get_tell_apart_keys_that_print_alike(capsys, cache, name):
    import ast

    alike = [42, "42", None, "None", b"x", "b'x'", (1, 2), "(1, 2)", "", " pad", "true", 1.5, "1.5", "plain",
             "'C:\\d'"]
    for i, k in enumerate(alike):
        cache.put(k, i)
    rc, out, err = run(capsys, "keys", name)
    printed = out.splitlines()
    assert rc == 0 and err == "" and len(printed) == len(set(printed)) == len(alike)
    assert {"42", "'42'", "None", "'None'", "b'x'", '"b\'x\'"', "(1, 2)", "'(1, 2)'", "''", "' pad'", "'true'",
            "1.5", "'1.5'", "plain", '"\'C:\\\\d\'"'} == set(printed)
    for line in printed:  # each line reads back as its key: --literal for a line that is a literal, else as it is
        try:
            argv, key = ("--literal", line), ast.literal_eval(line)
        except (ValueError, SyntaxError):
            argv, key = (line,), line
        rc, out, _ = run(capsys, "get", name, *argv)
        assert (rc, out) == (0, f"{alike.index(key)}\n"), line
    rc, out, _ = run(capsys, "keys", name, "4*")  # a str key is matched as itself, any other as printed
    assert rc == 0 and sorted(out.splitlines()) == ["'42'", "42"]
    rc, out, _ = run(capsys, "keys", name, "--json")
    assert [d for d in json.loads(out) if d["key"] in ("42", 42)] in (
        [{"key": "42"}, {"key": 42}], [{"key": 42}, {"key": "42"}])


def test_cli_get_prints_a_str_that_reads_as_another_value_as_its_repr(capsys, cache, name):
    values = {"n": 42, "s": "42", "null": None, "snull": "null", "l": [1, 2], "sl": "[1, 2]", "b": b"x",
              "sb": "b'x'", "arr": "array([1])", "text": "hello world", "multi": "two\nlines"}
    for k, v in values.items():
        cache.put(k, v)
    shown = {k: run(capsys, "get", name, k)[1] for k in values}
    assert shown == {"n": "42\n", "s": "'42'\n", "null": "null\n", "snull": "'null'\n", "l": "[1, 2]\n",
                     "sl": "'[1, 2]'\n", "b": "b'x'\n", "sb": '"b\'x\'"\n', "arr": "'array([1])'\n",
                     "text": "hello world\n", "multi": "two\nlines\n"}


# ------------------------------------------------------------------------------ ls: age, last write, attached

_ATTACH = """
import sys
from shmcache import SharedCache
c = SharedCache(sys.argv[1])
c.put("from-child", 1)
print("attached", flush=True)
sys.stdin.readline()
c.close()
print("closed", flush=True)
sys.stdin.readline()
"""


def _ls_row(capsys, name: str, handles: int | None = None) -> dict:
    """The cache's row of ``ls --json``; with ``handles``, the first that shows that many handles open, within a
    deadline: any process of the host may hold one for a moment (``shmcache ls`` and ``stats`` open every cache they
    list), so a count that differs once is read again, and one that stays wrong fails with the row."""
    deadline = time.monotonic() + 20
    while True:
        rc, out, _ = run(capsys, "ls", name, "--json")
        rows = [r for r in json.loads(out) if r["name"] == name]
        assert rc == 0 and len(rows) == 1
        if handles is None or rows[0]["attached_handles"] == handles or time.monotonic() > deadline:
            return rows[0]
        time.sleep(0.05)


def _ls_line_ends(capsys, name: str, pattern: str) -> None:
    """Assert that the cache's line of ``ls`` ends with ``pattern``, read again within a deadline as ``_ls_row``
    does (the line it failed on, if not)."""
    deadline = time.monotonic() + 20
    while True:
        rc, out, _ = run(capsys, "ls", name)
        line = next(x for x in out.splitlines() if x.startswith(name))
        if re.search(pattern + "$", line):
            return
        assert time.monotonic() < deadline, line
        time.sleep(0.05)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_cli_ls_shows_age_last_write_and_the_processes_attached(capsys, name):
    with SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True) as c:
        row = _ls_row(capsys, name, handles=1)
        assert row["last_write_s"] is None and 0 <= row["age_s"] < 60  # never stored to
        assert row["attached_handles"] == 1 and row["attached_pids"] == [os.getpid()]  # ls's own handle not counted
        child = subprocess.Popen([sys.executable, "-c", _ATTACH, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, cwd=ROOT)
        try:
            assert child.stdout.readline() == "attached\n"
            row = _ls_row(capsys, name, handles=2)
            assert row["attached_handles"] == 2 and row["attached_pids"] == sorted([os.getpid(), child.pid])
            assert 0 <= row["last_write_s"] < 10 and row["last_write_s"] <= row["age_s"]
            _ls_line_ends(capsys, name, r"\d+s ago\s+" + ",".join(map(str, sorted([os.getpid(), child.pid]))))
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline() == "closed\n"  # the child lives on, its handle closed
            row = _ls_row(capsys, name, handles=1)
            assert row["attached_handles"] == 1 and row["attached_pids"] == [os.getpid()]
            assert c.get("from-child") == 1
        finally:
            child.stdin.close()
            assert child.wait(timeout=60) == 0
    row = _ls_row(capsys, name, handles=0)  # nobody has it open: what `sweep` would remove
    assert row["attached_handles"] == 0 and row["attached_pids"] == []
    _ls_line_ends(capsys, name, r"\d+s ago\s+none")


def test_cli_ls_durations_read_as_people_write_them():
    from shmcache.cli import _ago, _shown_attached

    assert [_ago(s) for s in (0, 42.9, 60, 425, 3600, 11520, 86400, 2 * 86400 + 4 * 3600 + 59)] == [
        "0s", "42s", "1m00s", "7m05s", "1h00m", "3h12m", "1d00h", "2d04h"]
    assert _shown_attached(0, []) == "none" and _shown_attached(None, []) == "?"
    assert _shown_attached(2, [7, 9]) == "7,9" and _shown_attached(5, [1, 2, 3, 4, 5]) == "1,2,3 +2"
    assert _shown_attached(1, []) == "1 handle (pids not visible)"
