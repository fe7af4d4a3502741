"""SIGKILL a process writing a snapshot at a random instant, again and again, and restore what the path holds after
each kill: the previous file, whole, or the new one, whole; never a mixture, never a damaged record.

Each round rewrites every entry of the cache with the round's number (a value is ``(round, key, digest of both)``,
so a restored value says which file it came from and checks itself), then starts a process that opens the cache
and writes one snapshot to the same path, and SIGKILLs it after a random delay of up to one and a half times what
a snapshot takes (so most kills land while it writes, some after it finished). The file at the path is then
restored into a scratch cache: it must restore completely, with no damaged record, every value must check, and
every value must be of one round, either the round before (the kill came before the new file replaced the old)
or this one (it came after).

Reading the summary line:

    snapshot_kills: kills=K previous=P new=N damaged=0 mixed=0 wrong=0 incomplete=0 leftovers=L
                    snapshot_s=S restore_s=R entries=E verify=ok

kills         snapshot writers SIGKILLed (one per round)
previous      kills after which the path held the previous round's file (killed before its replacement)
new           kills after which it held this round's (the writer had finished)
damaged       records the restores found damaged; must be 0
mixed         restores holding values of more than one round, or of a round that is neither; must be 0
wrong         restored values whose key or digest does not check; must be 0
incomplete    restores that did not restore every record of the file; must be 0
leftovers     temporary files of killed writers in the directory at the end, after one last snapshot removed the
              ones older than snapshot.STALE_TMP_S (killed writers' files younger than that stay; at most kills)
snapshot_s    median seconds of a snapshot of the cache, measured before the kills; restore_s: median of a restore
verify        ok when every "must be" holds

The exit status is 1 when any "must be" above does not hold.

    python -m stress.snapshot_kills --kills 100 --entries 20000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time

from shmcache import SharedCache

CTX = mp.get_context("spawn")  # the writer is a process of its own, as a trainer's snapshotting rank would be


def _value(r: int, key: int) -> tuple:
    return (r, key, hashlib.blake2b(f"{r}:{key}".encode(), digest_size=16).hexdigest())


def _snapshot_once(name: str, path: str, ready) -> None:
    with SharedCache(name, create=False) as c:
        ready.set()
        c.snapshot(path)


def _fill(cache: SharedCache, r: int, entries: int) -> None:
    for i in range(0, entries, 2048):
        cache.put_many({k: _value(r, k) for k in range(i, min(entries, i + 2048))})


def run(kills: int, entries: int, seed: int, directory: str) -> dict:
    rng = random.Random(seed)
    tag = f"{os.getpid()}-{rng.randrange(1 << 30):x}"
    name, scratch = f"stress-snapkill-{tag}", f"stress-snapkill-scratch-{tag}"
    path = os.path.join(directory, "cache.snap")
    out = {"kills": 0, "previous": 0, "new": 0, "damaged": 0, "mixed": 0, "wrong": 0, "incomplete": 0}
    size = dict(capacity_bytes=max(2**20, entries * 256), max_entries=entries)
    with SharedCache(name, create=True, **size) as cache, SharedCache(scratch, create=True, **size) as restored:
        try:
            _fill(cache, 0, entries)
            snaps, restores = [], []
            for _ in range(3):
                t = time.perf_counter()
                cache.snapshot(path)
                snaps.append(time.perf_counter() - t)
                restored.clear()
                t = time.perf_counter()
                restored.restore(path)
                restores.append(time.perf_counter() - t)
            one = statistics.median(snaps)
            out["snapshot_s"], out["restore_s"] = one, statistics.median(restores)
            before = 0  # the round of the file at the path
            for r in range(1, kills + 1):
                _fill(cache, r, entries)
                ready = CTX.Event()
                p = CTX.Process(target=_snapshot_once, args=(name, path, ready))
                p.start()
                # The delay counts from the writer's attach (its interpreter's start and imports come before).
                if not ready.wait(60):
                    raise RuntimeError("the snapshot writer did not start")
                time.sleep(rng.random() * 1.5 * one)
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
                p.join(30)
                if p.is_alive():
                    p.kill()
                    p.join(5)
                out["kills"] += 1
                restored.clear()
                result = restored.restore(path)
                out["damaged"] += result.damaged
                out["incomplete"] += not result.complete or result.restored != entries
                rounds = set()
                for k, v in restored.items():
                    if not (isinstance(v, tuple) and len(v) == 3 and v[1] == k and v == _value(v[0], k)):
                        out["wrong"] += 1
                    else:
                        rounds.add(v[0])
                if rounds == {before}:
                    out["previous"] += 1
                elif rounds == {r}:
                    out["new"] += 1
                    before = r
                else:
                    out["mixed"] += 1
            cache.snapshot(path)  # the last one sweeps what the killed writers left, once stale
            out["leftovers"] = len([f for f in os.listdir(directory) if f.endswith(".tmp")])
            out["entries"] = entries
        finally:
            cache.unlink()
            restored.unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stress.snapshot_kills", description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--entries", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="the summary as one JSON object")
    args = p.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="shmcache-snapkills-")
    try:
        out = run(args.kills, args.entries, args.seed, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ok = not (out["damaged"] or out["mixed"] or out["wrong"] or out["incomplete"])
    if args.json:
        print(json.dumps({**out, "verify": "ok" if ok else "FAILED"}))
        return 0 if ok else 1
    print(f"snapshot_kills: kills={out['kills']} previous={out['previous']} new={out['new']} "
          f"damaged={out['damaged']} mixed={out['mixed']} wrong={out['wrong']} incomplete={out['incomplete']} "
          f"leftovers={out['leftovers']} snapshot_s={out['snapshot_s']:.3f} restore_s={out['restore_s']:.3f} "
          f"entries={out['entries']} verify={'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
