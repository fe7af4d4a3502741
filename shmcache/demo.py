"""``shmcache bench``: worker processes share one cache in front of a simulated expensive transform.

Each worker draws keys from a Zipf distribution (s = 1, as request keys in a web pool or samples re-read across
epochs tend to be) and reads through the cache with ``get_or_compute``: on a miss the value is "computed" (a busy
loop of ``--compute-us``) once for all workers. Every value read is checked against its key. The parent samples the
cache's global stats twice a second: a live view (with rich, when installed and on a terminal; plain lines
otherwise), then a table, or one JSON document with ``--json``; ``--plot FILE`` draws the run with matplotlib.

What sharing saves is the headline: after its timed run, each worker replays its own key stream (the same seed
draws the same keys again) through two simulated private LRU caches, one of ``C // N`` entries (N private caches
in the shared cache's memory) and one of ``C`` (each as large as the shared one: N times the memory), where ``C``
is how many entries of this size the shared cache's limits admit; a private cache computes each of its misses.
The replay runs after the workers' clocks stop, so it costs the measured run nothing.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np
import xxhash

from . import core
from .cache import SharedCache, parts

_SAMPLE_EVERY = 16  # latency is recorded for one operation in this many, to keep the workers' overhead small
_CHUNK = 2048  # keys drawn at a time; a worker checks its deadline between chunks


def _value_for(key: int, nbytes: int) -> bytes:
    seed = xxhash.xxh3_64_digest(key.to_bytes(8, "little"))
    return (seed * (nbytes // 8 + 1))[:nbytes]


def _compute(key: int, nbytes: int, compute_us: float) -> bytes:
    end = time.perf_counter() + compute_us / 1e6
    while time.perf_counter() < end:
        pass
    return _value_for(key, nbytes)


def _key_chunks(args: dict, worker: int) -> Iterator[list[int]]:
    """Worker ``worker``'s key stream, ``_CHUNK`` keys at a time: the same seed, the same keys, every time."""
    rng = np.random.default_rng(args["seed"] * 1000 + worker)
    weights = 1.0 / np.arange(1, args["keys"] + 1)
    weights /= weights.sum()
    while True:
        yield rng.choice(args["keys"], size=_CHUNK, p=weights).tolist()


def private_misses(chunks, capacities: list[int]) -> list[int]:
    """How many misses the key stream ``chunks`` (lists of keys) costs a private LRU cache of each of
    ``capacities`` entries (as functools.lru_cache counts them): each is a value that cache computes."""
    misses = [0] * len(capacities)
    lrus = [OrderedDict() for _ in capacities]  # type: ignore[var-annotated]
    for keys in chunks:
        for i, (lru, capacity) in enumerate(zip(lrus, capacities)):
            move, evict, m = lru.move_to_end, lru.popitem, 0
            for k in keys:
                if k in lru:
                    move(k)
                else:
                    m += 1
                    lru[k] = None
                    if len(lru) > capacity:
                        evict(False)
            misses[i] += m
    return misses


def _worker(name: str, worker: int, args: dict, deadline: float, queue) -> None:
    hit_lat: list[int] = []
    miss_lat: list[int] = []
    ops = hits = wrong = drawn = 0
    computed = False

    def compute(key):
        nonlocal computed
        computed = True
        return _compute(key, args["value_bytes"], args["compute_us"])

    with SharedCache(name, create=False) as cache:
        for chunk in _key_chunks(args, worker):
            drawn += 1
            for key in chunk:
                t0 = time.perf_counter_ns()
                computed = False
                value = cache.get_or_compute(key, lambda: compute(key))
                wrong += value != _value_for(key, args["value_bytes"])
                if computed:
                    lat = miss_lat
                else:
                    hits += 1
                    lat = hit_lat
                if ops % _SAMPLE_EVERY == 0:
                    lat.append(time.perf_counter_ns() - t0)
                ops += 1
            if time.monotonic() >= deadline:
                break
    end = time.monotonic()  # (CLOCK_MONOTONIC: the parent's clock too)
    replay = _key_chunks(args, worker)
    private = private_misses((next(replay) for _ in range(drawn)), args["private_capacities"])
    queue.put({"worker": worker, "ops": ops, "hits": hits, "wrong": wrong, "hit_ns": hit_lat, "miss_ns": miss_lat,
               "end": end, "private_misses": private})


def _percentiles(samples: list[int]) -> dict:
    if not samples:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(samples) / 1000.0
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def _capacity_entries(cache: SharedCache, keys: int, value_bytes: int) -> int:
    """How many entries of the workload's size the cache's limits admit (its longest key: a lower bound)."""
    size = parts(cache).store.encode(keys - 1, _value_for(keys - 1, value_bytes)).size
    limits = cache.limits()
    return max(1, min(limits.max_entries, limits.max_retained_bytes // size))


def run_demo(args) -> int:
    name = f"bench-{os.getpid()}"
    capacity = int(args.capacity_mib * 2**20)
    max_entries = max(16, capacity // max(64, args.value_bytes // 2))
    ctx: Any = mp.get_context("spawn" if sys.platform == "darwin" else "fork")  # (its stubs declare no Process)
    queue = ctx.Queue()
    cache = SharedCache(name, capacity_bytes=capacity, max_entries=max_entries, create=True, policy=args.policy)
    entries_shared = _capacity_entries(cache, args.keys, args.value_bytes)
    # N private caches in the same memory, and N as large as the shared one (see the module docstring)
    private_capacities = [max(1, entries_shared // args.workers), entries_shared]
    params = {"keys": args.keys, "value_bytes": args.value_bytes, "compute_us": args.compute_us, "seed": args.seed,
              "private_capacities": private_capacities}
    procs = []
    timeline = []  # global stats sampled by the parent: what the live view and the plot show
    live = None if args.json else _LiveView.start(args.workers, args.seconds)
    try:
        t0 = time.monotonic()
        deadline = t0 + args.seconds
        procs = [ctx.Process(target=_worker, args=(name, i, params, deadline, queue)) for i in range(args.workers)]
        for p in procs:
            p.start()
        while True:
            s = cache.stats()
            now = time.monotonic() - t0
            timeline.append({"t": now, "lookups": s.hits + s.misses, "hit_ratio": s.hit_ratio, "entries": s.entries,
                             "evictions": s.evictions, "computations": s.computations, "waits": s.waits})
            if live is not None:
                live.update(timeline)
            if now >= args.seconds:
                break
            time.sleep(min(_TICK_S, max(0.0, deadline - time.monotonic())))
        # The replay of each worker's stream takes a fraction of the run's time (no cache, no computing).
        results = sorted((queue.get(timeout=60 + args.seconds) for _ in procs), key=lambda r: r["worker"])
        for p in procs:
            p.join(timeout=30)
        elapsed = max(r["end"] for r in results) - t0  # the timed run, not the replays after it
        s = cache.stats()
        ops = sum(r["ops"] for r in results)
        private = []
        for i, (each, memory) in enumerate(zip(private_capacities, (capacity, capacity * args.workers))):
            misses = sum(r["private_misses"][i] for r in results)
            private.append({"caches": args.workers, "entries_each": each, "memory_bytes": memory,
                            "computations": misses, "hit_ratio": 1 - misses / ops if ops else 0.0})
        report = {
            "workers": args.workers,
            "policy": cache.policy,
            "hot_path": core.PATH,
            "seconds": elapsed,
            "ops": ops,
            "ops_per_s": ops / elapsed,
            "hit_ratio": s.hit_ratio,
            "wrong_values": sum(r["wrong"] for r in results),
            "evictions": s.evictions,
            "entries": s.entries,
            "computations": s.computations,
            "capacity_bytes": capacity,
            "capacity_entries": entries_shared,
            # the same key streams through N private LRU caches, simulated: [same memory, N times the memory]
            "private": private,
            "computations_saved": private[0]["computations"] - s.computations,
            "waits": s.waits,
            "takeovers": s.takeovers,
            "per_worker_ops": [r["ops"] for r in results],
            "hit_latency_us": _percentiles([x for r in results for x in r["hit_ns"]]),
            "miss_latency_us": _percentiles([x for r in results for x in r["miss_ns"]]),
            "verify_ok": cache.verify(deep=False).ok,
            "timeline": timeline,
        }
    finally:
        if live is not None:
            live.stop()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        cache.unlink()
        cache.close()
    if args.plot:
        _plot(report, params, args.plot)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        _print_report(report, params)
        if args.plot:
            print(f"\nchart written to {args.plot}")
    return 0 if report["wrong_values"] == 0 and report["verify_ok"] else 1


_TICK_S = 0.5


def _rate(timeline: list[dict]) -> float:
    """Lookups per second over the last tick."""
    if len(timeline) < 2:
        return 0.0
    a, b = timeline[-2], timeline[-1]
    return (b["lookups"] - a["lookups"]) / max(b["t"] - a["t"], 1e-9)


class _LiveView:
    """Progress while the workers run: rich's live table on a terminal, else one plain line per second."""

    def __init__(self, workers: int, seconds: float, live=None) -> None:
        self.workers, self.seconds, self.live, self.last_plain = workers, seconds, live, -1.0

    @classmethod
    def start(cls, workers: int, seconds: float) -> _LiveView:
        try:
            from rich.console import Console
            from rich.live import Live
        except ImportError:  # rich is in the "cli" extra; without it, plain lines
            return cls(workers, seconds)
        console = Console()
        if not console.is_terminal:
            return cls(workers, seconds)
        live = Live(console=console, refresh_per_second=4, transient=True)
        live.start()
        return cls(workers, seconds, live)

    def update(self, timeline: list[dict]) -> None:
        t = timeline[-1]
        if self.live is None:
            if t["t"] - self.last_plain >= 1.0:
                self.last_plain = t["t"]
                print(f"{t['t']:5.1f}s  lookups={t['lookups']:>10,}  {_rate(timeline):>9,.0f}/s  "
                      f"hit ratio={t['hit_ratio']:6.1%}  entries={t['entries']:>7,}  evictions={t['evictions']:>8,}",
                      flush=True)
            return
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(title=f"shmcache bench: {self.workers} workers, one shared cache ({core.PATH} hot path)",
                      title_justify="left")
        for col in ("elapsed", "lookups", "lookups/s", "hit ratio", "entries", "evictions", "computed",
                    "waited"):
            table.add_column(col, justify="right")
        table.add_row(f"{t['t']:.1f} s", f"{t['lookups']:,}", f"{_rate(timeline):,.0f}", f"{t['hit_ratio']:.1%}",
                      f"{t['entries']:,}", f"{t['evictions']:,}", f"{t['computations']:,}", f"{t['waits']:,}")
        bar = ProgressBar(total=self.seconds, completed=min(t["t"], self.seconds), width=60)
        table.caption = bar  # type: ignore[assignment]  # (typed str or Text; rich renders any renderable there)
        self.live.update(table)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def _plot(report: dict, params: dict, path: str) -> None:
    """Throughput and hit ratio over the run, and the latency percentiles, as one PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'shmcache[cli]'") from None
    tl = report["timeline"]
    times = [p["t"] for p in tl[1:]]
    rates = [_rate(tl[: i + 2]) for i in range(len(tl) - 1)]
    fig, (ax1, ax3) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.plot(times, rates, color="tab:blue")
    ax1.set_xlabel("seconds")
    ax1.set_ylabel("lookups/s (all workers)", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot([p["t"] for p in tl], [p["hit_ratio"] for p in tl], color="tab:orange")
    ax2.set_ylabel("hit ratio", color="tab:orange")
    ax2.set_ylim(0, 1)
    ax1.set_title(f"{report['workers']} workers, {params['keys']:,} Zipf keys, one shared cache")
    labels = ["p50", "p90", "p99"]
    for offset, (name, key) in enumerate((("hit", "hit_latency_us"), ("miss + compute", "miss_latency_us"))):
        values = [report[key][q] or 0.0 for q in labels]
        ax3.bar([i + offset * 0.4 for i in range(3)], values, width=0.4, label=name)
    ax3.set_xticks([i + 0.2 for i in range(3)], labels)
    ax3.set_yscale("log")
    ax3.set_ylabel("latency (us)")
    ax3.set_title(f"{report['ops_per_s']:,.0f} lookups/s, hit ratio {report['hit_ratio']:.1%}, "
                  f"{report['computations']:,} computations")
    ax3.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _print_report(r: dict, params: dict) -> None:
    print(f"\n{r['workers']} workers, {r['seconds']:.1f} s, {params['keys']:,} Zipf keys, "
          f"{params['value_bytes']} B values, {params['compute_us']:.0f} us per computed value; {core.hot_path()}")
    n = r["workers"]
    same, larger = r["private"]
    rows = [
        ("one shared cache", f"{_mib(r['capacity_bytes'])}, {r['capacity_entries']:,} entries, {r['policy']}",
         r["computations"], r["hit_ratio"]),
        (f"{n} private caches", f"{_mib(same['memory_bytes'])} in all, {same['entries_each']:,} entries each",
         same["computations"], same["hit_ratio"]),
        (f"{n} private caches", f"{_mib(larger['memory_bytes'])} in all, {larger['entries_each']:,} entries each",
         larger["computations"], larger["hit_ratio"]),
    ]
    w0, w1 = (max(len(row[i]) for row in rows) for i in (0, 1))
    w2 = max(len(f"{row[2]:,}") for row in rows)
    for label, memory, computed, ratio in rows:
        print(f"  {label:<{w0}}  {memory:<{w1}}  {computed:>{w2},} computed  hit ratio {ratio:6.1%}")
    saved = r["computations_saved"]
    share = saved / same["computations"] if same["computations"] else 0.0
    print(f"  sharing saved {saved:,} computations ({share:.0%}, {saved * params['compute_us'] / 1e6:,.1f} s of "
          f"compute) against {n} private caches in the same memory,")
    print(f"  and {larger['computations'] - r['computations']:,} against {n} private caches of {n}x the memory")
    print("  (private: each worker's own keys replayed through a simulated LRU cache of that many entries)")
    per_worker = ", ".join(map(str, r["per_worker_ops"]))
    print(f"  throughput   {r['ops_per_s']:>12,.0f} lookups/s   (per worker: {per_worker})")
    print(f"  hit ratio    {r['hit_ratio']:>12.1%}")
    print(f"  evictions    {r['evictions']:>12,}   entries resident: {r['entries']:,}")
    print(f"  computed     {r['computations']:>12,}   once each for all workers; {r['waits']:,} lookups waited for "
          f"another worker's computation")
    print(f"  wrong values {r['wrong_values']:>12}   integrity check: {'ok' if r['verify_ok'] else 'FAILED'}")
    print("  latency (us)        p50       p90       p99       max")
    for label, key in (("hit", "hit_latency_us"), ("miss+compute", "miss_latency_us")):
        p = r[key]
        if p["p50"] is None:
            continue
        print(f"  {label:<14}{p['p50']:>9.1f} {p['p90']:>9.1f} {p['p99']:>9.1f} {p['max']:>9.1f}")
