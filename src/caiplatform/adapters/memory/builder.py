"""In-memory builder: checks and hashes the source and keeps a private copy of the tree as the image.

No environment is installed (the platform's own Python runs the in-process app), so `requirements.txt`
is recorded, not installed; the language step of a function in another language does run
(`caiplatform.build.languages`: a Go function is compiled into `<digest>.bin/` beside the copy). The copy lives in a temporary directory owned by the builder and removed
on `close()`; a later change to the uploaded tree never reaches a built image.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from caiplatform.build.digest import source_files
from caiplatform.build.languages import build_function, function_env
from caiplatform.build.prepare import check_request
from caiplatform.ports.builder import Builder, BuildLog, BuildRequest, Image

HARNESS_MODULE = "caiplatform.harness"


def copy_tree(source_dir: Path, target: Path) -> None:
    """Copy the files the digest covers (no symlinks, no caches) into `target`."""
    for path in source_files(source_dir):
        dest = target / path.relative_to(source_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)


class InMemoryBuilder(Builder):
    name = "memory"

    def __init__(self, registry_host: str = "registry.local", *, root: Path | None = None):
        self.registry_host = registry_host
        self._owns_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="cai-images-"))
        self._images: dict[str, Image] = {}  # digest -> image as first built (reference varies by workload)
        self._references: dict[str, Image] = {}
        self.builds = 0  # how many builds did real work (tests and benchmarks read it)
        self._locks: dict[str, asyncio.Lock] = {}

    async def build(self, request: BuildRequest, log: BuildLog | None = None) -> Image:
        emit = log or (lambda _line: None)
        checked = await check_request(request, self.registry_host)
        digest, reference = checked.digest, checked.reference
        # Concurrent builds of one source take turns (they would share the staging directory).
        async with self._locks.setdefault(digest, asyncio.Lock()):
            image = await self._build_locked(checked, request, emit)
        self._references[reference] = replace(image, reused=False)
        return image

    async def _build_locked(self, checked: Any, request: BuildRequest, emit: BuildLog) -> Image:
        source, framework, digest, reference = checked.source, checked.framework, checked.digest, checked.reference
        existing = self._images.get(digest)
        if existing is not None and Path(existing.location).is_dir():
            emit(f"reusing image {digest} (this project built the same source before)")
            image = replace(existing, reference=reference, reused=True)
        else:
            emit(f"checked {framework} source; copying it into image {digest}")
            location = self.root / digest.removeprefix("sha256:")
            staging = self.root / (location.name + ".partial")
            bin_dir = self._bin_dir(location)
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(bin_dir, ignore_errors=True)
            await anyio.to_thread.run_sync(copy_tree, source, staging)
            try:
                await build_function(framework, staging, bin_dir, emit, cache_dir=self.root / "go-cache")
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                shutil.rmtree(bin_dir, ignore_errors=True)
                raise
            shutil.rmtree(location, ignore_errors=True)
            staging.rename(location)
            self.builds += 1
            image = Image(
                reference=reference,
                digest=digest,
                framework=framework,
                runtime=request.runtime,
                command=[sys.executable, "-m", HARNESS_MODULE],
                env={"CAI_FRAMEWORK": framework, "CAI_CODE_DIR": str(location),
                     **function_env(framework, self._bin_dir(location))},
                location=str(location),
            )
            self._images[digest] = image
        return image

    @staticmethod
    def _bin_dir(location: Path) -> Path:
        """Where the language step puts what it compiles (beside the code, not in it)."""
        return location.with_name(location.name + ".bin")

    async def resolve(self, reference: str) -> Image | None:
        image = self._references.get(reference)
        if image is None or not Path(image.location).is_dir():
            return None
        return image

    async def remove(self, reference: str) -> None:
        image = self._references.pop(reference, None)
        if image is None:
            return
        if any(other.digest == image.digest for other in self._references.values()):
            return  # another workload still runs the same content
        self._images.pop(image.digest, None)
        shutil.rmtree(image.location, ignore_errors=True)
        shutil.rmtree(self._bin_dir(Path(image.location)), ignore_errors=True)

    async def close(self) -> None:
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)


__all__ = ["InMemoryBuilder", "copy_tree"]
