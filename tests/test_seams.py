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
    ("lru.py", "_lru_cache_wrapper"),  # the docstring's reference to functools' own sentinel design
}
# (module, name) imports of a private module of the package itself: the compiled extension, loaded in one place.
ALLOWED_IMPORTS = {("compiled.py", "_core")}
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


# ---------------------------------------------------------------------------------------------- the C twins
# Each C function of the compiled section that mirrors a Python one names it, as "(twin: table.py Table.insert)"; the
# parts of _core.c name their module ("Twin of table.py (Table)"). A twin renamed or removed on the Python side must
# fail here, or the C comments would send a reader to code that is not there.
C_SOURCES = sorted(PACKAGE.glob("_*.c")) + sorted(PACKAGE.glob("_*.h"))
_TWIN = re.compile(r"\(twin: ([\w/]+\.py) ([A-Za-z_][\w.]*)\)")
_PART = re.compile(r"Twin of ((?:[\w/]+\.py(?: \([A-Za-z_][\w.]*\))?(?:, | and )?)+)")
_PART_ITEM = re.compile(r"([\w/]+\.py)(?: \(([A-Za-z_][\w.]*)\))?")


def _names(tree: ast.Module) -> set[str]:
    """Every qualified name ``tree`` defines: functions, classes, their methods and class attributes, and module
    assignments."""
    out: set[str] = set()

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, prefix + node.name + ".")
            elif isinstance(node, ast.Assign):
                out.update(prefix + t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(prefix + node.target.id)

    visit(tree.body, "")
    return out


def _twins(text: str) -> list[tuple[str, str | None]]:
    """The (module, name) pairs the C source ``text`` cites as its twins (name None: the module alone); a citation
    may run over a comment's line break."""
    flat = " ".join(re.sub(r"\n\s*\*(?!/)", " ", text).split())
    found: list[tuple[str, str | None]] = list(_TWIN.findall(flat))
    for m in _PART.finditer(flat):
        found += [(f, n or None) for f, n in _PART_ITEM.findall(m.group(1))]
    return found


def _missing_twins(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> list[str]:
    missing = []
    for module, name in _twins(path.read_text()):
        target = package / module
        if not target.exists():
            missing.append(f"{path.name}: {module} does not exist")
        elif name is not None and name not in _names(ast.parse(target.read_text())):
            missing.append(f"{path.name}: {module} has no {name}")
    return missing


@pytest.mark.parametrize("path", C_SOURCES, ids=lambda p: p.name)
def test_seams_every_cited_twin_exists(path):
    assert _missing_twins(path) == []


def test_seams_the_compiled_section_cites_its_twins():
    """Every part of _core.c names its Python module, and the locked operations name their functions."""
    parts = sorted(PACKAGE.glob("_core_*.c"))
    assert len(parts) == 12 and all(_PART.search(p.read_text()) for p in parts)
    cited = {t for p in parts for t in _twins(p.read_text())}
    for twin in [("table.py", "Table.insert"), ("table.py", "Table.evict_until"), ("store.py", "Store.put"),
                 ("policies/s3fifo.py", "s3fifo_evict_one"), ("policies/s3fifo.py", "ghost_add"),
                 ("policies/s3fifo.py", "S3fifo.link_new"), ("policies/base.py", "Policy.link_new"),
                 ("table.py", "Table.touch"),
                 ("store.py", "Store.read"), ("entries.py", "get_many_locked"), ("index.py", "find"),
                 ("snapshot.py", "_store")]:
        assert twin in cited
    assert max(len(p.read_text().splitlines()) for p in [*parts, PACKAGE / "_core.c"]) < 1000


def test_seams_twin_check_catches_a_missing_twin(tmp_path):
    (tmp_path / "table.py").write_text("class Table:\n    def insert(self):\n        pass\n")
    c = tmp_path / "_x.c"
    c.write_text("/* Twin of table.py (Table). */\n/* (twin: table.py Table.insert) */\n/* (twin: table.py\n"
                 " * Table.evict) (twin: gone.py f) */\n")
    assert _missing_twins(c, tmp_path) == ["_x.c: table.py has no Table.evict", "_x.c: gone.py does not exist"]


def test_seams_a_policy_is_asked_never_tested_by_its_number():
    """What a policy does is asked of its object (policies/, Policy; C: policy_ops, PolicyOps), never decided by
    comparing the segment's policy number: outside the policies, the layout (the ghost region's size) and the
    constants core.py hands the C at bind to check, no source names a POLICY_* number, and no C reads it."""
    allowed = {"policies", "layout"}
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in allowed:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bPOLICY_(LRU|S3FIFO|KEEP)\b", line) and not (rel.name == "core.py" and '"POLICY_' in line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    for path in sorted(PACKAGE.glob("_core*.[ch]")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"->policy\b|policy\s*[!=]=\s*POLICY_|POLICY_\w+\s*[!=]=", line) \
                    and path.name != "_core_binding.c":
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []


# ------------------------------------------------------------------------------------------- the import graph
# The package's modules import one another without a cycle, at import time or later (an import inside a function is
# a dependency too); and downward only through docs/design.md's module map, whose layers (entry points, adapters, the
# Redis tier, the facade, the dispatch, the parts, the compiled section, ...) are read from the map itself, so that
# the map a reader follows is the graph the code has. Imports for type checkers alone (``if TYPE_CHECKING:``) do not
# count: they never run.


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    """``tier/tiered`` for shmcache/tier/tiered.py, ``tier/__init__`` for the tier package."""
    return path.relative_to(package).with_suffix("").as_posix()


def _imports(path: pathlib.Path, package: pathlib.Path, names: set[str]) -> set[str]:
    """The modules of the package (by ``_module_name``) that ``path`` imports when it runs."""
    tree = ast.parse(path.read_text())
    checking = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            checking |= {id(n) for n in ast.walk(node)}
    here = _module_name(path, package).split("/")[:-1]  # the importing module's package, as parts
    found = set()

    def add(parts: list[str]) -> None:
        name = "/".join(parts)
        if name in names:
            found.add(name)
        elif f"{name}/__init__" in names or not name:
            found.add(f"{name}/__init__" if name else "__init__")

    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == package.name:
                    add(alias.name.split(".")[1:])
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else list(here)
            elif (node.module or "").split(".")[0] == package.name:
                base = []
            else:
                continue
            mod = base + ([p for p in (node.module or "").split(".") if p] if node.level else
                          node.module.split(".")[1:])
            for alias in node.names:  # a submodule imported by name, else the module itself
                sub = "/".join(mod + [alias.name])
                if sub in names or f"{sub}/__init__" in names:
                    add(mod + [alias.name])
                else:
                    add(mod)
    found.discard(_module_name(path, package))
    return found


def import_graph(package: pathlib.Path) -> dict[str, set[str]]:
    """Each module of ``package`` (``_module_name``) and the package's modules it imports when it runs; an extension
    module (one the package describes with a stub: ``_core.pyi``) is a module that imports nothing."""
    paths = sorted(package.rglob("*.py"))
    extensions = {p.stem for p in package.glob("*.pyi")}
    names = {_module_name(p, package) for p in paths} | extensions
    graph = {_module_name(p, package): _imports(p, package, names) for p in paths}
    return graph | {name: set() for name in extensions}


def a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its modules in order, the first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    path: list[str] = []

    def walk(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := walk(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := walk(v)):
            return found
    return None


def map_layers(design: str) -> list[tuple[str, list[str]]]:
    """The layers of docs/design.md's module map, top first: (label, the names listed in it). A name is a module's
    path in the package without ``.py`` (``tier/steps`` for a branch ``|- steps`` under ``tier/tiered``), or a
    package's with a slash (``policies/``); names of the compiled section's C files start with an underscore."""
    block = design[design.index("## 1. Module map"):]
    block = block[block.index("```\n") + 4:]
    block = block[: block.index("```")]
    layers: list[tuple[str, list[str]]] = []
    parent = ""
    for line in block.splitlines():
        label = re.match(r"^ ([A-Za-z][A-Za-z /]*?)\s{2,}(.*)$", line)
        rest = line
        if label and not line.startswith("  "):
            layers.append((label.group(1).strip(), []))
            rest = " " * 16 + label.group(2)
        entry = re.match(r"^ {15,17}([|`]- )?([\w/.]+)(?: -> ([\w/]+))? \.{3,}", rest)
        if entry and layers:
            branch, name, target = entry.groups()
            if branch and "/" in parent:
                name = parent.split("/")[0] + "/" + name
            if not branch:
                parent = name
            layers[-1][1].extend([name] + ([target] if target else []))
    return layers


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The index in ``layers`` of the layer that lists ``module`` (``_module_name``): by its name, or by its
    package's (``policies/`` holds ``policies/lru``; a package's ``__init__`` goes with its modules)."""
    for i, (_, names) in enumerate(layers):
        for name in names:
            if name == module or (name.endswith("/") and module.startswith(name)):
                return i
    if module.endswith("/__init__"):
        package = module[: -len("__init__")]
        found = [i for i, (_, names) in enumerate(layers) for name in names if name.startswith(package)]
        return min(found) if found else None
    return None


def layer_violations(graph: dict[str, set[str]], layers) -> list[str]:
    """Modules the map does not place, and imports that go up the map."""
    out = [f"{m} is in no layer of the module map" for m in sorted(graph) if layer_of(m, layers) is None]
    for m in sorted(graph):
        mine = layer_of(m, layers)
        for dep in sorted(graph[m]):
            theirs = layer_of(dep, layers)
            if mine is not None and theirs is not None and theirs < mine:
                out.append(f"{m} ({layers[mine][0]}) imports {dep}, a layer above ({layers[theirs][0]})")
    return out


def test_seams_the_package_imports_form_no_cycle():
    graph = import_graph(PACKAGE)
    assert "core" in graph["cache"] and "compiled" in graph["guard"]  # (the graph is read at all)
    assert a_cycle(graph) is None, " -> ".join(a_cycle(graph) or [])


def test_seams_the_module_maps_layers_call_downward_only():
    layers = map_layers((PACKAGE.parent / "docs" / "design.md").read_text())
    labels = [label for label, _ in layers]
    assert labels[0] == "entry points" and labels[-1] == "spec" and len(labels) >= 8, labels
    assert layer_violations(import_graph(PACKAGE), layers) == []


def test_seams_import_checks_catch_a_cycle_and_an_upward_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "top.py").write_text("from . import low\n")
    (package / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import top\n")
    (package / "sub" / "leaf.py").write_text("def f():\n    from ..top import g\n")
    graph = import_graph(package)
    assert graph["top"] == {"low"} and graph["low"] == set() and graph["sub/leaf"] == {"top"}
    assert a_cycle(graph) is None
    (package / "low.py").write_text("import pkg.sub.leaf\n")
    graph = import_graph(package)
    assert a_cycle(import_graph(package)) == ["low", "sub/leaf", "top", "low"]
    design = ("## 1. Module map\n\n```\n top layer      top ........ t\n                sub/ ....... s\n\n"
              " bottom         low ........ l\n```\n")
    layers = map_layers(design)
    assert layers == [("top layer", ["top", "sub/"]), ("bottom", ["low"])]
    assert layer_violations(graph, layers) == ["__init__ is in no layer of the module map",
                                               "low (bottom) imports sub/leaf, a layer above (top layer)"]


def test_views_read_no_frame_and_no_interpreter_internals():
    """A view is its export: no view code reads a caller's frame or counts references, and no C file of the package
    includes CPython's internal headers (they change with every release, 3.14's and 3.15's included)."""
    package = PACKAGE
    frames = re.compile(r"_getframe|f_locals|f_back|currentframe|getrefcount|PyEval_GetFrame|PyFrame_|Py_REFCNT|"
                        r"PyArrayObject_fields")
    for path in (package / "view.py", package / "_view.c", package / "_view.h"):
        found = frames.findall(path.read_text())
        assert not found, (path.name, found)
    internal = re.compile(r"#\s*include\s*[<\"](?:internal/)?pycore_|Py_BUILD_CORE")
    for path in sorted(package.glob("*.[ch]")):
        assert not internal.search(path.read_text()), path.name
    assert not (package / "_frame.c").exists()
