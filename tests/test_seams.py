"""The seams between modules stay cut: no module uses another module's private names.

A module may use ``obj._name`` only where ``_name`` is defined in that same module (a method, an attribute it
assigns, a class attribute): the facade's parts reach each other through ``cache.parts()``, ``store.Store`` and
``guard.Guard``'s named API, never through a private attribute. Nor may it import a private name from another
module. Standard-library privates that have no public spelling are listed with their reason.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "shmcache"
MODULES = sorted(p for p in PACKAGE.rglob("*.py"))
# (module, attribute): what the standard library offers only under a private name.
ALLOWED = {
    ("view.py", "_getframe"),  # sys._getframe: the caller's frame, to name who leaked a view
    ("lru.py", "_lru_cache_wrapper"),  # the docstring's reference to functools' own sentinel design
}
# (module, name) imports of a private module of the package itself: the compiled extension.
ALLOWED_IMPORTS = {("core.py", "_core")}
_DEFINED = re.compile(r"(?:def|class)\s+(_[a-z]\w*)|(?:self|cls)\.(_[a-z]\w*)\s*(?::[^=]*)?=|^\s+(_[a-z]\w*)\s*[:=]",
                      re.M)
_USED = re.compile(r"\b(?!self\b|cls\b)([A-Za-z_]\w*)\.(_[a-z]\w*)")


def _defined(text: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in _DEFINED.finditer(text)}


def _code_lines(text: str):
    """(line number, line) of code, strings and comments blanked (a docstring may name a private)."""
    lines = text.splitlines()
    keep = [list(line) for line in lines]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for n in range(node.lineno, node.end_lineno + 1):
                keep[n - 1] = [" "] * len(lines[n - 1])
    for n, chars in enumerate(keep, 1):
        line = "".join(chars)
        yield n, line.split("#", 1)[0]


def _violations(path: pathlib.Path) -> list[str]:
    text = path.read_text()
    own = _defined(text)
    rel = path.relative_to(PACKAGE).as_posix()
    found = []
    for n, line in _code_lines(text):
        for obj, attr in _USED.findall(line):
            if attr not in own and (path.name, attr) not in ALLOWED and not attr.startswith("__"):
                found.append(f"{rel}:{n}: {obj}.{attr}")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") \
                        and (path.name, alias.name) not in ALLOWED_IMPORTS:
                    found.append(f"{rel}:{node.lineno}: imports {alias.name} from {node.module}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_seams_no_private_name_of_another_module(path):
    assert _violations(path) == []


def test_seams_check_catches_a_private_use(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from .codec import _xxh\n\n\ndef f(cache):\n    return cache._locked(len)  # a use\n")
    found = _violations_of(sample)
    assert found == ["sample.py:5: cache._locked", "sample.py:1: imports _xxh from codec"]
    sample.write_text("class A:\n    def _own(self):\n        return self\n\n\ndef f(a):\n    return a._own()\n")
    assert _violations_of(sample) == []


def _violations_of(path: pathlib.Path) -> list[str]:
    global PACKAGE
    saved, PACKAGE = PACKAGE, path.parent
    try:
        return _violations(path)
    finally:
        PACKAGE = saved
