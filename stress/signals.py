"""Interrupt every kind of operation at random bytecodes and check that nothing leaks.

--workers processes run the hammer's random mix (get, put with and without ttl, delete, view with reads inside,
cas, add, touch, kind operations...) plus get_or_compute, memoized calls, incr and pop, while a timer
(ITIMER_REAL, a random interval of MIN_INTERVAL_US to MAX_INTERVAL_US) raises KeyboardInterrupt in them, or now and
then an exception of this script's own (a BaseException, as a signal handler's may be); the workers catch it and go
on. Every value carries its key and a checksum and every value read is checked. Each worker keeps a few files of its
own open and checks, every CHECK_EVERY operations and at the end, that they are still open and still the same files
(st_dev, st_ino), and that its descriptor count stays within FD_SLACK of its start (pooled descriptions aside).
When the time is up the workers stop their timers and wait, alive; the parent then checks that no byte of theirs is
locked (every key's claim, every memoized call's claim, every pin), puts every key and computes every key with a
short timeout; then the workers close their handles and compare their descriptor count with their start, exactly.

--policy chooses the cache's eviction policy (default auto); --policy all runs each of shmcache.POLICIES in turn,
--seconds split equally, and prints one summary line for each. Under keep a put may store nothing and return False
(a new key, the cache full): after the storm, with the workers idle, such a refusal must come with a cache that is
indeed full (entries at max_entries, or no room for the entry's bytes); under lru and s3fifo put must return True.

Reading the summary line:

    signals: policy=P ops=N interrupts=I wrong=0 errors=0 leaked_fds=0 closed_fds=0 held=0 refused=0 hangs=0
             crashes=0 not_admitted=A verify=ok

policy      the cache's eviction policy (lru, s3fifo or keep)
ops         operations done by all workers together
interrupts  operations cut short by the timer's exception
wrong       reads that returned a value not put under that key (workers and final read-back), and puts that
            returned anything but True (under keep: False, with room for the entry, after the storm); must be 0
errors      exceptions other than the timer's and the documented refusals; must be 0
leaked_fds  descriptors a worker had open beyond its count at start (periodically: beyond FD_SLACK and one per
            background refresh under way, which holds its claim's); must be 0
closed_fds  a worker's own files found closed or replaced; must be 0
held        claim or pin bytes still locked by the paused workers; must be 0
refused     puts (PinnedError) or computations (ComputeTimeout) refused after the storm, and old entries still
            held for a view once every key was written again (a pin left behind); must be 0
hangs       workers that did not pause or stop in time, or made no progress for HANG_SECONDS; must be 0
crashes     workers that died on their own; must be 0
not_admitted puts that returned False under keep (the workers' and those after the storm)
verify      ok when the final verify() and stats checks passed, FAILED otherwise (details on stderr)

The exit status is 1 when any "must be" above does not hold.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import threading
import time
import weakref

from shmcache import ComputeTimeout, PinnedError, SharedCache, ofd, refresh
from shmcache.cache import parts
from shmcache.codec import encode_key, fingerprint

from .common import (
    ERRORS, FOREIGN, NF, NOT_ADMITTED, OPS, WRONG, MIX, Workload, check_value, exit_on_sigterm, final_check,
    key_name, make_parser, make_value, reap, run_policies, start, unlink_quietly,
)

DEFAULT_SECONDS = 10.0
DEFAULT_WORKERS = 4
DEFAULT_SEED = 1
DEFAULT_KEYS = 200
DEFAULT_CAPACITY_BYTES = 4 << 20
DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_VALUE_BYTES = 16 * 1024
MIN_INTERVAL_US, MAX_INTERVAL_US = 50, 300  # the timer's interval, drawn anew at each pause
OWN_FILES = 4  # files each worker keeps open, to catch a descriptor closed that the cache did not own
CHECK_EVERY = 2000  # operations between a worker's periodic descriptor checks
FD_SLACK = 16  # descriptors a worker may hold above its start while its handle is open (idle pooled descriptions)
MEMO_NAME = "stress.signals.f"
HANG_SECONDS = 10.0
JOIN_SECONDS = 20.0
COMPUTE_TIMEOUT = 2.0
# (stale: its refreshes are queued for the process's refresh threads, and an interrupt that cuts a thread's start
# short leaves its job queued for the next start: refresh.Workers. The op found a claim registry left held by an
# interrupt, which each refresh then waited a second for under the cache lock (flight._take_registry), and, on
# CPython 3.14, the refresh threads' lock left held by an interrupt landing right after a ``with`` took it in the
# calling thread, which then hung the next call (refresh.Workers takes no blocking lock there now).)
SIGNAL_MIX = dict(MIX, get_or_compute=4, memoize=3, incr=1, pop=1, stale=1)
# Extra per-worker counters after the common FIELDS.
INTERRUPTS, LEAKED, CLOSED = NF, NF + 1, NF + 2
NW = NF + 3
RUNNING, PAUSE, FINISH = 0, 1, 2  # the parent's word to the workers


class Storm(BaseException):
    """This script's own exception, raised by the timer now and then instead of KeyboardInterrupt."""


class SignalWorkload(Workload):
    """The hammer's mix plus the operations that take claims (get_or_compute, memoize) and the atomic ones."""

    def __init__(self, cache, rng, counts, row, **opts) -> None:
        super().__init__(cache, rng, counts, row, mix=SIGNAL_MIX, **opts)
        self.base = row * NW
        self.memo = cache.memoize(name=MEMO_NAME, timeout=COMPUTE_TIMEOUT)(_memo_value)

    def interrupt_of(self, exc: Exception) -> BaseException | None:
        # CPython 3.10: an interrupt raised while a frame returns reaches the caller as "SystemError:
        # _PyEval_EvalFrameDefault returned a result with an exception set", caused by the interrupt (3.11 and later
        # raise the interrupt itself; tests/test_interrupts.py reads it the same way). The finally clauses it went
        # through are the interrupt's, so the checks of claims, descriptors and views still judge them.
        if (sys.version_info < (3, 11) and type(exc) is SystemError
                and isinstance(exc.__cause__, (KeyboardInterrupt, Storm))
                and "returned a result with an exception set" in str(exc)):
            return exc.__cause__
        return None

    def _get_or_compute(self) -> None:
        key = self.key()
        self.seq += 1
        seq, nbytes = self.seq, self.nbytes()
        try:
            v = self.cache.get_or_compute(key, lambda: make_value(key, seq, random.Random(seq), nbytes),
                                          timeout=COMPUTE_TIMEOUT)
        except ComputeTimeout as exc:
            self.report(ERRORS, f"get_or_compute({key!r}): {exc!r}")
            return
        why = check_value(key, v)
        if why:
            self.report(WRONG, f"get_or_compute({key!r}) returned a wrong value: {why}")

    def _memoize(self) -> None:
        i = self.rng.randrange(self.nkeys)
        if self.rng.random() < 0.01:
            self.memo.cache_clear()
        why = check_value(f"m{i}", self.memo(i))
        if why:
            self.report(WRONG, f"memoized call {i} returned a wrong value: {why}")

    def _incr(self) -> None:
        n = self.cache.incr(f"n{self.rng.randrange(16)}")
        if not isinstance(n, int) or n < 1:
            self.report(WRONG, f"incr returned {n!r}")

    def _pop(self) -> None:
        key = self.key()
        v = self.cache.pop(key, None)
        why = None if v is None else check_value(key, v)
        if why:
            self.report(WRONG, f"pop({key!r}) returned a wrong value: {why}")


def _memo_value(i: int):
    return make_value(f"m{i}", i, random.Random(i), 64 + i % 512)


def _own_files() -> tuple[list, dict]:
    files = [tempfile.TemporaryFile() for _ in range(OWN_FILES)]
    return files, {f.fileno(): _ident(f.fileno()) for f in files}


def _ident(fd: int):
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    except OSError:
        return None


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def signal_worker(name: str, row: int, seed: int, counts, control, paused, opts: dict) -> None:
    """Random operations under a storm of interrupts until the parent says PAUSE; then idle until FINISH."""
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks where a worker that did not pause is
    parent, rng, base = os.getppid(), random.Random(seed), row * NW
    files, own = _own_files()
    start_fds = _fd_count()
    cache = SharedCache(name, create=False)
    w = SignalWorkload(cache, rng, counts, row, **opts)
    armed = False

    def interrupt(signum, frame):
        nonlocal armed
        if armed:
            armed = False  # first: a second signal before the except clause runs must not raise outside a step
            raise KeyboardInterrupt() if rng.random() < 0.9 else Storm()

    def check_files() -> None:
        counts[base + CLOSED] += sum(1 for fd, ident in own.items() if _ident(fd) != ident)

    signal.signal(signal.SIGALRM, interrupt)
    steps = 0
    while control.value == RUNNING and os.getppid() == parent:
        signal.setitimer(signal.ITIMER_REAL, rng.randint(MIN_INTERVAL_US, MAX_INTERVAL_US) / 1e6,
                         rng.randint(MIN_INTERVAL_US, MAX_INTERVAL_US) / 1e6)
        for _ in range(CHECK_EVERY):
            try:
                armed = True
                w.step()
                armed = False
            except (KeyboardInterrupt, Storm):
                armed = False
                counts[base + INTERRUPTS] += 1
            steps += 1
            if control.value != RUNNING:
                break
        signal.setitimer(signal.ITIMER_REAL, 0)
        gc.collect()
        check_files()
        if _fd_count() > start_fds + FD_SLACK + _refreshing():  # (a refresh holds its claim's)
            print(f"[pid {os.getpid()}] descriptors above the slack: {_fd_targets()}", file=sys.stderr, flush=True)
            counts[base + LEAKED] += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    # The stale op's background refreshes ended (each holds its key's claim until its function returns) before the
    # parent looks for claims left held; a job whose thread's start an interrupt cut short gets a thread here.
    deadline = time.monotonic() + refresh.PENDING_S + 1.0  # (a record with no job is taken for lost by then)
    while parts(cache).refreshes.running and time.monotonic() < deadline:
        refresh.workers().ensure()
        time.sleep(0.01)
    if parts(cache).refreshes.running:  # (a refresh that did not end: where every thread is, for the log)
        print(f"[pid {os.getpid()}] {parts(cache).refreshes.running} refreshes still running after "
              f"{refresh.PENDING_S + 1.0:g} s; "
              f"{refresh.workers().busy} refresh threads busy", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
    with paused.get_lock():
        paused.value += 1
    while control.value != FINISH and os.getppid() == parent:
        time.sleep(0.05)
    cache.close()
    handle = weakref.ref(cache)
    del w, cache
    gc.collect()  # the lock's page (and its descriptor) goes with the handle
    check_files()
    leaked = max(0, _fd_count() - start_fds)
    if leaked:  # what they are, for the log: and whether the handle (its lock page's descriptor) is still alive
        alive, pool = handle(), refresh.workers()
        print(f"[pid {os.getpid()}] {leaked} descriptors more than at the start: {_fd_targets()}; threads: "
              f"{[t.name for t in threading.enumerate()]}; handle alive: {alive is not None}"
              f"{'' if alive is None else ', held by ' + str([type(r).__name__ for r in gc.get_referrers(alive)])}; "
              f"refresh jobs queued {pool.queued}, threads running a job {pool.busy}",
              file=sys.stderr, flush=True)
        del alive
    counts[base + LEAKED] += leaked
    for f in files:
        f.close()


def _fd_targets() -> list[str]:
    """Where this process's descriptors lead."""
    out = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            out.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    return out


def _refreshing() -> int:
    """The refresh threads alive in this process (refresh.Workers: idle ones too, each ending refresh.IDLE_S after
    its last job; a busy one holds its claim's descriptor), an upper bound on the refreshes under way."""
    return sum(t.name == "shmcache-refresh" for t in threading.enumerate())


def _held(cache: SharedCache, nkeys: int) -> int:
    """Claim bytes of every key and memoized call, and every pin byte, that another description holds."""
    fd = cache._seg.fd
    claims = [fingerprint(encode_key(key_name(i))) >> 1 for i in range(nkeys)]
    claims += [fingerprint(encode_key(["shmcache.memoize", MEMO_NAME, (i,), {}])) >> 1 for i in range(nkeys)]
    pins = [ofd.PIN_BASE + e for e in range(cache._table.slots)]
    held = [b for b in claims + pins if ofd.held_elsewhere(fd, b)]
    for b in held[:5]:
        print(f"after the storm: byte {b} is still locked", file=sys.stderr)
    return len(held)


def _write_everything(cache: SharedCache, nkeys: int) -> tuple[int, int, int]:
    """Put and compute every key: (refused, a pin or a claim left behind; wrong, a put that returned anything but
    True, or False under keep while the cache had room; not admitted, under keep with the cache full). The workers
    are idle: this process alone changes the cache."""
    refused = wrong = not_admitted = 0
    for i in range(nkeys):
        key = key_name(i)
        value = make_value(key, i, random.Random(i), 100)
        try:
            stored = cache.put(key, value)
            if stored is False and cache.policy == "keep":
                # What keep's insert weighs, as it stands after the refusal (the key's old entry gone, the expired
                # ones dropped): refused only when full.
                s, size = cache.stats(), parts(cache).store.encode(key, value).size
                if s.entries >= s.max_entries or s.retained_bytes + size > s.max_retained_bytes:
                    not_admitted += 1
                else:
                    wrong += 1
                    print(f"after the storm: put({key!r}) not admitted with room for it: entries={s.entries} of "
                          f"{s.max_entries}, retained_bytes={s.retained_bytes} + {size} of {s.max_retained_bytes}",
                          file=sys.stderr)
            elif stored is not True:
                wrong += 1
                print(f"after the storm: put({key!r}) returned {stored!r} under {cache.policy}", file=sys.stderr)
            cache.delete(key)
            cache.get_or_compute(key, lambda: make_value(key, i, random.Random(i), 100), timeout=COMPUTE_TIMEOUT)
        except (PinnedError, ComputeTimeout) as exc:
            refused += 1
            print(f"after the storm: {key!r} refused: {exc!r}", file=sys.stderr)
    # A pin left behind no longer refuses its key's put (the old entry is held aside for it): it shows as an entry
    # still held once every key was written again (each store gives back what no view pins).
    held = cache.stats().held_entries
    if held:
        refused += held
        print(f"after the storm: {held} old entries still held for views", file=sys.stderr)
    return refused, wrong, not_admitted


def main(argv: list[str] | None = None) -> int:
    args = make_parser(
        __doc__, seconds=DEFAULT_SECONDS, workers=DEFAULT_WORKERS, seed=DEFAULT_SEED, keys=DEFAULT_KEYS,
        capacity_bytes=DEFAULT_CAPACITY_BYTES, max_entries=DEFAULT_MAX_ENTRIES, max_value_bytes=DEFAULT_MAX_VALUE_BYTES,
    ).parse_args(argv)
    exit_on_sigterm()
    return run_policies("signals", args, _run)


def _run(args) -> tuple[dict, bool]:
    """One run under ``args.policy``: (summary fields, failed)."""
    ctx = mp.get_context(args.start_method)
    name = f"stress-signals-{args.policy}-{os.getpid()}"
    counts = ctx.RawArray("q", args.workers * NW)
    control, paused = ctx.RawValue("b", RUNNING), ctx.Value("i", 0)
    opts = dict(nkeys=args.keys, max_nbytes=args.max_value_bytes)
    cache = SharedCache(name, capacity_bytes=args.capacity_bytes, max_entries=args.max_entries, create=True,
                        policy=args.policy)
    procs, hangs, crashes, ok, wrong, held, refused, elapsed = [], 0, 0, False, 0, 0, 0, 0.0
    put_wrong = not_admitted = 0
    t0 = time.monotonic()
    try:
        procs = [start(ctx, signal_worker, (name, i, args.seed * 1_000_003 + i, counts, control, paused, opts))
                 for i in range(args.workers)]
        last, since = -1, time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(0.2)
            n = sum(counts[r * NW + OPS] for r in range(args.workers))
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since > HANG_SECONDS:
                hangs += 1
                break
        elapsed = time.monotonic() - t0
        control.value = PAUSE
        deadline = time.monotonic() + JOIN_SECONDS
        while paused.value < sum(p.is_alive() for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        hangs += max(0, sum(p.is_alive() for p in procs) - paused.value)
        if hangs:  # every thread's stack of every worker, on its stderr, before they are killed
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGUSR1)
            time.sleep(1.0)
        if not hangs:
            held = _held(cache, args.keys)  # the workers are alive and idle: whatever is locked now stays locked
            refused, put_wrong, not_admitted = _write_everything(cache, args.keys)
        control.value = FINISH
        stuck = reap(procs, JOIN_SECONDS)
        hangs += len(stuck)
        crashes = sum(1 for p in procs if p not in stuck and p.exitcode != 0)
        if not hangs:
            ok, wrong = final_check(cache, args.keys)
    finally:
        control.value = FINISH
        reap(procs, 5.0)
        cache.close()
        unlink_quietly(name)
    rows = [range(r * NW, r * NW + NW) for r in range(args.workers)]
    per = lambda field: sum(counts[r.start + field] for r in rows)  # noqa: E731
    wrong += per(WRONG) + put_wrong
    not_admitted += per(NOT_ADMITTED)
    errors = per(ERRORS) + per(FOREIGN)
    leaked, closed = per(LEAKED), per(CLOSED)
    return {
        "ops": per(OPS), "interrupts": per(INTERRUPTS), "wrong": wrong, "errors": errors, "leaked_fds": leaked,
        "closed_fds": closed, "held": held, "refused": refused, "hangs": hangs, "crashes": crashes,
        "not_admitted": not_admitted, "verify": "ok" if ok else "FAILED", "seconds": round(elapsed, 1),
        "workers": args.workers,
    }, bool(wrong or errors or leaked or closed or held or refused or hangs or crashes or not ok)


if __name__ == "__main__":
    sys.exit(main())
