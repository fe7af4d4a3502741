"""CacheStats and CacheLimits, and reading them from the header words (the caller holds the lock)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .layout.dtypes import (
    H_ARENA_NBYTES, H_ARENA_USED, H_CAPACITY_BYTES, H_CLEARS, H_COMPUTATIONS, H_DELETES, H_ENTRIES, H_ENTRY_SLOTS,
    H_EVICTIONS, H_EXPIRED, H_HITS, H_MAX_ENTRIES, H_MAX_RETAINED, H_MISSES, H_PUTS, H_RECOVERIES, H_RETAINED,
    H_TAKEOVERS, H_UPDATES, H_WAITS, H_ADMITTED, H_GHOST_HITS, H_NOT_ADMITTED, H_POLICY, H_PROMOTED, H_SMALL,
    H_TOO_LARGE, POLICY_NAMES, H_CAPACITY, H_RESIZES, A_PREFERRED, A_REFUSED, MAX_COUNTER, POLICY_AUTO, D_SWITCH_BUMPS,
    STALE_COUNTERS,
)

from .policies.auto import window_target
from .readers import set_aside, totals as reader_totals

if TYPE_CHECKING:
    from .kinds import KindStats
    from .tier.stats import TierStats

# Counters that clear() sets back to zero (clears and recoveries keep counting: they describe the segment's life).
RESET_BY_CLEAR = (H_HITS, H_MISSES, H_PUTS, H_UPDATES, H_DELETES, H_EVICTIONS, H_EXPIRED, H_COMPUTATIONS, H_WAITS,
                  H_TAKEOVERS, H_ADMITTED, H_NOT_ADMITTED, H_PROMOTED, H_GHOST_HITS, H_TOO_LARGE)


@dataclass(frozen=True)
class CacheLimits:
    """The limits a cache enforces: at most ``max_entries`` entries and ``max_retained_bytes`` of encoded keys and
    values. Both must be positive and at most the capacity the cache was created with."""

    max_entries: int
    max_retained_bytes: int

    def __post_init__(self) -> None:
        for what in ("max_entries", "max_retained_bytes"):
            n = getattr(self, what)
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"{what} must be an int, got {type(n).__name__}")
            if n <= 0:
                raise ValueError(f"{what} must be positive, got {n}")


@dataclass(frozen=True)
class CacheStats:
    """A consistent snapshot of a cache's global counters, the same from every process.

    ``entries`` and ``retained_bytes`` are what the segment holds: resident entries, every kind's, expired ones
    not yet dropped included (they take room until a lookup, ``expire()`` or a need for room drops them), where
    ``len()`` counts only the live entries iteration yields, of no kind.
    ``puts`` counts every successful put, ``updates`` those that replaced an existing key; ``evictions`` counts
    entries dropped to respect a limit; ``retained_bytes`` is the logical payload (encoded keys plus values), while
    ``arena_used_bytes`` is what their blocks physically take in the ``arena_bytes`` of the segment.
    ``computations`` counts the functions ``get_or_compute`` ran, ``waits`` the calls that waited for another
    caller computing the same key, and ``takeovers`` the waits that ended without a value (the computer raised or
    died), after which the waiter computed it. ``expired`` counts entries dropped because their time to live ran
    out (a lookup that finds one expired also counts a miss). ``too_large`` counts the stores refused with
    ``TooLargeError`` (an entry over ``max_retained_bytes``, or over the capacity), by every process: a value
    ``get_or_compute`` or ``memoize`` computed and could not keep is computed again by the next call (a
    ``TooLargeWarning`` says so once). ``kinds`` maps each key kind's name to its resident entries and bytes
    (``SharedCache.kind``).

    ``policy`` is the cache's eviction policy. ``admitted`` counts new entries stored and ``not_admitted`` the puts
    of a new entry not stored (``keep`` refuses one when the cache is full; every policy one whose room is all
    pinned or held by open views). Under ``s3fifo``,
    ``small_entries`` is how many entries the small queue holds, ``promoted`` counts those it moved to main for
    their hits and ``ghost_hits`` the new keys admitted straight to main because the ghost remembered them. Under
    ``auto``, ``small_entries`` is how many entries its window holds and ``window_target`` how many it aims at now
    (what the climber chose), ``promoted`` counts the entries that went from the window to main with a hit there, and
    ``filter_admitted`` and ``filter_refused`` the window's unhit entries the frequency sketch found more frequent
    than main's next victim (which they replaced) and those it did not (they left the cache). Under the other
    policies these are 0.

    Under ``s3fifo`` and ``keep`` the compiled section answers gets and views without the lock: ``unlocked_reads``
    counts those lookups (``hits`` and ``misses`` include them), ``read_retries`` the reads begun again because a
    writer changed what they were reading, ``read_fallbacks`` those that took the lock after all (a writer kept at
    it, an expired entry to drop).

    ``capacity_bytes`` is the capacity in force and ``max_capacity_bytes`` the most a resize reaches (fixed at
    creation); ``resizes`` counts the resizes made (``SharedCache.resize``, an attacher's other size).

    ``held_entries`` and ``held_bytes`` are the old values a put, delete or pop replaced while a view (of any
    process) was reading them: out of the cache, their bytes kept for the view until its array is gone. They count
    against ``max_entries`` and ``max_retained_bytes`` as entries do (the resident entries make room for them), so a
    cache never holds more than its limits; the next store gives back those no view reads any more.
    """

    hits: int
    misses: int
    puts: int
    updates: int
    deletes: int
    evictions: int
    expired: int
    clears: int
    recoveries: int
    computations: int
    waits: int
    takeovers: int
    entries: int
    retained_bytes: int
    max_entries: int
    max_retained_bytes: int
    capacity_entries: int
    capacity_bytes: int
    arena_bytes: int
    arena_used_bytes: int
    policy: str = "lru"
    admitted: int = 0
    not_admitted: int = 0
    small_entries: int = 0
    promoted: int = 0
    ghost_hits: int = 0
    window_target: int = 0
    filter_admitted: int = 0
    filter_refused: int = 0
    unlocked_reads: int = 0
    read_retries: int = 0
    read_fallbacks: int = 0
    too_large: int = 0
    max_capacity_bytes: int = 0
    resizes: int = 0
    held_entries: int = 0
    held_bytes: int = 0
    stale_hits: int = 0
    refreshes: int = 0
    refresh_failures: int = 0
    kinds: dict[str, KindStats] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        """hits / (hits + misses), 0.0 before the first lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict, hit_ratio included."""
        d = asdict(self)
        d["hit_ratio"] = self.hit_ratio
        return d


def read_stats(h, kinds: dict | None = None, readers=None, ghost=None, held: tuple[int, int] = (0, 0),
               stripes=None, idle=None) -> CacheStats:
    """Snapshot the counters from header words ``h``; ``kinds``: the per-kind counts, by name; ``readers``: the
    segment's reader slots (``Segment.reader_words``), whose counts are added (``readers.totals``); ``ghost``: the
    ghost region in force, whose state words auto's fields come from; ``held``: the held entries' count and bytes
    (``Table.held``); ``stripes``: the stripes region (``Segment.stripe_words``; None before version 11), whose
    stale-serving counters are read, each clamped to a counter's range; ``idle``: the idle region's words
    (``Segment.idle_words``; version 16), whose count of the resizes the idle columns' switch made is left out of
    ``resizes``."""
    stale = (0, 0, 0) if stripes is None else tuple(min(max(stripes[w], 0), MAX_COUNTER) for w in STALE_COUNTERS)
    hits, misses, retries, fallbacks = (0, 0, 0, 0) if readers is None else reader_totals(h, readers)
    resizes = h[H_RESIZES]
    if idle is not None:
        resizes -= min(max(idle[D_SWITCH_BUMPS], 0), max(resizes, 0))
    window = preferred = refused = 0
    if ghost is not None and h[H_POLICY] == POLICY_AUTO and len(ghost):
        window = window_target(h[H_MAX_ENTRIES], ghost)
        preferred, refused = (min(max(ghost[w], 0), MAX_COUNTER) for w in (A_PREFERRED, A_REFUSED))
    return CacheStats(
        hits=h[H_HITS] + hits, misses=h[H_MISSES] + misses, unlocked_reads=hits + misses, read_retries=retries,
        read_fallbacks=fallbacks, puts=h[H_PUTS], updates=h[H_UPDATES], deletes=h[H_DELETES],
        evictions=h[H_EVICTIONS], expired=h[H_EXPIRED], clears=h[H_CLEARS], recoveries=h[H_RECOVERIES],
        computations=h[H_COMPUTATIONS],
        waits=h[H_WAITS], takeovers=h[H_TAKEOVERS], entries=h[H_ENTRIES],
        retained_bytes=h[H_RETAINED], max_entries=h[H_MAX_ENTRIES], max_retained_bytes=h[H_MAX_RETAINED],
        capacity_entries=h[H_ENTRY_SLOTS] - 1,
        capacity_bytes=h[H_CAPACITY] if 0 < h[H_CAPACITY] <= h[H_CAPACITY_BYTES] else h[H_CAPACITY_BYTES],
        max_capacity_bytes=h[H_CAPACITY_BYTES], resizes=resizes, arena_bytes=h[H_ARENA_NBYTES],
        arena_used_bytes=h[H_ARENA_USED], admitted=h[H_ADMITTED],
        policy=POLICY_NAMES[h[H_POLICY]] if 0 <= h[H_POLICY] < len(POLICY_NAMES) else "?",
        not_admitted=h[H_NOT_ADMITTED], small_entries=h[H_SMALL], promoted=h[H_PROMOTED], ghost_hits=h[H_GHOST_HITS],
        window_target=window, filter_admitted=preferred, filter_refused=refused, too_large=h[H_TOO_LARGE],
        held_entries=held[0], held_bytes=held[1], stale_hits=stale[0], refreshes=stale[1], refresh_failures=stale[2],
        kinds=kinds or {},
    )


def reset_counters(h, readers=None, stripes=None) -> None:
    """clear()'s reset: the header's counters zeroed, the reader slots' sums set aside (``readers.set_aside``), and
    the stale-serving counters of the stripes region (version 11 and later) zeroed."""
    for w in RESET_BY_CLEAR:
        h[w] = 0
    if readers is not None:
        set_aside(h, readers)
    if stripes is not None:
        for w in STALE_COUNTERS:
            stripes[w] = 0


# (field, metric suffix, type, help) for the Prometheus exposition; counters get the conventional _total suffix.
_PROMETHEUS = (
    ("hits", "hits_total", "counter", "lookups that found their key"),
    ("misses", "misses_total", "counter", "lookups that did not"),
    ("puts", "puts_total", "counter", "successful puts"),
    ("updates", "updates_total", "counter", "puts that replaced a resident key"),
    ("deletes", "deletes_total", "counter", "entries deleted"),
    ("evictions", "evictions_total", "counter", "entries evicted to respect a limit"),
    ("expired", "expired_total", "counter", "entries dropped because their time to live ran out"),
    ("clears", "clears_total", "counter", "clear() calls"),
    ("recoveries", "recoveries_total", "counter", "repairs after a holder died or data was damaged"),
    ("computations", "computations_total", "counter", "functions run by get_or_compute"),
    ("waits", "waits_total", "counter", "get_or_compute calls that waited for another caller's computation"),
    ("takeovers", "takeovers_total", "counter", "waits that ended without a value, then computed here"),
    ("stale_hits", "stale_hits_total", "counter", "get_or_compute calls answered with a stale value (stale_ttl)"),
    ("refreshes", "refreshes_total", "counter", "background refreshes of a stale value"),
    ("refresh_failures", "refresh_failures_total", "counter", "background refreshes whose function raised"),
    ("too_large", "too_large_total", "counter", "stores refused: the entry can never fit the byte limit"),
    ("admitted", "admitted_total", "counter", "new entries stored"),
    ("not_admitted", "not_admitted_total", "counter", "puts of a new entry not stored (keep, full; or its room "
     "pinned or held by open views)"),
    ("promoted", "promoted_total", "counter", "s3fifo: entries moved from the small queue to main for their hits"),
    ("ghost_hits", "ghost_hits_total", "counter", "s3fifo: new keys admitted to main, remembered by the ghost"),
    ("filter_admitted", "filter_admitted_total", "counter",
     "auto: window entries the frequency sketch preferred to main's victim"),
    ("filter_refused", "filter_refused_total", "counter", "auto: window entries the frequency sketch let go"),
    ("unlocked_reads", "unlocked_reads_total", "counter", "lookups answered without the lock (s3fifo, keep, auto)"),
    ("read_retries", "read_retries_total", "counter", "reads without the lock begun again under a writer"),
    ("read_fallbacks", "read_fallbacks_total", "counter", "reads without the lock that took the lock after all"),
    ("entries", "entries", "gauge", "resident entries"),
    ("small_entries", "small_entries", "gauge", "s3fifo: entries in the small queue; auto: in the window"),
    ("window_target", "window_target", "gauge", "auto: the entries the window aims at now"),
    ("retained_bytes", "retained_bytes", "gauge", "encoded keys and values held"),
    ("max_entries", "max_entries", "gauge", "current entry limit"),
    ("max_retained_bytes", "max_retained_bytes", "gauge", "current byte limit"),
    ("capacity_entries", "capacity_entries", "gauge", "highest entry limit possible"),
    ("capacity_bytes", "capacity_bytes", "gauge", "the capacity in force: the highest byte limit without a resize"),
    ("max_capacity_bytes", "max_capacity_bytes", "gauge", "the most capacity a resize reaches"),
    ("resizes", "resizes_total", "counter", "resizes of the capacity or the entry limit"),
    ("arena_bytes", "arena_bytes", "gauge", "bytes of the arena"),
    ("arena_used_bytes", "arena_used_bytes", "gauge", "bytes of the arena in live blocks"),
    ("held_entries", "held_entries", "gauge", "replaced values kept for the views still reading them"),
    ("held_bytes", "held_bytes", "gauge", "their encoded keys and values"),
    ("hit_ratio", "hit_ratio", "gauge", "hits / (hits + misses) since the last clear"),
)


def prometheus_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(stats_by_cache: dict[str, CacheStats],
                    tiers: dict[tuple[str, str], TierStats] | None = None) -> str:
    """Prometheus text exposition (format 0.0.4) of the stats of each named cache, labelled ``cache="NAME"``:
    what a scrape endpoint of a worker pool returns, one set of global numbers whichever worker serves it.
    ``tiers`` maps ``(cache name, namespace)`` to a ``TieredCache``'s ``stats()``: its counters follow, as
    ``shmcache_tier_*`` labelled with both, and its remote latency percentiles as a summary. A family with no sample
    (the kind families of caches without kinds) is left out: the format allows one, but it carries nothing."""
    lines: list[str] = []

    def family(metric: str, kind: str, help_text: str, samples: list[str]) -> None:
        if samples:
            lines.extend((f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}", *samples))

    caches = sorted(stats_by_cache.items())
    family("shmcache_policy_info", "gauge", "the cache's eviction policy, as a label (always 1)",
           [f'shmcache_policy_info{{cache="{prometheus_label(cache)}",policy="{prometheus_label(stats.policy)}"}} 1'
            for cache, stats in caches])
    for attr, suffix, kind, help_text in _PROMETHEUS:
        metric = f"shmcache_{suffix}"
        family(metric, kind, help_text,
               [f'{metric}{{cache="{prometheus_label(cache)}"}} {getattr(stats, attr)!r}' for cache, stats in caches])
    for suffix, attr, help_text in (("kind_entries", "entries", "resident entries of a key kind"),
                                    ("kind_retained_bytes", "retained_bytes", "encoded keys and values of a key kind")):
        metric = f"shmcache_{suffix}"
        family(metric, "gauge", help_text, [
            f'{metric}{{cache="{prometheus_label(cache)}",kind="{prometheus_label(kind)}"}} {getattr(counts, attr)!r}'
            for cache, stats in caches for kind, counts in sorted(stats.kinds.items())])
    if tiers:  # each TierStats formats its kind's lines (the tier package sits above this module)
        lines += next(iter(tiers.values())).prometheus_lines(sorted(tiers.items()))
    return "".join(f"{line}\n" for line in lines)
