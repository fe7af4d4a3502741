"""``python -m benchmarks.run``: shmcache and its peers measured in the same run, side by side.

Prints, for every workload, each store's median (and p99, for latencies) and its figure as a ratio to shmcache's
(peer/shmcache: above 1 means a larger figure than shmcache, which is slower for latencies and memory, faster for
throughput). ``--json FILE`` writes the rows with the date, the machine (CPU model, nproc, load), the Python version
and the version of every package measured; ``--plot FILE`` draws them into a PNG. Peers whose package, or whose
redis-server binary, is missing are skipped with the reason. The numbers are only comparable within one run: other
load on the machine moves them all, and the load average is printed and recorded for that reason.

Workloads (see workloads.py and memory.py for how each is run):
  W1  latency in one process: get hit, get miss, put (and a zero-copy view); a ~100-byte dict, 64 KiB of bytes, a
      224x224x3 uint8 array
  W2  ops/s and hit ratio of 1, 2, 4, 8 forked workers on one store: 90% get / 10% put, Zipf keys, eviction
  W3  get-hit latency with 1k, 10k, 100k, 1M resident entries (--quick stops at 100k)
  W4  churn in a full shmcache: put latency for 64 B..256 KiB values, evictions per put, arena use, failed puts
  W5  summed PSS of 4 workers reading the same arrays: one shared shmcache vs a private cachetools cache each
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import sys
import time

from .memory import w5_memory
from .peers import ALL_PEERS, PEERS_BY_NAME, ShmcachePeer
from .workloads import FULL, QUICK, w1_latency, w2_throughput, w3_growth, w4_churn

DEFAULT_SEED = 1
REFERENCE = ShmcachePeer.name
WORKLOADS = {"W1": w1_latency, "W2": w2_throughput, "W3": w3_growth, "W4": w4_churn, "W5": w5_memory}
TITLES = {
    "W1": "W1  latency in one process (us per operation, each timed alone)",
    "W2": "W2  throughput of forked workers on one store (total ops/s; hit ratio of the gets)",
    "W3": "W3  get-hit latency as the store grows (us)",
    "W4": "W4  churn: puts of mixed sizes into a full cache",
    "W5": "W5  memory of 4 workers reading the same arrays",
}
ALWAYS_RECORDED = ("shmcache", "numpy", "msgpack")
FAULTS_SHOWN = 0.5  # minor page faults per operation (in this process) worth a note in the table


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes and short runs (a smoke test, not figures)")
    p.add_argument("--only", default=",".join(WORKLOADS), help="workloads to run, e.g. W1,W3 (default: all)")
    p.add_argument("--peers", default=",".join(PEERS_BY_NAME),
                   help="stores to compare (default: all of %(default)s); shmcache is always included")
    p.add_argument("--json", metavar="FILE", help="write the results, machine and versions as JSON")
    p.add_argument("--plot", metavar="FILE", help="draw a comparison PNG (needs matplotlib)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of every random choice (default %(default)s)")
    args = p.parse_args(argv)
    only = [w.strip().upper() for w in args.only.split(",") if w.strip()]
    args.peers = [n.strip() for n in args.peers.split(",") if n.strip()]
    for w in only:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    args.only = [w for w in WORKLOADS if w in only]  # always run in order
    for n in args.peers:
        if n not in PEERS_BY_NAME:
            p.error(f"unknown peer {n!r}; choose from {', '.join(PEERS_BY_NAME)}")
    return args


def select_peers(names: list[str]) -> tuple[list, dict]:
    """The peer classes to run, in the standard order, and {name: reason} for those that cannot run here."""
    chosen, skipped = [], {}
    for peer in ALL_PEERS:
        if peer.name != REFERENCE and peer.name not in names:
            continue
        reason = peer.available()
        if reason is None:
            chosen.append(peer)
        else:
            skipped[peer.name] = reason
    return chosen, skipped


def machine() -> dict:
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return {"cpu": cpu, "nproc": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "platform": platform.platform(), "load_average": list(os.getloadavg())}


def versions(peers) -> dict:
    out = {}
    for dist in ALWAYS_RECORDED:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    for peer in peers:
        out[peer.name] = peer.version()
    return out


def add_ratios(rows: list[dict]) -> None:
    """Set each row's ``ratio``: its value over shmcache's for the same workload and case (None when there is none)."""
    ref = {(r["workload"], r["case"]): r["value"] for r in rows if r["peer"] == REFERENCE}
    for r in rows:
        base = ref.get((r["workload"], r["case"]))
        ok = r["peer"] != REFERENCE and base and r["value"] is not None
        r["ratio"] = r["value"] / base if ok else None


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    a = abs(v)
    return f"{v:,.0f}" if a >= 1000 else f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}"


def _notes(r: dict) -> str:
    parts = [f"hit ratio {r['hit_ratio']:.1%}"] if "hit_ratio" in r else []
    if r.get("faults_per_op", 0) >= FAULTS_SHOWN:
        parts.append(f"{r['faults_per_op']:.1f} page faults/op (this process)")
    return "; ".join(parts + ([r["note"]] if r["note"] else []))


def print_table(rows: list[dict], workloads: list[str]) -> None:
    head = ("case", "peer", "median", "p99", "unit", "peer/shmcache", "notes")
    for w in workloads:
        body = [(r["case"], r["peer"], _num(r["value"]), _num(r["p99"]), r["unit"],
                 "-" if r["ratio"] is None else f"{r['ratio']:.2f}x", _notes(r)) for r in rows if r["workload"] == w]
        if not body:
            continue
        widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
        print(f"\n{TITLES[w]}")
        for line in (head, *body):
            cells = [c.ljust(n) if i in (0, 1, 4, 6) else c.rjust(n) for i, (c, n) in enumerate(zip(line, widths))]
            print("  " + "  ".join(cells).rstrip())


def print_header(report: dict, skipped: dict) -> None:
    m = report["machine"]
    print(f"{report['date']}  {m['cpu']}  nproc={m['nproc']}  {m['python']}  "
          f"load average {', '.join(f'{x:.2f}' for x in m['load_average'])}{'  (--quick)' if report['quick'] else ''}")
    width = max((len(p["version"]) for p in report["peers"].values()), default=0)
    for name, p in report["peers"].items():
        print(f"  {name:<13} {p['version']:<{width}}  values: {p['codec']}; bound: {p['bound']}")
    for name, reason in skipped.items():
        print(f"  {name:<13} skipped: {reason}")
    print("  timed loops run with the garbage collector off; ratios are peer/shmcache", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # unwind through every finally
    peers, skipped = select_peers(args.peers)
    scale = QUICK if args.quick else FULL
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "quick": args.quick, "seed": args.seed, "versions": versions(peers),
        "peers": {p.name: {"version": p.version(), "codec": p.codec, "bound": p.bound, "shared": p.shared}
                  for p in peers},
        "skipped": skipped, "workloads": args.only, "scale": vars(scale).copy(),
    }
    print_header(report, skipped)
    rows, t0 = [], time.monotonic()
    for w in args.only:
        print(f"{w} ...", file=sys.stderr, flush=True)
        rows.extend(WORKLOADS[w](scale, peers, args.seed))
    add_ratios(rows)
    report["results"], report["seconds"] = rows, time.monotonic() - t0
    report["machine"]["load_average_at_end"] = list(os.getloadavg())
    print_table(rows, args.only)
    print(f"\n{report['seconds']:.1f} s; load average at the end "
          f"{', '.join(f'{x:.2f}' for x in report['machine']['load_average_at_end'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=float)
        print(f"wrote {args.json}")
    if args.plot:
        try:
            from .plot import plot
        except ImportError as exc:
            print(f"no plot: {exc} (pip install matplotlib)")
        else:
            plot(report, args.plot)
            print(f"wrote {args.plot}")
    errors = [r for r in rows if r["case"] == "(error)"]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
