"""Draw a run's results into one PNG: a panel per workload, every store in the same colour throughout."""

from __future__ import annotations

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np

FIGSIZE = (19, 10)
DPI = 110


def plot(report: dict, path: str) -> None:
    rows = [r for r in report["results"] if r["value"] is not None]
    peers = list(report["peers"])
    colours = {p: plt.cm.tab10(i) for i, p in enumerate(peers)}
    fig, axes = plt.subplots(2, 3, figsize=FIGSIZE)
    _w1(axes[0][0], rows, peers, colours)
    _w2(axes[0][1], rows, peers, colours)
    _w3(axes[0][2], rows, peers, colours)
    _bars(axes[1][0], [r for r in rows if r["workload"] == "W4" and r["unit"] == "us"], colours,
          "W4 put into a full cache, 64 B..256 KiB (us, median and p99; log scale)")
    axes[1][0].set_yscale("log")
    _w5(axes[1][1], rows, colours)
    _about(axes[1][2], report)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _w1(ax, rows, peers, colours) -> None:
    w1 = [r for r in rows if r["workload"] == "W1" and r["peer"] in colours]
    cases = list(dict.fromkeys(r["case"] for r in w1))
    width = 0.8 / max(1, len(peers))
    for i, peer in enumerate(peers):
        value = {r["case"]: r["value"] for r in w1 if r["peer"] == peer}
        xs = [j for j, c in enumerate(cases) if c in value]
        ax.bar([x + i * width for x in xs], [value[cases[x]] for x in xs], width, label=peer, color=colours[peer])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, rotation=60, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_title("W1 latency in one process (us, median; log scale)")
    ax.legend(fontsize=7)


def _lines(ax, rows, peers, colours, x_key: str) -> None:
    for peer in peers:
        pts = sorted((r[x_key], r["value"]) for r in rows if r["peer"] == peer and x_key in r)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=peer, color=colours[peer])
    ax.legend(fontsize=7)


def _w2(ax, rows, peers, colours) -> None:
    _lines(ax, [r for r in rows if r["workload"] == "W2"], peers, colours, "workers")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["workers"] for r in rows if r["workload"] == "W2"}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("worker processes")
    ax.set_title("W2 throughput, 90% get / 10% put, Zipf keys (total ops/s)")


def _w3(ax, rows, peers, colours) -> None:
    _lines(ax, [r for r in rows if r["workload"] == "W3"], peers, colours, "entries")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("resident entries")
    ax.set_title("W3 get-hit latency as the store grows (us, median)")


def _w5(ax, rows, colours) -> None:
    cases = {"sum of PSS / data size": "all of it", "(sum of PSS - sum before reading) / data size": "added by reading"}
    w5 = [r for r in rows if r["workload"] == "W5" and r["case"] in cases]
    peers = list(dict.fromkeys(r["peer"] for r in w5))
    for i, peer in enumerate(peers):
        value = {r["case"]: r["value"] for r in w5 if r["peer"] == peer}
        ax.bar([j + i * 0.4 for j in range(len(cases))], [value.get(c, 0) for c in cases], 0.4, label=peer,
               color=colours.get(peer, "grey"))
    ax.set_xticks([j + 0.2 * (len(peers) - 1) for j in range(len(cases))], list(cases.values()))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_title("W5 sum of 4 workers' PSS / data size (1 = the data once)")
    ax.legend(fontsize=7)


def _bars(ax, rows, colours, title: str) -> None:
    xs = np.arange(len(rows))
    ax.bar(xs, [r["value"] for r in rows], color=[colours.get(r["peer"], "grey") for r in rows])
    p99 = [r["p99"] for r in rows]
    if rows and all(v is not None for v in p99):
        ax.scatter(xs, p99, marker="_", s=400, color="black", label="p99")
        ax.legend(fontsize=7)
    ax.set_xticks(xs, [r["peer"] for r in rows])
    ax.set_title(title)


def _about(ax, report: dict) -> None:
    m = report["machine"]
    lines = [report["date"] + ("  (--quick)" if report["quick"] else ""), f"{m['cpu']}, nproc {m['nproc']}",
             m["python"], f"load average {m['load_average'][0]:.2f} at start", ""]
    lines += [f"{name} {p['version']}: {p['codec']}" for name, p in report["peers"].items()]
    lines += [f"{name}: skipped ({why})" for name, why in report["skipped"].items()]
    ax.text(0, 1, "\n".join(lines), va="top", fontsize=8, family="monospace", wrap=True)
    ax.axis("off")
