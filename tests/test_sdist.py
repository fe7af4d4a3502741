"""The sdist is the whole project: the package, the docs, and the test suite with everything it imports or runs, so
that ``pip install -e ".[test]" && python -m pytest`` works in an unpacked sdist as in a checkout (MANIFEST.in).
``.ci/package`` checks the same of the sdist ``python -m build`` makes, and installs the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARRIED = ("docs", "tests", "stress", "benchmarks", "examples")


@pytest.mark.timeout(180)
def test_sdist_carries_docs_tests_and_what_they_import(tmp_path):
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):  # (a worktree's is a file)
        pytest.skip("not a git checkout (an unpacked sdist): nothing to compare the sdist with")
    tracked = subprocess.run(["git", "ls-files", *CARRIED], cwd=ROOT, capture_output=True, text=True, timeout=60,
                             check=True).stdout.split()
    assert len(tracked) > 100  # the listing found the files
    # Why setup.py and not python -m build: no isolated environment to install (no network needed), no compiler run.
    done = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--formats=gztar", "-d", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    missing = sorted(set(tracked) - names)
    assert not missing, f"tracked files missing from the sdist: {missing}"
    built = sorted(n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so")))
    assert not built, f"built files in the sdist: {built}"
    for f in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "shmcache/py.typed", "shmcache/_core.c"):
        assert f in names, f
