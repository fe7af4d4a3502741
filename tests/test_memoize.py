"""SharedCache.memoize: lru_cache's interface, one cache for every process."""

from __future__ import annotations

import functools
import multiprocessing as mp
from typing import NamedTuple

import pytest

from shmcache import SharedCache
from shmcache.codec import encode_key, encode_key_prefix
from shmcache.memo import MemoInfo, function_name

from .workers import memo_partial, memo_slow_square, scaled_sum


def test_memoize_second_call_is_served_from_the_cache(cache):
    calls = []

    @cache.memoize
    def add(a, b=0):
        calls.append((a, b))
        return {"sum": a + b}

    assert add(1, b=2) == {"sum": 3} and add(1, b=2) == {"sum": 3}
    assert calls == [(1, 2)]
    assert add.cache_info() == MemoInfo(hits=1, misses=1, maxsize=64, currsize=1)
    assert add.__name__ == "add" and add.cache_name.endswith("test_memoize_second_call_is_served_from_the_cache"
                                                               ".<locals>.add")


def test_memoize_keyword_order_does_not_matter_types_do(cache):
    calls = []

    @cache.memoize(name="f")
    def f(*args, **kwargs):
        calls.append(1)
        return len(calls)

    assert f(x=1, y=2) == f(y=2, x=1) == 1
    assert f(1) != f(1.0)  # typed, like lru_cache(typed=True)
    assert f(1, b=2) != f(1, 2)  # like lru_cache: positional and keyword are different calls
    assert len(calls) == 5


def test_memoize_functions_do_not_share_entries(cache):
    @cache.memoize(name="one")
    def one(x):
        return ("one", x)

    @cache.memoize(name="two")
    def two(x):
        return ("two", x)

    assert one(5) == ("one", 5) and two(5) == ("two", 5)


def test_memoize_cache_clear_drops_only_its_own_entries(cache):
    @cache.memoize(name="sq")
    def sq(x):
        return x * x

    @cache.memoize(name="sq2")  # a name that begins like the other: still another function
    def sq2(x):
        return -x

    for i in range(5):
        sq(i)
        sq2(i)
    cache.put("plain", 1)
    assert sq.cache_clear() == 5
    assert sq.cache_info() == MemoInfo(0, 0, 64, 0)
    assert cache.stats().entries == 6 and "plain" in cache
    sq(1)
    assert sq.cache_info() == MemoInfo(hits=0, misses=1, maxsize=64, currsize=1)  # computed again
    assert cache.verify(deep=True).ok


def test_memoize_unencodable_argument_is_a_type_error(cache):
    @cache.memoize
    def f(x):
        return 1

    with pytest.raises(TypeError):
        f(object())


def test_memoize_name_is_the_same_in_spawned_children():
    def fake():
        pass

    fake.__module__ = "__mp_main__"
    assert function_name(fake).startswith("__main__.")


def test_key_prefix_begins_every_key_of_the_family():
    for rest in ([(), {}], [(1, "a"), {"k": [1.5]}], [tuple(range(40)), {}]):
        assert encode_key(["fam", "name", *rest]).startswith(encode_key_prefix(["fam", "name"], 4))
    assert not encode_key(["fam", "name2", (), {}]).startswith(encode_key_prefix(["fam", "name"], 4))
    assert not encode_key(["fam", "name", ()]).startswith(encode_key_prefix(["fam", "name"], 4))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_memoize_pool_computes_each_argument_once(name, method):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=256, create=True) as c:
        args = [(name, i % 8) for i in range(48)]
        with mp.get_context(method).Pool(4) as pool:
            results = pool.starmap_async(memo_slow_square, args).get(timeout=90)
        assert results == [(i % 8) ** 2 for i in range(48)]
        s = c.stats()
        assert s.computations == 8 and s.takeovers == 0
        assert s.hits + s.misses == 48 and s.misses == 8

def test_memoize_a_builtin_the_cache_itself_calls(cache):
    """``builtins.len = cache.memoize(len)``: the cache's own code calls len, which must not recurse into the
    wrapper (CPython's test_lru_reentrancy_with_len, for lru_cache); called from outside, it is cached."""
    import builtins

    memo_len = cache.memoize(len)
    old = builtins.len
    builtins.len = memo_len
    try:
        got = [len("abcdefghijklmn"[:i]) for i in (0, 0, 1, 2, 3, 3, 4, 5, 6, 1, 7, 2, 1)]
    finally:
        builtins.len = old
    assert got == [0, 0, 1, 2, 3, 3, 4, 5, 6, 1, 7, 2, 1]
    info = memo_len.cache_info()
    assert info.misses == 8 and info.hits == 5  # the calls from outside were cached, the package's own were not


def test_memoize_a_recursive_function_caches_its_inner_calls(cache):
    @cache.memoize
    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    assert fib(20) == 6765
    info = fib.cache_info()
    assert info.misses == 21 and info.hits == 18


def test_memoize_ignore_leaves_arguments_out_of_the_key(cache):
    calls = []

    @cache.memoize(ignore=("conn", "verbose"))
    def load(item, conn, scale=2, verbose=False):
        calls.append((item, conn, scale, verbose))
        return item * scale

    assert load(3, "db-1") == 6 and load(3, "db-2", verbose=True) == 6  # conn and verbose are no part of the key
    assert load(3, conn="db-3", scale=2) == 6  # bound first: scale=2 is the default, the same entry
    assert load(3, "db-1", 3) == 9  # scale is
    assert calls == [(3, "db-1", 2, False), (3, "db-1", 3, False)]
    assert load.cache_parameters()["ignore"] == ("conn", "verbose")
    with pytest.raises(ValueError, match=r"ignore names 'nope'.*it takes item, conn, scale, verbose"):
        cache.memoize(ignore="nope")(load.__wrapped__)
    with pytest.raises(ValueError, match="not both"):
        cache.memoize(ignore="conn", key=str)(load.__wrapped__)


def test_memoize_key_replaces_the_arguments(cache):
    calls = []

    @cache.memoize(name="user", key=lambda user, **_: user["id"])
    def profile(user, fresh=False):
        calls.append(user["id"])
        return {"id": user["id"], "name": user["name"]}

    assert profile({"id": 7, "name": "Ada"}) == profile({"id": 7, "name": "changed"}, fresh=True)
    assert calls == [7] and profile.cache_info().currsize == 1
    assert profile.cache_clear() == 1
    with pytest.raises(TypeError, match="key must be a function"):
        cache.memoize(key="id")(profile.__wrapped__)


class Shape:
    """Instances are no valid keys (a memoized method is keyed without them)."""

    calls: list = []

    def __init__(self, scale):
        self.scale = scale


def test_memoize_a_method_is_keyed_without_its_instance_unless_key_asks(cache):
    class Area(Shape):
        @cache.memoize(name="area")
        def area(self, side):
            self.calls.append(("area", side))
            return side * side

        @cache.memoize(name="scaled", key=lambda self, side: (self.scale, side))
        def scaled(self, side):
            self.calls.append(("scaled", self.scale, side))
            return self.scale * side

    a, b = Area(2), Area(3)
    assert a.area(4) == b.area(4) == 16 and Shape.calls == [("area", 4)]  # one entry for every instance
    assert a.scaled(4) == 8 and b.scaled(4) == 12 and a.scaled(4) == 8
    assert Shape.calls[1:] == [("scaled", 2, 4), ("scaled", 3, 4)]
    assert a.area.cache_info().currsize == 1 and Area.area.cache_name == "area"
    with pytest.raises(TypeError, match="unsupported key type Area"):
        Area.area(a, 5)  # through the class it is a plain function: the instance is an argument, and no valid key


def test_memoize_a_partial_is_named_by_its_function_and_arguments(cache):
    f = cache.memoize(functools.partial(scaled_sum, 2, scale=10))
    g = cache.memoize(functools.partial(scaled_sum, 3, scale=10))
    assert f(1) == 30 and g(1) == 40 and f(1) == 30
    assert f.cache_info().hits == 1 and g.cache_info().currsize == 1
    assert f.cache_name == "functools.partial(tests.workers.scaled_sum, 2, scale=10)"
    assert "0x" not in f.cache_name


def test_memoize_a_partial_of_arguments_that_are_no_keys_asks_for_a_name(cache):
    with pytest.raises(TypeError, match=r"cannot name a partial object.*unsupported key type method_desc.*name="):
        cache.memoize(functools.partial(sorted, key=str.lower))
    f = cache.memoize(functools.partial(sorted, key=str.lower), name="sorted-ignoring-case")
    assert f(("b", "A")) == f(("b", "A")) == ["A", "b"] and f.cache_info().hits == 1


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_memoize_a_partial_has_one_key_in_every_process(name):
    with SharedCache(name, capacity_bytes=1 << 20, max_entries=64, create=True) as c:
        with mp.get_context("spawn").Pool(1) as pool:
            child_key, child_value, child_info = pool.apply_async(memo_partial, (name, 5)).get(timeout=90)
        f = c.memoize(functools.partial(scaled_sum, 2, scale=10))
        assert child_value == 70 and child_info == (0, 1, 64, 1)
        assert encode_key(f.key_of((5,), {})) == child_key
        assert f(5) == 70 and f.cache_info() == MemoInfo(hits=1, misses=0, maxsize=64, currsize=1)  # the child's


def test_memoize_a_callable_object_without_qualname_asks_for_a_name(cache):
    class Scaler:
        def __call__(self, x):
            return 2 * x

    with pytest.raises(TypeError, match=r"cannot name a Scaler object the same in every process.*pass name="):
        cache.memoize(Scaler())
    scale = cache.memoize(Scaler(), name="scaler")
    assert scale(4) == scale(4) == 8 and scale.cache_info().hits == 1


def test_memoize_a_bound_method_or_callable_object_is_named_with_its_instance(cache):
    class Power(NamedTuple):
        exp: int

        def __call__(self, x):
            return x ** self.exp

        def of(self, x):
            return x ** self.exp

    square, cube = cache.memoize(Power(2)), cache.memoize(Power(3))
    assert square(3) == 9 and cube(3) == 27
    square, cube = cache.memoize(Power(2).of), cache.memoize(Power(3).of)
    assert square(3) == 9 and cube(3) == 27
    assert square.cache_info().currsize == 1
    with pytest.raises(TypeError, match="cannot name .*Shape.__init__.*pass name="):
        cache.memoize(Shape(1).__init__)


def test_memoize_a_memoized_function_pickles_by_name():
    import pickle

    from . import workers

    assert pickle.loads(pickle.dumps(workers.memo_slow_square)) is workers.memo_slow_square
