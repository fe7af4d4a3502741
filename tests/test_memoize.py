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
    """Instances are no valid keys: a memoized method of theirs is refused unless key= or ignore= says how."""

    calls: list = []

    def __init__(self, scale):
        self.scale = scale


class Side(NamedTuple):
    """Instances are valid keys (a tuple subclass keys as its tuple): a memoized method is keyed by them."""

    scale: int


def test_memoize_a_method_is_keyed_by_its_instance(cache):
    calls = []

    class Area(Side):
        @cache.memoize(name="area")
        def area(self, side):
            calls.append((self.scale, side))
            return self.scale * side * side

    assert Area(1).area(2) == 4 and Area(3).area(2) == 12  # never the other instance's result
    assert Area(3).area(2) == 12 and Area.area(Area(3), 2) == 12  # an equal instance, bound or not: one entry
    assert calls == [(1, 2), (3, 2)]
    assert Area(1).area.cache_info() == MemoInfo(hits=2, misses=2, maxsize=64, currsize=2)


def test_memoize_a_method_of_an_instance_that_is_no_key_is_refused(cache):
    class Area(Shape):
        @cache.memoize
        def area(self, side):
            return side * side

        @cache.memoize
        def unbound(this, side):  # not named self: refused when called bound, and the hint names it
            return side

    with pytest.raises(TypeError, match=r"keyed by the Area it is called on.*key=.*ignore=\(\"self\",\)"):
        Area(3).area(2)
    with pytest.raises(TypeError, match=r"ignore=\(\"self\",\)"):
        Area.area(Area(3), 2)  # through the class: its first parameter is self, the same refusal
    with pytest.raises(TypeError, match=r"ignore=\(\"this\",\)"):
        Area(3).unbound(2)
    assert Area.area.cache_info().misses == 0 and len(cache) == 0


def test_memoize_a_method_shares_across_instances_only_when_asked(cache):
    class Area(Shape):
        @cache.memoize(name="area", ignore=("self",))  # explicitly one result for every instance
        def area(self, side):
            self.calls.append(("area", side))
            return side * side

        @cache.memoize(name="scaled", key=lambda self, side: (self.scale, side))
        def scaled(self, side):
            self.calls.append(("scaled", self.scale, side))
            return self.scale * side

    a, b = Area(2), Area(3)
    assert a.area(4) == b.area(4) == 16 and Shape.calls == [("area", 4)]
    assert a.scaled(4) == 8 and b.scaled(4) == 12 and a.scaled(4) == 8
    assert Shape.calls[1:] == [("scaled", 2, 4), ("scaled", 3, 4)]
    assert a.area.cache_info().currsize == 1 and Area.area.cache_name == "area"
    assert Area.area(a, 4) == 16 and len(Shape.calls) == 3  # through the class, self still left out of the key
    assert Area.area.key_of((a, 4), {}, True) == ["shmcache.memoize", "area", {"side": 4}, True]  # old default's keys


def test_memoize_methods_of_equal_and_unequal_instances_like_lru_cache(cache):
    """``functools.lru_cache`` on a method keys by the instance (equal instances share, unequal ones never do),
    with one cache_info for the function; the same with the cache shared."""
    calls = []

    class Num(int):
        @cache.memoize
        def times(self, x):
            calls.append((int(self), x))
            return int(self) * x

    ones, twos = [Num(1), Num(1)], [Num(2), Num(2)]
    for x in (5, 6, 5):
        for n in ones + twos:
            assert n.times(x) == n * x
    assert calls == [(1, 5), (2, 5), (1, 6), (2, 6)]
    assert Num.times.cache_info() == MemoInfo(hits=8, misses=4, maxsize=64, currsize=4)
    assert Num(7).times.cache_clear() == 4 and Num(1).times(5) == 5 and len(calls) == 5


def test_memoize_a_classmethod_is_keyed_by_its_class(cache):
    calls = []

    class Base:
        @classmethod
        @cache.memoize
        def outer(cls, x):
            calls.append((cls.__name__, x))
            return (cls.__name__, x)

        @cache.memoize
        @classmethod
        def inner(cls, x):
            calls.append((cls.__name__, x))
            return (cls.__name__, x)

    class Sub(Base):
        pass

    for f in ("outer", "inner"):
        assert getattr(Base, f)(1) == ("Base", 1) and getattr(Sub, f)(1) == ("Sub", 1)
        assert getattr(Sub(), f)(1) == ("Sub", 1) and getattr(Base, f)(1) == ("Base", 1)
    assert len(calls) == 4
    key = Base.inner.key_of((Sub, 1), {}, True)
    assert key[2] == (("shmcache.class", f"{Sub.__module__}.{Sub.__qualname__}"), 1)  # by name, in every process


def test_memoize_a_staticmethod_is_a_function(cache):
    class Tool:
        @staticmethod
        @cache.memoize(name="outer")
        def outer(x):
            return x + 1

        @cache.memoize(name="inner")
        @staticmethod
        def inner(x):
            return x + 2

    assert Tool.outer(1) == Tool().outer(1) == 2 and Tool.inner(1) == Tool().inner(1) == 3
    assert Tool.outer.cache_info().hits == 1 and Tool.inner.cache_info().hits == 1


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


def test_memoize_counts_every_thread_and_an_interrupted_count_blocks_nothing(cache):
    """cache_info() counts the calls of every thread exactly, and clear() starts them again; an exception raised at
    any line of a count (as a signal handler's would be) costs at most that count and blocks no later call: the
    counts take no lock, which an interruption between its acquire and its block would leave held (CPython 3.14's
    ``with``: memo.Tally)."""
    import sys
    import threading

    from shmcache.memo import Tally

    @cache.memoize(name="counted")
    def double(x):
        return 2 * x

    def calls():
        for i in range(500):
            assert double(i % 50) == 2 * (i % 50)

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    info = double.cache_info()
    assert info.hits + info.misses == 2000 and 50 <= info.misses
    double.cache_clear()
    assert double.cache_info()[:2] == (0, 0)

    tally = Tally()
    lines = {n for n in range(Tally.add.__code__.co_firstlineno, Tally.add.__code__.co_firstlineno + 12)}
    interrupted = 0
    for at in sorted(lines):
        def trace(frame, event, arg, at=at):
            if frame.f_code is Tally.add.__code__:
                if event == "line" and frame.f_lineno == at:
                    raise KeyboardInterrupt
                return trace
            return None

        sys.settrace(trace)
        try:
            tally.add(True)
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            sys.settrace(None)
        before = tally.totals()
        done = threading.Event()
        t = threading.Thread(target=lambda: (tally.add(False), done.set()))
        t.start()
        t.join(10)
        assert done.is_set() and tally.totals() == (before[0] + 1, before[1])
    assert interrupted >= 3  # (the trace reached the lines of a count)
