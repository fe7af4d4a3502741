"""Django's own cache backend tests (``BaseCacheTests`` of its ``tests/cache/tests.py``) run against
SharedMemoryCache, from the sdist of the installed Django version (``tests/suites.py``), as Django runs them
against its memcached and Redis backends: every alias of ``caches_setting_for_tests`` names the same cache, with its
own KEY_PREFIX, VERSION or KEY_FUNCTION, and the ``cull`` and ``zero_cull`` aliases are left out as for memcached
and Redis (their tests then skip themselves, "Culling isn't implemented": eviction is LRU by bytes and entries, not a
fraction of MAX_ENTRIES). Each test gets a fresh cache (unlinked after it), and the suite a test database (in-memory
SQLite) for its model-instance tests.

Excluded, with the reason: none. Every test of BaseCacheTests runs; none depends on this backend's internals.
The suite runs twice: through the sync methods, and through their async twins (``AsyncDriven``, one exclusion).
"""

from __future__ import annotations

import importlib

import pytest

from . import djangosite
from .conftest import unique_name
from .suites import django_tests_dir

django_tests_dir()
djangosite.configure(extra_apps=("cache",))  # Django's cache test app (its Poll model)
_suite = importlib.import_module("cache.tests")

from asgiref.sync import async_to_sync  # noqa: E402
from django.test import TestCase, override_settings  # noqa: E402

from shmcache import SharedCache  # noqa: E402
from shmcache.contrib import django as backend  # noqa: E402

NAME = unique_name("djsuite")


@pytest.fixture(scope="module", autouse=True)
def _test_database():
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    setup_test_environment()
    # Why no serialize=: Django 6.1 deprecates it (RemovedInDjango2028Warning) and no longer serializes by default;
    # before 6.1 the default serializes the empty test database, which costs nothing worth a version switch.
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    yield
    connection.creation.destroy_test_db(old_name, verbosity=0)
    teardown_test_environment()


@override_settings(CACHES=_suite.caches_setting_for_tests(
    BACKEND="shmcache.contrib.django.SharedMemoryCache", LOCATION=NAME, exclude={"cull", "zero_cull"}))
class TestSharedMemoryCacheDjangoSuite(_suite.BaseCacheTests, TestCase):
    def tearDown(self) -> None:
        super().tearDown()  # Django's: cache.clear()
        backend.close_handles()
        try:
            SharedCache.unlink_name(NAME)
        except FileNotFoundError:
            pass


class AsyncDriven:
    """The backend driven through its async methods: each call Django's tests make (``get``, ``set``,
    ``incr_version``, ...) runs its awaitable twin (``aget``, ``aset``, BaseCache's ``aincr_version``, ...) to
    completion, as Django runs async code from sync code (asgiref's ``async_to_sync``: a loop in another thread,
    this one serving the ``thread_sensitive`` calls, the database's included); anything else is the backend's.
    Django's suite has async cache tests for its dummy backend only (``tests/cache/tests_async.py``, which check
    that nothing is stored), so its whole BaseCacheTests is run this way instead: the async API held to every rule
    the sync one is."""

    _TWINS = {"get": "aget", "set": "aset", "add": "aadd", "touch": "atouch", "delete": "adelete",
              "has_key": "ahas_key", "incr": "aincr", "decr": "adecr", "get_many": "aget_many",
              "set_many": "aset_many", "delete_many": "adelete_many", "get_or_set": "aget_or_set", "clear": "aclear",
              "close": "aclose", "incr_version": "aincr_version", "decr_version": "adecr_version"}

    def __init__(self, location, params) -> None:
        object.__setattr__(self, "_backend", backend.SharedMemoryCache(location, params))

    def __setattr__(self, name: str, value) -> None:
        setattr(self._backend, name, value)  # (the key-validation tests swap key_func)

    def __getattr__(self, name: str):
        twin = self._TWINS.get(name)
        if twin is None:
            return getattr(self._backend, name)
        return _Twin(getattr(self._backend, name), getattr(self._backend, twin))

    def __contains__(self, key) -> bool:
        return async_to_sync(self._backend.ahas_key)(key)


class _Twin:
    """A sync method's stand-in that runs its async twin to completion. It answers ``__func__`` and ``__self__`` as
    the bound sync method does: Django 6.1's suite asks ``cache.get_many.__func__ is not BaseCache.get_many`` to
    learn whether the backend specialises a method (its ``test_*_async_uses_specialized_implementation``)."""

    def __init__(self, method, twin) -> None:
        self.__func__, self.__self__ = method.__func__, method.__self__
        self._run = async_to_sync(twin)

    def __call__(self, *args, **kwargs):
        return self._run(*args, **kwargs)


@override_settings(CACHES=_suite.caches_setting_for_tests(
    BACKEND=f"{__name__}.AsyncDriven", LOCATION=NAME, exclude={"cull", "zero_cull"}))
class TestSharedMemoryCacheDjangoSuiteAsync(TestSharedMemoryCacheDjangoSuite):
    """Excluded, with the reason: ``test_get_or_set_racing``, which patches the backend class's ``add`` to lose the
    race; ``aget_or_set`` calls ``aadd`` (tests/test_django.py loses that race through ``aadd``)."""

    test_get_or_set_racing = None
