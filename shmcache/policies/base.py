"""The interface every eviction policy answers (``Policy``), and what the list policies (lru, keep) share: table.py
asks it what a hit does, where a new key goes and whether it is admitted, and which entry goes next; verify.py asks
it to check and rebuild its own words; the snapshots, in which order its entries are hottest. table.py alone decides
when to evict. The compiled section's twin is the table of functions in _core_policy.c (``PolicyOps``), chosen at
bind as ``policies.of`` chooses here, once per handle."""

from __future__ import annotations

from ..layout import SENTINEL
from ..layout.dtypes import H_SMALL, H_SMALL_FIRST


class Policy:
    """One eviction policy. The defaults are the list policies': a new entry at the front, the tail the next to
    go (pinned ones passed over), no marks and no words of their own."""

    number = -1  # POLICY_* (layout/dtypes.py): the header's ``policy`` word
    name = ""  # what SharedCache(policy=...) takes
    # Whether gets and views read without the lock (seqlock.py): a hit writes no link, so readers can validate
    # against ``seq`` alone. Also whether writers open ``seq`` (Guard, Table.seqlocked).
    reads_unlocked = True
    relinks_on_hit = False  # a hit moves its entry (lru): a write of links, in a dirty bracket, under the lock
    marks_on_hit = False  # a hit raises its entry's counter (s3fifo): one byte, any value valid, no bracket
    # Whether a new key makes its room by evicting; False: it is admitted only while it fits (keep), and counted in
    # ``not_admitted`` when it does not.
    evicts_to_admit = True
    # Whether the next entry to go is the list's tail, pinned ones passed over (Table.evict_until walks it);
    # False: ``evict_one`` chooses, one at a time.
    evicts_from_tail = True
    snapshot_ranks = 1  # how many groups hottest_first orders a snapshot's entries in (``snapshot_rank``)

    def step(self, name: str):
        """This policy's method ``name`` bound, or None where it keeps the base's, which does nothing (or links at the
        front): what the hot paths bind once and skip the call of (Table.__init__)."""
        method = getattr(self, name)
        return None if getattr(type(self), name) is getattr(Policy, name) else method

    def on_hit(self, table, e: int) -> None:
        """A hit on resident entry ``e`` (lock held; the caller raised the dirty word where ``relinks_on_hit``)."""

    def admit(self, table, fp: int) -> bool:
        """Asked before a new key (fingerprint ``fp``) evicts for its room: whether it enters on probation
        (s3fifo's small queue) rather than where a hit would put it."""
        return False

    def link_new(self, table, e: int, probation: bool) -> tuple[int, int]:
        """Where new entry ``e`` is linked: its (prev, next); its marks and the policy's words set."""
        table.marks[e] = 0
        return SENTINEL, table.rec.next[SENTINEL]  # after the sentinel, before the most recent entry

    def unlinked(self, table, e: int, n: int) -> None:
        """Entry ``e``, whose next was ``n``, has left the list (removed or evicted): the policy's words follow."""

    def leaving(self, table, e: int) -> None:
        """Entry ``e`` is about to be evicted (not removed otherwise)."""

    def evict_one(self, table) -> bool:
        """Evict the entry no view pins that the policy chooses; False if there is none."""
        return table.evict_oldest()

    def check(self, seg, order: list[int], problems) -> None:
        """Add to ``problems`` what is wrong with the policy's words and marks, the list being ``order``."""
        h, marks = seg.header_words, seg.marks_bytes
        odd = [e for e in order if marks[e]]
        if h[H_SMALL_FIRST] != SENTINEL or h[H_SMALL]:
            problems.add(f"small queue words set (small_first={h[H_SMALL_FIRST]}, small={h[H_SMALL]}) under a "
                         "policy without one")
        if odd:
            problems.add(f"entry {odd[0]} has marks {marks[odd[0]]:#x}, which its policy never sets")

    def repair_order(self, seg, kept: list[int]) -> list[int]:
        """The repair's order of the ``kept`` entries (the list's, most recent first) as the policy links them."""
        return kept

    def rebuild(self, seg, kept: list[int]) -> None:
        """The policy's words and marks made again from the ``kept`` entries, linked as ``repair_order`` ordered."""
        h, marks = seg.header_words, seg.marks_bytes
        for e in kept:
            marks[e] = 0
        h[H_SMALL_FIRST], h[H_SMALL] = SENTINEL, 0

    def snapshot_rank(self, mark: int) -> int:
        """The group (0: hottest, below ``snapshot_ranks``) of an entry with marks ``mark`` in a snapshot's order."""
        return 0
