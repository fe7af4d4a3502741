"""``keep``: the dataset policy. Nothing moves on a hit and a new key is admitted only while it fits: once the cache
is full it keeps what it holds (expired entries still make room), which repeated shuffled passes over a dataset
larger than the cache hit as often as any policy can. ``set_limits`` and ``popitem`` take the oldest."""

from __future__ import annotations

from ..layout.dtypes import POLICY_KEEP
from .base import Policy


class Keep(Policy):
    number = POLICY_KEEP
    name = "keep"
    evicts_to_admit = False
