"""The digest of the compiled section's C sources, which setup.py compiles into ``_core.SOURCES``.

``core.py`` computes it again where the sources lie beside the package (a checkout; a wheel carries none), so that
an extension built from other sources than these (a checkout pulled or edited since its last build) is refused,
with a warning, instead of run against Python code it was not built for. Standard library only: setup.py loads this
file by path, before anything the package needs is installed.
"""

from __future__ import annotations

import hashlib
import os


def sources_digest(package_dir: str) -> str | None:
    """The sha256 of the C sources in ``package_dir`` (each file's name, a NUL, its bytes, in name order), or None
    where there are none."""
    names = sorted(n for n in os.listdir(package_dir) if n.startswith("_") and n.endswith((".c", ".h")))
    if not names:
        return None
    digest = hashlib.sha256()
    for name in names:
        with open(os.path.join(package_dir, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()
