"""``SharedCache.memoize``: functools.lru_cache's interface over ``get_or_compute``, with one cache for every
process. Kept apart from cache.py, which owns the segment; this module only builds keys and counts calls."""

from __future__ import annotations

import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, Protocol, TypeVar, cast

from .codec import encode_key, encode_key_prefix
from .oversize import Computation

if TYPE_CHECKING:
    from .cache import SharedCache
    from .kinds import KindView
    from .tier.tiered import TieredCache

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

_FAMILY = "shmcache.memoize"  # first item of every memoized key: [_FAMILY, function name, args, kwargs]
_KEY_ITEMS = 4
_CLASS = "shmcache.class"  # a class in a key: (_CLASS, its module.qualname), the same in every process
_INSTANCE_NAMES = ("self", "cls")  # a first parameter so named takes the instance (or class) a method is called on


class MemoInfo(NamedTuple):
    """``functools.lru_cache``'s ``cache_info()``, field for field. ``hits`` and ``misses`` count this process's
    calls: served from the cache (including values another process computed while this one waited), or run here.
    ``maxsize`` is the entry limit of the cache the results share (None for a TieredCache: Redis bounds it by
    memory), ``currsize`` how many results of this function the cache holds now, for every process."""

    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class Memoized(Protocol[P, R_co]):
    """What ``memoize`` returns for a function ``(*P) -> R``: a function of the same signature with
    ``functools.lru_cache``'s ``cache_info()``, ``cache_clear()`` and ``cache_parameters()``."""

    cache_name: str  # the function's name in the key: ``module.qualname`` (a partial's with its arguments), or name=

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def cache_info(self) -> MemoInfo: ...

    def cache_clear(self) -> int: ...

    def cache_parameters(self) -> dict[str, Any]: ...


def function_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of ``fn``, the same in every process: the main script is ``__main__`` everywhere,
    although multiprocessing's spawned children import it as ``__mp_main__``. TypeError where ``fn`` has no
    ``__qualname__``."""
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(qualname, str):
        raise TypeError(f"{type(fn).__qualname__} object has no __qualname__")
    module = getattr(fn, "__module__", None) or "?"
    if module == "__mp_main__":
        module = "__main__"
    return f"{module}.{qualname}"


def key_name(fn: Callable[..., Any]) -> tuple[str, Any]:
    """How ``fn``'s entries are named in their keys, the same in every process, and how that name reads: its
    ``module.qualname``; with a partial's arguments, or the instance a bound method is bound to, which must then be
    valid keys (checked when the name is encoded). TypeError for a callable with no name of its own."""
    if isinstance(fn, functools.partial):
        text, item = key_name(fn.func)
        shown = [text, *map(repr, fn.args), *(f"{k}={v!r}" for k, v in fn.keywords.items())]
        return f"functools.partial({', '.join(shown)})", [item, fn.args, fn.keywords]
    if isinstance(fn, (classmethod, staticmethod)):
        return key_name(fn.__func__)
    obj: Any = fn
    if not isinstance(getattr(obj, "__qualname__", None), str) and isinstance(obj.__call__, types.MethodType):
        return key_name(obj.__call__)  # a callable object: named as its __call__, bound to it
    text = function_name(fn)
    owner = getattr(fn, "__self__", None)  # builtins are bound to their module: named by it alone
    if owner is None or isinstance(owner, types.ModuleType):
        return text, text
    return text, [text, _keyed_class(owner)]


def _keyed_class(obj: Any) -> Any:
    """``obj`` as a key holds it: a class by its qualified name, anything else as itself."""
    return (_CLASS, function_name(obj)) if isinstance(obj, type) else obj


def _first_parameter(fn: Callable[..., Any]) -> str | None:
    """The name of ``fn``'s first positional parameter, if it has one (and a signature)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return params[0].name if params and params[0].kind in positional else None


class _Inside(threading.local):
    busy = False  # whether a memoized call of this thread is inside the cache's own code (not in its fn)


_inside = _Inside()


class Family(NamedTuple):
    """What a cache class gives memoize for one function's entries, all sharing an encoded key prefix."""

    count: Callable[[bytes], int]  # live entries whose key starts with the prefix
    delete: Callable[[bytes], int]  # remove them; how many
    maxsize: Callable[[], int]  # the cache's entry limit in force


def _ignored(fn: Callable[..., Any], ignore: str | Iterable[str],
             shown: str) -> tuple[inspect.Signature | None, frozenset]:
    """``fn``'s signature (None where none is needed) and the parameter names ``ignore`` leaves out of the key;
    ValueError for a name that is no parameter of ``fn``."""
    names = frozenset([ignore] if isinstance(ignore, str) else ignore)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"ignore must be a parameter name or an iterable of them, got {ignore!r}")
    if not names:
        return None, names
    sig = inspect.signature(fn)
    unknown = sorted(names - set(sig.parameters))
    if unknown:
        raise ValueError(f"ignore names {', '.join(map(repr, unknown))}, which {shown} has no parameter "
                         f"of: it takes {', '.join(sig.parameters) or 'none'}")
    return sig, names


class _Memo:
    """The wrapper ``memoize`` returns: a callable with ``functools.lru_cache``'s methods, and a descriptor that
    binds as the function it wraps does (a method to its instance, a classmethod to its class, a staticmethod not
    at all). As with ``lru_cache``, the instance or class a method is called on is part of the key."""

    def __init__(self, cache, family: Family, fn: Callable[..., Any], name: str | None, timeout: float | None,
                 ttl: float | None, key: Callable[..., Any] | None, ignore: str | Iterable[str],
                 stale_ttl: float | None = None) -> None:
        if key is not None and not callable(key):
            raise TypeError(f"key must be a function of the arguments, got {key!r}")
        if key is not None and ignore:
            raise ValueError("pass key= (the whole key) or ignore= (arguments left out of it), not both")
        self._binds = "class" if isinstance(fn, classmethod) else "none" if isinstance(fn, staticmethod) else "self"
        func = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
        try:
            names: tuple[str, Any] = (name, name) if name else key_name(fn)
            self.cache_name, self._name = names  # how the name reads, and what the keys hold
            self._prefix = encode_key_prefix([_FAMILY, self._name], _KEY_ITEMS)
        except TypeError as exc:
            shown = getattr(fn, "__qualname__", None) or f"a {type(fn).__name__} object"
            raise TypeError(f"memoize cannot name {shown} the same in every process ({exc}): pass name=, one "
                            "name per distinct computation") from None
        functools.update_wrapper(self, func)
        self._cache, self._family, self._fn, self._timeout, self._ttl = cache, family, func, timeout, ttl
        # (given to get_or_compute only when set: a TieredCache's takes none yet)
        self._stale: dict[str, float] = {} if stale_ttl is None else {"stale_ttl": stale_ttl}
        self._key = key
        self.told_as = f"memoized {self.cache_name}"  # its family in a TooLargeWarning (oversize.py)
        self._sig, self._ignore = _ignored(func, ignore, self.cache_name)
        self._first = _first_parameter(func)
        # Whether args[0] is an instance (or class) even when called unbound: Area.area(a, 5) is a.area(5).
        self._takes_instance = self._binds == "class" or (self._binds == "self" and self._first in _INSTANCE_NAMES)
        self._counts = Tally()  # hits, misses of this process

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(args, kwargs, False)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        owner = self.owner(obj, objtype)
        return self if owner is None else _Bound(self, owner)

    def owner(self, obj: Any, objtype: Any = None) -> Any:
        """What the wrapper is bound to when looked up on ``obj`` (on the class ``objtype`` where ``obj`` is None):
        the instance, a classmethod's class, or None (unbound)."""
        if self._binds == "class":
            return objtype if objtype is not None else type(obj)
        return obj if self._binds == "self" else None

    def __reduce__(self) -> str:
        # Pickled as a function is: by its qualified name, found again in its module (spawned workers).
        return self.__qualname__  # type: ignore[attr-defined,no-any-return]

    def key_of(self, args: tuple, kwargs: dict, method: bool = False) -> list:
        """The cache key of a call with ``args`` and ``kwargs`` (``method``: ``args[0]`` is the instance or class
        a memoized method was called on). The instance is keyed as an argument, and must be a valid key unless
        ``ignore`` names it; a class is keyed by its qualified name."""
        if self._key is not None:
            return [_FAMILY, self._name, self._key(*args, **kwargs), None]
        if args and (method or self._takes_instance) and self._first not in self._ignore:
            args = (self._keyed_instance(args[0]), *args[1:])
        if not self._ignore:
            return [_FAMILY, self._name, args, kwargs]
        if self._sig is None:
            self._sig = inspect.signature(self._fn)
        bound = self._sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return [_FAMILY, self._name, {n: v for n, v in bound.arguments.items() if n not in self._ignore}, True]

    def _keyed_instance(self, obj: Any) -> Any:
        """``obj``, the instance a method is called on, as the key holds it; TypeError saying what to do instead
        where it is no valid key."""
        if isinstance(obj, type):
            return _keyed_class(obj)
        try:
            # Why: encoded here too, not only with the whole key, so that the refusal can say what to do instead.
            encode_key(obj)
        except TypeError as exc:
            first = self._first or "self"
            raise TypeError(
                f"{self.cache_name} is keyed by the {type(obj).__name__} it is called on, as functools.lru_cache "
                f"keys a method, and that is no valid key ({exc}). Pass key= a function of the arguments that "
                f"returns one (key=lambda {first}, *args: ({first}.id, *args)), or ignore=(\"{first}\",) to share "
                f"the results across every instance") from None
        return obj

    def _call(self, args: tuple, kwargs: dict, method: bool) -> Any:
        fn = self._fn
        if _inside.busy:
            # Called by the cache's own code (encoding the key, the lookup): the wrapper replaced something the
            # package calls (``builtins.len = cache.memoize(len)``), so it runs ``fn`` itself, uncached.
            return fn(*args, **kwargs)
        computed = False

        def compute() -> Any:
            nonlocal computed
            computed = True
            busy = _inside.busy
            try:
                _inside.busy = False  # fn's own calls of memoized functions are cached as usual
                return fn(*args, **kwargs)
            finally:
                _inside.busy = busy

        key = self.key_of(args, kwargs, method)  # the user's key= runs outside the cache's code
        # Crash window: saved first and put back in finally, so an exception at any bytecode leaves it as it was.
        busy = _inside.busy
        try:
            _inside.busy = True
            value = self._cache.get_or_compute(key, Computation(compute, self.told_as), timeout=self._timeout,
                                               ttl=self._ttl, **self._stale)
        finally:
            _inside.busy = busy
        self.count(computed)
        return value

    def count(self, computed: bool) -> None:
        """Count a call of this process: computed here (a miss), or served from the cache (a hit)."""
        self._counts.add(computed)

    @property
    def timeout(self) -> float | None:
        return self._timeout

    @property
    def ttl(self) -> float | None:
        return self._ttl

    @property
    def stale(self) -> dict[str, float]:
        """``{"stale_ttl": seconds}`` where results are served stale while refreshed, else empty."""
        return self._stale

    def cache_info(self) -> MemoInfo:
        """This process's hits and misses; the cache's entry limit and the function's entries in it (a pass over
        the cache's entries, under its lock)."""
        hits, misses = self._counts.totals()
        return MemoInfo(hits, misses, self._family.maxsize(), self._family.count(self._prefix))

    def cache_parameters(self) -> dict[str, Any]:
        """``functools.lru_cache``'s ``cache_parameters()``: ``maxsize`` and ``typed`` (always True: ``f(1)`` and
        ``f(1.0)`` are two entries), with the key's name, the compute timeout, the results' time to live and the
        arguments left out of the key."""
        return {"maxsize": self._family.maxsize(), "typed": True, "name": self.cache_name, "timeout": self._timeout,
                "ttl": self._ttl, "stale_ttl": self._stale.get("stale_ttl"), "key": self._key,
                "ignore": tuple(sorted(self._ignore))}

    def cache_clear(self) -> int:
        """Remove this function's entries from the shared cache (for every process); how many there were."""
        self._counts.clear()
        return self._family.delete(self._prefix)

    def __repr__(self) -> str:
        return f"<memoized {self.cache_name} in {self._cache!r}>"


class Tally:
    """A process's hits and misses of one memoized function, counted without a lock: each thread adds to a row of
    its own (one dict item, which only that thread writes), and the totals are the sums of the rows of the current
    generation, which clear() moves on. Why no lock: a ``with lock:`` that an exception from a signal handler (Ctrl-C,
    a task's time limit) interrupts right after the acquire leaves the lock held for ever on CPython 3.14, whose
    ``with`` calls ``__enter__`` with an ordinary call that checks for pending signals before the block is entered;
    the next count would then wait for ever. Here an interruption costs at most the count under way."""

    __slots__ = ("_rows", "_generation")

    def __init__(self) -> None:
        self._rows: dict[int, list[int]] = {}  # thread id -> [generation, hits, misses]
        self._generation = 0

    def add(self, computed: bool) -> None:
        """One call of this thread: computed here (a miss), or served from the cache (a hit)."""
        me, generation, rows = threading.get_ident(), self._generation, self._rows
        row = rows.get(me)
        if row is None or row[0] != generation:
            row = [generation, 0, 0]
            rows[me] = row  # (a thread that reuses an ended one's id takes its row on: the totals stay)
        row[1 + computed] += 1

    def totals(self) -> tuple[int, int]:
        """(hits, misses) since the last clear()."""
        generation = self._generation
        rows = [row for row in list(self._rows.values()) if row[0] == generation]
        return sum(row[1] for row in rows), sum(row[2] for row in rows)

    def clear(self) -> None:
        """Start the counts again from 0 (a count under way in another thread meanwhile may be lost), and forget
        the rows of threads gone since (a new dict: one whose count was under way writes to the old one, or to a
        row of the old generation, which the totals pass over)."""
        self._generation += 1
        self._rows = {}


class _Bound:
    """A memoized method bound to ``obj`` (an instance, or a classmethod's class): called, ``fn(obj, ...)``, keyed
    with ``obj``; the rest is the function's (``cache_info``, ``cache_clear``: for the entries of every instance)."""

    __slots__ = ("__self__", "__func__")

    def __init__(self, memo: _Memo, obj: Any) -> None:
        self.__func__ = memo
        self.__self__ = obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__._call((self.__self__, *args), kwargs, True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__func__, name)

    def __repr__(self) -> str:
        return f"<bound memoized {self.__func__.cache_name} of {self.__self__!r}>"


def memoized(cache: SharedCache | KindView | TieredCache, family: Family, fn: Callable[P, R], name: str | None,
             timeout: float | None, ttl: float | None = None, key: Callable[..., Any] | None = None,
             ignore: str | Iterable[str] = (), stale_ttl: float | None = None) -> Memoized[P, R]:
    """The wrapper ``cache.memoize`` returns for ``fn``. ``name``: the function's name in the key (None: made of
    ``fn``, see ``key_name``); ``key``: a function of the call's arguments whose result (a valid key) replaces them
    in the cache key; ``ignore``: parameter names left out of it; ``stale_ttl``: get_or_compute's."""
    return cast("Memoized[P, R]", _Memo(cache, family, fn, name, timeout, ttl, key, ignore, stale_ttl))
