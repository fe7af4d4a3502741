"""Build of the optional C extension ``shmcache._core`` (everything else is in pyproject.toml).

The extension is optional: where no C compiler (or no Python headers) is found, the build warns and installs the
pure-Python package, which works the same, only slower (``shmcache.core.PATH`` says which one runs).

Environment:
    SHMCACHE_WERROR=1        add -Werror (development and CI: the build must stay free of warnings)
    SHMCACHE_REQUIRE_CORE=1  fail the build when the extension does not build (CI, wheels), instead of warning
    SHMCACHE_SANITIZE=1      build with AddressSanitizer and UndefinedBehaviorSanitizer, for the tests:
                             SHMCACHE_SANITIZE=1 python setup.py build_ext --inplace --force
                             LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \\
                                 PYTHONPATH=$PWD python -m pytest -p no:cacheprovider tests/test_core.py
                             (python is not built with ASan, so its runtime must be preloaded; Python's own
                             allocations are reported as leaks at exit, hence detect_leaks=0)
    SHMCACHE_COVERAGE=1      build for gcov's line and branch counts (.ci/coverage): each process that exits
                             normally writes its counts beside the object files in build/
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _sources_digest() -> str:
    """shmcache/_sources.py's digest of the C sources, loaded by path (the package's dependencies may be missing)."""
    spec = importlib.util.spec_from_file_location("_shmcache_sources", os.path.join("shmcache", "_sources.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sources_digest("shmcache") or ""


_flags = ["-O2", "-Wall", "-Wextra", "-fwrapv", "-std=c11"]
_link = []
if os.environ.get("SHMCACHE_WERROR") == "1":
    _flags.append("-Werror")
if os.environ.get("SHMCACHE_SANITIZE") == "1":
    _flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
    _link += ["-fsanitize=address,undefined"]
if os.environ.get("SHMCACHE_COVERAGE") == "1":
    _flags += ["--coverage", "-O0", "-g"]
    _link += ["--coverage"]


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: the package works without its compiled part."""

    skipped = False

    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler at all (setuptools raises its own error classes)
            self._skip(exc)
            return
        # Built for an install from a checkout (`pip install .`): the checkout gets its copy too, so that code run
        # from inside it (`python -m shmcache`, a script), which imports ./shmcache, is never an unbuilt package.
        if not self.inplace and not self.skipped and os.path.isdir(".git"):
            self.copy_extensions_to_source()

    def build_extension(self, ext):
        try:
            import numpy  # the views build arrays through numpy's C API (shmcache/_view.c): its headers

            ext.include_dirs.append(numpy.get_include())
            super().build_extension(ext)
        except Exception as exc:  # the compiler failed (missing headers...)
            self._skip(exc)

    def _skip(self, exc):
        if os.environ.get("SHMCACHE_REQUIRE_CORE") == "1":
            raise exc
        if not self.skipped:  # once: an in-place build then also fails to copy what was not built
            print(f"WARNING: shmcache._core was not built ({exc}); shmcache will run its pure-Python path.",
                  file=sys.stderr)
        self.skipped = True


setup(
    # _core.c includes its parts (shmcache/_core_*.c, one translation unit): they are dependencies, not sources.
    ext_modules=[Extension("shmcache._core", ["shmcache/_core.c", "shmcache/_unpack.c", "shmcache/_view.c"],
                           depends=["shmcache/_core.h", "shmcache/_unpack.h", "shmcache/_view.h",
                                    *sorted(glob.glob("shmcache/_core_*.c"))],
                           define_macros=[("SHMCACHE_SOURCES", f'"{_sources_digest()}"')],
                           extra_compile_args=_flags, extra_link_args=_link)],
    cmdclass={"build_ext": OptionalBuildExt},
)
