"""Short runs of the stress scripts (stress/), so every CI run also kills lock holders and damages segments.

Each runs under every eviction policy (shmcache.POLICIES), a quarter of the time each, so that the four scripts take
about what one run each took before the policies. The long runs, with their figures in docs/operations.md
("Measured under stress"), are the same scripts run for minutes instead of seconds (--policy all: each in turn).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from shmcache import POLICIES, SharedCache

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]
ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_stress(script: str, policy: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", f"stress.{script}", "--json", "--policy", policy, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )
    assert proc.stdout.strip(), f"{script} printed no summary; stderr:\n{proc.stderr[-3000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, f"{script} failed: {summary}\n{proc.stderr[-3000:]}"
    assert summary["wrong"] == 0 and summary["hangs"] == 0 and summary["verify"] == "ok", summary
    assert summary["ops"] > 0 and summary["policy"] == policy, summary
    # (not_admitted is not judged here: keep leaves a put unstored when full, and every policy one whose room the
    # views of the mix pin; the scripts count a False anywhere else as wrong)
    return summary


@pytest.mark.parametrize("policy", POLICIES)
def test_stress_hammer_short(policy):
    s = run_stress("hammer", policy, "--seconds", "1.1", "--workers", "3", "--seed", "11")
    assert s["errors"] == 0 and s["crashes"] == 0


def reads_without_the_lock(name: str, policy: str) -> bool:
    """Whether a cache of ``policy`` answers gets without the lock here (the compiled section on x86-64, not lru):
    then the storms' readers must have done so, or they held nothing of what they are for."""
    with SharedCache(name, create=True, policy=policy, capacity_bytes=1 << 16, max_entries=16) as c:
        try:
            return c._core is not None and c._core.unlocked
        finally:
            c.unlink()


@pytest.mark.parametrize("policy", POLICIES)
def test_stress_kill_storm_short(policy, name):
    s = run_stress("kill_storm", policy, "--seconds", "2.25", "--workers", "4", "--seed", "12")
    assert s["kills"] > 10 and s["errors"] == 0 and s["crashes"] == 0 and s["resizes"] > 0
    if reads_without_the_lock(name, policy):
        assert s["unlocked_reads"] > 0, s


@pytest.mark.parametrize("policy", POLICIES)
def test_stress_fuzz_short(policy, name):
    s = run_stress("fuzz", policy, "--seconds", "2.25", "--workers", "3", "--seed", "13")
    assert s["corruptions"] > 0 and s["crashes"] == 0 and s["foreign"] == 0
    if reads_without_the_lock(name, policy):
        assert s["unlocked_reads"] > 0, s


@pytest.mark.parametrize("policy", POLICIES)
def test_stress_signals_short(policy):
    s = run_stress("signals", policy, "--seconds", "1.1", "--workers", "3", "--seed", "14")
    assert s["interrupts"] > 100 and s["errors"] == 0 and s["crashes"] == 0
    assert s["leaked_fds"] == 0 and s["closed_fds"] == 0 and s["held"] == 0 and s["refused"] == 0




@pytest.mark.parametrize("policy", POLICIES)
def test_stress_views_short(policy):
    """Views taken every way a program takes them (stress/views.py) while writers replace their keys: no value read
    wrong or changed under its view, and no pin left once every view is dropped."""
    s = run_stress("views", policy, "--seconds", "1", "--workers", "2", "--seed", "15")
    assert s["stale"] == 0 and s["errors"] == 0 and s["pins_left"] == 0 and s["crashes"] == 0, s


def test_stress_snapshot_kills_short():
    """stress/snapshot_kills.py (100 kills in the nightly): each killed snapshot writer leaves the previous file or
    the new one, whole."""
    proc = subprocess.run([sys.executable, "-m", "stress.snapshot_kills", "--json", "--kills", "3", "--entries",
                           "3000", "--seed", "3"], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    assert s["kills"] == 3 == s["previous"] + s["new"] and s["verify"] == "ok", s
    assert s["damaged"] == s["mixed"] == s["wrong"] == s["incomplete"] == 0, s
