"""The compiled section (``shmcache._core``), loaded once: the extension where it is built from the C sources beside
it and not refused (SHMCACHE_PURE_PYTHON=1), else None and a ``CompiledSectionMissing`` warning saying why and what to
do; with the few of its calls the modules below the dispatch use (the lock's). The choice between it and the Python
path, and the binding of a segment, are ``core.py``'s, which imports this module as the lock and the views do.
"""

from __future__ import annotations

import os
import warnings
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Any

from ._sources import sources_digest
from .arena import block_nbytes
from .errors import CompiledSectionMissing
from .layout import BLOCK_HEADER_NBYTES

_PURE_ASKED = os.environ.get("SHMCACHE_PURE_PYTHON") == "1"
try:
    if _PURE_ASKED:
        raise ImportError("SHMCACHE_PURE_PYTHON=1")
    from . import _core  # (shmcache/_core.pyi describes it)

    _here = sources_digest(os.path.dirname(os.path.abspath(__file__)))
    if _core.SOURCES and _here is not None and _here != _core.SOURCES:
        raise ImportError("it was built from other C sources than those beside it: rebuild it")
except ImportError as exc:
    _core = None  # type: ignore[assignment]  # (None: the pure-Python path)
    if not _PURE_ASKED:
        _missing = exc

extension: Any = _core  # the compiled section's module, for the modules that use it directly (view.py); None: not built
Core: Any = None if _core is None else _core.Core  # the compiled section's type; None: not built (or not wanted)
PATH = "compiled" if _core is not None else "pure Python"  # what `shmcache ls` / `stats` print as the hot path
# What a Core bound without a fallback answers (tests/test_core.py drives it so): the handles bind one with a
# HandOver, which takes these calls itself.
HANDOVER = None if _core is None else _core.HANDOVER  # a call the Python path must make instead
PINNED = None if _core is None else _core.PINNED  # a view pins what the call must change (version 11 and before)
Raw = None if _core is None else _core.Raw  # get_value: a hit left to the Python side (HandOver.finish)
TIMEOUT = "timeout"  # Core.reason after a call that waited the whole lock timeout in C


def _missing_message(exc: ImportError) -> str:
    """Why the compiled section is missing, and what to do, for the warning an import without it gives."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if not any(os.path.exists(os.path.join(here, "_core" + suffix)) for suffix in EXTENSION_SUFFIXES):
        exc = ImportError(f"no {os.path.join(here, '_core')}{EXTENSION_SUFFIXES[0]} was built")
    if os.path.exists(os.path.join(root, "pyproject.toml")) and os.path.exists(os.path.join(root, "setup.py")):
        fix = (f"shmcache was imported from the source checkout {root}, where it is not built (or was built from "
               "other sources): build it in place "
               "(`pip install -e .`, or `python setup.py build_ext --inplace`), or run from another directory to "
               "import the installed copy")
    else:
        fix = ("reinstall with a C compiler and the Python headers (`pip install -v shmcache` shows the build), or "
               "install a wheel")
    return (f"shmcache's compiled section (shmcache._core) is not available ({exc}): every call runs the pure-Python "
            f"path, several times slower. {fix}. Set SHMCACHE_PURE_PYTHON=1 to choose the pure path and silence "
            "this warning.")


if _core is None and not _PURE_ASKED:
    warnings.warn(_missing_message(_missing), CompiledSectionMissing, stacklevel=2)

if block_nbytes(0) != BLOCK_HEADER_NBYTES:
    raise ImportError("shmcache.core: a block of no payload is not its header alone, as _core_arena.c assumes")


def last_wait() -> tuple[float, int, int] | None:
    """How long the calling thread's last wait for the lock took in the compiled section, in seconds, how many
    timeouts it added while the holder made progress, and the holder it gave up on (a thread id; 0: none) (None:
    not built)."""
    return None if _core is None else _core.last_wait()


def word_try():
    """The Python path's try of the lock's word when the compiled section is built (``_core.try_word``: a
    compare-and-swap, no system call); None: not built, the kernel's FUTEX_TRYLOCK_PI is used."""
    return None if _core is None else _core.try_word
