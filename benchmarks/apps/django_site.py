"""A small Django site under gunicorn, driven by wrk, with each of four cache backends: shmcache's SharedMemoryCache,
Django's LocMemCache (one per worker), memcached (PyMemcacheCache) and Redis (RedisCache) on real local servers.

    python -m benchmarks.apps.django_site --seconds 20 --workers 4 --connections 32 --rounds 3 --json out.json

The site: ``GET /page?k=K`` renders an HTML fragment of ``--page-kb`` (a table of the top groups of a seeded "query":
K's rows, 6000 to 24000 of them, made, sorted and aggregated, 4 to 17 ms of CPU, then filler text) and caches it
with Django's low-level API (``cache.get`` / ``cache.set``, 5 minutes); it also touches the client's session
(``SESSION_ENGINE`` is the cache one, so the session lives in the same backend: a read and a write per request).
wrk draws K from a Zipf distribution over ``--keys`` keys (exponent ``--zipf``), so a few pages are hot and many
are cold, and sends in turn one of ``--sessions`` session cookies made through the site before the load. The cached
value carries its key and a digest of its HTML, checked on every hit: a wrong value is counted, and fails the run.

Each worker counts the requests it served, the pages it computed (misses), the sessions it did not find (a cookie whose
session the backend does not have: with LocMemCache, every request that lands on another worker than the one that
made the session) and the wrong values, in a file of its own; the hit rate is 1 - computed / served.

Every (backend, round) is a fresh gunicorn (``--workers`` sync workers on 127.0.0.1; ``--preload`` optional) over
an empty cache: a new segment, a new memcached or redis-server process (started here, a child, on a free loopback port).
``--warmup-requests`` of the same load come first (other draws, the same for every backend, sent from Python),
unmeasured, so that every backend starts the measure with a cache that served as many requests; then wrk runs
``--seconds`` at ``--connections``.
Rounds are interleaved (every backend once per round, in the same order), and the medians across rounds are reported.

Memory is sampled when wrk ends: the PSS (/proc/PID/smaps_rollup) of the gunicorn master and its workers (the pages
of shmcache's segment that they map count there, split among them), and, apart, that of the memcached or Redis
server, and the pages of the segment that no process maps (posix_fallocate makes all of them resident at creation).
Their sum is the total. Everything started here is stopped in a ``finally``: gunicorn's process group, the servers,
the segment, the temporary directory. Figures on a shared machine are noisy: compare within one run, never across
machines.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import http.cookies
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

from benchmarks.measure import pss_total

BACKENDS = ("shmcache", "locmem", "memcached", "redis")
LOOPBACK = "127.0.0.1"
ROWS_BASE = 6000  # rows of page K: ROWS_BASE * (1 + K % 4), about 4 to 17 ms of CPU here
TOP_ROWS = 40  # rows of the page's table (about 3 KiB of HTML; --page-kb pads the page)
PAGE_TTL_S = 300  # longer than any run: pages leave the cache only by eviction
SESSION_COOKIE = "sessionid"  # Django's default SESSION_COOKIE_NAME
START_TIMEOUT_S = 60.0
WARMUP_TIMEOUT_S = 60.0  # for one request of the warm-up
STOP_TIMEOUT_S = 20.0
COUNTER_FIELDS = ("served", "computed", "lost_sessions", "wrong")
COUNTER_NBYTES = 128  # one fixed-width record per worker file, rewritten in place
MAPPING_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")  # a mapping's first line in /proc/PID/smaps
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------------------------------------- the site


def compute(k: int) -> list[tuple[int, float]]:
    """The slow part of page ``k``: a seeded table of rows, sorted, summed by group; the top TOP_ROWS groups."""
    rng = random.Random(k)
    rows = [(rng.random(), rng.randrange(1000), rng.randrange(200)) for _ in range(ROWS_BASE * (1 + k % 4))]
    rows.sort()
    totals: dict[int, float] = {}
    for score, item, group in rows:
        totals[group] = totals.get(group, 0.0) + score * item
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_ROWS]


def render(k: int, top: list[tuple[int, float]], page_nbytes: int) -> str:
    """The page's HTML: the table, and a note of filler text that brings it to ``page_nbytes`` (ASCII)."""
    cells = "".join(f'<tr><td class="group">group {g}</td><td class="total">{t:.3f}</td></tr>\n' for g, t in top)
    html = f'<section id="page-{k}"><h2>Top groups of page {k}</h2>\n<table>\n{cells}</table>\n'
    tail = "</p></section>\n"
    room = page_nbytes - len(html) - len('<p class="note">') - len(tail)
    word = hashlib.sha256(str(k).encode()).hexdigest()[:15] + " "
    return f'{html}<p class="note">{(word * (room // len(word) + 1))[:max(0, room)]}{tail}'


def digest(k: int, html: str) -> str:
    return hashlib.blake2b(f"{k}\0{html}".encode(), digest_size=16).hexdigest()


class Counters:
    """This worker's counts, rewritten in place in a file named by its pid (so a restarted worker adds a file)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.values = dict.fromkeys(COUNTER_FIELDS, 0)
        self._pid = None
        self._fd = -1

    def current(self) -> dict[str, int]:
        """This process's counts, to add to; a process forked from another (a preloading master) starts its own."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self.values = dict.fromkeys(COUNTER_FIELDS, 0)
            self._fd = os.open(os.path.join(self.directory, str(self._pid)), os.O_WRONLY | os.O_CREAT, 0o600)
        return self.values

    def save(self) -> None:
        record = " ".join(str(self.values[f]) for f in COUNTER_FIELDS).encode()
        os.pwrite(self._fd, record.ljust(COUNTER_NBYTES), 0)


def read_counters(directory: str) -> dict[str, int]:
    """The sum of every worker's counts (and how many workers wrote any)."""
    total = dict.fromkeys(COUNTER_FIELDS, 0)
    files = os.listdir(directory)
    for name in files:
        with open(os.path.join(directory, name), "rb") as f:
            values = f.read().split()
        for field, value in zip(COUNTER_FIELDS, values):
            total[field] += int(value)
    total["workers"] = len(files)
    return total


_counters: Counters | None = None
_page_nbytes = 0


def page(request):
    """The cached page (computed on a miss) and a session touch; counts both."""
    from django.core.cache import cache
    from django.http import HttpResponse, HttpResponseBadRequest

    try:
        k = int(request.GET["k"])
    except (KeyError, ValueError):
        return HttpResponseBadRequest("k must be an integer")
    counts = _counters.current()
    counts["served"] += 1
    session = request.session
    if SESSION_COOKIE in request.COOKIES and "views" not in session:
        counts["lost_sessions"] += 1
    session["views"] = session.get("views", 0) + 1
    key = f"page:{k}"
    entry = cache.get(key)
    if entry is not None and not (entry.get("k") == k and digest(k, entry.get("html", "")) == entry.get("sum")):
        counts["wrong"] += 1
        entry = None
    if entry is None:
        html = render(k, compute(k), _page_nbytes)
        entry = {"k": k, "html": html, "sum": digest(k, html)}
        cache.set(key, entry, PAGE_TTL_S)
        counts["computed"] += 1
    _counters.save()
    return HttpResponse(entry["html"])


def login(request):
    """Start a session (its cookie is what wrk sends back)."""
    from django.http import HttpResponse

    request.session["views"] = 0
    return HttpResponse("ok")


def health(request):
    from django.http import HttpResponse

    return HttpResponse(str(os.getpid()))


def make_application():
    """gunicorn's application factory: Django configured from DJBENCH_CACHES (JSON) and DJBENCH_COUNTS (a directory)."""
    global _counters, _page_nbytes, urlpatterns
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="the benchmark's own key, for sessions that live for one run",
        ALLOWED_HOSTS=[LOOPBACK, "localhost"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=["django.contrib.sessions"],
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware"],
        SESSION_ENGINE="django.contrib.sessions.backends.cache",
        CACHES=json.loads(os.environ["DJBENCH_CACHES"]),
    )
    django.setup()
    from django.core.wsgi import get_wsgi_application
    from django.urls import path
    from django.utils.module_loading import import_string

    # Why: the backend's modules are imported here, by the master under --preload (its workers then share them),
    # while its connection or segment handle is still opened by each worker, on first use.
    import_string(settings.CACHES["default"]["BACKEND"])
    import_string(settings.SESSION_ENGINE + ".SessionStore")

    urlpatterns = [path("page", page), path("login", login), path("health", health)]
    _page_nbytes = int(os.environ["DJBENCH_PAGE_NBYTES"])
    _counters = Counters(os.environ["DJBENCH_COUNTS"])
    _counters.current()
    _counters.save()  # the file says this worker is up
    return get_wsgi_application()


urlpatterns: list = []  # set by make_application (ROOT_URLCONF is this module)


# ---------------------------------------------------------------------------------------------------- the driver


def cache_settings(backend: str, server, name: str, capacity_mb: int, max_entries: int) -> dict:
    """Django's CACHES for ``backend``; the same capacity where the backend takes one."""
    if backend == "shmcache":
        default = {"BACKEND": "shmcache.contrib.django.SharedMemoryCache", "LOCATION": name,
                   "OPTIONS": {"capacity_bytes": capacity_mb * 2**20, "max_entries": max_entries}}
    elif backend == "locmem":
        # Why MAX_ENTRIES: Django's default (300) would cull most pages; each worker may keep them all instead.
        default = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": name,
                   "OPTIONS": {"MAX_ENTRIES": max_entries}}
    elif backend == "memcached":
        default = {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache", "LOCATION": server.location}
    elif backend == "redis":
        default = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": server.url}
    else:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    return {"default": {**default, "TIMEOUT": PAGE_TTL_S}}


def start_server(backend: str, capacity_mb: int):
    """The memcached or redis-server ``backend`` needs (a fresh, empty one), or None."""
    from benchmarks.servers import MemcachedServer, RedisServer

    if backend == "memcached":
        return MemcachedServer(memory_mb=capacity_mb)
    if backend == "redis":
        return RedisServer(tcp=True)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def mapping_pss_bytes(pids: list[int], path: str) -> int:
    """The sum of the processes' PSS in their mappings of the file ``path``: the file's pages that any maps."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps") as f:
                inside = False
                for line in f:
                    if MAPPING_HEADER.match(line):
                        inside = line.rstrip("\n").endswith(" " + path)
                    elif inside and line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def children(pid: int) -> list[int]:
    pids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except FileNotFoundError:
        pass
    return pids


def http_get(url: str, timeout: float = 10.0) -> tuple[str, list[str]]:
    """The body and the Set-Cookie headers of a GET."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode(), r.headers.get_all("Set-Cookie") or []


class Site:
    """gunicorn serving this module's site with ``cache`` settings, in a session (process group) of its own."""

    def __init__(self, caches: dict, workers: int, page_nbytes: int, directory: str, preload: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.counts = os.path.join(directory, "counts")
        os.mkdir(self.counts)
        self.log_path = os.path.join(directory, "gunicorn.log")
        env = {**os.environ, "DJBENCH_CACHES": json.dumps(caches), "DJBENCH_COUNTS": self.counts,
               "DJBENCH_PAGE_NBYTES": str(page_nbytes),
               "PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "gunicorn", "-w", str(workers), "-k", "sync", "-b", f"{LOOPBACK}:{self.port}",
               "--timeout", "60", "--graceful-timeout", "5", "--error-logfile", self.log_path, "--chdir", REPO_ROOT,
               *(["--preload"] if preload else []), "benchmarks.apps.django_site:make_application()"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            self._wait_ready(workers, preload)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, workers: int, preload: bool) -> None:
        """Until every worker is forked and has loaded the site (written its counts file; with ``preload``, the
        master did before forking) and the site answers."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start within {START_TIMEOUT_S} s: {self.log_tail()}")
            if len(children(self.proc.pid)) >= workers and (preload or len(os.listdir(self.counts)) >= workers):
                try:
                    http_get(f"{self.url}/health", timeout=5)
                    return
                except OSError:
                    pass
            time.sleep(0.1)

    def log_tail(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def pids(self) -> list[int]:
        """The master and its workers."""
        return [self.proc.pid, *children(self.proc.pid)]

    def make_sessions(self, n: int) -> list[str]:
        keys = []
        for _ in range(n):
            _, cookies = http_get(f"{self.url}/login")
            jar = http.cookies.SimpleCookie()
            for header in cookies:
                jar.load(header)
            keys.append(jar[SESSION_COOKIE].value)
        return keys

    def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after STOP_TIMEOUT_S; waits for the master."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers the master did not reap, if any
        except ProcessLookupError:
            pass
        self.proc.wait(STOP_TIMEOUT_S)


# ---------------------------------------------------------------------------------------------------- wrk


WRK_SCRIPT = """
-- Zipf-distributed page keys (inverse CDF by bisection) and a round of session cookies; one JSON line at the end.
local cdf = {%(cdf)s}
local cookies = {%(cookies)s}
local nthreads = 0
function setup(thread)
  nthreads = nthreads + 1
  thread:set("id", nthreads)
end
function init(args)
  math.randomseed(%(seed)d + 7919 * id)
  turn = id
end
function request()
  local u = math.random()
  local lo, hi = 1, #cdf
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  turn = turn + 1
  return wrk.format("GET", "/page?k=" .. (lo - 1), {["Cookie"] = "%(cookie)s=" .. cookies[turn %% #cookies + 1]})
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('DJBENCH {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p90_us": %%d, ' ..
    '"p99_us": %%d, "max_us": %%d, "connect_errors": %%d, "read_errors": %%d, "write_errors": %%d, ' ..
    '"status_errors": %%d, "timeouts": %%d}\\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(90), latency:percentile(99), latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def zipf_cdf(keys: int, exponent: float) -> list[float]:
    weights = [1.0 / (i + 1) ** exponent for i in range(keys)]
    total, acc, cdf = sum(weights), 0.0, []
    for w in weights:
        acc += w
        cdf.append(acc / total)
    cdf[-1] = 1.0
    return cdf


def write_wrk_script(path: str, keys: int, exponent: float, sessions: list[str], seed: int) -> None:
    cdf = ",".join(f"{p:.9g}" for p in zipf_cdf(keys, exponent))
    cookies = ",".join(f'"{s}"' for s in sessions)
    with open(path, "w") as f:
        f.write(WRK_SCRIPT % {"cdf": cdf, "cookies": cookies, "cookie": SESSION_COOKIE, "seed": seed})


def run_wrk(url: str, script: str, seconds: int, args) -> dict:
    cmd = ["wrk", "-t", str(args.threads), "-c", str(args.connections), "-d", f"{seconds}s", "--latency",
           "--timeout", "10s", "-s", script, f"{url}/page"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("DJBENCH ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    result = json.loads(lines[-1][len("DJBENCH "):])
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def warm_up(url: str, sessions: list[str], args) -> None:
    """``args.warmup_requests`` requests drawn as wrk draws them (from Python's generator: other draws), from
    ``args.connections`` threads.

    Why not wrk: its run lasts its whole ``-d`` whatever a script's ``thread:stop()`` does, and a stopped thread's
    open connections hold sync workers until gunicorn's timeout kills them.
    """
    cdf = zipf_cdf(args.keys, args.zipf)
    rng = random.Random(args.seed)
    draws = [bisect.bisect_left(cdf, rng.random()) for _ in range(args.warmup_requests)]

    def one(i: int) -> None:
        cookie = f"{SESSION_COOKIE}={sessions[i % len(sessions)]}"
        request = urllib.request.Request(f"{url}/page?k={draws[i]}", headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=WARMUP_TIMEOUT_S) as r:
            r.read()

    with ThreadPoolExecutor(args.connections) as pool:
        for _ in pool.map(one, range(len(draws))):
            pass  # an error is raised here


# ---------------------------------------------------------------------------------------------------- one run


def run_one(backend: str, round_no: int, args) -> dict:
    """One gunicorn over an empty ``backend`` cache, loaded by wrk for ``args.seconds``; its figures."""
    from shmcache import SharedCache
    from shmcache.layout.dtypes import SEGMENT_PREFIX

    directory = tempfile.mkdtemp(prefix="shmcache-djbench-")
    name = f"djbench-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    server = site = None
    try:
        server = start_server(backend, args.capacity_mb)
        site = Site(cache_settings(backend, server, name, args.capacity_mb, args.max_entries), args.workers,
                    args.page_kb * 1024, directory, args.preload)
        sessions = site.make_sessions(args.sessions)
        warm_up(site.url, sessions, args)
        script = os.path.join(directory, "zipf.lua")
        write_wrk_script(script, args.keys, args.zipf, sessions, args.seed)
        before = read_counters(site.counts)
        load = run_wrk(site.url, script, args.seconds, args)
        pids = site.pids()
        result = {"backend": backend, "round": round_no, **load, "workers_pss_bytes": pss_total(pids),
                  "pss_bytes_by_process": [pss_total([pid]) for pid in pids],
                  "gunicorn_pids": pids}
        after = read_counters(site.counts)
        result.update({f: after[f] - before[f] for f in COUNTER_FIELDS})
        result["worker_processes"] = after["workers"]
        result["hit_rate"] = 1 - result["computed"] / result["served"] if result["served"] else None
        if server is not None:
            result["server_pss_bytes"] = pss_total([server.pid])
        if backend == "shmcache":
            path = f"/dev/shm/{SEGMENT_PREFIX}{name}"
            st = os.stat(path)
            result["segment_bytes"] = st.st_size
            result["segment_resident_bytes"] = st.st_blocks * 512
            # Invariant: posix_fallocate made every page of the segment resident; the pages no worker has touched
            # are in no process's PSS, but they are memory all the same.
            result["segment_mapped_bytes"] = mapping_pss_bytes(pids, path)
            result["segment_unmapped_bytes"] = max(0, st.st_blocks * 512 - result["segment_mapped_bytes"])
        if result["wrong"]:
            raise RuntimeError(f"{backend}: {result['wrong']} cached pages were not the page asked for")
        return result
    finally:
        try:
            if site is not None:
                site.stop()
        finally:
            try:
                if server is not None:
                    server.stop()
            finally:
                try:
                    SharedCache.unlink_name(name)
                except FileNotFoundError:
                    pass  # not shmcache, or it never started
                shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- the report


def summarize(runs: list[dict]) -> dict:
    """The median of every figure across rounds, by backend."""
    summary = {}
    for backend in dict.fromkeys(r["backend"] for r in runs):
        rs = [r for r in runs if r["backend"] == backend]
        row = {"rounds": len(rs)}
        for field in ("rps", "p50_us", "p99_us", "hit_rate", "workers_pss_bytes", "server_pss_bytes",
                      "segment_bytes", "segment_resident_bytes", "segment_mapped_bytes", "segment_unmapped_bytes",
                      "lost_sessions",
                      "served"):
            values = [r[field] for r in rs if r.get(field) is not None]
            if values:
                row[field] = statistics.median(values)
        row["errors"] = sum(r["connect_errors"] + r["read_errors"] + r["write_errors"] + r["status_errors"]
                            + r["timeouts"] for r in rs)
        row["total_bytes"] = (row["workers_pss_bytes"] + row.get("server_pss_bytes", 0)
                              + row.get("segment_unmapped_bytes", 0))
        summary[backend] = row
    return summary


def progress(r: dict) -> str:
    """One run's line."""
    line = (f"round {r['round']} {r['backend']:9s} {r['rps']:7.0f} req/s  p50 {r['p50_us'] / 1e3:6.1f} ms  "
            f"p99 {r['p99_us'] / 1e3:6.1f} ms  hits {r['hit_rate']:.1%}  gunicorn PSS {_mb(r['workers_pss_bytes'])} MB")
    if "server_pss_bytes" in r:
        line += f"  server PSS {_mb(r['server_pss_bytes'])} MB"
    return line


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def table(summary: dict) -> str:
    lines = ["| backend | requests/s | p50 ms | p99 ms | hit rate | sessions lost | gunicorn PSS MB | server PSS MB "
             "| segment outside PSS MB | total MB | errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for backend, r in summary.items():
        lost = f"{r['lost_sessions'] / r['served']:.0%}" if r.get("served") else "-"
        lines.append(f"| {backend} | {r['rps']:.0f} | {r['p50_us'] / 1e3:.1f} | {r['p99_us'] / 1e3:.1f} "
                     f"| {r['hit_rate']:.1%} | {lost} | {_mb(r['workers_pss_bytes'])} "
                     f"| {_mb(r.get('server_pss_bytes'))} | {_mb(r.get('segment_unmapped_bytes'))} "
                     f"| {_mb(r['total_bytes'])} | {r['errors']} |")
    return "\n".join(lines)


def plot(summary: dict, path: str, title: str) -> None:
    """Requests/s and memory (gunicorn's PSS, stacked with the server's) per backend, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(summary)
    colours = [plt.cm.tab10(i) for i in range(len(backends))]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    rps = [summary[b]["rps"] for b in backends]
    bars = ax1.bar(backends, rps, color=colours)
    for bar, b in zip(bars, backends):
        r = summary[b]
        ax1.annotate(f"{r['rps']:.0f}/s\np99 {r['p99_us'] / 1e3:.0f} ms\nhits {r['hit_rate']:.0%}",
                     (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("requests/s (median of rounds)")
    ax1.set_ylim(0, max(rps) * 1.35)
    ax1.set_title("throughput")
    workers = [summary[b]["workers_pss_bytes"] / 2**20 for b in backends]
    servers = [(summary[b].get("server_pss_bytes", 0) + summary[b].get("segment_unmapped_bytes", 0)) / 2**20
               for b in backends]
    ax2.bar(backends, workers, color=colours, label="gunicorn master + workers (PSS)")
    ax2.bar(backends, servers, bottom=workers, color="lightgrey", hatch="//",
            label="memcached / redis-server PSS;\nshmcache segment pages in no PSS")
    for i, _b in enumerate(backends):
        ax2.annotate(f"{workers[i] + servers[i]:.0f} MB", (i, workers[i] + servers[i]), ha="center", va="bottom",
                     fontsize=8)
    ax2.set_ylabel("memory at the end of the run, MB")
    ax2.set_ylim(0, max(w + s for w, s in zip(workers, servers)) * 1.2)
    ax2.set_title("memory")
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=20, help="wrk's duration per run")
    ap.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    ap.add_argument("--connections", type=int, default=32, help="wrk's concurrent connections")
    ap.add_argument("--threads", type=int, default=2, help="wrk's threads")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each backend, interleaved; medians are reported")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--warmup-requests", type=int, default=2000,
                    help="requests of the same load (other draws) before each measured run; 0: a cold cache")
    ap.add_argument("--keys", type=int, default=2000, help="distinct pages")
    ap.add_argument("--page-kb", type=int, default=16, help="the size of a page's HTML")
    ap.add_argument("--zipf", type=float, default=1.0, help="the Zipf exponent of the page keys' popularity")
    ap.add_argument("--sessions", type=int, default=64, help="session cookies wrk sends in turn")
    ap.add_argument("--capacity-mb", type=int, default=64, help="shmcache's capacity_bytes and memcached's -m")
    ap.add_argument("--max-entries", type=int, default=20_000, help="shmcache's max_entries, LocMemCache's MAX_ENTRIES")
    ap.add_argument("--preload", action="store_true",
                    help="gunicorn --preload: the master imports the site, its workers share those pages")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="write every run and the summary to FILE as JSON")
    ap.add_argument("--plot", metavar="FILE", help="draw requests/s and memory per backend into FILE (PNG)")
    args = ap.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        ap.error(f"unknown backends {unknown}: choose from {','.join(BACKENDS)}")
    if shutil.which("wrk") is None:
        ap.error("wrk is not on PATH (Debian: apt-get install wrk)")
    runs = []
    for round_no in range(1, args.rounds + 1):
        for backend in backends:  # interleaved, so a slow spell of the machine touches every backend
            r = run_one(backend, round_no, args)
            runs.append(r)
            print(progress(r), file=sys.stderr, flush=True)
    summary = summarize(runs)
    preload = " (--preload)" if args.preload else ""
    about = (f"{args.workers} gunicorn sync workers{preload}, wrk -t{args.threads} -c{args.connections} "
             f"-d{args.seconds}s after {args.warmup_requests} requests of warm-up, "
             f"{args.keys} pages of {args.page_kb} KiB (Zipf {args.zipf}), {args.sessions} sessions, "
             f"median of {args.rounds} round(s), {os.cpu_count()} CPUs")
    print(about)
    print(table(summary))
    shm = summary.get("shmcache")
    if shm:
        print(f"shmcache segment: {_mb(shm['segment_bytes'])} MB ({args.capacity_mb} MB of capacity_bytes, the "
              f"index and entry table for {args.max_entries} entries), {_mb(shm['segment_resident_bytes'])} MB "
              f"resident: {_mb(shm['segment_mapped_bytes'])} MB mapped by the workers (in their PSS), "
              f"{_mb(shm['segment_unmapped_bytes'])} MB by none")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "about": about, "runs": runs, "summary": summary}, f, indent=1)
    if args.plot:
        plot(summary, args.plot, about)
    return 0


if __name__ == "__main__":
    sys.exit(main())
