"""The ``shmcache`` command: list, inspect and manage the caches of this host, look at their entries, and run the
demo benchmark.

Each subcommand is a ``cmd_<name>(args) -> int`` behind one argparse dispatcher; every one that prints data takes
``--json`` and then prints exactly one JSON document on stdout (``--watch --json`` one per refresh, and ``dump``,
always JSON, one per entry: JSON Lines).
"""

from __future__ import annotations

import argparse
import ast
import base64
import fnmatch
import json
import math
import os
import pwd
import shlex
import sys
import time
import warnings
from typing import Any

from . import __version__, block, core, entries, tensors
from .cache import DEFAULT_POLICY, SharedCache, parts
from .codec import KIND_PREFIXES, TAG_TENSOR, array_layout, body_checksum, decode_body, encode_key, fingerprint
from .errors import OwnershipError, SerializerMismatch, ShmCacheError
from .segment import attached, segment_in_use, segment_names, sweep
from .keys import decode_key
from .layout import EMPTY
from .layout.dtypes import (
    H_CREATED_NS, H_CREATOR_PID, H_DEFAULT_TTL, H_FILL, H_LAST_PUT, POLICY_NAMES,
)
from .serializers import PICKLE, TAG_PICKLE
from .stats import CacheLimits, prometheus_text
from .trust import Trust



# Why short: a listing must not stall on one cache whose lock is held by a stopped process, or that another process
# is still creating; the lock is held for microseconds by a healthy cache, so this is a lifetime.
INSPECT_TIMEOUT_S = 0.25


def _open(args, name: str) -> SharedCache:
    """Attach to an existing cache with the trust the command line asked for (--mode, --trust-owner), waiting at
    most ``INSPECT_TIMEOUT_S`` for its lock or its creation: no command stalls on a stuck cache. A pickle cache is
    opened as one: only ``get`` and ``dump`` read values, and they unpickle none unless asked to (``--unpickle``)."""
    kwargs = dict(create=False, mode=args.mode, trust_owner=args.trust_owner, lock_timeout=INSPECT_TIMEOUT_S,
                  attach_timeout=INSPECT_TIMEOUT_S)
    try:
        return SharedCache(name, **kwargs)
    except SerializerMismatch as exc:
        return SharedCache(name, serializer=exc.found, **kwargs)


def _describe(args, name: str, attachment: tuple[int | None, list[int]]) -> dict:
    """One row of ``ls``: ``state`` is ``ok``, ``busy`` (its lock or its creation did not come within the timeout:
    a holder is stuck or stopped), ``damaged`` (the segment cannot be read as a cache) or ``skipped`` (not opened:
    another user's, more open than --mode, not a regular file; ``reason`` says which); the figures that need the
    lock are missing unless ``ok``. ``attachment``: the handles open on it and the processes seen holding them,
    taken before this command opened anything (``segment.attached``)."""
    handles, pids = attachment
    attached = {"attached_handles": handles, "attached_pids": pids}
    try:
        c = _open(args, name)
    except OwnershipError as exc:
        return {"name": name, "state": "skipped", "reason": exc.reason, **attached}
    except (TimeoutError, ShmCacheError) as exc:  # LockTimeout and an unfinished creation are TimeoutErrors
        return {"name": name, "state": "busy" if isinstance(exc, TimeoutError) else "damaged", "error": str(exc),
                **attached}
    with c:
        seg = parts(c).seg
        h = seg.header_words  # creation-time and display words: read without the lock
        age = max(0.0, (time.time_ns() - h[H_CREATED_NS]) / 1e9)
        last_put = h[H_LAST_PUT]  # the writers' CLOCK_MONOTONIC, to the second; 0: never stored to
        # (clamped to the age: a writer with a clock of its own, SharedCache(clock=...), stamps in its own time)
        since = None if not last_put else min(age, max(0.0, (time.monotonic_ns() - last_put) / 1e9))
        st = os.fstat(seg.fd)
        # (st_blocks: the pages backed with memory, what the cache occupies; the size is what it may grow to under
        # its capacity in force, not the file's length, which is sized for max_capacity_bytes and sparse)
        row = {"name": name, "state": "ok", "size_bytes": seg.geometry.occupied_at_most(c.capacity_bytes),
               "occupied_bytes": st.st_blocks * 512, "creator_pid": h[H_CREATOR_PID], "owner": _user(st.st_uid),
               "age_s": age, "last_write_s": since, **attached}
        try:
            s = c.stats()
        except ShmCacheError as exc:
            row.update(state="busy" if isinstance(exc, TimeoutError) else "damaged", error=str(exc))
            return row
    row.update(policy=s.policy, entries=s.entries, max_entries=s.max_entries, retained_bytes=s.retained_bytes,
               max_retained_bytes=s.max_retained_bytes, fill=s.retained_bytes / s.max_retained_bytes,
               hit_ratio=s.hit_ratio)
    return row


def _shown(name: str) -> str:
    """A name as it may be printed: one another user chose may hold terminal control codes or bytes that are not
    UTF-8 (escaped here, as repr does), never written to the terminal as they are."""
    return name if name.isprintable() else repr(name)[1:-1]


def _shell_word(name: str) -> str:
    """``name`` quoted for a shell command line the user may paste: as shlex does, or, for a name with control codes
    or bytes that are not UTF-8, in ANSI-C quoting (bash, zsh: ``$'...'``), so the hint names exactly that file and
    prints no control code."""
    if name.isprintable():
        return shlex.quote(name)
    out = []
    for c in name:
        n = ord(c)
        if 0xDC80 <= n <= 0xDCFF:  # a byte that is not UTF-8, as os.listdir gives it
            out.append(f"\\x{n - 0xDC00:02x}")
        elif c in "\\'" or not c.isprintable():
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


# The counters --watch gives rates of: they only grow, except when clear() sets them back to zero.
STATS_COUNTERS = ("hits", "misses", "puts", "updates", "deletes", "evictions", "expired", "clears", "recoveries",
                  "computations", "waits", "takeovers", "stale_hits", "refreshes", "refresh_failures", "too_large",
                  "admitted", "not_admitted", "promoted", "ghost_hits", "filter_admitted", "filter_refused",
                  "unlocked_reads", "read_retries", "read_fallbacks")


class Interval:
    """What ``--watch`` shows of the change between two refreshes: the increase of each of ``rated`` divided by the
    seconds measured between the two snapshots (``time.monotonic``), and ``derived(increases)``: figures of the
    interval itself (its hit ratio; None where it had no lookup), which may also use the increases of ``also``.

    A counter found lower than at the last refresh was reset (``clear()``); its increase is then its new value, as
    Prometheus's ``rate()`` takes a reset. ``step`` returns None at the first refresh, which has nothing to compare to.
    """

    def __init__(self, rated: tuple, derived, also: tuple = ()) -> None:
        self.rated, self.derived, self.counted = rated, derived, rated + also
        self.last: tuple[dict, float] | None = None

    def step(self, d: dict, now: float) -> dict | None:
        last, self.last = self.last, (d, now)
        if last is None:
            return None
        before, then = last
        elapsed = max(now - then, 1e-9)
        increase = {k: d[k] - before[k] if d[k] >= before[k] else d[k] for k in self.counted}
        rates: dict[str, Any] = {k: increase[k] / elapsed for k in self.rated}
        rates.update(self.derived(increase))
        rates["interval_s"] = elapsed
        return rates


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _stats_interval() -> Interval:
    return Interval(STATS_COUNTERS, lambda i: {"hit_ratio": _ratio(i["hits"], i["hits"] + i["misses"])})


def _tier_interval() -> Interval:
    from .tier.layout import COUNTERS

    def derived(i: dict) -> dict:  # the hit ratio as TierStats.hit_ratio's: lookups served from either tier
        mean_ns = _ratio(i["remote_ns"], i["remote_calls"])
        return {"hit_ratio": _ratio(i["local_hits"] + i["remote_hits"], i["local_hits"] + i["local_misses"]),
                "remote_mean_us": None if mean_ns is None else mean_ns / 1e3}

    return Interval(tuple(c for c in COUNTERS if c != "remote_ns"), derived, also=("remote_ns",))


def _figure(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _rows_with_rates(d: dict, rates: dict | None, rated: tuple, skip=()) -> list[list[str]]:
    """``name  total  rate`` rows of a refresh: a rate for each of ``rated`` once there are rates, and for each
    figure of the interval (the hit ratio) its value over the interval."""
    rows = []
    for k, v in d.items():
        if k in skip:
            continue
        if rates is None or k not in rates:
            rows.append([k, _figure(v), ""])
        elif k in rated:
            rows.append([k, _figure(v), f"{rates[k]:,.1f}/s"])
        else:
            r = rates[k]
            rows.append([k, _figure(v), f"{'-' if r is None else _figure(r)} in the last {rates['interval_s']:.3f} s"])
    return rows


def _watch_frame(args, data: dict, render) -> None:
    """One refresh of ``--watch``: a JSON line with ``--json`` (so the stream is JSON Lines), else the rendered text
    after a screen clear on a terminal, or after a timestamp line when the output is a file or a pipe."""
    if args.json:
        print(json.dumps({"time": time.time(), **data}, sort_keys=True))
    elif sys.stdout.isatty():
        print("\033[H\033[J", end="")
        render()
    else:
        print(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
        render()
    sys.stdout.flush()


_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
               "t": 2**40, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> int:
    """A size or a count as people write it: ``4096``, ``100_000``, ``1e6``, ``128MiB``, ``64k`` (binary: K, M, G,
    T with or without ``iB``), ``2GB`` (decimal: KB, MB, GB, TB). Refuses what is not a whole, non-negative number."""
    raw = text.strip().replace("_", "")
    number = raw.rstrip("bBkKmMgGtTi")
    unit = raw[len(number):].strip().lower()
    if unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown unit {unit!r} (use B, KiB, MiB, GiB, KB, MB, GB)")
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 1e6, 128MiB)") from None
    if not 0 <= value < float("inf") or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole, non-negative number")
    return int(value)


def parse_watch(text: str) -> float:
    """``--watch``'s refresh interval: a positive, finite number of seconds (``1``, ``0.5``, ``2e-1``). Refuses zero
    (a loop that never sleeps), negative numbers, nan, inf and what is not a number, before anything is opened."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 1, 0.5)") from None
    if not 0 < value < math.inf:  # nan fails both comparisons
        raise argparse.ArgumentTypeError(f"{text!r}: the refresh interval must be a positive, finite number of "
                                         "seconds")
    return value


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table(rows: list[list[str]]) -> str:
    """Columns padded to their widest cell; a row may have more cells than the header (a note at its end)."""
    widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(max(map(len, rows)))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _ago(seconds: float) -> str:
    """A duration as ``ls`` shows it: two units at most (``42s``, ``7m05s``, ``3h12m``, ``2d04h``)."""
    s = int(seconds)
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit}{s % size // subsize:02d}{sub}"
    return f"{s}s"


def _shown_attached(handles: int | None, pids: list[int]) -> str:
    """``ls``'s ATTACHED column: the processes holding the cache open, by pid (three at most, then how many more),
    or how many handles are open where none of their processes can be seen here (another user's, or another PID
    namespace's)."""
    if handles is None and not pids:
        return "?"
    if pids:
        shown = ",".join(map(str, pids[:3]))
        return shown + (f" +{len(pids) - 3}" if len(pids) > 3 else "")
    return "none" if not handles else _count(handles, "handle", "handles") + " (pids not visible)"


def cmd_ls(args) -> int:
    caches = []
    names = [n for n in segment_names()
             if not args.patterns or any(fnmatch.fnmatchcase(n, p) for p in args.patterns)]
    attachments = attached(names)  # before this command opens any of them
    for name in names:
        try:
            caches.append(_describe(args, name, attachments.get(name, (None, []))))
        except Exception as exc:  # an unexpected failure is listed, not fatal
            caches.append({"name": name, "state": "error", "error": str(exc)})
    if args.json:
        _print_json(caches)
        return 0
    if not caches:
        print("no shmcache caches on this host" + (" match" if args.patterns else ""))
        print(core.hot_path())
        return 0
    rows = [["NAME", "STATE", "SIZE", "ENTRIES", "FILL", "HIT RATIO", "OWNER", "CREATOR", "AGE", "LAST WRITE",
             "ATTACHED"]]
    for c in caches:
        if "size_bytes" not in c:
            rows.append([_shown(c["name"]), c["state"], "-", "-", "-", "-", "-", "-", "-", "-",
                         _shown_attached(c.get("attached_handles"), c.get("attached_pids", [])),
                         f"{c['state']}: {c.get('reason') or c.get('error')}"])
            continue
        last = "never" if c["last_write_s"] is None else _ago(c["last_write_s"]) + " ago"
        age = [c["owner"], str(c["creator_pid"]), _ago(c["age_s"]), last,
               _shown_attached(c["attached_handles"], c["attached_pids"])]
        size = f"{_human(c['occupied_bytes'])}/{_human(c['size_bytes'])}"
        if c["state"] != "ok":
            rows.append([_shown(c["name"]), c["state"], size, "-", "-", "-", *age])
            continue
        rows.append([_shown(c["name"]), c["state"], size, f"{c['entries']}/{c['max_entries']}",
                     f"{c['fill']:.0%}", f"{c['hit_ratio']:.1%}", *age])
    print(_table(rows))
    print(core.hot_path())
    return 0


def cmd_stats(args) -> int:
    interval = _stats_interval()
    with _open(args, args.name) as c:
        while True:
            stats = c.stats()
            d = stats.as_dict()
            rates = interval.step(d, time.monotonic()) if args.watch else None

            def render() -> None:
                print(_table(_rows_with_rates(d, rates, STATS_COUNTERS, skip=("kinds",))))
                if d["kinds"]:
                    print(_table([[f"kind {k!r}", f"{_count(v['entries'], 'entry', 'entries')}, "
                                                  f"{_count(v['retained_bytes'], 'byte', 'bytes')}"]
                                  for k, v in d["kinds"].items()]))
                print(core.hot_path())

            if args.prometheus:
                print(prometheus_text({c.name: stats}), end="")
                sys.stdout.flush()
            elif args.watch:
                _watch_frame(args, {**d, "rates": rates}, render)
            elif args.json:
                _print_json(d)
            else:
                render()
            if not args.watch:
                return 0
            time.sleep(args.watch)


def cmd_inspect(args) -> int:
    with _open(args, args.name) as c:
        g = parts(c).seg.geometry
        report = c.verify(deep=not args.shallow)
        s = c.stats()
        fill = parts(c).seg.header_words[H_FILL]  # read without the lock: a display figure, not a decision
        default_ttl_ns = parts(c).seg.header_words[H_DEFAULT_TTL]  # written once, at creation
    data = {
        "name": args.name,
        "layout": {"version": parts(c).seg.version, "total_nbytes": g.total_nbytes, "index_off": g.index_off,
                   "index_slots": g.index_slots, "index_in_force": parts(c).seg.mask + 1,
                   "entries_off": g.entries_off, "entry_slots": g.entry_slots,
                   "entry_slots_shown": parts(c).seg.shown[2], "arena_off": g.arena_off,
                   "arena_nbytes": g.arena_nbytes},
        "limits": {"max_entries": s.max_entries, "max_retained_bytes": s.max_retained_bytes,
                   "capacity_entries": s.capacity_entries, "capacity_bytes": s.capacity_bytes,
                   "default_ttl_s": default_ttl_ns / 1e9},
        "policy": {"name": s.policy, "ghost_slots": g.ghost_slots, "admitted": s.admitted,
                   "not_admitted": s.not_admitted, "small_entries": s.small_entries, "promoted": s.promoted,
                   "ghost_hits": s.ghost_hits, "window_target": s.window_target,
                   "filter_admitted": s.filter_admitted, "filter_refused": s.filter_refused},
        "unlocked": {"reads": s.unlocked_reads, "retries": s.read_retries, "fallbacks": s.read_fallbacks},
        "arena": _arena_report(s, fill),
        "verify": {"ok": report.ok, "problems": list(report.problems), "entries": report.entries},
    }
    if args.json:
        _print_json(data)
    else:
        for section, values in data.items():
            if isinstance(values, dict):
                print(f"{section}:")
                for k, v in values.items():
                    print(f"  {k}: {v}")
            else:
                print(f"{section}: {values}")
    return 0 if report.ok else 1


def _arena_report(s, fill: int) -> dict:
    """Arena use and fragmentation: free bytes are either contiguous (after the ring's head) or dead blocks inside
    the ring, which the allocator reclaims as its cleaner passes; fragmentation is the dead share of the free."""
    dead = max(0, fill - s.arena_used_bytes)
    contiguous = max(0, s.arena_bytes - fill)
    return {"bytes": s.arena_bytes, "used_bytes": s.arena_used_bytes, "held_entries": s.held_entries,
            "held_bytes": s.held_bytes, "utilization": s.retained_bytes / s.arena_bytes, "dead_bytes": dead,
            "contiguous_free_bytes": contiguous,
            "fragmentation": dead / (dead + contiguous) if dead + contiguous else 0.0}


def cmd_sweep(args) -> int:
    found = sweep(remove=args.yes, names=args.names or None, mode=args.mode, trust_owner=args.trust_owner)
    if args.json:
        _print_json(found)
        return 0
    orphans = [f for f in found if f["state"] == "orphan"]
    for f in found:
        size = _human(f["size_bytes"]) if "size_bytes" in f else "-"
        what = "removed" if f.get("removed") else f["state"]
        if "reason" in f:
            what += f": {f['reason']}"
        print(f"{_shown(f['name']):<40} {size:>10}  {what}")
    missing = sorted(set(args.names) - {f["cache"] for f in found})
    for name in missing:
        print(f"shmcache: no cache named {name!r} (and no TieredCache stats segment of it)", file=sys.stderr)
    if orphans and not args.yes:
        # The hint removes exactly what was listed: the caches named, never every orphan on the host.
        again = ["shmcache", "sweep", "--yes", *map(_shell_word, sorted({f["cache"] for f in orphans}))]
        if args.mode != 0o600:
            again += ["--mode", oct(args.mode)[2:]]
        for owner in args.trust_owner or ():
            again += ["--trust-owner", shlex.quote(str(owner))]
        print(f"\n{len(orphans)} orphan(s): nobody has them open. Remove them with `{' '.join(again)}`.")
    elif not found and not args.names:
        print("no shmcache caches on this host")
    return 1 if missing else 0


def cmd_rm(args) -> int:
    status = 0
    for name in args.names:
        try:
            in_use = segment_in_use(name)
            SharedCache.unlink_name(name)
            print(f"removed {_shown(name)}")
            if in_use:
                print(f"shmcache: warning: processes still have {name!r} open: they keep using the removed memory "
                      "until they close it, and a cache created under this name now is a new, separate one",
                      file=sys.stderr)
        except FileNotFoundError:
            print(f"shmcache: no cache named {name!r}", file=sys.stderr)
            status = 1
    return status


def cmd_clear(args) -> int:
    with _open(args, args.name) as c:
        removed = c.clear()
    if args.json:
        _print_json({"name": args.name, "removed": removed})
    else:
        entries = "entry" if removed == 1 else "entries"
        print(f"cleared {_shown(args.name)}: {removed} {entries} removed, counters reset")
    return 0


# ------------------------------------------------------------------------------------------- get, keys, dump
#
# Why their own locked reads: these commands look, they do not use the cache. A lookup through the API counts a hit
# or a miss, makes the entry the most recent and drops an expired one; the walks below (as entries.snapshot_locked,
# which iteration uses) write nothing to the segment: no count, no move in the LRU order, no expired entry dropped,
# and a damaged entry is reported, never repaired. Bytes are copied under the lock and checked after it.


class _Pickled:
    """A value of a pickle cache, left pickled: unpickling runs whatever code its writer put in it."""

    def __init__(self, body: bytes) -> None:
        self.body = body


class _Tensor:
    """A torch tensor value, read as the array it is stored as (no torch needed): dtype name, shape, C-order data."""

    def __init__(self, dtype: str, shape: tuple, data: bytes) -> None:
        self.dtype, self.shape, self.data = dtype, shape, data


class _Unreadable:
    """A value that checked out but could not be built here (a tensor nested in a value without torch, a class an
    unpickled value names that this process cannot import): why."""

    def __init__(self, error: str) -> None:
        self.error = error


def _space(args, c: SharedCache) -> int:
    """The space the command reads (``entries.py``): 0, the keys of no kind, or the kind ``--kind`` names, which must
    exist already (looking never makes a kind)."""
    if args.kind is None:
        return 0
    known = c.stats().kinds
    if args.kind not in known:
        raise LookupError(f"cache {args.name!r} has no kind {args.kind!r} "
                          f"(its kinds: {', '.join(map(repr, known)) or 'none'})")
    return c.kind(args.kind).number


def _other_kinds(args, c: SharedCache) -> str:
    """Without --kind, a word on the kinds holding entries that the command did not read; '' if there are none."""
    if args.kind is not None:
        return ""
    held = {k: v.entries for k, v in c.stats().kinds.items() if v.entries}
    if not held:
        return ""
    listed = ", ".join(f"{k!r} ({n} {'entry' if n == 1 else 'entries'})" for k, n in held.items())
    return f"also holds keys of kind{'s' if len(held) > 1 else ''} {listed}: --kind NAME reads one"


def _peek_locked(store, kb: bytes, fp: int):
    """(tag, body, checksum, ns left to live or 0) of the live entry of key bytes ``kb``, or None; writes nothing."""
    e = store.table.index.find(store.ix, store.rec, store.mm, store.base, store.mask, fp, kb)
    if e == EMPTY:
        return None
    x, now = store.exp[e], store.clock()
    if x and x <= now:
        return None  # expired: absent, as a lookup finds it (and left for a lookup or the sweep to drop)
    v0 = block.value_at(store.rec, store.base, e)
    vlen = store.rec.vlen[e]
    return store.mm[v0], store.mm[v0 + 1 : v0 + vlen], store.rec.check[e], max(x - now, 1) if x else 0


def _snapshot_locked(store, space: int, with_values: bool):
    """``entries.snapshot_locked`` (most recently used first, nothing written), with each entry's ns left to live
    (0: no expiry) read in the same hold of the lock."""
    found, damaged = entries.snapshot_locked(store, space, with_values)
    if not with_values:
        return found, damaged
    exp, now = store.exp, store.clock()
    return [(kb, tag, body, check, max(exp[e] - now, 1) if exp[e] else 0) for kb, tag, body, check, e in found], damaged


def _value(store, tag: int, body: bytes, unpickle: bool):
    """The value of a checked (tag, body): decoded as a get would, except that a pickled value stays pickled unless
    ``unpickle`` and a tensor is read as its array. Raises ValueError for bytes that do not decode (damage)."""
    if tag == TAG_PICKLE and store.serializer is PICKLE:  # (in a msgpack cache the tag is damage: decode_body says so)
        if not unpickle:
            return _Pickled(body)
        try:
            return PICKLE.decode(tag, body)
        except ValueError:
            raise
        except Exception as exc:  # the value's own failure (a class not importable here), not damage
            return _Unreadable(f"{type(exc).__name__}: {exc}")
    if tag == TAG_TENSOR:
        whole = memoryview(bytes((tag,)) + body)
        dtype, shape, data0 = array_layout(whole)
        tensors.check(body[0], dtype)
        name = "bfloat16" if body[0] == tensors.BFLOAT16 else dtype.name
        return _Tensor(name, shape, bytes(whole[data0:]))
    try:
        return decode_body(tag, body)
    except ValueError:
        raise
    except Exception as exc:  # a tensor inside a value, and torch not installed here
        return _Unreadable(f"{type(exc).__name__}: {exc}")


def _plain_json(v, depth: int = 0) -> bool:
    """Whether ``v`` is JSON as it is, and comes back from it equal: no tuple (it would come back a list), no bytes,
    no NaN or infinity, no dict key but str."""
    if v is None or type(v) in (bool, int, str):
        return True
    if type(v) is float:
        return math.isfinite(v)
    if depth > 64:
        return False
    if type(v) is list:
        return all(_plain_json(x, depth + 1) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _plain_json(x, depth + 1) for k, x in v.items())
    return False


def _b64(data) -> str:
    return base64.b64encode(data).decode("ascii")


def _value_fields(v, summary: bool) -> dict[str, Any]:
    """How a value appears in a JSON entry: ``value`` as JSON when it is plain JSON; else ``encoding`` says what
    ``value`` holds: ``base64`` (bytes), ``ndarray`` (the C-order data in base64, with ``dtype`` as numpy spells it
    and ``shape``), ``tensor`` (likewise, ``dtype`` a torch dtype's name), ``pickle`` (the pickle stream in base64),
    ``repr`` (Python's repr: a tuple, a float NaN, bytes nested in a list...), ``unreadable`` (with ``error``).
    ``summary``: binary payloads are replaced by their size, ``nbytes``."""
    import numpy as np

    def payload(fields: dict, data) -> dict:
        return {**fields, "nbytes": len(data)} if summary else {**fields, "value": _b64(data)}

    if isinstance(v, _Pickled):
        return payload({"encoding": "pickle"}, v.body)
    if isinstance(v, _Tensor):
        return payload({"encoding": "tensor", "dtype": v.dtype, "shape": list(v.shape)}, v.data)
    if isinstance(v, _Unreadable):
        return {"encoding": "unreadable", "error": v.error}
    if type(v) is bytes:
        return payload({"encoding": "base64"}, v)
    if type(v) is np.ndarray:
        return payload({"encoding": "ndarray", "dtype": v.dtype.str, "shape": list(v.shape)},
                       np.ascontiguousarray(v).tobytes())
    if _plain_json(v):
        return {"value": v}
    return {"encoding": "repr", "value": repr(v)}


def _key_fields(k) -> dict[str, Any]:
    """A key in a JSON entry: ``key`` as JSON when it is plain JSON, else its repr with ``key_encoding: "repr"``
    (what ``get --literal`` takes back)."""
    return {"key": k} if _plain_json(k) else {"key": repr(k), "key_encoding": "repr"}


def _entry(k, v, left_ns: int, summary: bool = False) -> dict[str, Any]:
    return {**_key_fields(k), **_value_fields(v, summary), "ttl_s": left_ns / 1e9 if left_ns else None}


def _reads_as_other(text: str) -> bool:
    """Whether ``text``, printed as it is, could be taken for a value of another type as this command prints it:
    it reads as JSON (``42``, ``true``, ``[1]``, ``"x"``) or as a Python literal (``None``, ``b'x'``, ``(1, 'a')``,
    ``'42'``)."""
    try:
        json.loads(text)
        return True
    except (ValueError, RecursionError):
        pass
    try:
        with warnings.catch_warnings():  # an invalid escape ('C:\d') is a SyntaxWarning, not ours to print
            warnings.simplefilter("ignore")
            ast.literal_eval(text)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _shown_key(k) -> str:
    """A key as ``keys`` lists it: a str key as it is, unless it is empty, has whitespace at an end, holds a
    character that cannot be printed, or reads as a literal (``42``, ``None``, ``(1, 2)``), so that it could be taken
    for another key; that one, and every key that is not a str, as its repr, which ``--literal`` reads back. So
    the str ``'42'`` and the int ``42`` never print alike."""
    if type(k) is str and k and k.isprintable() and k == k.strip() and not _reads_as_other(k):
        return k
    return repr(k)


def _matched_key(k) -> str:
    """What ``keys PATTERN`` matches: a str key as itself, any other key as printed."""
    return k if type(k) is str else repr(k)


# The str values that would print as a value of another sort does: get prints them as their repr.
_PLACEHOLDERS = ("array(", "<tensor of ", "<a value this process cannot build")


def _shown_str(value: str) -> str:
    """A str value as ``get`` prints it: as it is, unless it holds a character that cannot be printed (newline and
    tab apart) or could be taken for a value of another sort (``42``, ``null``, ``[1, 2]``, ``b'x'``): then as its
    repr, so that the str ``'42'`` and the int ``42`` never print alike (``--raw`` writes it as it is)."""
    plain = all(ch.isprintable() or ch in "\n\t" for ch in value)
    return value if plain and not value.startswith(_PLACEHOLDERS) and not _reads_as_other(value) else repr(value)


def _damaged_note(args, damaged: int) -> None:
    print(f"shmcache: {damaged} damaged {'entry' if damaged == 1 else 'entries'} of cache {args.name!r} left out "
          f"(`shmcache inspect {_shell_word(args.name)}` checks the cache)", file=sys.stderr)


def _key_arg(text: str, literal: bool):
    """A KEY argument: the str itself, or with ``--literal`` the Python literal it spells (as ``keys`` prints a
    key that is not a plain str: ``42``, ``'42'``, ``('page', 3)``, ``b'raw'``)."""
    if not literal:
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"--literal: {text!r} is not a Python literal ({exc})") from None


def cmd_get(args) -> int:
    key = _key_arg(args.key, args.literal)
    with _open(args, args.name) as c:
        space = _space(args, c)
        kb = KIND_PREFIXES[space] + encode_key(key) if space else encode_key(key)
        p = parts(c)
        found = p.guard.run(_peek_locked, p.store, kb, fingerprint(kb))
        if found is None:
            note = _other_kinds(args, c)
            where = f"kind {args.kind!r} of cache {args.name!r}" if args.kind else f"cache {args.name!r}"
            print(f"shmcache: no key {key!r} in {where}" + (f" (it {note})" if note else ""), file=sys.stderr)
            return 1
        tag, body, check, left = found
        if body_checksum(tag, body) != check:
            _damaged_note(args, 1)
            return 1
        try:
            value = _value(p.store, tag, body, args.unpickle)
        except ValueError:
            _damaged_note(args, 1)
            return 1
    return _print_value(args, key, value, left)


def _print_value(args, key, value, left_ns: int) -> int:
    import numpy as np

    if args.json:
        _print_json(_entry(key, value, left_ns))
        return 0
    if isinstance(value, _Pickled) and not args.raw:
        print(f"shmcache: the value of {key!r} is pickled ({len(value.body)} bytes): --unpickle loads it, which runs "
              "whatever code its writer put in it (only for a cache whose every writer you trust); --raw writes "
              "the pickle stream, --json gives it in base64", file=sys.stderr)
        return 1
    if args.raw:
        if isinstance(value, (_Pickled, _Tensor)):
            data = value.body if isinstance(value, _Pickled) else value.data
        elif type(value) is bytes:
            data = value
        elif type(value) is str:
            data = value.encode("utf-8", "surrogateescape")
        elif type(value) is np.ndarray:
            data = np.ascontiguousarray(value).tobytes()
        else:
            print(f"shmcache: --raw writes a bytes, str or array value as it is; the value of {key!r} is a "
                  f"{type(value).__name__} (leave --raw out, or use --json)", file=sys.stderr)
            return 1
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    if type(value) is str:
        print(_shown_str(value))
    elif isinstance(value, _Tensor):
        print(f"<tensor of {value.dtype}, shape {value.shape}, {len(value.data)} bytes: --raw writes its data, "
              "--json gives it in base64>")
    elif isinstance(value, _Unreadable):
        print(f"<a value this process cannot build: {value.error}>")
    elif type(value) is not bytes and _plain_json(value):
        print(json.dumps(value))
    else:
        print(repr(value))
    return 0


def cmd_keys(args) -> int:
    with _open(args, args.name) as c:
        space = _space(args, c)
        p = parts(c)
        raw, damaged = p.guard.run(_snapshot_locked, p.store, space, False)
        note = _other_kinds(args, c)
    keys = []
    for kb in raw:
        try:
            keys.append(decode_key(kb))
        except ValueError:
            damaged += 1
    if args.pattern is not None:
        keys = [k for k in keys if fnmatch.fnmatchcase(_matched_key(k), args.pattern)]
    if args.json:
        _print_json([_key_fields(k) for k in keys])
    else:
        for k in keys:
            print(_shown_key(k))
    return _listing_done(args, note, damaged)


def _listing_done(args, note: str | None, damaged: int) -> int:
    """The end of a listing (keys, dump): what other kinds hold, and the damaged entries left out (exit code 1)."""
    if note:
        print(f"shmcache: cache {args.name!r} {note}", file=sys.stderr)
    if damaged:
        _damaged_note(args, damaged)
    return 1 if damaged else 0


def cmd_dump(args) -> int:
    with _open(args, args.name) as c:
        space = _space(args, c)
        p = parts(c)
        found, damaged = p.guard.run(_snapshot_locked, p.store, space, True)
        note = _other_kinds(args, c)
        for kb, tag, body, check, left in found:
            try:
                if body_checksum(tag, body) != check:
                    raise ValueError("checksum")
                line = _entry(decode_key(kb), _value(p.store, tag, body, args.unpickle), left, args.summary)
            except ValueError:
                damaged += 1
                continue
            sys.stdout.write(json.dumps(line) + "\n")  # key first, the value's fields, the TTL last
    sys.stdout.flush()
    return _listing_done(args, note, damaged)


# ------------------------------------------------------------------------------------------- set, del
#
# Why str by default: guessing the type from the text (redis-cli stores every value as bytes, so it never has to)
# would make `set c k 42` store an int and `set c k 007` a str; a value is a str unless --type says otherwise.

VALUE_TYPES = ("str", "int", "float", "json", "literal", "bytes")


def _value_arg(args):
    """The VALUE of ``set`` (or stdin's bytes, with ``--stdin``) as ``--type`` reads it."""
    if args.stdin == (args.value is not None):
        raise ValueError("give VALUE or --stdin, not both" if args.stdin else "give VALUE, or --stdin to read it")
    data = sys.stdin.buffer.read() if args.stdin else args.value.encode("utf-8", "surrogateescape")
    if args.type == "bytes":
        return data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the value is not UTF-8 text: --type bytes stores it as bytes") from None
    try:
        if args.type == "int":
            return int(text)
        if args.type == "float":
            return float(text)
        if args.type == "json":
            return json.loads(text, parse_constant=_refuse_constant)
        if args.type == "literal":
            return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"--type {args.type}: {_clip(text)!r} is not {_A_TYPE[args.type]} ({exc})") from None
    return text


_A_TYPE = {"int": "an integer", "float": "a number", "json": "JSON", "literal": "a Python literal"}


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (--type float or literal stores it)")


def _clip(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def parse_ttl(text: str) -> float:
    """``--ttl``: seconds from now, a finite number from 0 (0: never expires, whatever the cache's default)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 60, 0.5)") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: a time to live is a finite number of seconds from 0 "
                                         "(0: never expires)")
    return value


def _expiry_note(ttl: float | None, default_ttl_ns: int) -> tuple[float | None, str]:
    """The seconds an entry stored with ``ttl`` (None: the cache's default) lives, and how ``set`` says it."""
    if ttl is None and default_ttl_ns:
        return default_ttl_ns / 1e9, f"expires in {default_ttl_ns / 1e9:g} s, the cache's default"
    if ttl:
        return ttl, f"expires in {ttl:g} s"
    return None, "never expires"


def cmd_set(args) -> int:
    key = _key_arg(args.key, args.literal)
    value = _value_arg(args)
    with _open(args, args.name) as c:
        target = c if args.kind is None else c.kind(args.kind)  # a kind set to is made, as the API makes it
        store = target.add if args.nx else target.replace if args.xx else target.put
        stored = store(key, value, ttl=args.ttl)
        default_ttl_ns = parts(c).seg.header_words[H_DEFAULT_TTL]  # written at creation
        policy = c.stats().policy if not stored else None
    ttl_s, expiry = _expiry_note(args.ttl, default_ttl_ns)
    where = f"kind {args.kind!r} of cache {args.name!r}" if args.kind else f"cache {args.name!r}"
    why = None
    if not stored:
        why = ("the key is present (--nx)" if args.nx else "the key is absent (--xx)" if args.xx else
               f"the cache is full and its policy ({policy!r}) admits no new entry")
    if args.json:
        _print_json({"name": args.name, "kind": args.kind, **_key_fields(key), "value_type": type(value).__name__,
                     "stored": stored, "ttl_s": ttl_s if stored else None, **({"reason": why} if why else {})})
    elif stored:
        print(f"stored {key!r} in {where} ({type(value).__name__}; {expiry})")
    if not stored:
        if not args.json:
            print(f"shmcache: {key!r} not stored in {where}: {why}", file=sys.stderr)
        return 1
    return 0


def cmd_del(args) -> int:
    keys = [_key_arg(text, args.literal) for text in args.keys]
    with _open(args, args.name) as c:
        if args.kind is not None:
            _space(args, c)  # a kind that does not exist is an error, never made
        target = c if args.kind is None else c.kind(args.kind)
        deleted = [target.delete(k) for k in keys]
    where = f"kind {args.kind!r} of cache {args.name!r}" if args.kind else f"cache {args.name!r}"
    if args.json:
        _print_json({"name": args.name, "kind": args.kind, "deleted": sum(deleted),
                     "keys": [{**_key_fields(k), "deleted": d} for k, d in zip(keys, deleted)]})
    else:
        for k, d in zip(keys, deleted):
            if d:
                print(f"deleted {k!r} from {where}")
            else:
                print(f"shmcache: no key {k!r} in {where}", file=sys.stderr)
    return 0 if all(deleted) else 1


def cmd_resize(args) -> int:
    with _open(args, args.name) as c:
        before = c.capacity_bytes
        c.resize(capacity_bytes=args.capacity_bytes, max_entries=args.max_entries)
        s = c.stats()
    if args.json:
        _print_json({"capacity_bytes": s.capacity_bytes, "max_capacity_bytes": s.max_capacity_bytes,
                     "max_entries": s.max_entries, "entries": s.entries, "retained_bytes": s.retained_bytes,
                     "resizes": s.resizes})
    else:
        print(f"{args.name}: capacity {_human(before)} -> {_human(s.capacity_bytes)} (at most "
              f"{_human(s.max_capacity_bytes)}), max_entries={s.max_entries} ({s.entries} entries, "
              f"{_human(s.retained_bytes)} retained)")
    return 0


def cmd_set_limits(args) -> int:
    with _open(args, args.name) as c:
        old = c.limits()
        new = CacheLimits(
            max_entries=old.max_entries if args.max_entries is None else args.max_entries,
            max_retained_bytes=old.max_retained_bytes if args.max_retained_bytes is None else args.max_retained_bytes)
        c.set_limits(new)
        s = c.stats()
    if args.json:
        _print_json({"max_entries": new.max_entries, "max_retained_bytes": new.max_retained_bytes,
                     "entries": s.entries, "retained_bytes": s.retained_bytes})
    else:
        print(f"{args.name}: max_entries={new.max_entries} max_retained_bytes={new.max_retained_bytes} "
              f"({s.entries} entries, {s.retained_bytes} bytes retained)")
    return 0


def _open_to_use(args, name: str) -> SharedCache:
    """Attach to an existing cache to use it for a while (snapshot, restore): ``_open``'s trust and its patience for
    a creation under way, and a lock timeout of a program's rather than a look's."""
    kwargs = dict(create=False, mode=args.mode, trust_owner=args.trust_owner, lock_timeout=args.lock_timeout,
                  attach_timeout=INSPECT_TIMEOUT_S)
    try:
        return SharedCache(name, **kwargs)
    except SerializerMismatch as exc:  # values are copied as they are stored, never decoded
        return SharedCache(name, serializer=exc.found, **kwargs)


def cmd_snapshot(args) -> int:
    with _open_to_use(args, args.name) as c:
        done = c.snapshot(args.path)
    if args.json:
        _print_json({"name": args.name, "path": done.path, "entries": done.entries, "nbytes": done.nbytes,
                     "seconds": round(done.seconds, 6)})
    else:
        print(f"snapshot of {_shown(args.name)} written to {done.path}: {_count(done.entries, 'entry', 'entries')}, "
              f"{_human(done.nbytes)} in {done.seconds:.3f} s")
    return 0


def cmd_restore(args) -> int:
    with _open_to_use(args, args.name) as c:
        r = c.restore(args.path)
    if args.json:
        _print_json({"name": args.name, "path": args.path, "restored": r.restored, "damaged": r.damaged,
                     "expired": r.expired, "no_room": r.no_room, "complete": r.complete, "nbytes": r.nbytes,
                     "seconds": round(r.seconds, 6)})
    else:
        print(f"restored {_count(r.restored, 'entry', 'entries')} into {_shown(args.name)} from {args.path} "
              f"({_human(r.nbytes)} in {r.seconds:.3f} s): {r.expired} expired, {r.no_room} beyond the limits, "
              f"{r.damaged} damaged{'' if r.complete else '; the file is incomplete (cut short or damaged)'}")
    return 0


def _namespace_state(args, cache: str, namespace: str, cache_exists: bool) -> dict[str, Any] | None:
    """One row of ``tier``'s listing: ``state`` is ``in use`` (``handles``: the TieredCache handles of the host that
    count in it now), ``idle`` (none has it open: the counts are those of processes gone) or ``skipped`` (not opened:
    ``reason``); None if it went meanwhile."""
    from .tier.stats import handles

    row: dict[str, Any] = {"cache": cache, "namespace": namespace, "cache_exists": cache_exists}
    try:
        n = handles(cache, namespace, Trust.of(args.mode, args.trust_owner))
    except FileNotFoundError:
        return None
    except OwnershipError as exc:
        return {**row, "state": "skipped", "reason": exc.reason}
    return {**row, "state": "in use" if n else "idle", "handles": n}


def _shown_state(f: dict) -> str:
    if f["state"] == "skipped":
        return f"skipped: {f['reason']}"
    state = f"in use ({f['handles']} TieredCache handle{'s' if f['handles'] != 1 else ''})" if f["handles"] else \
        "idle: no TieredCache has it open"
    if f["cache_exists"]:
        return state
    return "cache removed: `shmcache sweep` cleans up" if not f["handles"] else f"cache removed; {state}"


def cmd_tier(args) -> int:
    from .tier.stats import segments
    from .tier.tiered import host_stats

    caches = set(segment_names())
    if args.name is None:  # list the namespaces, with their state, saying which have lost their cache
        found = [f for c, ns in segments() if (f := _namespace_state(args, c, ns, c in caches)) is not None]
        if args.json:
            _print_json(found)
        elif not found:
            print("no TieredCache namespaces on this host")
        else:
            print(_table([["CACHE", "NAMESPACE", "STATE"]] + [
                [_shown(f["cache"]), _shown(f["namespace"]), _shown_state(f)] for f in found]))
        return 0
    if args.name not in caches:
        print(f"shmcache: no cache named {args.name!r}", file=sys.stderr)
        return 1
    spaces = [ns for c, ns in segments() if c == args.name]
    if args.namespace is None:
        if len(spaces) != 1:
            print(f"shmcache: cache {args.name!r} fronts {len(spaces)} TieredCache namespaces "
                  f"({', '.join(spaces) or 'none'})" + (": name one" if spaces else ""), file=sys.stderr)
            return 1
        args.namespace = spaces[0]
    elif args.namespace not in spaces:
        print(f"shmcache: cache {args.name!r} fronts no namespace {args.namespace!r} "
              f"(it fronts: {', '.join(spaces) or 'none'})", file=sys.stderr)
        return 1
    interval = _tier_interval()
    while True:
        stats = host_stats(args.name, args.namespace, mode=args.mode, trust_owner=args.trust_owner,
                           timeout=INSPECT_TIMEOUT_S)
        d = stats.as_dict()
        rates = interval.step(d, time.monotonic()) if args.watch else None

        def render() -> None:
            shown = {k: v for k, v in d.items() if k != "remote_ns"}
            shown["remote_mean_us"] = d["remote_ns"] / d["remote_calls"] / 1e3 if d["remote_calls"] else 0.0
            print(_table(_rows_with_rates(shown, rates, interval.rated)))

        if args.prometheus:
            print(prometheus_text({}, tiers={(args.name, args.namespace): stats}), end="")
            sys.stdout.flush()
        elif args.watch:
            _watch_frame(args, {**d, "rates": rates}, render)
        elif args.json:
            _print_json(d)
        else:
            render()
        if not args.watch:
            return 0
        time.sleep(args.watch)


def cmd_bench(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shmcache", description="Inspect and manage the shmcache caches of this host.")
    p.add_argument("--version", action="version", version=f"shmcache {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn, help: str, json_flag: bool = True, trust: bool = True,
            prometheus: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(fn=fn)
        out = sp.add_mutually_exclusive_group() if prometheus else sp
        if json_flag:
            out.add_argument("--json", action="store_true",
                             help="print one JSON document (with --watch: one per refresh, as JSON Lines)"
                             if prometheus else "print one JSON document")
        if prometheus:
            out.add_argument("--prometheus", action="store_true", help="print the Prometheus text exposition instead")
        if trust:  # the SharedCache options that say which segments may be opened (see its docstring)
            sp.add_argument("--mode", type=_octal, default=0o600,
                            help="the broadest permissions a segment may have, in octal (default 600)")
            sp.add_argument("--trust-owner", action="append", type=_user_id, metavar="USER",
                            help="also open segments owned by USER (a name or uid; may be repeated)")
        return sp

    sp = add("ls", cmd_ls, "list every shmcache cache on this host (or those whose names match)")
    sp.add_argument("patterns", nargs="*", metavar="PATTERN",
                    help="list only the caches whose names match one of these shell patterns ('web-*'); "
                    "the others are not opened")
    sp = add("stats", cmd_stats, "print a cache's global counters", prometheus=True)
    sp.add_argument("name")
    sp.add_argument("--watch", type=parse_watch, metavar="SECONDS", help="refresh every SECONDS until interrupted")
    sp = add("inspect", cmd_inspect, "layout, limits, arena fill and an integrity check of a cache")
    sp.add_argument("name")
    sp.add_argument("--shallow", action="store_true", help="skip re-hashing every stored key and value")
    sp = add("sweep", cmd_sweep, "list caches that no process has open (left by crashed processes); --yes removes them")
    sp.add_argument("names", nargs="*", metavar="NAME", help="only these caches (default: every one)")
    sp.add_argument("--yes", action="store_true", help="remove the orphans found")
    sp = add("rm", cmd_rm, "remove caches (processes that have them open keep their mapping)", json_flag=False,
             trust=False)
    sp.add_argument("names", nargs="+", metavar="NAME")
    sp = add("clear", cmd_clear, "drop every entry of a cache (of every kind, but those open views pin) and reset "
                                 "its counters; says how many went")
    sp.add_argument("name")
    sp = add("get", cmd_get, "print the value of a key, as it is (no hit or miss counted, no LRU move); exit "
                             "code 1 if the key is absent")
    sp.add_argument("name")
    sp.add_argument("key", help="a str key, or with --literal a Python literal: 42, (1, 'a'), b'raw'")
    sp.add_argument("--literal", action="store_true",
                    help="read KEY as a Python literal (as `keys` prints a key that is not a str)")
    sp.add_argument("--raw", action="store_true", help="write a bytes, str or array value to stdout as its bytes")
    sp.add_argument("--kind", metavar="KIND", help="look among the keys of this key kind")
    sp.add_argument("--unpickle", action="store_true",
                    help="load a pickled value (pickle caches: runs code its writer chose; trust every writer)")
    sp = add("set", cmd_set, "store a value under a key (a str unless --type says otherwise); exit code 1 if it "
                             "was not stored (--nx, --xx, or a full cache of policy keep)")
    sp.add_argument("name")
    sp.add_argument("key", help="a str key, or with --literal a Python literal: 42, (1, 'a'), b'raw'")
    sp.add_argument("value", nargs="?", help="the value, read as --type says (default: the str as it is)")
    sp.add_argument("--type", choices=VALUE_TYPES, default="str",
                    help="how VALUE is read: str (as it is, the default), int, float, json (an object, a list, a "
                         "number, true, false, null...), literal (a Python literal: a tuple, bytes...) or bytes "
                         "(its UTF-8 bytes; with --stdin, stdin's bytes as they are)")
    sp.add_argument("--stdin", action="store_true", help="read the value from stdin (all of it, a last newline "
                                                         "included) instead of VALUE")
    sp.add_argument("--ttl", type=parse_ttl, metavar="SECONDS",
                    help="seconds until the entry expires (0: never; default: the cache's default time to live)")
    once = sp.add_mutually_exclusive_group()
    once.add_argument("--nx", action="store_true", help="store only if the key is absent (SharedCache.add)")
    once.add_argument("--xx", action="store_true", help="store only if the key is present (SharedCache.replace)")
    sp.add_argument("--literal", action="store_true", help="read KEY as a Python literal (as `keys` prints a key "
                                                           "that is not a plain str)")
    sp.add_argument("--kind", metavar="KIND", help="store under this key kind (made if it does not exist)")
    sp = add("del", cmd_del, "delete keys; exit code 1 if any of them was absent")
    sp.add_argument("name")
    sp.add_argument("keys", nargs="+", metavar="KEY", help="str keys, or with --literal Python literals")
    sp.add_argument("--literal", action="store_true", help="read each KEY as a Python literal")
    sp.add_argument("--kind", metavar="KIND", help="delete keys of this key kind")
    sp = add("keys", cmd_keys, "list a cache's keys, most recently used first (no lookup counted, no LRU move)")
    sp.add_argument("name")
    sp.add_argument("pattern", nargs="?", help="only keys matching this glob (*, ?, [abc]), matched against each key "
                                               "as printed")
    sp.add_argument("--kind", metavar="KIND", help="list the keys of this key kind")
    sp = add("dump", cmd_dump, "every entry as JSON Lines: key, value, seconds left to live, most recently used "
                               "first (no lookup counted, no LRU move)", json_flag=False)
    sp.add_argument("name")
    sp.add_argument("--kind", metavar="KIND", help="dump the entries of this key kind")
    sp.add_argument("--summary", action="store_true",
                    help="give the size of bytes, array, tensor and pickled values instead of their data")
    sp.add_argument("--unpickle", action="store_true",
                    help="load pickled values (pickle caches: runs code their writers chose; trust every writer)")
    sp = add("resize", cmd_resize, "change a cache's capacity (and entry limit) while every process serves: a "
                                   "smaller one evicts as its policy chooses and gives the memory back")
    sp.add_argument("name")
    sp.add_argument("capacity_bytes", type=parse_size, metavar="SIZE", help="e.g. 1GiB, 268435456")
    sp.add_argument("--max-entries", type=parse_size, metavar="N", help="the entry limit (default: as it is)")
    sp = add("set-limits", cmd_set_limits, "change a cache's limits (evicts at once to meet them)")
    sp.add_argument("name")
    sp.add_argument("--max-entries", type=parse_size, metavar="N", help="e.g. 100000, 1e5")
    sp.add_argument("--max-retained-bytes", type=parse_size, metavar="SIZE", help="e.g. 134217728, 128MiB, 1e8")
    for command, run, what in (
            ("snapshot", cmd_snapshot, "write every live entry of a cache to a file, hottest first, while it serves "
                                       "(the file is replaced atomically)"),
            ("restore", cmd_restore, "store the entries of a snapshot file in an existing cache: the hottest that "
                                     "fit its limits, expired ones skipped")):
        sp = add(command, run, what)
        sp.add_argument("name")
        sp.add_argument("path")
        sp.add_argument("--lock-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for the cache's lock each time (default 10)")
    sp = add("tier", cmd_tier, "a TieredCache namespace's counts on this host: local and remote hits, misses, "
                               "errors, remote latency percentiles (no NAME: list the namespaces)", prometheus=True)
    sp.add_argument("name", nargs="?", help="the local cache")
    sp.add_argument("namespace", nargs="?", help="the namespace (may be left out if the cache fronts only one)")
    sp.add_argument("--watch", type=parse_watch, metavar="SECONDS", help="refresh every SECONDS until interrupted")
    sp = add("bench", cmd_bench, "demo: worker processes share one cache under a skewed workload", trust=False)
    sp.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    sp.add_argument("--seconds", type=float, default=10.0, help="how long to run (default 10)")
    sp.add_argument("--keys", type=int, default=20_000, help="distinct keys in the workload (default 20000)")
    sp.add_argument("--capacity-mib", type=float, default=16.0, help="cache capacity in MiB (default 16)")
    sp.add_argument("--value-bytes", type=int, default=1024, help="bytes per cached value (default 1024)")
    sp.add_argument("--compute-us", type=float, default=200.0,
                    help="cost of the simulated transform on a miss, in microseconds (default 200)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--policy", choices=POLICY_NAMES, default=DEFAULT_POLICY,
                    help=f"the shared cache's eviction policy (default {DEFAULT_POLICY})")
    sp.add_argument("--plot", metavar="FILE", help="also draw the run into a PNG (needs matplotlib)")
    return p


def _octal(text: str) -> int:
    try:
        return int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an octal mode: {text!r}") from None


def _user_id(text: str):
    return int(text) if text.isdigit() else text


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except BrokenPipeError:
        # The reader went away (``shmcache ls --json | head``): exit quietly, as a command killed by SIGPIPE does.
        # Python flushes stdout again at exit, which would raise once more: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except FileNotFoundError as exc:
        print(f"shmcache: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"shmcache: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
