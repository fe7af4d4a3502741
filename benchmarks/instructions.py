"""``python -m benchmarks.instructions``: CPU instructions per operation, counted by valgrind, for shmcache's hot
paths and lmdb's beside them.

Timings on a shared VM swing by 2x from one second to the next; instruction counts do not. For each case this runs one
child under ``valgrind --tool=callgrind`` twice, with N and with N + DELTA operations of the same kind, and prints
(count(N + DELTA) - count(N)) / DELTA: the start-up and imports cancel out. What grows with N besides the operations
(making the keys, the driving loop) is the ``loop`` case, which is subtracted from the others. Instructions are not time
(a cache miss costs no instruction), so this complements the timed harness (``benchmarks.run``) and is what to compare
before and after a change of the hot path. Needs valgrind (Debian's ``valgrind``); lmdb rows need the bench extra (``pip
install -e ".[bench]"``).

    python -m benchmarks.instructions               # every case
    python -m benchmarks.instructions --cases get,lmdb-get
    python -m benchmarks.instructions --cases get,core-get --wall   # also wall time per operation (no valgrind)

The ``core-*`` cases run the compiled critical section (``shmcache._core``, built by ``python setup.py build_ext
--inplace``) as SharedCache will call it: encode and hash before, the section in C, checksum and decode after
(``_CoreOps``). The policy decides which section a get runs: under lru the locked one (a hit relinks the entry),
under s3fifo and keep the one without the lock (x86-64); ``--policy lru,s3fifo`` puts the two side by side.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time

from .measure import make_key, small_value

RESIDENT = 3000  # keys put before the measured loop; gets draw from them
CASES = {
    "get": "get hit, ~100-byte dict, random resident key",
    "get-miss": "get miss",
    "kind-get": "get hit through a KindView (a key kind's namespace)",
    "tier-get": "TieredCache get, local hit (its copies live in a kind)",
    "put-new": "put of a new key (no eviction)",
    "put-update": "put of a resident key, value of the same size",
    "put-evict": "put of a new key into a full cache (evicts one entry)",
    "get-many": "per key of get_many of 64 resident keys (compare with get)",
    "put-many": "per key of put_many of 64 resident keys (compare with put-update)",
    "view": "with cache.view(key): of a resident 1 KB array this handle viewed before (pin, build, unpin)",
    "get-150k": "get hit of a 150 KB int64 array (copy, checksum, array), one of 128 resident keys",
    "view-150k": "with cache.view(key): of a 150 KB int64 array this handle viewed before, as view (compare: get-150k)",
    "view-as": "with cache.view(key) as arr: as view, the array bound to a name (its end counts the caller's names)",
    "core-get": "get hit through shmcache._core (encode, then Core.get_value: C section, checksum, decode)",
    "core-put-new": "put of a new key through shmcache._core (no eviction)",
    "core-put-update": "put of a resident key through shmcache._core, value of the same size",
    "core-put-evict": "put of a new key into a full cache through shmcache._core (evicts one entry)",
    "core-get-raw": "Core.get_value alone, called with arguments made before the loop (nothing encoded)",
    "core-put-raw": "Core.put alone (a resident key, same size), called with the entry encoded before the loop",
    "lmdb-get": "lmdb: read transaction, get, pickle.loads",
    "lmdb-put": "lmdb: pickle.dumps, write transaction, put",
    "loop": "the set-up per operation and the driving loop alone (subtracted from the rows above)",
}


class _CoreOps:
    """get and put through the compiled section, with the work SharedCache does around it (str keys only)."""

    def __init__(self, cache) -> None:
        import xxhash

        from shmcache import core
        from shmcache.arena import block_nbytes
        from shmcache.codec import encode_parts

        self.core = core.bind(cache._seg, 10.0)
        if self.core is None:
            raise RuntimeError(f"shmcache._core is not available ({core.PATH}); python setup.py build_ext --inplace")
        # As SharedCache binds its own (core.path): under the policies that move nothing on a hit, a reader slot,
        # so that gets read without the lock; under lru none, and every get takes it.
        self.reader = None
        if cache.policy != "lru":
            from shmcache.readers import Reader

            self.reader = Reader(cache._seg)
            self.reader.bind(self.core)
        self.cache, self.handover, self.raw = cache, core.HANDOVER, core.Raw
        self.handovers = 0  # calls the Python path made instead (printed: a figure with some is not Core's alone)
        self.xxh, self.encode, self.nb = xxhash.xxh3_64_intdigest, encode_parts, block_nbytes

    def get(self, key: str, default=None):
        kb = key.encode()
        fp = self.xxh(kb) & 0x7FFFFFFFFFFFFFFF
        r = self.core.get_value(kb, fp, -1, default)  # -1: Core reads CLOCK_MONOTONIC itself, if an expiry needs it
        if r is self.handover or type(r) is self.raw:  # (a Raw: not a small dict's answer)
            self.handovers += 1
            return self.cache.get(key, default)
        return r

    def put(self, key: str, value) -> None:
        kb = key.encode()
        tag, body = self.encode(value)
        size = len(kb) + len(body) + 1
        encoded = (kb, tag, body, self.xxh(kb) & 0x7FFFFFFFFFFFFFFF, (self.xxh(body, tag) & 0x7FFFFFFFFFFFFFFF) | 1,
                   size, self.nb(size))
        r = self.core.put(encoded, -1, -1, -1)
        if r is not True and r is not False:  # stored, or not admitted (keep): else HANDOVER or PINNED
            self.handovers += 1
            self.cache.put(key, value)

    def close(self) -> None:
        print(f"handovers {self.handovers}", file=sys.stderr)
        self.core.release()
        if self.reader is not None:
            self.reader.close()


def _child(case: str, n: int) -> None:
    """The measured process: set up, then run ``n`` operations of ``case``; prints the loop's wall time (ns) on
    stderr (``--wall``)."""
    import random

    value = small_value()
    resident = RESIDENT
    if case.endswith("-150k"):  # the size the views' goal is stated for: fewer keys, to fit the cache
        import numpy as np

        value, resident = np.arange(150 * 1024 // 8, dtype=np.int64), 128
        case = case[: -len("-150k")]
    bind = case == "view-as"
    if bind:
        case = "view"
    keys = [make_key("i:", i) for i in range(RESIDENT + n)]
    rng = random.Random(1)
    drawn = [keys[rng.randrange(resident)] for _ in range(n)]
    misses = [make_key("miss:", i) for i in range(n)]
    if case.startswith("lmdb"):
        import lmdb

        directory = tempfile.mkdtemp(prefix="benchmarks-instructions-", dir="/dev/shm")
        env = lmdb.open(directory, map_size=2**30, writemap=True, sync=False, metasync=False)
        try:
            with env.begin(write=True) as txn:
                for k in keys[:RESIDENT]:
                    txn.put(k.encode(), pickle.dumps(value, 5))
            if case == "lmdb-get":
                for _k in drawn:
                    with env.begin() as txn:
                        raw = txn.get(k.encode())
                    pickle.loads(raw)
            else:
                for k in keys[RESIDENT:]:
                    raw = pickle.dumps(value, 5)
                    with env.begin(write=True) as txn:
                        txn.put(k.encode(), raw)
        finally:
            env.close()
            shutil.rmtree(directory, ignore_errors=True)
        return
    from shmcache import SharedCache

    name = f"benchmarks-instructions-{os.getpid()}"
    cache = SharedCache(name, capacity_bytes=64 * 2**20,
                        max_entries=RESIDENT + (0 if case.endswith("put-evict") else n),
                        create=True, policy=os.environ.get(_POLICY_VAR, "lru"))
    try:
        # The arena backed ahead of the measured loop (one large value stored and deleted): a growth is a system call
        # the Python path makes, rare in a cache's life and no part of what a get or a put costs.
        cache.put("-grow-", bytes(16 * 2**20))
        del cache["-grow-"]
        get, put = cache.get, cache.put
        if case == "tier-get":
            from shmcache import TieredCache

            # Redis is never asked on a local hit: a URL nobody answers will do, and the listener thread is
            # stopped so that nothing but the measured loop runs.
            tier = TieredCache(cache, "redis://127.0.0.1:1/0", namespace="bench")
            tier._listener_box[0].close()
            get, put = tier.get, tier._kind.put
        elif case == "kind-get":
            kind = cache.kind("bench")
            get, put = kind.get, kind.put
        elif case == "view":
            import numpy as np

            if resident == RESIDENT:
                value = np.arange(128, dtype=np.int64)

            if bind:
                def get(key):
                    with cache.view(key) as arr:  # noqa: F841  (the name is what is measured)
                        pass
            else:
                def get(key):
                    with cache.view(key):
                        pass
        ops = None
        if case.endswith("-raw"):
            ops = _CoreOps(cache)
            for k in keys[:RESIDENT]:
                ops.put(k, value)
            kc, handover, now = ops.core, ops.handover, -1
            # The arguments of each resident key are made once (a cost that does not grow with n, so it cancels).
            if case == "core-get-raw":
                call = kc.get_value
                prepared = {k: (k.encode(), ops.xxh(k.encode()) & 0x7FFFFFFFFFFFFFFF, now, None)
                            for k in keys[:RESIDENT]}
            else:
                call = kc.put
                tag, body = ops.encode(value)
                prepared = {}
                for k in keys[:RESIDENT]:
                    kb = k.encode()
                    size = len(kb) + len(body) + 1
                    prepared[k] = ((kb, tag, body, ops.xxh(kb) & 0x7FFFFFFFFFFFFFFF,
                                    (ops.xxh(body, tag) & 0x7FFFFFFFFFFFFFFF) | 1, size, ops.nb(size)), now, -1, -1)
            t0 = time.perf_counter_ns()
            for k in drawn:
                if call(*prepared[k]) is handover:
                    ops.handovers += 1
            print(f"elapsed_ns {time.perf_counter_ns() - t0}", file=sys.stderr)
            case = "done"
        elif case.startswith("core-"):
            ops = _CoreOps(cache)
            get, put = ops.get, ops.put
            case = case[len("core-"):]
        if case != "done":
            for k in keys[:resident]:
                put(k, value)
        if case == "view":
            # Each stored value viewed once before the loop, after its last put: a handle checks a value's bytes
            # on its first view of it alone (the checksum policy), and a put makes the value a new one.
            for k in keys[:resident]:
                get(k)
        t0 = time.perf_counter_ns()
        if case == "done":
            pass
        elif case in ("get", "kind-get", "tier-get", "view"):
            for k in drawn:
                get(k)
        elif case == "get-many":
            for i in range(0, n, 64):
                cache.get_many(drawn[i : i + 64])
        elif case == "put-many":
            batches = [[(k, value) for k in drawn[i : i + 64]] for i in range(0, n, 64)]
            for batch in batches:
                cache.put_many(batch)
        elif case == "get-miss":
            for k in misses:
                get(k)
        elif case in ("put-new", "put-evict"):
            for k in keys[RESIDENT:]:
                put(k, value)
        elif case == "put-update":
            for k in drawn:
                put(k, value)
        elif case == "loop":
            for _k in drawn:
                pass
        if case != "done":
            print(f"elapsed_ns {time.perf_counter_ns() - t0}", file=sys.stderr)
    finally:
        if ops is not None:
            ops.close()
        if case == "tier-get":
            tier.close()
            tier.unlink()
        cache.close()
        SharedCache.unlink_name(name)


# str hashing salted per run moves counts by a few percent; OpenBLAS's worker threads (started when numpy is
# imported) spin for a while, and their instructions moved a count by up to 4,000 per operation from run to run.
_CHILD_ENV = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
_POLICY_VAR = "SHMCACHE_BENCH_POLICY"  # the child's cache policy (--policy)


def count(case: str, n: int, collect: str | None = None) -> int:
    """Instructions of one child run of ``n`` operations (with ``collect``, only those inside that C function)."""
    toggle = [f"--toggle-collect={collect}"] if collect else []
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *toggle, sys.executable, "-m",
         "benchmarks.instructions", "--child", case, str(n)],
        capture_output=True, text=True, check=True, timeout=1800,
        env=_CHILD_ENV)
    m = re.search(r"Collected : (\d+)", out.stderr)
    if not m:
        raise RuntimeError(f"no instruction count in valgrind's output for {case}:\n{out.stderr[-2000:]}")
    return int(m.group(1))


def wall(case: str, n: int, repeats: int) -> float:
    """Median wall time (ns) of ``n`` operations of ``case`` over ``repeats`` child runs, without valgrind."""
    times = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-m", "benchmarks.instructions", "--child", case, str(n)],
                             capture_output=True, text=True, check=True, timeout=600,
                             env=_CHILD_ENV)
        times.append(int(re.search(r"elapsed_ns (\d+)", out.stderr).group(1)))
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.instructions",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--ops", type=int, default=2000, help="N, the operations of the first run (default 2000)")
    ap.add_argument("--delta", type=int, default=10000, help="DELTA, the extra operations (default 10000)")
    ap.add_argument("--wall", action="store_true", help="also wall time per operation (median of --repeats runs of "
                    "N + DELTA operations, without valgrind; the loop case subtracted)")
    ap.add_argument("--collect", metavar="FUNCTION", help="count only the instructions inside this C function "
                    "(callgrind --toggle-collect), e.g. Core_get_value with --cases core-get-raw: the C section alone, "
                    "without the interpreter's loop and call around it; no loop case is subtracted")
    ap.add_argument("--repeats", type=int, default=5, help="child runs per case for --wall (default 5)")
    ap.add_argument("--policy", default="lru", help="comma-separated eviction policies of the measured cache, a "
                    "column each (default lru; under keep, put-evict is a put the full cache does not admit)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s): {', '.join(unknown)}")
    from shmcache import POLICIES

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if not policies or any(p not in POLICIES for p in policies):
        ap.error(f"--policy: comma-separated, of: {', '.join(POLICIES)}")

    def per_op(case: str) -> float:
        return (count(case, args.ops + args.delta, args.collect) - count(case, args.ops, args.collect)) / args.delta

    n_wall = args.ops + args.delta

    def wall_per_op(case: str) -> float:
        return wall(case, n_wall, args.repeats) / n_wall

    loop = per_op("loop") if not args.collect else 0.0
    loop_ns = wall_per_op("loop") if args.wall else 0.0
    cells = [f"{p:>16s}" + (f" {'ns':>8s}" if args.wall else "") for p in policies]
    print(f"{'case':16s} " + " ".join(cells) + "  what (instructions per operation" + (", ns" if args.wall else "")
          + ")")
    for case in cases:
        if case == "loop":
            cell = f"{loop:16,.0f}" + (f" {loop_ns:8,.0f}" if args.wall else "")
            print(f"{case:16s} " + " ".join([cell] * len(policies)) + f"  {CASES[case]}", flush=True)
            continue
        cells = []
        for policy in policies:
            _CHILD_ENV[_POLICY_VAR] = policy
            try:
                net = per_op(case) - loop
                ns = wall_per_op(case) - loop_ns if args.wall else 0.0
                cells.append(f"{net:16,.0f}" + (f" {ns:8,.0f}" if args.wall else ""))
            except (subprocess.CalledProcessError, RuntimeError) as exc:
                cells.append(f"{'error':>16s}" + (f" {'':8s}" if args.wall else ""))
                # (the child's own error, its traceback's end: what failed, not only that it did)
                said = getattr(exc, "stderr", None) or ""
                print(f"{case} ({policy}): {exc}" + (f"\n{said[-2000:]}" if said else ""), file=sys.stderr)
        print(f"{case:16s} " + " ".join(cells) + f"  {CASES[case]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
