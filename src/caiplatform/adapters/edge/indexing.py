"""HNSW for the embedded engine, built in the background without holding up writes or queries.

Edge builds its index in `EdgeShard.optimize()`, which holds Python's GIL for the whole build (about a
minute at 100k x 384): run in process, it would stop the server. So a build works on a copy: under the
collection's lock the live shard is flushed and copied and a journal starts; a child process (at lower
priority) optimizes the copy; then, under the lock again, every update the journal recorded meanwhile is
replayed on the copy, `collection.json` is switched to it and the old shard is closed and removed.
Writes and queries go to the live shard throughout; a crash at any point leaves the old shard current
(the next start removes the unfinished copy). A build starts once a collection holds at least
`threshold_kb` of vectors not yet in an index.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import qdrant_edge as edge

if TYPE_CHECKING:
    from caiplatform.adapters.edge.vector import Collection

log = logging.getLogger(__name__)

# The child process: load the copy, build every index the optimizer plans, close (flushes).
_OPTIMIZE = "import os, sys, qdrant_edge as e; os.nice(10); s = e.EdgeShard.load(sys.argv[1]); s.optimize(); s.close()"


def copy_sparse(source: Path, target: Path) -> None:
    """Copy a shard directory keeping holes as holes: Edge preallocates its WAL and payload pages as
    sparse files (about 100 MB each shard, nearly all holes), which a plain copy would write out."""
    try:
        subprocess.run(["cp", "-r", "--sparse=always", str(source), str(target)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except (FileNotFoundError, subprocess.CalledProcessError):  # no GNU cp: a dense copy still works
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)


@dataclass(frozen=True)
class IndexSettings:
    """HNSW parameters (measured in benchmarks/vector_edge_bench.py; docs/decisions/vector.md)."""

    m: int = 16
    ef_construct: int = 100
    ef: int = 128  # the search beam; a query asking for more results widens it to top_k + offset
    threshold_kb: int = 20_000  # unindexed vectors (KB of float32) that start a build
    full_scan_threshold_kb: int = 10_000  # Qdrant's default: smaller segments are scanned, not walked
    retry_seconds: float = 300.0  # after a failed build


class IndexBuilder:
    def __init__(self, settings: IndexSettings):
        self.settings = settings
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._failed_at: dict[str, float] = {}

    def consider(self, collection: Collection, info: Any) -> None:
        """Start a background build when enough vectors wait outside the index (and none is running)."""
        collection.unindexed = info.points_count - info.indexed_vectors_count
        unindexed_kb = collection.unindexed * collection.config.dimensions * 4 / 1024
        threshold = collection.config.indexing_threshold
        if threshold is None:
            threshold = self.settings.threshold_kb
        if threshold == 0 or collection.config.hnsw.m == 0:  # Qdrant's "never index" settings
            return
        if collection.building or unindexed_kb < threshold:
            return
        if time.monotonic() - self._failed_at.get(collection.name, -1e9) < self.settings.retry_seconds:
            return
        collection.building = True
        task = asyncio.get_running_loop().create_task(self._build(collection), name=f"hnsw-{collection.name}")
        self._tasks[collection.name] = task
        task.add_done_callback(lambda done: self._forget(collection.name, done))

    def _forget(self, name: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(name) is task:  # a build may have started the next one already
            del self._tasks[name]

    def cancel(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait(self) -> None:
        """Until every running build has finished (tests and benchmarks)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def _build(self, collection: Collection) -> None:
        number = int(collection.current.rpartition("-")[2]) + 1
        target_name = f"shard-{number}"
        target = collection.home / target_name
        copy: edge.EdgeShard | None = None
        built = False
        try:
            await anyio.to_thread.run_sync(self._copy, collection, target)
            await anyio.run_process([sys.executable, "-c", _OPTIMIZE, str(target)], stdout=subprocess.DEVNULL)
            copy = await anyio.to_thread.run_sync(edge.EdgeShard.load, str(target))
            await anyio.to_thread.run_sync(self._swap, collection, copy, target_name)
            copy, built = None, True
        except Exception:
            log.exception("building the HNSW index of %s failed; it is searched without it", collection.name)
            self._failed_at[collection.name] = time.monotonic()
        finally:
            collection.journal = None
            collection.building = False
            if copy is not None:
                copy.close()
            if collection.current != target_name:
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(target, ignore_errors=True))
        if built:  # what was written during the build may be enough for the next one
            self.consider(collection, await anyio.to_thread.run_sync(collection.shard.info))

    @staticmethod
    def _copy(collection: Collection, target: Path) -> None:
        with collection.lock:
            collection.shard.flush()
            copy_sparse(collection.home / collection.current, target)
            collection.journal = []

    @staticmethod
    def _swap(collection: Collection, copy: edge.EdgeShard, target_name: str) -> None:
        with collection.lock:
            for operation in collection.journal or ():
                copy.update(operation)
            copy.flush()
            old_name, old = collection.current, collection.shard
            collection.current = target_name
            try:
                collection.write_settings()
            except BaseException:
                collection.current = old_name
                raise
            collection.shard, collection.journal = copy, None
        old.close()  # a read still on it reads again from the new shard
        shutil.rmtree(collection.home / old_name, ignore_errors=True)
