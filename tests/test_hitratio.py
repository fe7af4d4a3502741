"""benchmarks/hitratio.py: the real cache's LRU against the exact LRU model, hit for hit, on each kind of workload;
the reference models on short sequences worked out by hand from their papers; the trace readers; the command line.
No timing is asserted."""

from __future__ import annotations

import bz2
import gzip
import json
import random
import struct

import pytest

from benchmarks import hitratio as hr
from shmcache import SharedCache
from benchmarks.hitratio import LRU, S3FIFO, TwoQ, Clock, KeepFirst, Sieve, replay_shm, simulate


def _lru_policies() -> list[str | None]:
    """The policy= values under which the real cache is LRU."""
    return [p for p in [None, *hr.shm_policies()] if hr.shm_model(p) == "lru"]


SMALL_WORKLOADS = {
    "zipf-0.6": lambda: hr.zipf_workload(1_000, 4_000, 0.6, (0.01, 0.1, 0.25), seed=7),
    "zipf-1.2": lambda: hr.zipf_workload(1_000, 4_000, 1.2, (0.01, 0.1, 0.25), seed=7),
    "epochs": lambda: hr.epochs_workload(800, 4, (0.25, 0.5), seed=7),
    "loop": lambda: hr.loop_workload(100, 10),
    "zipf-scan": lambda: hr.scan_workload(1_000, 1.0, 3_000, 500, 200, (0.1, 0.25), seed=7),
}


# --------------------------------------------------------------------------------------------- LRU, hit for hit


@pytest.mark.parametrize("kind", sorted(SMALL_WORKLOADS))
def test_real_lru_hits_and_misses_exactly_as_the_model(kind, name):
    w = SMALL_WORKLOADS[kind]()
    keys = [str(k) for k in w.keys]
    for policy in _lru_policies():
        for size in w.sizes:
            shm, stats = replay_shm(keys, size, name, policy)
            model = simulate(LRU(size), w.keys)
            assert len(shm) == len(model) == len(w.keys)
            assert hr.first_mismatch(shm, model) is None, (kind, size, policy)
            assert list(shm) == list(model)  # element by element: pytest names the first index that differs
            assert (stats.hits, stats.misses) == (shm.count(1), shm.count(0))
            assert stats.puts == shm.count(0) and stats.entries <= size
            assert hr.stats_disagreement(shm, stats) == ""


def test_the_workloads_exercise_both_hits_and_evictions():
    # A check that compares only misses (or only hits) would prove nothing.
    for kind, make in SMALL_WORKLOADS.items():
        w = make()
        for size in w.sizes:
            hits = simulate(LRU(size), w.keys)
            distinct = len(set(w.keys))
            assert distinct > size, kind  # evictions happen
            if kind != "loop":
                assert 0 < hits.count(1) < len(hits), kind


def test_run_workload_reports_hit_for_hit_and_the_stats_agree(name):
    w = SMALL_WORKLOADS["zipf-scan"]()
    results = hr.run_workload(w, ["lru", "sieve"], ["lru"], name=name)
    assert [r.size for r in results] == list(w.sizes)
    for r in results:
        (check,) = r.checks
        assert check.shm == "lru (shm)" and check.model == "lru"
        assert check.mismatch is None and check.stats_problem == ""
        assert r.hits["lru (shm)"] == r.hits["lru"] and r.hits["lru"][0] > 0
        assert 0 < r.ratio("lru", 0) < r.ratio("sieve", 0) < 1  # (this scan mix: SIEVE resists the bursts)
    lines = hr.check_lines(results)
    assert lines == [f"zipf-scan: shm lru == model lru: hit for hit (cache sizes {w.sizes[0]:,}, {w.sizes[1]:,})"]


def test_a_mismatch_is_reported_with_its_first_lookup():
    assert hr.first_mismatch(bytearray([1, 0, 1]), bytearray([1, 0, 1])) is None
    assert hr.first_mismatch(bytearray([1, 0, 1, 0]), bytearray([1, 0, 0, 0])) == 2
    assert hr.first_mismatch(bytearray([1, 0]), bytearray([1, 0, 1])) == 2


def test_the_real_cache_reports_its_policies():
    assert hr.shm_policies() == ["lru", "s3fifo", "keep", "auto"]  # one spelling per model, in SHM_POLICY_NAMES's order
    assert hr.shm_policies(["s3-fifo"]) == ["s3-fifo"]


@pytest.mark.parametrize("workload", sorted(SMALL_WORKLOADS))
def test_every_policy_of_the_real_cache_against_its_model(workload, name):
    """lru, keep and auto hit exactly where their models do; s3fifo within S3FIFO_TOLERANCE points of the published
    one."""
    w = SMALL_WORKLOADS[workload]()
    results = hr.run_workload(w, ["lru"], ["lru", "s3fifo", "keep", "auto"], name=name)
    for r in results:
        for c in r.checks:
            assert not c.failed and not c.stats_problem, (c.workload, c.size, c.shm, c.points, c.detail)
            if c.model in hr.EXACT_MODELS:
                assert c.mismatch is None
    assert all(m in results[0].hits for m in ("s3fifo", "keep-first", "auto"))  # models compared with are run too


def test_a_policy_that_is_not_what_it_says_is_reported(monkeypatch, name):
    # A stand-in SharedCache whose "s3fifo" evicts by LRU: reported as failing the S3-FIFO model on the scan
    # workload, which is what makes the exit status 1.
    class Impostor(SharedCache):
        def __init__(self, name, *, policy="lru", **kwargs):
            super().__init__(name, **kwargs, policy="lru" if policy == "s3fifo" else policy)

    monkeypatch.setattr(hr, "SharedCache", Impostor)
    w = SMALL_WORKLOADS["zipf-scan"]()
    results = hr.run_workload(w, ["lru"], ["lru", "s3fifo"], name=name)
    lines = hr.check_lines(results)
    assert lines[0].startswith("zipf-scan: shm lru == model lru: hit for hit")
    assert lines[1].startswith("zipf-scan: shm s3fifo vs model s3fifo: hit ratio FAILS 1 point of the model's")
    assert [line.split(": first mismatch at lookup ")[0] for line in lines[2:]] == [
        f"zipf-scan at {size:,} entries: shm s3fifo != model s3fifo" for size in w.sizes]
    assert any(c.failed for r in results for c in r.checks)


# --------------------------------------------------------------------------------------------- the reference models


def _hits(model, sequence: str) -> list[int]:
    return list(simulate(model, sequence.split()))


def test_lru_by_hand():
    # size 2: A B A C (evicts B) B (evicts A) A (evicts C)
    assert _hits(LRU(2), "A B A C B A") == [0, 0, 1, 0, 0, 0]
    assert _hits(LRU(2), "A B A C A B") == [0, 0, 1, 0, 1, 0]


def test_sieve_keeps_an_entry_the_hand_has_passed_where_lru_and_clock_evict_it():
    # Size 3. A B C fill the queue (head to tail: C B A); A is hit. D: the hand starts at the tail, clears A's bit,
    # moves towards the head and evicts B, stopping at C. E evicts C (unvisited), the hand moving on to D; F evicts
    # D. A, behind the hand, is still there: a hit. LRU evicted A at F (A was least recent after D and E); so did
    # CLOCK, whose hand came back to A (bit cleared at D) right after replacing B's and C's slots.
    seq = "A B C A D E F A"
    assert _hits(Sieve(3), seq) == [0, 0, 0, 1, 0, 0, 0, 1]
    assert _hits(LRU(3), seq) == [0, 0, 0, 1, 0, 0, 0, 0]
    assert _hits(Clock(3), seq) == [0, 0, 0, 1, 0, 0, 0, 0]
    s = Sieve(3)
    simulate(s, seq.split())
    assert set(s.visited) == {"F", "E", "A"} and s.visited["A"]
    assert (s.head, s.tail, s.hand) == ("F", "A", "E")


def test_sieve_wraps_round_when_every_entry_was_visited():
    # Size 2, both hit: the hand clears both bits (tail to head, then from the tail again) and evicts the oldest.
    # Then the hand rests on B (unvisited now): A evicts B, B evicts C.
    s = Sieve(2)
    assert _hits(s, "A B A B C") == [0, 0, 1, 1, 0]
    assert (s.head, s.tail, s.hand) == ("C", "B", "B") and not s.visited["B"]
    assert _hits(s, "A B") == [0, 0]
    assert set(s.visited) == {"A", "B"}


def test_clock_gives_a_hit_entry_a_second_chance():
    # Size 2: A B, A hit. C: the hand clears A's bit and replaces B. B: replaces A (bit clear), C stays.
    assert _hits(Clock(2), "A B A C B C") == [0, 0, 1, 0, 0, 1]
    c = Clock(2)
    simulate(c, "A B A C B C".split())
    assert c.keys == ["B", "C"] and c.referenced == [False, True]


def test_s3fifo_promotes_a_key_hit_twice_in_small_and_readmits_ghosts_to_main():
    # Size 3: small FIFO of 1, main of 2, ghost of 2 keys (int(3 * 0.9)); move to main after 2 hits in small.
    # A (hit twice), B and C fill the cache in small. D: small's tail A has 2 hits -> main (counter 0); B, not hit,
    # goes to the ghost. A is then a hit in main (LRU had evicted A for D). B: a ghost hit -- still a miss -- enters
    # main directly, evicting C from small to the ghost. E: main holds 2 (its share), so small's D leaves for the
    # ghost; F: E leaves, the ghost, full, drops C. B and A are both hits in main; LRU evicted A for F.
    seq = "A A A B C D A B E F B A"
    assert _hits(S3FIFO(3), seq) == [0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1]
    assert _hits(LRU(3), seq) == [0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    s = S3FIFO(3)
    assert (s.small_size, s.main_size, s.ghost_size) == (1, 2, 2)
    simulate(s, "A A A B C D".split())
    assert list(s.small) == ["C", "D"] and dict(s.main) == {"A": 0} and list(s.ghost) == ["B"]
    simulate(s, "A B E F".split())
    assert list(s.small.items()) == [("F", 0)]
    assert list(s.main.items()) == [("A", 1), ("B", 0)]
    assert list(s.ghost) == ["D", "E"]


def test_s3fifo_as_libcachesim_now_runs_it_fills_main_first():
    # The same sequence under libCacheSim's current S3FIFO.c: while nothing was evicted, B and C find small (1 key)
    # full and enter main. D: A (2 hits) moves from small to main, which is then over its share: B, never hit, is
    # evicted from main (main's evictions leave no ghost). A hits; B misses, not in the ghost, and enters small,
    # pushing D to the ghost. E and F push B and then E to the ghost (which drops D). B, found in the ghost, misses
    # into main, pushing F to the ghost; A hits.
    seq = "A A A B C D A B E F B A"
    s = hr.S3FIFOLibCacheSim(3)
    assert _hits(s, seq) == [0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert not s.small and list(s.main.items()) == [("C", 0), ("A", 2), ("B", 0)] and list(s.ghost) == ["E", "F"]


def test_s3fifo_sends_a_key_hit_once_in_small_to_the_ghost():
    # A is hit once only: at D it goes to the ghost, not to main; its next request is a miss that enters main.
    s = S3FIFO(3)
    assert _hits(s, "A A B C D A") == [0, 1, 0, 0, 0, 0]
    assert list(s.small) == ["C", "D"] and dict(s.main) == {"A": 0} and list(s.ghost) == ["B"]


def test_s3fifo_main_is_a_clock_with_2_bit_counters():
    # Size 10: small 1, main 9. Counters saturate at 3 and are decremented on each pass of main's tail.
    s = S3FIFO(10)
    s.main.update({"M": 0})
    for _ in range(5):
        s.access("M")
    assert s.main["M"] == 3
    s._evict_main()  # M survives three passes (3 -> 2 -> 1 -> 0) and is evicted on the fourth
    assert "M" not in s.main


def test_2q_keeps_keys_missed_again_after_a1in_in_its_lru():
    # Size 4: Kin 1, Kout 2. A..D fill A1in; E pushes A out to A1out. A: found in A1out (a miss) -> Am, pushing B
    # to A1out. A and C hit (C in A1in does not move). F pushes C out; B, from A1out, -> Am pushing D out; G pushes
    # E out (A1out drops C). A is in Am: a hit, where LRU had evicted it for G.
    seq = "A B C D E A A C F B G A"
    assert _hits(TwoQ(4), seq) == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert _hits(LRU(4), seq) == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    q = TwoQ(4)
    simulate(q, seq.split()[:-1])
    assert list(q.a1in) == ["F", "G"] and list(q.am) == ["A", "B"] and list(q.a1out) == ["D", "E"]


def test_keep_first_admits_until_full_then_nothing():
    k = KeepFirst(2)
    assert _hits(k, "A B C A C B C") == [0, 0, 0, 1, 0, 1, 0]
    assert k.kept == {"A", "B"}


@pytest.mark.parametrize("model", sorted(hr.MODELS))
def test_every_model_is_bounded_and_only_cold_misses_when_everything_fits(model):
    rng = random.Random(3)
    keys = [rng.randrange(300) for _ in range(5_000)]
    distinct = len(set(keys))
    hits = simulate(hr.MODELS[model](distinct), keys)
    assert hits.count(0) == distinct  # each key misses once, never again
    m = hr.MODELS[model](20)
    for k in keys:
        m.access(k)
        held = {"lru": lambda: len(m.entries), "s3fifo": lambda: len(m.small) + len(m.main),
                "s3fifo-libcachesim": lambda: len(m.small) + len(m.main),
                "sieve": lambda: len(m.visited), "clock": lambda: len(m.slot_of),
                "2q": lambda: len(m.a1in) + len(m.am), "keep-first": lambda: len(m.kept),
                "auto": lambda: len(m.window) + len(m.main)}[model]()
        assert held <= 20


# --------------------------------------------------------------------------------------------- workloads


def test_workloads_are_deterministic_and_seeded():
    a = hr.zipf_workload(500, 2_000, 0.8, (0.1,), seed=1)
    assert a.keys == hr.zipf_workload(500, 2_000, 0.8, (0.1,), seed=1).keys
    assert a.keys != hr.zipf_workload(500, 2_000, 0.8, (0.1,), seed=2).keys
    assert a.sizes == (50,) and a.seed == "1/zipf-0.8"
    counts = [a.keys.count(k) for k in range(3)]
    assert counts[0] > counts[1] > counts[2]  # the most popular keys first


def test_epochs_are_permutations_and_reported_apart():
    w = hr.epochs_workload(100, 3, (0.25, 0.5), seed=1)
    epochs = [w.keys[i:i + 100] for i in range(0, 300, 100)]
    assert all(sorted(e) == list(range(100)) for e in epochs) and epochs[0] != epochs[1]
    assert w.sizes == (25, 50) and w.rows() == (("epoch 1", 0, 100), ("epochs 2-3", 100, 300))
    hits = simulate(KeepFirst(25), w.keys)
    assert hits.count(1, 0, 100) == 0 and hits.count(1, 100, 300) == 50  # a quarter of epochs 2 and 3


def test_loop_and_scan_workloads():
    loop = hr.loop_workload(100, 3)
    assert loop.keys == list(range(110)) * 3 and loop.sizes == (100,)
    assert simulate(LRU(100), loop.keys).count(1) == 0  # LRU's worst case
    w = hr.scan_workload(1_000, 1.0, 3_000, 500, 200, (0.1,), seed=1)
    assert len(w.keys) == 3_000 + 5 * 200
    scanned = [k for k in w.keys if k >= 1_000]
    assert len(scanned) == len(set(scanned)) == 1_000  # one-hit wonders: each read once


# --------------------------------------------------------------------------------------------- trace files


def test_text_trace(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("a\n b \n\n17\na\n*\n")
    assert hr.read_trace(str(p), "text") == ["a", "b", "17", "a"]
    g = tmp_path / "t.txt.gz"
    g.write_bytes(gzip.compress(b"x\ny\nx\n"))
    assert hr.read_trace(str(g), "text") == ["x", "y", "x"]


def test_binary_traces(tmp_path):
    p32 = tmp_path / "t.u32"
    p32.write_bytes(struct.pack(">4I", 1, 2**32 - 1, 1, 258))
    assert hr.read_trace(str(p32), "u32be") == [1, 2**32 - 1, 1, 258]
    p64 = tmp_path / "t.u64.bz2"
    p64.write_bytes(bz2.compress(struct.pack(">3Q", 2**64 - 1, 5, 2**40)))
    assert hr.read_trace(str(p64), "u64be") == [2**64 - 1, 5, 2**40]
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00" * 6)
    with pytest.raises(ValueError, match="whole number of 4-byte keys"):
        hr.read_trace(str(bad), "u32be")
    with pytest.raises(ValueError, match="unknown trace format"):
        hr.read_trace(str(bad), "csv")


def test_cache_sizes_are_entries_or_fractions():
    assert hr.parse_cache_sizes("1000", 50) == (1000,)
    assert hr.parse_cache_sizes("0.1, 1000,1e-3,1.0", 2_000) == (200, 1000, 2, 2_000)
    assert hr.parse_cache_sizes("0.0001", 50) == (1,)
    for bad in ("0", "1.5", "", "-3"):
        with pytest.raises(ValueError):
            hr.parse_cache_sizes(bad, 50)


# --------------------------------------------------------------------------------------------- the command line


def test_main_replays_a_trace_and_writes_json(tmp_path, capsys):
    rng = random.Random(5)
    trace = tmp_path / "trace.u32"
    keys = [rng.randrange(400) for _ in range(3_000)]
    trace.write_bytes(struct.pack(f">{len(keys)}I", *keys))
    sizes = (40, round(len(set(keys)) * 0.5))
    out = tmp_path / "figures.json"
    rc = hr.main(["--trace", str(trace), "--format", "u32be", "--cache-size", "40,0.5", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert printed.startswith("command: python -m benchmarks.hitratio --trace ")
    assert "seed: 1" in printed and "| lru (shm) |" in printed
    assert f"trace: shm lru == model lru: hit for hit (cache sizes {sizes[0]}, {sizes[1]})" in printed
    data = json.loads(out.read_text())
    assert data["columns"][0] == "lru (shm)" and set(hr.MODELS) <= set(data["columns"])
    assert [r["cache_entries"] for r in data["runs"]] == list(sizes)
    assert all(not c["failed"] and not c["stats_problem"] for c in data["checks"])
    assert all(c["hit_for_hit"] for c in data["checks"] if c["model"] in hr.EXACT_MODELS)
    for r in data["runs"]:
        assert r["hit_ratio"]["lru (shm)"] == r["hit_ratio"]["lru"]


def test_main_only_selects_workloads(capsys):
    assert hr.main(["--quick", "--only", "loop", "--models", "lru,keep-first"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| loop")]
    assert len(rows) == 1 and rows[0].split("|")[3].strip() == "0.0"  # LRU on a loop: no hit
    assert "zipf" not in printed
    assert hr.main(["--only", "nosuch"]) == 2
