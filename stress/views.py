"""Views under fire: zero-copy views taken every way a program takes them, while other processes replace, delete and
clear the same keys, and a timer's signal cuts blocks short at any bytecode.

--workers processes each loop over these ways of holding a view, over --keys keys whose values are arrays or bytes
that name their key and carry a checksum (stress/common.py), while --writers processes put, delete and clear them
all the time (so that viewed entries are held aside, and blocks are replaced and moved around them):

  block      a with block; the array read inside it, and again after it while its name still binds it
  kept       arrays kept past their blocks in a list of a few, dropped later
  exitstack  views entered through contextlib.ExitStack
  generator  a generator that yields a view's array, closed before it ends
  exec       a with block run by exec() in a namespace of its own (a module's frame)
  traceback  an exception raised inside a block, its traceback (which holds the block's frame) kept a while
  thread     views taken in a thread of the worker
  fork       a child forked while a view is open reads it and exits
  signal     a one-shot timer whose handler raises, from inside the block to past its end

Each value read through a view is checked against its key and checksum when first read, and its bytes compared at
its last read with those of its first: a change is a stale read. At the end every worker drops what it holds and
collects its garbage, and then, with every worker still alive, the parent checks that no pin is left: no pin byte
locked, no reader slot's pin word, and no entry still held once a store has given back what no view pins.

    views: policy=P ops=N stale=0 wrong=0 errors=0 pins_left=0 hangs=0 crashes=0 seconds=S workers=W

ops        views taken by all workers together
stale      values whose bytes changed while a view still held them; must be 0
wrong      values read through a view that were not put under their key; must be 0
errors     exceptions other than the documented ones (PinnedError for room, KeyError for an absent key, the
           timer's own); must be 0
pins_left  pins (pin bytes, reader slot pin words, held entries) left once every worker dropped its views; must be 0
hangs      workers that did not finish in time; must be 0
crashes    workers that died on their own; must be 0
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import random
import signal
import sys
import threading
import time

import numpy as np

from shmcache import PinnedError, SharedCache

from .common import (
    check_value, exit_on_sigterm, key_name, make_parser, reap, run_policies, start, unlink_quietly,
    viewable_value as view_value,
)

DEFAULT_SECONDS = 10.0
DEFAULT_WORKERS = 3
DEFAULT_SEED = 1
DEFAULT_KEYS = 64
DEFAULT_CAPACITY_BYTES = 1 << 20
DEFAULT_MAX_ENTRIES = 256
DEFAULT_MAX_VALUE_BYTES = 8192
WRITERS = int(os.environ.get("VIEWS_WRITERS", "2"))
JOIN_SECONDS = 20.0
WAYS = ("block", "kept", "exitstack", "generator", "exec", "traceback", "thread", "fork", "signal")
OPS, STALE, WRONG, ERRORS, DONE = range(5)
NF = 5  # counts per worker


class _Interrupted(BaseException):
    """The timer's exception: a BaseException, so that no ``except Exception`` of the checks takes it for theirs."""


class Viewer:
    """One worker's views: each read checked, its first bytes kept to compare with its last read."""

    def __init__(self, cache: SharedCache, rng: random.Random, counts, row: int, nkeys: int) -> None:
        self.cache, self.rng, self.c, self.base, self.nkeys = cache, rng, counts, row * NF, nkeys
        self.way = ""
        self.kept: list = []  # (key, array, its first bytes), past their blocks
        self.armed = False
        signal.signal(signal.SIGALRM, self._interrupt)

    def _interrupt(self, signum, frame) -> None:
        if self.armed:
            self.armed = False
            raise _Interrupted()

    def first(self, key: str, v) -> bytes | None:
        """Check a value as first read; its bytes, or None (counted) if it is not its key's."""
        raw = bytes(v) if isinstance(v, memoryview) else np.asarray(v).tobytes()
        why = check_value(key, bytes(v) if isinstance(v, memoryview) else v)
        if why:
            self.c[self.base + WRONG] += 1
            print(f"[pid {os.getpid()}] view({key!r}): {why}", file=sys.stderr, flush=True)
            return None
        return raw

    def last(self, key: str, v, raw: bytes | None) -> None:
        """Compare a value's bytes at its last read with those of its first (a memoryview only inside its block:
        it is released at the block's end)."""
        if raw is not None and (bytes(v) if isinstance(v, memoryview) else np.asarray(v).tobytes()) != raw:
            self.c[self.base + STALE] += 1
            print(f"[pid {os.getpid()}] {self.way}: view({key!r}) changed under its view", file=sys.stderr,
                  flush=True)

    def after(self, key: str, v, raw: bytes | None) -> None:
        """``last``, for a read after the block: an array's (a memoryview has been released)."""
        if not isinstance(v, memoryview):
            self.last(key, v, raw)

    def key(self) -> str:
        return key_name(self.rng.randrange(self.nkeys))

    def step(self) -> None:
        way = self.way = self.rng.choice(WAYS)
        try:
            getattr(self, "_" + way)(self.key())
        except (KeyError, PinnedError, _Interrupted):
            pass
        except Exception as exc:  # anything else is an error of the cache or of the views
            self.c[self.base + ERRORS] += 1
            print(f"[pid {os.getpid()}] {way}: {exc!r}", file=sys.stderr, flush=True)
        self.c[self.base + OPS] += 1

    def _block(self, key: str) -> None:
        with self.cache.view(key) as v:
            raw = self.first(key, v)
            self.cache.get(self.key())  # another operation while the pin is held
            self.last(key, v, raw)
        self.after(key, v, raw)

    def _kept(self, key: str) -> None:
        with self.cache.view(key) as v:
            raw = self.first(key, v)
        if not isinstance(v, memoryview):
            self.kept.append((key, v, raw))
        while len(self.kept) > self.rng.randrange(1, 6):
            k, old, old_raw = self.kept.pop(0)
            self.last(k, old, old_raw)

    def _exitstack(self, key: str) -> None:
        other = self.key()
        with contextlib.ExitStack() as stack:
            v = stack.enter_context(self.cache.view(key))
            raw = self.first(key, v)
            v2 = stack.enter_context(self.cache.view(other))  # (a KeyError here unwinds the first view too)
            raw2 = self.first(other, v2)
            self.cache.put(key, view_value(key, 2, self.rng, 64))
            self.last(key, v, raw)
            self.last(other, v2, raw2)

    def _generator(self, key: str) -> None:
        def chunks():
            with self.cache.view(key) as v:
                for _ in range(4):
                    yield v

        gen = chunks()
        v = next(gen)
        raw = self.first(key, v)
        gen.close()  # ends the block early (GeneratorExit at the yield)
        self.after(key, v, raw)

    def _exec(self, key: str) -> None:
        namespace = {"cache": self.cache, "key": key}
        exec("with cache.view(key) as v:\n    raw = first(key, v)\n", {**namespace, "first": self.first},
             namespace)
        self.after(key, namespace["v"], namespace["raw"])

    def _traceback(self, key: str) -> None:
        try:
            with self.cache.view(key) as v:
                raw = self.first(key, v)
                raise RuntimeError("inside the block")
        except RuntimeError as exc:
            tb = exc.__traceback__  # holds the block's frame, and so the view's array
        self.cache.put(key, view_value(key, 0, self.rng, 64))  # replaced while the traceback holds it
        self.after(key, v, raw)
        del tb

    def _thread(self, key: str) -> None:
        out: list = []

        def run() -> None:
            try:
                with self.cache.view(key) as v:
                    out.append((self.first(key, v), v if not isinstance(v, memoryview) else None))
            except KeyError:
                pass

        t = threading.Thread(target=run)
        t.start()
        t.join()
        if out and out[0][1] is not None:
            self.last(key, out[0][1], out[0][0])

    def _fork(self, key: str) -> None:
        with self.cache.view(key) as v:
            raw = self.first(key, v)
            pid = os.fork()
            if pid == 0:  # the child reads the inherited view, whatever the parent does meanwhile, and leaves
                try:
                    time.sleep(self.rng.random() * 0.002)
                    same = (bytes(v) if isinstance(v, memoryview) else np.asarray(v).tobytes()) == raw
                finally:
                    os._exit(0 if same else 3)
        self.cache.put(key, view_value(key, 1, self.rng, 64))
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            self.c[self.base + STALE] += 1
            print(f"[pid {os.getpid()}] a forked child's view of {key!r} changed", file=sys.stderr, flush=True)

    def _signal(self, key: str) -> None:
        v = raw = None
        try:
            try:
                self.armed = True
                signal.setitimer(signal.ITIMER_REAL, self.rng.uniform(5e-6, 300e-6))
                with self.cache.view(key) as v:
                    raw = self.first(key, v)
            finally:
                self.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Interrupted:
            pass
        if v is not None and raw is not None:
            self.after(key, v, raw)

    def drop(self) -> None:
        """Let go of everything held: the last reads of what was kept, then a collection."""
        while self.kept:
            k, old, old_raw = self.kept.pop()
            self.last(k, old, old_raw)
        gc.collect()


def viewer(name: str, row: int, seed: int, counts, stop, release, nkeys: int) -> None:
    with SharedCache(name, create=False) as cache:
        w = Viewer(cache, random.Random(seed), counts, row, nkeys)
        while not stop.value:
            w.step()
        w.drop()
        del w
        gc.collect()
        counts[row * NF + DONE] = 1
        while not release.value:  # alive, holding whatever it failed to drop, while the parent looks
            time.sleep(0.01)


def writer(name: str, seed: int, stop, nkeys: int, max_nbytes: int) -> None:
    rng = random.Random(seed)
    with SharedCache(name, create=False) as cache:
        seq = 0
        while not stop.value:
            key = key_name(rng.randrange(nkeys))
            r = rng.random()
            try:
                if r < 0.8:
                    seq += 1
                    cache.put(key, view_value(key, seq, rng, rng.randrange(8, max_nbytes)))
                elif r < 0.995:
                    cache.delete(key)
                else:
                    cache.clear()
            except PinnedError:
                pass


def pins_left(cache: SharedCache) -> int:
    """Pins still held on any entry (pin bytes, reader slot words), and entries still held once a store has given
    back what no view pins."""
    table = cache._table
    cache.put("stress-views-last-store", 0)
    left = sum(1 for e in range(1, cache._seg.slots_in_use()) if table._pin_held(e))
    return left + cache.stats().held_entries


def main(argv: list[str] | None = None) -> int:
    args = make_parser(
        __doc__, seconds=DEFAULT_SECONDS, workers=DEFAULT_WORKERS, seed=DEFAULT_SEED, keys=DEFAULT_KEYS,
        capacity_bytes=DEFAULT_CAPACITY_BYTES, max_entries=DEFAULT_MAX_ENTRIES, max_value_bytes=DEFAULT_MAX_VALUE_BYTES,
    ).parse_args(argv)
    exit_on_sigterm()
    return run_policies("views", args, _run)


def _run(args) -> tuple[dict, bool]:
    ctx = mp.get_context("fork")  # (the fork way forks anyway; spawn would only slow the start)
    name = f"stress-views-{args.policy}-{os.getpid()}"
    counts = ctx.RawArray("q", args.workers * NF)
    stop, release, wstop = ctx.RawValue("b", 0), ctx.RawValue("b", 0), ctx.RawValue("b", 0)
    cache = SharedCache(name, capacity_bytes=args.capacity_bytes, max_entries=args.max_entries, create=True,
                        policy=args.policy)
    rng = random.Random(args.seed)
    for i in range(args.keys):
        cache.put(key_name(i), view_value(key_name(i), 0, rng, 256))
    procs, writers, hangs, crashes, left, elapsed = [], [], 0, 0, -1, 0.0
    t0 = time.monotonic()
    try:
        writers = [start(ctx, writer, (name, args.seed * 7919 + i, wstop, args.keys, args.max_value_bytes))
                   for i in range(WRITERS)]
        procs = [start(ctx, viewer, (name, i, args.seed * 1_000_003 + i, counts, stop, release, args.keys))
                 for i in range(args.workers)]
        time.sleep(args.seconds)
        elapsed = time.monotonic() - t0
        stop.value = 1
        wstop.value = 1
        hangs += len(reap(writers, JOIN_SECONDS))
        deadline = time.monotonic() + JOIN_SECONDS
        while not all(counts[r * NF + DONE] for r in range(args.workers)) and time.monotonic() < deadline:
            if any(not p.is_alive() for p in procs):
                break
            time.sleep(0.05)
        if all(counts[r * NF + DONE] for r in range(args.workers)):
            left = pins_left(cache)  # every viewer alive, having dropped what it held
        else:
            hangs += sum(1 for r in range(args.workers) if not counts[r * NF + DONE])
        release.value = 1
        stuck = reap(procs, JOIN_SECONDS)
        hangs += len(stuck)
        crashes = sum(1 for p in procs if p not in stuck and p.exitcode != 0)
        ok = cache.verify().ok
    finally:
        stop.value = release.value = wstop.value = 1
        reap(procs + writers, 5.0)
        cache.close()
        unlink_quietly(name)
    fields = {f: sum(counts[r * NF + i] for r in range(args.workers))
              for f, i in (("ops", OPS), ("stale", STALE), ("wrong", WRONG), ("errors", ERRORS))}
    fields.update(pins_left=left, hangs=hangs, crashes=crashes, verify="ok" if ok else "FAILED",
                  seconds=round(elapsed, 1), workers=args.workers)
    failed = bool(fields["stale"] or fields["wrong"] or fields["errors"] or left != 0 or hangs or crashes or not ok)
    return fields, failed


if __name__ == "__main__":
    sys.exit(main())
