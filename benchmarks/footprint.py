"""``python -m benchmarks.footprint``: what a cache's segment occupies in /dev/shm beyond the keys and values it holds.

The segment's pages backed with memory are read from ``st_blocks`` (what /dev/shm gives the cache, the figure
``du`` and ``shmcache ls`` show); the keys and values from ``stats().retained_bytes`` (encoded keys and values). Four
cases, each in a cache of its own, on the path this process runs:

- ``empty``: a cache of the default limits, as made.
- ``fill``: ``--entries`` entries of ``--value-bytes`` bytes (bytes values, keys ``k<i>``) stored once into a cache
  with room for them (``max_entries`` = ``--entries``, a capacity of twice their bytes): the bytes per entry beyond
  its key and value, split into the tables' share (the index, the entry records and their columns: backed for the
  entry limit in force, ``max_entries``; each table's bytes per entry printed below) and the arena's (block headers,
  padding, and the slack the ring keeps for compaction). The same bytes split the other way: what each entry costs
  (the tables' share, its block header and padding: the header's ``arena_used`` less the keys and values) and the
  ring's free space, the arena backed beyond the live blocks (``arena_extent`` less ``arena_used``: the last
  growth's eighth not yet filled, and the eighth the ring keeps for compaction).
- ``churn``: the same keys rewritten ``--rounds`` times at sizes from half to one and a half ``--value-bytes``
  (dead blocks all through the ring): the arena's bytes over the live ones.
- ``default``: the default cache filled to its byte limit with 2 KiB values: the whole segment, against the 64 MiB
  /dev/shm of a container.

Nothing passes or fails here.

    python -m benchmarks.footprint
    python -m benchmarks.footprint --entries 1000000 --value-bytes 16 --json
"""

from __future__ import annotations

import argparse
import json
import os

from shmcache import SharedCache, core
from shmcache.cache import parts
from shmcache.layout.dtypes import H_ARENA_USED

MIB = 1 << 20


def _name(tag: str) -> str:
    return f"bench-footprint-{tag}-{os.getpid()}"


def _occupied(cache: SharedCache) -> int:
    return os.stat(f"/dev/shm/shmcache.{cache.name}").st_blocks * 512


def _tables(cache: SharedCache) -> int:
    """The bytes the tables back: header, the index in force, the entry records and columns the limit shows, kind
    table, ghost, reader slots, and the lazy columns (idle, versions, expires) where they are in use (layout
    Geometry.backed, the arena left out)."""
    seg = parts(cache).seg
    return sum(stop - start for start, stop in seg.geometry.backed(seg.mask + 1, seg.shown[2], 0, seg.shown[5]))


def _tables_by_region(cache: SharedCache, resident: int) -> dict[str, float]:
    """The bytes each table shows per resident entry (``Geometry.tables``, in its order): where the tables' share
    goes."""
    seg = parts(cache).seg
    g = seg.geometry
    names = (["ttis", "deadlines"] if g.version >= 14 else []) + [
        "index", "entry records", "expires", "versions", "kinds", "pins", "marks", "ghost"]
    return {n: shown / resident
            for n, (_, shown, _) in zip(names, g.tables(seg.mask + 1, seg.shown[2], seg.shown[5]))}


def _case(tag: str, **kwargs) -> SharedCache:
    return SharedCache(_name(tag), create=True, **kwargs)


def measure(entries: int, value_bytes: int, rounds: int, policy: str) -> dict:
    out: dict = {"path": core.PATH, "policy": policy, "entries": entries, "value_bytes": value_bytes}
    caches = []
    try:
        c = _case("empty", policy=policy)
        caches.append(c)
        out["empty_default_mib"] = _occupied(c) / MIB
        # (the most it occupies under its capacity: the file itself is sized for max_capacity_bytes, sparse)
        out["default_most_mib"] = parts(c).seg.geometry.occupied_at_most(c.capacity_bytes,
                                                                          c.limits().max_entries) / MIB

        c = _case("fill", capacity_bytes=2 * entries * (value_bytes + 16), max_entries=entries, policy=policy)
        caches.append(c)
        value = b"v" * value_bytes
        batch = 4096
        for i in range(0, entries, batch):
            c.put_many({f"k{j}": value for j in range(i, min(entries, i + batch))})
        s = c.stats()
        occupied, tables = _occupied(c), _tables(c)
        used = parts(c).seg.header_words[H_ARENA_USED]  # the live blocks' bytes, headers and padding included
        out["fill"] = {
            "resident": s.entries, "retained_mib": s.retained_bytes / MIB, "occupied_mib": occupied / MIB,
            "beyond_key_value_per_entry": (occupied - s.retained_bytes) / s.entries,
            "tables_per_entry": tables / s.entries,
            "arena_per_entry": (occupied - tables - s.retained_bytes) / s.entries,
            "arena_over_retained": (occupied - tables) / s.retained_bytes,
            "entry_per_entry": (tables + used - s.retained_bytes) / s.entries,
            "ring_free_per_entry": (occupied - tables - used) / s.entries,
            "tables_by_region": _tables_by_region(c, s.entries),
        }

        c = _case("churn", capacity_bytes=4 * entries * (value_bytes + 16), max_entries=entries, policy=policy)
        caches.append(c)
        for r in range(rounds):
            for i in range(0, entries, batch):
                c.put_many({f"k{j}": b"c" * (value_bytes // 2 + (j * 7 + r * 131) % (value_bytes + 1))
                            for j in range(i, min(entries, i + batch))})
        s = c.stats()
        occupied, tables = _occupied(c), _tables(c)
        out["churn"] = {"rounds": rounds, "retained_mib": s.retained_bytes / MIB, "occupied_mib": occupied / MIB,
                        "arena_over_retained": (occupied - tables) / s.retained_bytes}

        c = _case("default", policy=policy)
        caches.append(c)
        v = b"d" * 2048
        i = 0
        while c.stats().evictions == 0:
            c.put_many({f"k{j}": v for j in range(i, i + 1024)})
            i += 1024
        s = c.stats()
        out["default_full"] = {"retained_mib": s.retained_bytes / MIB, "occupied_mib": _occupied(c) / MIB}
    finally:
        for c in caches:
            c.close()
            SharedCache.unlink_name(c.name)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.footprint", description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5, help="rewrites of every key in the churn case")
    p.add_argument("--policy", default="lru")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = measure(args.entries, args.value_bytes, args.rounds, args.policy)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    f, ch, d = out["fill"], out["churn"], out["default_full"]
    print(f"path {out['path']}, policy {out['policy']}")
    print(f"empty default cache: {out['empty_default_mib']:.2f} MiB occupied "
          f"(at most {out['default_most_mib']:.1f} MiB)")
    print(f"fill: {f['resident']} entries of {out['value_bytes']} B values: {f['occupied_mib']:.1f} MiB for "
          f"{f['retained_mib']:.1f} MiB of keys and values: {f['beyond_key_value_per_entry']:.0f} B per entry beyond "
          f"them ({f['tables_per_entry']:.0f} B the tables', {f['arena_per_entry']:.0f} B the arena's); arena / "
          f"retained {f['arena_over_retained']:.2f}")
    print(f"  the same per entry: {f['entry_per_entry']:.1f} B each entry's own (the tables', its block header and "
          f"padding), {f['ring_free_per_entry']:.1f} B the ring's free space")
    print("  the tables' bytes per entry: " + ", ".join(f"{n} {b:.1f}" for n, b in f["tables_by_region"].items() if b))
    print(f"churn: {ch['rounds']} rewrites of every key at other sizes: arena / retained "
          f"{ch['arena_over_retained']:.2f}")
    print(f"default cache filled to its byte limit: {d['occupied_mib']:.1f} MiB occupied for "
          f"{d['retained_mib']:.1f} MiB of keys and values")


if __name__ == "__main__":
    main()
