"""Django's own cache backend tests (``BaseCacheTests`` of its ``tests/cache/tests.py``) run against
SharedMemoryCache, from the sdist of the installed Django version (``tests/suites.py``), as Django runs them
against its memcached and Redis backends: every alias of ``caches_setting_for_tests`` names the same cache, with its
own KEY_PREFIX, VERSION or KEY_FUNCTION, and the ``cull`` and ``zero_cull`` aliases are left out as for memcached
and Redis (their tests then skip themselves, "Culling isn't implemented": eviction is LRU by bytes and entries, not a
fraction of MAX_ENTRIES). Each test gets a fresh cache (unlinked after it), and the suite a test database (in-memory
SQLite) for its model-instance tests.

Excluded, with the reason: none. Every test of BaseCacheTests runs; none depends on this backend's internals.
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

from django.test import TestCase, override_settings  # noqa: E402

from shmcache import SharedCache  # noqa: E402
from shmcache.contrib import django as backend  # noqa: E402

NAME = unique_name("djsuite")


@pytest.fixture(scope="module", autouse=True)
def _test_database():
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
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
