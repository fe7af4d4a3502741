"""The package's annotations: complete on the public API, accepted by a user's ``mypy --strict``, and true.

``examples/typed_usage.py`` uses every public call as typed user code. mypy checks it with ``--strict`` and
``--follow-imports=silent``, which is how mypy treats an installed package (errors inside shmcache are not the
user's), in the checkout and again from outside it, where only the installed package can be found; the script is
also run, so the types it asserts are those the calls return. The annotations themselves are checked against what
the calls return on a real cache (``typing.get_type_hints``, then ``isinstance`` through unions, tuples, lists, dicts
and dataclass fields), so an annotation that lies fails here, not in a user's program.
And the package's own code passes mypy (its configuration is pyproject.toml's ``[tool.mypy]``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import inspect
import os
import shutil
import site
import subprocess
import sys
import types
import typing
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

import shmcache
from shmcache import CacheLimits, KindView, SharedCache, TieredCache
from shmcache.memo import Memoized
from shmcache.view import PyView

from .conftest import SHM_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join("examples", "typed_usage.py")
TIMEOUT = 300  # seconds for one mypy run (a cold cache on a loaded machine takes ~10 s)

# Dunders of the public classes that are part of their API (every other public name is one without a leading _).
_DUNDERS = ("__init__", "__enter__", "__exit__", "__reduce__", "__contains__", "__len__", "__getitem__",
            "__setitem__", "__delitem__", "__iter__", "__reversed__", "__bool__")
# Names some annotations use only under TYPE_CHECKING, for get_type_hints to resolve them.
_HINT_NAMES = {"Memoized": Memoized, "CacheLimits": CacheLimits, "SharedCache": SharedCache, "KindView": KindView,
               "View": shmcache.View, "KindStats": shmcache.KindStats, "TierStats": shmcache.TierStats,
               "TieredCache": TieredCache, "npt": npt, "np": np, "Callable": Callable}


def _unavailable(reason: str) -> None:
    """Skip the test for ``reason``, or fail it where SHMCACHE_REQUIRE_SUITES=1 (as in CI)."""
    if os.environ.get("SHMCACHE_REQUIRE_SUITES") == "1":
        pytest.fail(f"SHMCACHE_REQUIRE_SUITES=1: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory) -> str:
    """One mypy cache for the module's runs (in each worker): the package is checked cold once, not once a test."""
    return str(tmp_path_factory.mktemp("mypy-cache"))


def _mypy(*args: str, cache_dir: str, cwd: str = ROOT) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("mypy") is None:
        _unavailable("mypy is not installed (pip install 'shmcache[test]')")
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache_dir, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=TIMEOUT)


def _public_functions() -> list[tuple[str, Callable[..., object]]]:
    """Every public function of ``shmcache.__all__``, and every public method (and API dunder) of its classes
    that shmcache defines (inherited ones from the standard library are typeshed's)."""
    found = []
    for name in shmcache.__all__:
        obj = getattr(shmcache, name)
        if inspect.isfunction(obj):
            found.append((name, obj))
        if not inspect.isclass(obj):
            continue
        for klass in obj.__mro__:
            if not klass.__module__.startswith("shmcache"):
                continue
            for attr, member in vars(klass).items():
                if attr.startswith("_") and attr not in _DUNDERS:
                    continue
                member = member.fget if isinstance(member, property) else member
                member = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if inspect.isfunction(member) and member.__module__.startswith("shmcache"):
                    found.append((f"{name}.{attr}", member))
    return found


def test_typing_public_api_is_annotated():
    missing = []
    for qualname, fn in _public_functions():
        sig = inspect.signature(fn)
        if sig.return_annotation is inspect.Signature.empty:
            missing.append(f"{qualname}: return")
        missing += [f"{qualname}: {p.name}" for i, p in enumerate(sig.parameters.values())
                    if p.annotation is inspect.Parameter.empty and not (i == 0 and p.name in ("self", "cls"))]
    assert len(_public_functions()) > 100  # the walk found the API
    assert not missing, f"public signatures without annotations: {missing}"


def test_typing_user_script_passes_mypy_strict(tmp_path, mypy_cache):
    done = _mypy("--strict", "--follow-imports=silent", SCRIPT, cache_dir=mypy_cache)
    assert done.returncode == 0, f"mypy --strict {SCRIPT} failed:\n{done.stdout}{done.stderr}"


def test_typing_user_script_outside_the_checkout_finds_the_installed_package(tmp_path, mypy_cache):
    """The same script, checked from outside the checkout, as a user's is: mypy finds shmcache (and its py.typed)
    only through what the install put in site-packages, where the check above finds ./shmcache whatever the install.
    An editable install must be one mypy can follow: setup.cfg's strict mode, not setuptools' import hook."""
    site_dirs = [*site.getsitepackages(), site.getusersitepackages()]  # not the checkout's shmcache.egg-info
    if not list(importlib.metadata.distributions(name="shmcache", path=site_dirs)):
        _unavailable("shmcache is not installed in this environment (pip install -e '.[test]')")
    if any(name.startswith("__editable___shmcache_") for name in sys.modules):  # imported by its .pth at start-up
        _unavailable("shmcache is installed with an import hook, which mypy cannot follow: reinstall it with "
                     "`pip install -e '.[test]'` (setup.cfg makes that a strict editable install)")
    script = shutil.copy(os.path.join(ROOT, SCRIPT), tmp_path)
    done = _mypy("--strict", "--follow-imports=silent", script, cache_dir=mypy_cache, cwd=str(tmp_path))
    assert done.returncode == 0, f"mypy --strict {SCRIPT}, run in {tmp_path}, failed:\n{done.stdout}{done.stderr}"


def test_typing_the_package_itself_passes_mypy(tmp_path, mypy_cache):
    """The package's own code agrees with its annotations (``[tool.mypy]`` in pyproject.toml: ``mypy`` from the
    checkout); what a user's mypy reads of it is checked above."""
    done = _mypy(cache_dir=mypy_cache)
    assert done.returncode == 0, f"mypy shmcache failed:\n{done.stdout}{done.stderr}"
    assert "no issues found in" in done.stdout and " source files" in done.stdout


def test_typing_mypy_catches_a_wrong_type(tmp_path, mypy_cache):
    """The check above can fail: the same mypy run rejects user code that misuses the types the package declares."""
    bad = tmp_path / "bad_usage.py"
    bad.write_text(
        "from shmcache import SharedCache\n"
        "def f(cache: SharedCache) -> None:\n"
        "    n: str = cache.clear()\n"
        "    @cache.memoize\n"
        "    def square(x: int) -> int:\n"
        "        return x * x\n"
        "    square('three')\n"
        "    s: str = cache.get_or_compute('k', lambda: 3)\n"
        "    h: str = square.cache_info().hits\n"
    )
    done = _mypy("--strict", "--follow-imports=silent", str(bad), cache_dir=mypy_cache)
    assert done.returncode == 1, done.stdout + done.stderr
    for line in (3, 7, 8, 9):
        assert f"bad_usage.py:{line}: error:" in done.stdout, done.stdout


def test_typing_async_compute_and_views_need_no_cast(tmp_path, mypy_cache):
    """``aget_or_compute`` returns what ``fn`` returns (awaited where it is a coroutine function), as
    ``get_or_compute`` does, on every class that has it; a view's target is used as the array it is, with no cast
    or narrowing. The wrong uses (lines 11 to 13) are still caught."""
    code = tmp_path / "async_usage.py"
    code.write_text(
        "from shmcache import KindView, SharedCache, TieredCache\n"
        "async def compute() -> int:\n"
        "    return 3\n"
        "async def main(cache: SharedCache, kind: KindView, tier: TieredCache) -> int:\n"
        "    n: int = await cache.aget_or_compute('k', compute)\n"
        "    s: str = await cache.aget_or_compute('s', lambda: 'x')\n"
        "    m: int = await kind.aget_or_compute('k', compute) + await tier.aget_or_compute('k', compute)\n"
        "    with cache.view('arr') as arr:\n"
        "        total = int(arr.sum()) + len(arr)\n"
        "    return n + m + total + len(s)\n"
        "async def wrong(cache: SharedCache, kind: KindView, tier: TieredCache) -> None:\n"
        "    s: str = await cache.aget_or_compute('k', compute)\n"
        "    t: str = await kind.aget_or_compute('k', lambda: 3) + await tier.aget_or_compute('k', compute)\n"
    )
    done = _mypy("--strict", "--follow-imports=silent", str(code), cache_dir=mypy_cache)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert {int(line.split(":")[1]) for line in errors} == {12, 13}, done.stdout + done.stderr


def test_typing_flask_single_flight_cache_types_as_flask_cachings(tmp_path, mypy_cache):
    """``shmcache.contrib.flask.Cache``'s decorators keep Flask-Caching's types: a user's ``mypy --strict`` reports
    the same of code using it as of code using ``flask_caching.Cache`` (no "untyped decorator")."""
    pytest.importorskip("flask_caching")
    code = ("import flask\n"
            "from {module} import Cache\n"
            "app = flask.Flask(__name__)\n"
            "cache = Cache(app)\n"
            "@cache.memoize(60)\n"
            "def square(x: int) -> int:\n"
            "    return x * x\n"
            "@app.route('/')\n"
            "@cache.cached(60)\n"
            "def page() -> str:\n"
            "    return 'p'\n"
            "n: int = square(3)\n"
            "s: str = square(3)\n")
    reports = []
    for module in ("flask_caching", "shmcache.contrib.flask"):
        path = tmp_path / f"{module.replace('.', '_')}_usage.py"
        path.write_text(code.format(module=module))
        done = _mypy("--strict", "--follow-imports=silent", str(path), cache_dir=mypy_cache)
        reports.append(sorted(line.split(":", 1)[1] for line in done.stdout.splitlines() if ": error:" in line))
    assert any(line.startswith("13: error:") for line in reports[0]), reports[0]  # the wrong use is caught
    assert reports[1] == reports[0], reports


def test_typing_user_script_runs():
    """The script is real: it runs every SharedCache call it type-checks, and leaves no segment behind."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "typed_usage: ok"


def test_typing_user_script_runs_with_redis(redis_url):
    """And its TieredCache part, against a real Redis."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, SCRIPT, "--redis", redis_url], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == 0, out + err
    assert out.strip() == "typed_usage: ok"
    assert not [n for n in os.listdir(SHM_DIR) if f"-{proc.pid}-" in n]


# The annotations are true: what the calls return matches the declared types ----------------------------------------


def _conforms(value: object, hint: object) -> bool:
    """Whether ``value`` is of type ``hint`` (the subset of typing the public annotations use)."""
    if hint is typing.Any or isinstance(hint, (typing.TypeVar, typing.ParamSpec)):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_alias(hint):  # ``type X = ...`` (numpy 2.5's NDArray): what it stands for
        return _conforms(value, hint.__value__)
    if _is_alias(origin):  # X[args]: what it stands for, its parameters given
        expanded = origin.__value__
        return _conforms(value, expanded[args] if origin.__type_params__ else expanded)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(_conforms(v, a) for v, a in zip(value, args))
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(k, args[0]) and _conforms(v, args[1])
                                               for k, v in value.items())
    if origin is Memoized:
        return callable(value) and all(callable(getattr(value, m, None))
                                       for m in ("cache_info", "cache_clear", "cache_parameters"))
    if origin is not None and inspect.isclass(origin) and origin.__module__ == "collections.abc":
        return isinstance(value, origin) if origin is not Callable else callable(value)
    if origin is np.ndarray:
        return isinstance(value, np.ndarray)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)  # PEP 484: int is acceptable
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if not inspect.isclass(hint):
        raise AssertionError(f"_conforms cannot check {hint!r}")
    if not isinstance(value, hint):
        return False
    if dataclasses.is_dataclass(hint):
        fields = typing.get_type_hints(hint, localns=_HINT_NAMES)
        return all(_conforms(getattr(value, f.name), fields[f.name]) for f in dataclasses.fields(hint))
    return True


def _is_alias(hint: object) -> bool:
    """Whether ``hint`` is a type alias statement's (``typing.TypeAliasType``, Python 3.12 on, or its
    typing_extensions backport): numpy 2.5 writes ``NDArray`` so."""
    return type(hint).__name__ == "TypeAliasType" and hasattr(hint, "__value__")


def _returns(fn: Callable[..., object]) -> object:
    target = getattr(fn, "__func__", fn)
    if isinstance(target, property):
        target = target.fget
    return typing.get_type_hints(target, localns=_HINT_NAMES)["return"]


def _check(calls: list[tuple[Callable[..., object], tuple[object, ...], dict[str, object]]]) -> None:
    wrong = []
    for fn, args, kwargs in calls:
        value = fn(*args, **kwargs)
        hint = _returns(fn)
        if not _conforms(value, hint):
            wrong.append(f"{fn.__qualname__} returned {value!r} ({type(value).__name__}), annotated {hint!r}")
    assert not wrong, "\n".join(wrong)


def test_typing_conforms_catches_a_lie():
    """The checker below can fail: values that are not of the annotated type are refused."""
    assert not _conforms(np.int64(3), int)
    assert not _conforms(True, int)
    assert not _conforms((1, "x"), tuple[int, int])
    assert not _conforms({"a": np.int64(1)}, dict[str, int])
    assert not _conforms(shmcache.CacheStats(*range(20), kinds={"k": 1}), shmcache.CacheStats)
    assert _conforms(shmcache.CacheStats(*range(20)), shmcache.CacheStats)
    assert _conforms(np.arange(2), npt.NDArray[typing.Any]) and not _conforms([1, 2], npt.NDArray[typing.Any])
    assert _conforms(np.arange(2), npt.NDArray[np.int64]) and not _conforms(b"", npt.NDArray[np.int64])


def test_typing_shared_cache_returns_what_it_declares(cache):
    cache.put("a", 1)
    cache.put("b", b"xy")
    cache.put("arr", np.arange(3))
    kind = cache.kind("k")
    kind.put(1, 2)
    _check([
        (cache.get, ("a",), {}), (cache.put, ("c", 3), {}), (cache.delete, ("c",), {}), (cache.add, ("d", 1), {}),
        (cache.replace, ("d", 2), {}), (cache.get_with_version, ("d",), {}),
        (cache.get_with_version, ("absent",), {}), (cache.cas, ("d", 3, 1), {}), (cache.touch, ("d", 5.0), {}),
        (cache.ttl, ("d",), {}), (cache.ttl, ("a",), {}), (cache.incr, ("n",), {}), (cache.decr, ("n",), {}),
        (cache.pop, ("n",), {}), (cache.setdefault, ("s", 1), {}), (cache.get_many, (["a", "b"],), {}),
        (cache.put_many, ({"m": 1},), {}), (cache.__contains__, ("a",), {}), (cache.__len__, (), {}),
        (cache.get_or_compute, ("gc", lambda: 5), {}), (cache.memoize, (lambda: 1,), {}),
        (cache.memoize, (), {"name": "n"}), (cache.expire, (), {}), (cache.stats, (), {}),
        (cache.limits, (), {}), (cache.set_limits, (), {"max_entries": 64}), (cache.verify, (), {}),
        (cache.kind, ("k",), {}), (cache.view, ("arr",), {}), (cache.values, (), {}),
        (cache.items, (), {}), (cache.__iter__, (), {}), (cache.__enter__, (), {}), (cache.__reduce__, (), {}),
        (cache.popitem, (), {}),
        (kind.get, (1,), {}), (kind.add, (2, 3), {}), (kind.pop, (2,), {}), (kind.incr, ("i",), {}),
        (kind.get_with_version, (1,), {}), (kind.get_many, ([1],), {}), (kind.stats, (), {}),
        (kind.limits, (), {}), (kind.get_or_compute, ("x", lambda: "y"), {}), (kind.__len__, (), {}),
        (kind.popitem, (), {}), (kind.clear, (), {}),
        (shmcache.sweep, (), {"names": [cache.name]}),
        (shmcache.prometheus_text, ({cache.name: cache.stats()},), {}),
        (cache.clear, (), {}),
    ])
    # What type checkers read (view.PyView; the compiled build's View is the same class in C, without annotations).
    enter = typing.get_type_hints(PyView.__enter__, localns=_HINT_NAMES)["return"]
    cache.put_many({"arr": np.arange(3), "b": b"xy"})
    for key in ("arr", "b"):
        with cache.view(key) as value:
            assert _conforms(value, enter)
    memoized = cache.memoize(lambda x: x, name="typing.identity")
    memoized(1)
    _check([(memoized.cache_info, (), {}), (memoized.cache_clear, (), {}), (memoized.cache_parameters, (), {})])


def test_typing_tiered_cache_returns_what_it_declares(cache, redis_url, namespace):
    with TieredCache(cache, redis_url, namespace=namespace, strict=True) as tier:
        tier.put("a", 1)
        try:
            _check([
                (tier.get, ("a",), {}), (tier.put, ("b", 2), {}), (tier.add, ("c", 3), {}),
                (tier.replace, ("c", 4), {}), (tier.get_with_version, ("c",), {}),
                (tier.get_with_version, ("absent",), {}), (tier.cas, ("c", 5, 1), {}),
                (tier.touch, ("c", 5.0), {}), (tier.ttl, ("c",), {}), (tier.ttl, ("a",), {}),
                (tier.incr, ("n",), {}), (tier.decr, ("n",), {}), (tier.delete, ("n",), {}),
                (tier.pop, ("c",), {}), (tier.setdefault, ("s", 1), {}), (tier.get_many, (["a", "b"],), {}),
                (tier.put_many, ({"m": 1},), {}), (tier.__contains__, ("a",), {}), (tier.__len__, (), {}),
                (tier.get_or_compute, ("gc", lambda: 5), {}), (tier.memoize, (lambda: 1,), {}),
                (tier.stats, (), {}), (tier.set_limits, (), {"max_entries": 64}), (tier.values, (), {}),
                (tier.items, (), {}), (tier.__iter__, (), {}), (tier.__enter__, (), {}), (tier.__reduce__, (), {}),
                (tier.popitem, (), {}), (tier.limits, (), {}), (tier.clear, (), {}),
            ])
        finally:
            tier.unlink()
