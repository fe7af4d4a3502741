"""Public behaviour of SharedCache, one small scenario per test."""

from __future__ import annotations

import numpy as np
import pytest

from shmcache import CacheLimits, ClosedError, SharedCache, TooLargeError
from shmcache.codec import encode_key, encode_value

from .workers import python_path


def entry_size(key, value) -> int:
    return len(encode_key(key)) + len(encode_value(value))


def test_cache_get_put_roundtrip(cache):
    cache.put("a", {"x": 1, "y": [1, 2.5, None, True, "s", b"b"]})
    assert cache.get("a") == {"x": 1, "y": [1, 2.5, None, True, "s", b"b"]}


def test_cache_get_missing_returns_default(cache):
    assert cache.get("nope") is None
    assert cache.get("nope", 42) == 42


def test_cache_mapping_protocol(cache):
    cache["k"] = 1
    assert cache["k"] == 1
    assert "k" in cache and "other" not in cache
    assert len(cache) == 1
    del cache["k"]
    assert "k" not in cache and len(cache) == 0
    with pytest.raises(KeyError):
        cache["k"]
    with pytest.raises(KeyError):
        del cache["k"]


def test_cache_none_value_is_a_hit(cache):
    cache["n"] = None
    assert cache["n"] is None
    assert cache.stats().hits == 1


def test_cache_delete_reports_presence(cache):
    cache.put("a", 1)
    assert cache.delete("a") is True
    assert cache.delete("a") is False


@pytest.mark.parametrize(
    "key",
    ["s", b"b", 7, -(2**70), 2.5, True, None, (1, "a"), [1, 2], {"b": 1, "a": (2, 3)}, np.arange(4, dtype=np.int16)],
)
def test_cache_key_kinds(cache, key):
    cache.put(key, "v")
    assert cache.get(key) == "v"


def test_cache_keys_are_typed(cache):
    cache.put(1, "int")
    cache.put(1.0, "float")
    cache.put(True, "bool")
    cache.put("1", "str")
    assert [cache[1], cache[1.0], cache[True], cache["1"]] == ["int", "float", "bool", "str"]


def test_cache_dict_key_order_does_not_matter(cache):
    cache.put({"a": 1, "b": 2}, "v")
    assert cache.get({"b": 2, "a": 1}) == "v"


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "uint64", "float16", "float32", "float64",
                                   "complex64", "complex128"])
def test_cache_array_values_roundtrip(cache, dtype):
    arr = (np.arange(24) % 3).astype(dtype).reshape(2, 3, 4)
    cache.put("a", arr)
    out = cache.get("a")
    assert out.dtype == arr.dtype and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_cache_array_value_is_private_and_writable(cache):
    cache.put("a", np.zeros(8))
    out = cache.get("a")
    out[:] = 5  # the caller owns it ...
    assert out.flags.writeable
    cache.put("other", np.ones(8))  # ... and later puts cannot change it
    np.testing.assert_array_equal(cache.get("a"), np.zeros(8))
    np.testing.assert_array_equal(out, np.full(8, 5.0))


def test_cache_array_zero_d_and_non_contiguous(cache):
    cache.put("z", np.array(3.5))
    assert cache.get("z").shape == () and cache.get("z") == 3.5
    base = np.arange(20).reshape(4, 5)
    cache.put("t", base.T[::2])
    np.testing.assert_array_equal(cache.get("t"), base.T[::2])


def test_cache_tuple_values_stay_tuples(cache):
    cache.put("t", (1, (2, 3), [4]))
    assert cache.get("t") == (1, (2, 3), [4])


@pytest.mark.parametrize("bad", [object(), {1, object()}, lambda: 0, np.array(["a"]), np.array([object()])])
def test_cache_unencodable_value_raises_type_error_and_changes_nothing(cache, bad):
    cache.put("k", 1)
    before = cache.stats()
    with pytest.raises(TypeError):
        cache.put("k", bad)
    assert cache.get("k") == 1
    assert cache.stats().puts == before.puts


@pytest.mark.parametrize("bad", [object(), {1, object()}, bytearray(b"k")])
def test_cache_unencodable_key_raises_type_error(cache, bad):
    with pytest.raises(TypeError):
        cache.put(bad, 1)
    with pytest.raises(TypeError):
        cache.get(bad)


def test_cache_update_replaces_value(cache):
    cache.put("k", "old")
    cache.put("k", "new" * 10)
    assert cache.get("k") == "new" * 10
    s = cache.stats()
    assert (s.puts, s.updates, s.entries) == (2, 1, 1)
    assert s.retained_bytes == entry_size("k", "new" * 10)


@pytest.mark.parametrize("new", ["abcdefgh", "abcdefghi", "abc", b"\x00" * 8, 12345])
def test_cache_update_in_place_keeps_every_structure_consistent(cache, new):
    """An update whose block is as large as the old one rewrites it in place (the other cases here remove and
    insert): the value, the key behind it, the byte count and the LRU position come out the same either way."""
    for k in ("a", "b", "c"):
        cache.put(k, "abcdefgh")
    cache.put("a", new)
    assert cache.get("a") == new and cache.get("b") == "abcdefgh"
    s = cache.stats()
    assert (s.entries, s.updates) == (3, 1)
    assert s.retained_bytes == entry_size("a", new) + 2 * entry_size("b", "abcdefgh")
    assert cache.verify(deep=True).ok
    # evicts the least recent: "c" ("b" and "a" were read after it)
    cache.set_limits(CacheLimits(max_entries=2, max_retained_bytes=64 * 1024))
    assert "c" not in cache and "a" in cache and "b" in cache


def test_cache_update_in_place_past_the_byte_limit_evicts_others(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True) as c:
        c.put("old", b"x" * 100)
        c.put("k", b"y" * 1001)
        c.set_limits(CacheLimits(8, entry_size("old", b"x" * 100) + entry_size("k", b"y" * 1001)))
        c.put("k", b"z" * 1007)  # same block size, but six more bytes than the limit leaves
        assert c.get("k") == b"z" * 1007 and "old" not in c
        assert c.stats().evictions == 1 and c.verify(deep=True).ok


def test_cache_lru_evicts_least_recent_by_entries(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=3, create=True, policy="lru") as c:
        for k in "abc":
            c.put(k, k)
        c.get("a")  # a becomes most recent; b is now the least
        c.put("d", "d")
        assert "b" not in c and all(k in c for k in "acd")
        assert c.stats().evictions == 1


def test_cache_lru_evicts_by_bytes(name):
    with SharedCache(name, capacity_bytes=1000, max_entries=100, create=True, policy="lru") as c:
        for i in range(10):
            c.put(i, b"x" * 200)  # each ~ 205 bytes: four fit in 1000
        s = c.stats()
        assert s.entries == 4 and s.retained_bytes <= 1000
        assert [i in c for i in range(10)] == [False] * 6 + [True] * 4


def test_cache_too_large_put_raises_and_evicts_nothing(cache):
    cache.put("a", 1)
    with pytest.raises(TooLargeError) as info:
        cache.put("big", b"x" * (64 * 1024))
    assert isinstance(info.value, ValueError)
    assert "max_retained_bytes" in str(info.value) or "capacity_bytes" in str(info.value)
    assert cache.get("a") == 1 and cache.stats().evictions == 0


def test_cache_too_large_update_keeps_old_value(cache):
    cache.put("a", 1)
    cache.set_limits(CacheLimits(max_entries=64, max_retained_bytes=100))
    with pytest.raises(TooLargeError):
        cache.put("a", b"x" * 200)
    assert cache.get("a") == 1


@pytest.mark.policy("lru")  # whose order says which five stay
def test_cache_set_limits_evicts_at_once(cache):
    for i in range(20):
        cache.put(i, i)
    cache.set_limits(CacheLimits(max_entries=5, max_retained_bytes=64 * 1024))
    assert len(cache) == 5 and all(i in cache for i in range(15, 20))
    assert cache.limits() == CacheLimits(5, 64 * 1024)
    assert cache.stats().evictions == 15


def test_cache_set_limits_above_what_it_was_made_for_raises(cache):
    """Above the capacity a byte limit grows it (a resize); above max_capacity_bytes or the most entries the tables
    reach (16 times those of creation), a refusal."""
    with pytest.raises(ValueError, match="1024"):
        cache.set_limits(CacheLimits(max_entries=16 * 64 + 1, max_retained_bytes=1024))
    with pytest.raises(ValueError):
        cache.set_limits(CacheLimits(max_entries=10, max_retained_bytes=cache.max_capacity_bytes + 1))
    assert cache.limits() == CacheLimits(64, 64 * 1024) and cache.stats().resizes == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_cache_limits_reject_bad_values(bad):
    with pytest.raises((ValueError, TypeError)):
        CacheLimits(max_entries=bad, max_retained_bytes=10)
    with pytest.raises((ValueError, TypeError)):
        CacheLimits(max_entries=10, max_retained_bytes=bad)


def test_cache_set_limits_raise_again_lets_it_grow(cache):
    cache.set_limits(CacheLimits(max_entries=2, max_retained_bytes=64 * 1024))
    cache.set_limits(CacheLimits(max_entries=64, max_retained_bytes=64 * 1024))
    for i in range(64):
        cache.put(i, i)
    assert len(cache) == 64


def test_cache_clear_drops_entries_and_resets_counters(cache):
    for i in range(10):
        cache.put(i, i)
    cache.get(1)
    cache.get("missing")
    cache.clear()
    s = cache.stats()
    assert len(cache) == 0 and 1 not in cache
    assert ((s.hits, s.misses, s.puts, s.entries, s.retained_bytes, s.arena_used_bytes, s.clears)
            == (0, 0, 0, 0, 0, 0, 1))
    cache.put("again", 1)
    assert cache.get("again") == 1
    assert cache.verify().ok


def test_cache_fragmentation_never_fails_a_put_within_limits(name):
    rng = np.random.default_rng(1)
    with SharedCache(name, capacity_bytes=50_000, max_entries=200, create=True) as c:
        for i in range(3000):
            size = int(rng.integers(1, 8000))
            c.put(int(rng.integers(0, 300)), b"v" * size)
            if i % 7 == 0:
                c.delete(int(rng.integers(0, 300)))
        s = c.stats()
        assert s.retained_bytes <= 50_000 and s.entries <= 200
        assert c.verify().ok


def test_cache_entry_exactly_at_the_byte_limit_fits(name):
    with SharedCache(name, capacity_bytes=1000, max_entries=4, create=True) as c:
        c.put("a", b"x")
        value = b"y" * (1000 - entry_size("b", b""))
        assert entry_size("b", value) == 1000
        c.put("b", value)
        assert c.get("b") == value and "a" not in c


def test_cache_close_is_idempotent_and_blocks_use(name):
    c = SharedCache(name, create=True, capacity_bytes=4096, max_entries=8)
    c.put("k", 1)
    c.close()
    c.close()
    for op in (lambda: c.get("k"), lambda: c.put("k", 1), lambda: c.delete("k"), lambda: len(c), c.stats, c.clear):
        with pytest.raises(ClosedError):
            op()
    assert "closed" in repr(c)


def test_cache_context_manager_closes(name):
    with SharedCache(name, create=True, capacity_bytes=4096, max_entries=8) as c:
        c.put("k", 1)
    with pytest.raises(ClosedError):
        c.get("k")


def test_cache_hit_ratio(cache):
    assert cache.stats().hit_ratio == 0.0
    cache.put("a", 1)
    cache.get("a")
    cache.get("a")
    cache.get("b")
    assert cache.stats().hit_ratio == pytest.approx(2 / 3)
    assert cache.stats().as_dict()["hit_ratio"] == pytest.approx(2 / 3)


def test_cache_contains_does_not_count_or_reorder(name):
    with SharedCache(name, capacity_bytes=4096, max_entries=2, create=True, policy="lru") as c:
        c.put("a", 1)
        c.put("b", 2)
        assert "a" in c  # no move to front: a stays least recent
        c.put("c", 3)
        assert "a" not in c
        s = c.stats()
        assert (s.hits, s.misses) == (0, 0)


def test_cache_many_entries_index_stays_consistent(name):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=2000, create=True) as c:
        for i in range(5000):
            c.put(f"key-{i}", i)
            if i % 3 == 0:
                c.delete(f"key-{i // 2}")
        present = [i for i in range(5000) if c.get(f"key-{i}") == i]
        assert len(present) == len(c)
        assert c.verify().ok


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, 0, 0.0, -float("inf"), True, "1", None])
def test_cache_lock_timeout_must_be_finite_and_positive(name, bad):
    with pytest.raises(ValueError, match="lock_timeout"):
        SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True, lock_timeout=bad)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, -float("inf"), True, "1"])
def test_cache_get_or_compute_timeout_must_be_finite_or_none(cache, bad):
    with pytest.raises(ValueError, match="timeout"):
        cache.get_or_compute("k", lambda: 1, timeout=bad)
    with pytest.raises(ValueError, match="timeout"):
        cache.memoize(timeout=bad)
    assert cache.get_or_compute("k", lambda: 1, timeout=None) == 1 and cache.get_or_compute("j", lambda: 2,
                                                                                           timeout=0) == 2


def test_cache_lock_timeout_finite_large_works(name):
    with SharedCache(name, capacity_bytes=1 << 16, max_entries=16, create=True, lock_timeout=1e9) as c:
        c.put("k", 1)
        assert c.get("k") == 1


@pytest.mark.parametrize("path", ["compiled", "pure Python"])
def test_cache_update_in_place_never_exceeds_the_byte_limit(name, path):
    """A value one byte longer fits its entry's block (padding), but not the byte limit: the update must not be made
    in place; the least recently used entry makes the room."""
    with SharedCache(name, capacity_bytes=4096, max_entries=8, create=True) as c:
        if path == "compiled" and c._core is None:
            pytest.skip("the compiled section is not built")
        if path == "pure Python":
            python_path(c)
        c.put("a", b"x" * 100)
        c.put("b", b"y" * 100)
        c.set_limits(max_retained_bytes=c.stats().retained_bytes)
        c.put("b", b"y" * 101)
        s = c.stats()
        assert s.retained_bytes <= s.max_retained_bytes and c.verify().ok
        assert c.get("b") == b"y" * 101 and "a" not in c
