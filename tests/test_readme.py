"""The README's recipes run as written: its ``multiprocessing.Pool`` recipe under every start method, "spawn" (the
default on macOS) and "forkserver" (the default from Python 3.14) included, where each worker imports the main
module."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from shmcache import SharedCache

from .conftest import unique_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the recipe takes as given: a transform and the items; the imports it names.
PRELUDE = '''\
import multiprocessing as mp
from shmcache import SharedCache

def expensive_transform(item):
    return {"item": item, "square": item * item}

items = [i % 5 for i in range(20)]
'''
RUN = '''\
import multiprocessing as mp, runpy, sys
mp.set_start_method(sys.argv[2])
ns = runpy.run_path(sys.argv[1], run_name="__main__")
print(ns["results"])
'''


def _pool_recipe() -> str:
    """The README's Pool recipe: the python block that follows "A `multiprocessing.Pool`", unindented."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    found = re.search(r"A `multiprocessing.Pool`.*?```python\n(.*?)\n\s*```", readme, re.S)
    assert found, "the README's Pool recipe is missing"
    lines = found.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_readme_pool_recipe_runs_under_every_start_method(tmp_path, method):
    name = unique_name("readme")
    recipe = _pool_recipe()
    assert '"samples"' in recipe
    script = tmp_path / "recipe.py"
    script.write_text(PRELUDE + recipe.replace('"samples"', repr(name)))
    try:
        done = subprocess.run([sys.executable, "-c", RUN, str(script), method], capture_output=True, text=True,
                              timeout=90, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        expected = [{"item": i % 5, "square": (i % 5) ** 2} for i in range(20)]
        assert done.stdout.strip() == repr(expected)
    finally:
        try:
            SharedCache.unlink_name(name)
        except FileNotFoundError:
            pass
