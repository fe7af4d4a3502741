"""Shared fixtures: unique cache names, caches that are always unlinked, and a check that every test leaves
/dev/shm as it found it."""

from __future__ import annotations

import os
import uuid

import pytest

from shmcache import SharedCache

SHM_DIR = "/dev/shm"
PREFIX = "shmcache."


def unique_name(tag: str = "t") -> str:
    return f"{tag}-{os.getpid()}-{uuid.uuid4().hex[:10]}"


def _segments() -> set[str]:
    """Segments named by this test process (unique_name embeds its pid), so parallel runs never see each other's."""
    mark = f"-{os.getpid()}-"
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX) and mark in n}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def leaves_no_segment():
    """Fail a test that leaves a segment behind (and remove it, so one leak does not fail the tests after it)."""
    before = _segments()
    yield
    leaked = _segments() - before
    for n in leaked:
        os.unlink(os.path.join(SHM_DIR, n))
    assert not leaked, f"test left shared-memory segments behind: {sorted(leaked)}"


@pytest.fixture
def name() -> str:
    """A cache name no other test uses; unlinked after the test if it still exists."""
    n = unique_name()
    yield n
    try:
        SharedCache.unlink_name(n)
    except FileNotFoundError:
        pass


@pytest.fixture
def cache(name):
    """A small cache: 64 KiB of payload, 64 entries."""
    c = SharedCache(name, capacity_bytes=64 * 1024, max_entries=64, create=True)
    yield c
    c.close()
