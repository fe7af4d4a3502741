"""CPython's own mapping protocol tests (``test.mapping_tests``: BasicTestMappingProtocol and TestMappingProtocol)
run against SharedCache and KindView, from the system's CPython test package (``tests/suites.py``).

Each test gets fresh caches (unique names, unlinked after). Excluded, with the reason:
- ``test_fromkeys``: a cache is opened by name with its segment's parameters, so there is no ``fromkeys``
  classmethod (nor a no-argument constructor for the subclasses that test makes).
- ``test_copy``: no ``copy()``: a handle is a view of shared state, and ``dict(cache.items())`` is the copy.
- ``TestMappingProtocol.test_setdefault``: it mutates the object setdefault returned and expects the stored value to
  change; a cache stores values by value (encoded into shared memory). The rest of setdefault's contract is
  BasicTestMappingProtocol's, and tests/test_mapping.py's.
``test_popitem`` builds its second mapping with ``copy()``: the factories below give theirs one (a new cache with
the same items) for that test only; it is not part of the API.
"""

from __future__ import annotations

import unittest

from shmcache import SharedCache

from .conftest import unique_name
from .suites import cpython_mapping_tests

_suite = cpython_mapping_tests()
_made: list = []  # caches made by the current test, closed and unlinked after it


class _Cache(SharedCache):
    """type2test for SharedCache: ``_Cache(*args, **kwargs)`` is a new cache holding ``dict(*args, **kwargs)``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(unique_name("mapproto"), capacity_bytes=1 << 20, max_entries=4096, create=True)
        _made.append(self)
        self.update(*args, **kwargs)

    def copy(self):  # for test_popitem's second mode only (see the module docstring)
        return type(self)(self.items())


def _kind_view(*args, **kwargs):
    """type2test for KindView: a kind of a new cache that also holds keys of no kind and of another kind, which
    the view must never show."""
    cache = _Cache({"plain": 1})
    cache.kind("other")["x"] = 2
    view = cache.kind("k")
    view.update(*args, **kwargs)
    view.copy = lambda: _kind_view(view.items())  # for test_popitem's second mode only
    return view


def _excluded(reason: str):
    @unittest.skip(reason)
    def test(self):
        raise AssertionError("excluded")

    return test


class _Cleanup:
    def tearDown(self) -> None:
        while _made:
            c = _made.pop()
            c.close()
            SharedCache.unlink_name(c.name)


_NO_FROMKEYS = "a cache is opened by name: no fromkeys classmethod"
_NO_COPY = "no copy(): a handle views shared state; dict(cache.items()) is the copy"
_BY_VALUE = "mutates what setdefault returned: a cache stores values by value"


class TestSharedCacheBasicMappingProtocol(_Cleanup, _suite.BasicTestMappingProtocol):
    type2test = _Cache


class TestSharedCacheMappingProtocol(_Cleanup, _suite.TestMappingProtocol):
    type2test = _Cache
    test_fromkeys = _excluded(_NO_FROMKEYS)
    test_copy = _excluded(_NO_COPY)
    test_setdefault = _excluded(_BY_VALUE)


class TestKindViewBasicMappingProtocol(_Cleanup, _suite.BasicTestMappingProtocol):
    type2test = staticmethod(_kind_view)


class TestKindViewMappingProtocol(_Cleanup, _suite.TestMappingProtocol):
    type2test = staticmethod(_kind_view)
    test_fromkeys = _excluded(_NO_FROMKEYS)
    test_copy = _excluded(_NO_COPY)
    test_setdefault = _excluded(_BY_VALUE)
