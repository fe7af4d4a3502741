"""Flask-Caching's own tests run against SharedMemoryCache, from the sdist of the installed Flask-Caching version
(``tests/suites.py``): its backend suite (``GenericCacheTests`` of ``tests/test_backend_cache.py``, bound here as it
binds SimpleCache and RedisCache, with and without a key prefix), and its tests of the extension (``cached``,
``memoize``, cached views, the Jinja2 tag, signals, hash methods, subclassing), each given an app whose cache is a
SharedMemoryCache of its own (``CACHE_TYPE`` set by the ``app`` fixture their conftest.py would give), through
``flask_caching.Cache`` and through ``shmcache.contrib.flask.Cache`` (single-flight decorators).

Their ``clock`` fixture advances a fake time that cachelib's SimpleCache reads; here it is the clock of the handles
opened in the test (SharedCache's ``clock``), so the tests of expiry run in full without sleeping.

Excluded, with the reason (``EXCLUDED``): the tests that build a cache of another backend of their own (Redis's
``unlink``, SimpleCache's ``CACHE_IGNORE_ERRORS``, FileSystemCache's hash method), where this backend is not the one
tested; and with Flask-Caching before 2.5 (Python 3.10), its test of the ``delete_many`` rule 2.5 changed. Not run:
the modules about other backends' construction (test_basic_app, test_cachelib, test_init) and ``CACHE_SERIALIZER``
(test_serializer: this backend pickles through SharedCache and takes no cachelib serializer).
"""

from __future__ import annotations

import time
from importlib.metadata import version

import pytest

pytest.importorskip("flask_caching", reason="Flask-Caching is in the test extra (pip install -e '.[test]')")

import flask
import flask_caching as fsc

from shmcache import SharedCache
from shmcache.contrib import backends
from shmcache.contrib import flask as contrib_flask
from shmcache.contrib.flask import SharedMemoryCache, close_handles

from .suites import flask_caching_tests

EXTENSION_MODULES = ("test_cache", "test_memoize", "test_view", "test_templates", "test_signals", "test_subclassing",
                     "test_hash_method", "test_py314_annotations")
FIXTURES = ("signals_cache", "recording_cache")  # the fixtures those modules define for their own tests
EXCLUDED = {
    "test_cache_unlink": "Redis's UNLINK on a RedisCache of its own (needs its redis_server fixture)",
    "test_cache_unlink_if_not": "builds a SimpleCache of its own: this backend is not the one tested",
    "test_cache_delete_many_ignored": "builds a SimpleCache of its own: this backend is not the one tested",
    "test_file_hash_method_is_independent": "sets CACHE_TYPE to FileSystemCache: this backend is not the one tested",
}
if tuple(int(part) for part in version("Flask-Caching").split(".")[:2]) < (2, 5):
    EXCLUDED["test_cache_delete_many"] = ("before 2.5 Flask-Caching's delete_many stopped at the first absent key; "
                                          "2.5 and cachelib count it deleted and go on, as this backend does")
ROOT, MODULES = flask_caching_tests(("test_backend_cache", *EXTENSION_MODULES))
CAPACITY = {"capacity_bytes": 1 << 20, "max_entries": 512}


def _bind_extension_tests() -> list[str]:
    """Put the extension modules' tests and fixtures in this module's namespace, for pytest to collect; their
    names."""
    bound = []
    for stem in [m for m in EXTENSION_MODULES if m in MODULES]:
        module = MODULES[stem]
        marks = getattr(module, "pytestmark", [])
        marks = marks if isinstance(marks, list) else [marks]
        for attr, obj in vars(module).items():
            if attr in FIXTURES:
                globals()[attr] = obj
            elif attr.startswith("test_") and callable(obj) and attr not in EXCLUDED:
                assert attr not in globals(), f"{stem}.{attr} is named as another module's test"
                for mark in marks:  # the module's marks (a skipif on the Python version) go with its tests
                    obj = mark(obj)
                globals()[attr] = obj
                bound.append(attr)
    return bound


class FakeClock:
    """Flask-Caching's ``clock`` for this backend: the time (monotonic ns) of every handle opened in the test,
    advanced by the test instead of slept."""

    def __init__(self) -> None:
        self.ns = time.monotonic_ns()

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    # Why here: handles open on first use, after every fixture has run, so each one a test opens reads this clock.
    monkeypatch.setattr(backends, "SharedCache", lambda *args, **kw: SharedCache(*args, clock=fake, **kw))
    return fake


def _unlink(name: str) -> None:
    close_handles()
    try:
        SharedCache.unlink_name(name)
    except FileNotFoundError:
        pass


@pytest.fixture
def app(request, name):
    """Their conftest's app, its cache a SharedMemoryCache of the test's own."""
    made = flask.Flask(request.module.__name__, template_folder=ROOT)
    made.testing = True
    made.config.update(CACHE_TYPE="shmcache.contrib.flask.SharedMemoryCache", CACHE_SHMCACHE_NAME=name,
                       CACHE_OPTIONS=dict(CAPACITY))
    yield made
    _unlink(name)


@pytest.fixture(params=[fsc.Cache, contrib_flask.Cache], ids=["flask_caching.Cache", "single-flight Cache"])
def cache(request, app):
    """Flask-Caching's extension, and this package's single-flight one, which must keep every rule of it."""
    return request.param(app)


@pytest.fixture(params=fsc.SUPPORTED_HASH_FUNCTIONS, ids=[m.__name__ for m in fsc.SUPPORTED_HASH_FUNCTIONS])
def hash_method(request):
    return request.param


BOUND = _bind_extension_tests()


def test_flask_suite_runs_the_extension_tests_against_this_backend(app, cache):
    # The modules every Flask-Caching 2 release has were found, and their tests bound (a renamed one fails here).
    assert {"test_backend_cache", "test_cache", "test_memoize", "test_view"} <= set(MODULES)
    assert {MODULES[stem].__name__ for stem in ("test_cache", "test_memoize", "test_view")} <= {
        globals()[t].__module__ for t in BOUND}
    assert type(app.extensions["cache"][cache]) is SharedMemoryCache


class TestSharedMemoryCacheGeneric(MODULES["test_backend_cache"].GenericCacheTests):
    @pytest.fixture(params=["werkzeug-test-case:", ""], ids=["prefixed", "unprefixed"])
    def make_cache(self, request, name):
        yield lambda **kw: SharedMemoryCache(name, key_prefix=request.param, **CAPACITY, **kw)
        _unlink(name)
