"""The served OpenAPI document for collection, built once per state of the source.

The contract and fuzz tests need the document when pytest collects them (a test per operation or route),
so every xdist worker of every run built it again: about 0.8 s of CPU for FastAPI to make it.
It is a function of the source of `caiplatform` and `caiplatform_server`, of the versions of the
libraries that write it, of the interpreter, and of the `CAI_*` settings in the environment; the copy
kept in the checkout's git-ignored `.caiplatform/test-cache/` (or `CAI_TEST_CACHE_DIR`) is named by a
hash of all of them, so any change to one builds it again. `test_the_collected_document_is_the_served_one`
(tests/contract) compares the copy with the document the app serves.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.cache_support import shared_cache_dir

PACKAGES = ("caiplatform", "caiplatform_server")
WRITERS = ("fastapi", "pydantic", "pydantic-core", "starlette")


def build_document() -> dict[str, Any]:
    from caiplatform.platform import Platform
    from caiplatform_server.app import create_app

    return create_app(Platform.in_memory(), manage_lifecycle=False).app.openapi()  # type: ignore[attr-defined]


def source_key() -> str:
    digest = hashlib.blake2b(digest_size=16)
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)  # a top-level package is found without importing it
        directories = (spec.submodule_search_locations or []) if spec is not None else []
        for directory in directories:
            for path in sorted(Path(directory).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    for name in WRITERS:
        digest.update(f"{name}={importlib.metadata.version(name)}\0".encode())
    digest.update(sys.version.encode())
    digest.update(json.dumps(sorted((k, v) for k, v in os.environ.items() if k.startswith("CAI_"))).encode())
    return digest.hexdigest()


def cache_dir() -> Path:
    return shared_cache_dir() / "openapi"


def served_document() -> dict[str, Any]:
    """The document, from the cache when it holds the one for this source, else built and kept there
    (written whole under a temporary name, then renamed, so a concurrent reader never sees half of it)."""
    directory = cache_dir()
    path = directory / f"{source_key()}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    document = build_document()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.json"):
            stale.unlink(missing_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False) as out:
            json.dump(document, out)
        os.replace(out.name, path)
    except OSError:
        pass  # a read-only checkout: built every time, as before
    return document
