"""The benchmark tools still run and report what they claim: a smoke test, never a timing check."""

from __future__ import annotations

import json
import os
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
@pytest.mark.parametrize("case", ["get", "get-miss", "put-new", "put-update", "put-evict", "get-many", "put-many", "loop"])
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
