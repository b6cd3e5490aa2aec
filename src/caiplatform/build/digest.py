"""The content hash that names an image, shared by every builder so the same source gets the same digest.

The hash covers the project, every regular file of the tree (relative path, executable bit, bytes), the
framework, the function runtime and the platform version (the harness an image starts is part of what
was built). The project is part of the key: a build runs the tenant's code (a `setup.py`, a
`postinstall`), so an image is reused within its project only, and no project runs, or learns of, what
another project built from the same source.
Byte-compiled caches are left out: they appear when code runs and say nothing about the source.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import caiplatform

IGNORED_DIRS = {"__pycache__", ".git"}
IGNORED_SUFFIXES = (".pyc", ".pyo")


def source_files(source_dir: Path) -> list[Path]:
    """Regular files of the tree, sorted by relative path (symlinks and caches left out)."""
    source_dir = Path(source_dir)
    out: list[Path] = []
    for root, dirs, files in os.walk(source_dir):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS and not os.path.islink(os.path.join(root, d)))
        for name in files:
            path = Path(root) / name
            if path.is_symlink() or not path.is_file() or name.endswith(IGNORED_SUFFIXES):
                continue
            out.append(path)
    return sorted(out, key=lambda p: p.relative_to(source_dir).as_posix())


def source_digest(source_dir: Path, framework: str, runtime: str | None = None, *, project: str) -> str:
    """`sha256:<hex>` over the project, the tree and what it is built as."""
    source_dir = Path(source_dir)
    h = hashlib.sha256()
    for part in ("caiplatform-image/2", caiplatform.__version__, project, framework, runtime or ""):
        h.update(part.encode() + b"\0")
    for path in source_files(source_dir):
        rel = path.relative_to(source_dir).as_posix().encode()
        executable = b"x" if os.access(path, os.X_OK) else b"-"
        data = path.read_bytes()
        h.update(b"%d:%s%s%d:" % (len(rel), rel, executable, len(data)))
        h.update(data)
    return "sha256:" + h.hexdigest()


def image_reference(registry_host: str, project_short: str, workload: str, digest: str) -> str:
    return f"{registry_host}/cai-{project_short}-{workload}@{digest}"


def digest_of_reference(reference: str) -> str | None:
    """The `sha256:<hex>` a pinned reference ends with, or None."""
    _, at, digest = reference.rpartition("@")
    return digest if at and digest.startswith("sha256:") else None
