"""Other projects' test suites, loaded from their published sources at test time (never copied into this
repository): CPython's ``test.mapping_tests`` from the running Python's test package (its own, or Debian's
``libpython3.X-testsuite``), and cachetools', Django's and Flask-Caching's tests from their sdists on PyPI (``pip
download``, unpacked into a temporary directory removed at exit).

The downloads happen while pytest collects the test modules, and take a while (pip prepares each sdist's metadata):
each is announced on the terminal before it starts, and its sdist is kept in SUITES_CACHE (``shmcache/test-suites``
under ``$XDG_CACHE_HOME``, else ``~/.cache``), so that later runs unpack it from there instead of downloading it
again. ``rm -r`` that directory to fetch them afresh; where it cannot be written, each run downloads into a temporary
directory, as before.

Where a suite cannot be had, the tests that use it skip with the reason, unless SHMCACHE_REQUIRE_SUITES=1 (as in
CI), which makes them fail instead."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile

import pytest

CACHETOOLS_PIN = "8.0.0"  # the cachetools release whose tests run (its CacheTestMixin and LRU tests)
SUITES_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shmcache",
                            "test-suites")
_config: pytest.Config | None = None  # set by conftest.py's pytest_configure: where announce() writes


def configure(config: pytest.Config) -> None:
    """Remember pytest's configuration, whose terminal announce() writes to (called by conftest.py)."""
    global _config
    _config = config


def announce(message: str) -> None:
    """Write ``message`` on its own line on pytest's terminal now, even while pytest captures the output of the
    collection (where the downloads happen: without this, pytest would sit silent meanwhile); on stderr outside it."""
    reporter = _config.pluginmanager.get_plugin("terminalreporter") if _config is not None else None
    if reporter is None:  # not under pytest's terminal (imported by hand, or in a worker of pytest-xdist)
        print(message, file=sys.stderr, flush=True)
        return
    capture = _config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        reporter.write_line(message)
        reporter.flush()


def unavailable(reason: str):
    """Skip the calling test module for ``reason``, or fail it where SHMCACHE_REQUIRE_SUITES=1."""
    if os.environ.get("SHMCACHE_REQUIRE_SUITES") == "1":
        pytest.fail(f"SHMCACHE_REQUIRE_SUITES=1: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def cpython_mapping_tests():
    """CPython's ``test.mapping_tests`` module for the running Python: from its own standard library where that
    includes the test package (a CPython built from source, as pyenv's), else from the system's (Debian's
    ``libpython3.X-testsuite``, which its ``python3`` lacks)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = (os.path.join(sysconfig.get_path("stdlib"), "test", "mapping_tests.py"),
                  f"/usr/lib/python{version}/test/mapping_tests.py")
    path = next((p for p in candidates if os.path.exists(p)), None)
    if path is None:
        unavailable(f"{' and '.join(candidates)} are missing (Debian: apt-get install libpython{version}-testsuite)")
    spec = importlib.util.spec_from_file_location("cpython_mapping_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _download(requirement: str, where: str) -> str:
    """Download the sdist of ``requirement`` (``name==version``) into ``where``; its path. Raises OSError."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                           requirement, "-d", where], capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise OSError(f"pip download failed: {done.stderr.strip()[-500:]}")
    (sdist,) = [f for f in os.listdir(where) if f.endswith(".tar.gz")]
    return os.path.join(where, sdist)


def _one_sdist(directory: str) -> str | None:
    """The path of the one sdist in ``directory``, or None where there is none (or more than one)."""
    found = [f for f in os.listdir(directory) if f.endswith(".tar.gz")] if os.path.isdir(directory) else []
    return os.path.join(directory, found[0]) if len(found) == 1 else None


def _cached_sdist(requirement: str) -> str:
    """The path of the sdist of ``requirement``: from SUITES_CACHE, or downloaded (saying so first) and kept there.

    A download goes into a new directory beside the cached ones and is renamed into place once whole, so that a run
    cut short, or one running at the same time, never leaves or finds half an sdist. Raises OSError.
    """
    entry = os.path.join(SUITES_CACHE, requirement.lower())
    cached = _one_sdist(entry)
    if cached is not None:
        return cached
    try:
        os.makedirs(SUITES_CACHE, exist_ok=True)
        partial = tempfile.mkdtemp(prefix=".download-", dir=SUITES_CACHE)
    except OSError:  # a cache that cannot be written: a temporary directory of this run's, as without a cache
        where = tempfile.mkdtemp(prefix="shmcache-suites-")
        atexit.register(shutil.rmtree, where, True)
        announce(f"tests/suites.py: downloading the sources of {requirement} for its tests (pip download, which can "
                 f"take a minute)")
        return _download(requirement, where)
    announce(f"tests/suites.py: downloading the sources of {requirement} for its tests (pip download, which can "
             f"take a minute; kept in {entry} for later runs)")
    try:
        name = os.path.basename(_download(requirement, partial))
        try:
            os.rename(partial, entry)  # fails where the entry is there already, and not empty
        except OSError:
            if _one_sdist(entry) is None:  # not a whole entry (emptied by hand): replaced
                shutil.rmtree(entry, ignore_errors=True)
                os.rename(partial, entry)
            # else another run put its copy in place meanwhile: as good as this one
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return os.path.join(entry, name)


@contextlib.contextmanager
def _sdist(requirement: str):
    """The sdist of ``requirement`` (``name==version``), opened. A damaged cached copy is removed (the next run
    downloads it again) and its error raised. Raises OSError or tarfile.TarError."""
    path = _cached_sdist(requirement)
    try:
        with tarfile.open(path) as tar:
            yield tar
    except tarfile.TarError:
        if path.startswith(SUITES_CACHE + os.sep):
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        raise


def django_tests_dir() -> str:
    """The ``tests`` directory of the installed Django version's sdist, holding its ``cache`` test app (tests.py,
    models.py and the backends its tests name), put first on sys.path so that it imports as ``cache``."""
    import django

    version = django.__version__
    where = tempfile.mkdtemp(prefix="shmcache-suites-")
    atexit.register(shutil.rmtree, where, True)
    try:
        with _sdist(f"django=={version}") as tar:
            # Only the cache test app: the sdist holds the whole framework and all its tests (~10 MB packed).
            members = [m for m in tar.getmembers() if m.name.split("/")[1:3] == ["tests", "cache"]]
            if not members:
                raise ValueError("the sdist has no tests/cache/")
            tar.extractall(where, members=members, filter="data")
    except (subprocess.SubprocessError, OSError, ValueError, tarfile.TarError) as exc:
        unavailable(f"django=={version} sources could not be downloaded: {exc!r}")
    root = os.path.join(where, members[0].name.split("/")[0], "tests")
    sys.path.insert(0, root)
    return root


def cachetools_tests():
    """cachetools' test package (``tests/__init__.py`` with CacheTestMixin, and ``tests/test_lru.py``) of release
    CACHETOOLS_PIN, imported as ``cachetools_tests`` with its own ``cachetools`` source first on sys.path."""
    if "cachetools_tests" in sys.modules:
        return sys.modules["cachetools_tests"], sys.modules["cachetools_tests.test_lru"]
    where = tempfile.mkdtemp(prefix="shmcache-suites-")
    atexit.register(shutil.rmtree, where, True)
    try:
        with _sdist(f"cachetools=={CACHETOOLS_PIN}") as tar:
            tar.extractall(where, filter="data")
    except (subprocess.SubprocessError, OSError, ValueError, tarfile.TarError) as exc:
        unavailable(f"cachetools=={CACHETOOLS_PIN} sources could not be downloaded: {exc!r}")
    root = os.path.join(where, f"cachetools-{CACHETOOLS_PIN}")
    sys.path.insert(0, os.path.join(root, "src"))  # the tests import cachetools itself (types, LRUCache)
    spec = importlib.util.spec_from_file_location("cachetools_tests", os.path.join(root, "tests", "__init__.py"),
                                                  submodule_search_locations=[os.path.join(root, "tests")])
    package = importlib.util.module_from_spec(spec)
    sys.modules["cachetools_tests"] = package
    spec.loader.exec_module(package)
    return package, importlib.import_module("cachetools_tests.test_lru")


def _sdist_tests(requirement: str) -> str:
    """The ``tests`` directory of ``requirement``'s sdist (``name==version``), extracted into a temporary directory
    removed at exit; the test is skipped (or fails, under SHMCACHE_REQUIRE_SUITES=1) when it cannot be had."""
    where = tempfile.mkdtemp(prefix="shmcache-suites-")
    atexit.register(shutil.rmtree, where, True)
    try:
        with _sdist(requirement) as tar:
            members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["tests"]]
            if not members:
                raise ValueError("the sdist has no tests/")
            tar.extractall(where, members=members, filter="data")
    except (subprocess.SubprocessError, OSError, ValueError, tarfile.TarError) as exc:
        unavailable(f"{requirement} sources could not be downloaded: {exc!r}")
    return os.path.join(where, members[0].name.split("/")[0], "tests")


def flask_caching_tests(names: tuple[str, ...]) -> tuple[str, dict]:
    """The ``tests`` directory of the installed Flask-Caching version's sdist, and those of its modules ``names``
    (file stems, such as ``test_memoize``) that this version has, imported by path as ``flask_caching_tests.<stem>``.
    Its conftest.py is not imported (it needs pytest-xprocess for the Redis and memcached servers of its own
    backends' tests): the caller provides the fixtures the tests ask for."""
    from importlib.metadata import version as installed

    root = _sdist_tests(f"Flask-Caching=={installed('Flask-Caching')}")
    modules = {}
    for stem in names:
        if not os.path.exists(os.path.join(root, f"{stem}.py")):
            continue  # a module of a later (or earlier) release
        spec = importlib.util.spec_from_file_location(f"flask_caching_tests.{stem}", os.path.join(root, f"{stem}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        modules[stem] = module
    return root, modules


def aiocache_tests():
    """aiocache's acceptance tests (``tests/acceptance/test_base.py``) of the installed aiocache version's sdist,
    imported by path as ``aiocache_tests.acceptance.test_base`` (its package, with ``tests/utils.py``, as
    ``aiocache_tests``). Its conftest.py is not imported (its fixtures are aiocache's own backends): the caller
    provides the cache the tests take."""
    from importlib.metadata import version as installed

    name = "aiocache_tests.acceptance.test_base"
    if name in sys.modules:
        return sys.modules[name]
    root = _sdist_tests(f"aiocache=={installed('aiocache')}")
    spec = importlib.util.spec_from_file_location("aiocache_tests", os.path.join(root, "__init__.py"),
                                                  submodule_search_locations=[root])
    package = importlib.util.module_from_spec(spec)
    sys.modules["aiocache_tests"] = package
    spec.loader.exec_module(package)
    return importlib.import_module(name)
