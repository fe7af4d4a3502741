"""``lru`` (the default): exact LRU. A hit moves its entry to the front of the list; the entry at the back goes.
A hit writes links, so every get takes the lock (docs/performance.md says what that costs on many cores)."""

from __future__ import annotations

from .. import lru
from ..layout.dtypes import POLICY_LRU
from .base import Policy


class Lru(Policy):
    number = POLICY_LRU
    name = "lru"
    reads_unlocked = False
    relinks_on_hit = True

    def on_hit(self, table, e: int) -> None:
        lru.move_to_front(table.rec, e)
