"""The embedded vector engine: Qdrant Edge (Qdrant's own shard engine, in process), one shard per collection.

Layout under the engine's directory: `collections/<name>/collection.json` (the collection's settings and
which shard directory is current) and `collections/<name>/shard-<n>/` (an Edge shard: segments and its
write-ahead log, so an accepted change survives a restart). Filters, payloads, scoring, id order and
scroll are Qdrant's own code; this adapter checks input in Qdrant's words, translates the JSON filter
(`adapters/qdrant/grammar.py`, `adapters/edge/filters.py`) and keeps the HNSW index built in the
background (`adapters/edge/indexing.py`). Queries with a filter search exactly: with no payload index,
HNSW under a restrictive filter can miss matches, and the API promises every match up to `top_k`.
See docs/decisions/vector.md for the measurements behind the defaults.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio.to_thread
import qdrant_edge as edge

from caiplatform.adapters.edge.filters import to_edge
from caiplatform.adapters.edge.former import former_collections, set_aside
from caiplatform.adapters.edge.indexing import IndexBuilder, IndexSettings
from caiplatform.adapters.memory.vector import checked_vector, json_payload
from caiplatform.adapters.qdrant.grammar import parse_filter, point_id
from caiplatform.ports.vector import (
    CollectionConfig,
    CollectionInfo,
    HnswConfig,
    Point,
    PointId,
    Quantization,
    Record,
    ScoredPoint,
    SearchParams,
    VectorEngine,
    VectorEngineRejected,
)

T = TypeVar("T")

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_DISTANCE = {"cosine": edge.Distance.Cosine, "dot": edge.Distance.Dot, "euclid": edge.Distance.Euclid}


def _quantization(q: Quantization) -> Any:
    if q.kind == "scalar":
        return edge.ScalarQuantizationConfig(type=edge.ScalarType.Int8, quantile=q.quantile, always_ram=q.always_ram)
    if q.kind == "binary":
        return edge.BinaryQuantizationConfig(always_ram=q.always_ram)
    return None


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def edge_config(config: CollectionConfig, index: IndexSettings) -> edge.EdgeConfig:
    """The shard's settings: the collection's own `hnsw_config`/`indexing_threshold` where create set
    them, the engine's defaults otherwise."""
    hnsw = config.hnsw
    return edge.EdgeConfig(
        vectors=edge.EdgeVectorParams(size=config.dimensions, distance=_DISTANCE[config.distance], on_disk=config.on_disk),
        on_disk_payload=config.payload_on_disk,
        hnsw_config=edge.HnswIndexConfig(m=_or(hnsw.m, index.m), ef_construct=_or(hnsw.ef_construct, index.ef_construct),
                                         full_scan_threshold=_or(hnsw.full_scan_threshold, index.full_scan_threshold_kb)),
        quantization_config=_quantization(config.quantization),
        optimizers=edge.EdgeOptimizersConfig(indexing_threshold=_or(config.indexing_threshold, index.threshold_kb)),
    )


def _refused_in_qdrant_words(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except (ValueError, TypeError) as exc:  # Edge refuses bad input with these
        raise VectorEngineRejected(f"Wrong input: {exc}") from None


# Beyond 2**53 an integer's conversion through a double could round differently from numpy's; no
# embedding comes near it, and such a vector simply takes the array's path.
_PLAIN_BOUND = 2.0**53
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _edge_vector(vector: Sequence[float], dimensions: int) -> list[float]:
    """What Edge takes for a vector: a list of the right width whose numbers are finite as float32 is
    handed over as it is (Edge converts it once); anything else goes through `checked_vector`, which
    converts it and words the refusal. A finite sum means every term is finite; the bound keeps every
    value inside float32's range."""
    if type(vector) is list and len(vector) == dimensions:
        try:
            if (math.isfinite(sum(vector)) and max(vector) <= _PLAIN_BOUND
                    and min(vector) >= -_PLAIN_BOUND):
                return vector
        except (TypeError, OverflowError):  # a string, None, or an integer beyond a float: refused below
            pass
    return checked_vector(vector, dimensions).tolist()


def _edge_payload(payload: Mapping[str, Any] | None) -> dict[str, Any]:
    """`json_payload`'s private copy, made without a JSON round trip when the payload is flat: string
    keys and scalar values (finite floats) are already what JSON gives back."""
    if type(payload) is dict and all(type(key) is str for key in payload) and _SCALARS.issuperset(
            map(type, payload.values())):
        floats = [value for value in payload.values() if type(value) is float]
        if not floats or math.isfinite(sum(floats)):
            return dict(payload)
    if not payload:
        return {}
    return json_payload(payload)


def _public_id(value: Any) -> PointId:
    return value if isinstance(value, int) else str(value)


@dataclass
class Collection:
    """One open collection: its settings, its live shard, and the lock every call to the shard takes."""

    name: str
    home: Path
    config: CollectionConfig
    current: str  # the shard directory in use, relative to `home`
    shard: edge.EdgeShard
    lock: threading.Lock = field(default_factory=threading.Lock)
    journal: list[Any] | None = None  # updates applied while a background index build runs
    building: bool = False
    # points not in the HNSW graph (searched by a scan), as the shard last said; None until it has
    unindexed: int | None = None

    def write_settings(self) -> None:
        """collection.json, replaced atomically: the settings and the current shard directory."""
        text = json.dumps({"config": asdict(self.config), "current": self.current})
        temporary = self.home / f".collection.json.{secrets.token_hex(4)}"
        temporary.write_text(text)
        os.replace(temporary, self.home / "collection.json")

    def apply(self, operation: Any) -> None:
        """Apply one update to the live shard (lock held); a running build replays it on its copy."""
        self.shard.update(operation)
        if self.journal is not None:
            self.journal.append(operation)


def _config_of(data: dict[str, Any]) -> CollectionConfig:
    data = dict(data)
    data["quantization"] = Quantization(**data.get("quantization", {}))
    data["hnsw"] = HnswConfig(**(data.get("hnsw") or {}))  # absent in collections written before
    return CollectionConfig(**data)


def _read_now(collection: Collection, fn: Callable[[edge.EdgeShard], T]) -> T:
    """`EdgeVectorEngine._read` in the calling thread."""
    while True:
        shard = collection.shard

        def on_this_shard(shard: edge.EdgeShard = shard) -> T:
            return fn(shard)

        try:
            return _refused_in_qdrant_words(on_this_shard)
        except VectorEngineRejected:
            raise
        except Exception:
            if collection.shard is shard:
                raise


# A query is answered on the event loop, without a worker thread's round trip, when it is bounded to
# well under a millisecond of CPU: a walk of the HNSW graph at a modest beam plus a scan of at most
# this much of the vectors not yet in it, all in memory (no filter, not exact, vectors not on disk).
# Anything else (a collection still mostly unindexed, an exact or filtered search, a wide beam) runs in a
# worker thread as before, so the loop never waits for a scan.
INLINE_SCAN_BYTES = 2 * 1024 * 1024
INLINE_MAX_EF = 256


class EdgeVectorEngine(VectorEngine):
    name = "edge"

    def __init__(self, directory: str | Path, *, index: IndexSettings | None = None):
        self.directory = Path(directory)
        self.root = self.directory / "collections"
        self.index = index or IndexSettings()
        self._collections: dict[str, Collection] = {}
        self._started = False
        self._starting = asyncio.Lock()  # the first calls may all find the engine not started yet
        self._builder = IndexBuilder(self.index)

    async def wait_indexed(self) -> None:
        """Until every background index build has finished (tests and benchmarks)."""
        await self._builder.wait()

    # ------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open every collection (its write-ahead log replays what the last run accepted)."""
        async with self._starting:
            if self._started:
                return
            infos = await anyio.to_thread.run_sync(self._open_all)
            self._started = True
            await self._import_former()
            for collection, info in infos:
                self._builder.consider(collection, info)

    async def _import_former(self) -> None:
        """The data of the former embedded engine (`vectors.db`), once (`adapters/edge/former.py`)."""
        database = self.directory / "vectors.db"
        if not database.is_file():
            return
        for name, config, batches in former_collections(database):
            if name not in self._collections:  # else an import cut short: upserting again is harmless
                await self.create_collection(name, config)
            for points in batches:
                await self.upsert(name, points)
        await anyio.to_thread.run_sync(set_aside, database)

    def _open_all(self) -> list[tuple[Collection, Any]]:
        self.root.mkdir(parents=True, exist_ok=True)
        for home in sorted(self.root.iterdir()):
            if not home.is_dir() or home.name.startswith("."):
                continue
            settings = home / "collection.json"
            if not settings.is_file():  # a creation the process did not finish: nothing was accepted in it
                shutil.rmtree(home, ignore_errors=True)
                continue
            data = json.loads(settings.read_text())
            current = data["current"]
            for stale in home.iterdir():  # a build the process did not finish
                if stale.is_dir() and stale.name != current:
                    shutil.rmtree(stale, ignore_errors=True)
            config = _config_of(data["config"])
            # A payload_on_disk changed by update_collection, and changed index settings, take effect here.
            shard = edge.EdgeShard.load(str(home / current), edge_config(config, self.index))
            self._collections[home.name] = Collection(home.name, home, config, current, shard)
        return [(c, c.shard.info()) for c in self._collections.values()]

    async def close(self) -> None:
        await self._builder.stop()
        collections, self._collections = list(self._collections.values()), {}
        self._started = False

        def close_all() -> None:
            for collection in collections:
                with collection.lock:
                    collection.shard.close()

        await anyio.to_thread.run_sync(close_all)

    def service_url(self) -> str:
        return self.directory.resolve().as_uri()

    async def health(self) -> None:
        if not self._started:
            await self.start()
        if not os.access(self.root, os.W_OK):
            raise OSError(f"the vector directory {self.root} is not writable")

    # ---------------------------------------------------------------------------------- collections

    async def _get(self, name: str) -> Collection:
        if not self._started:
            await self.start()
        collection = self._collections.get(name)
        if collection is None:
            raise VectorEngineRejected(f"Not found: Collection `{name}` doesn't exist!")
        return collection

    async def _write(self, collection: Collection, fn: Callable[[], T]) -> T:
        """Writers take the collection's lock (a background build copies the shard under it)."""

        def locked() -> T:
            with collection.lock:
                return _refused_in_qdrant_words(fn)

        return await anyio.to_thread.run_sync(locked)

    async def _read(self, collection: Collection, fn: Callable[[edge.EdgeShard], T]) -> T:
        """Readers take no lock, so a build's copy does not hold them up; a read that met the shard a
        build had just replaced (and closed) is read again from the new one."""
        return await anyio.to_thread.run_sync(_read_now, collection, fn)

    async def create_collection(self, name: str, config: CollectionConfig) -> None:
        if not _NAME.match(name):
            raise VectorEngineRejected(
                f"Wrong input: Collection name `{name}` must be 1 to 255 letters, digits, `_` or `-`")
        if not self._started:
            await self.start()
        if name in self._collections:
            raise VectorEngineRejected(f"Wrong input: Collection `{name}` already exists!")
        home = self.root / name

        def create() -> Collection:
            home.mkdir()
            shard = edge.EdgeShard.create(str(home / "shard-0"), edge_config(config, self.index))
            collection = Collection(name, home, config, "shard-0", shard)
            collection.write_settings()  # last: a collection without it was never created
            return collection

        self._collections[name] = await anyio.to_thread.run_sync(create)

    async def drop_collection(self, name: str) -> bool:
        if not self._started:
            await self.start()
        collection = self._collections.pop(name, None)
        if collection is None:
            return False
        self._builder.cancel(name)

        def drop() -> None:
            with collection.lock:
                collection.shard.close()
                doomed = self.root / f".dropped-{name}-{secrets.token_hex(4)}"
                os.rename(collection.home, doomed)  # gone at once, even if the removal below is cut short
            shutil.rmtree(doomed, ignore_errors=True)

        await anyio.to_thread.run_sync(drop)
        return True

    async def collection_info(self, name: str) -> CollectionInfo | None:
        if not self._started:
            await self.start()
        collection = self._collections.get(name)
        if collection is None:
            return None
        info = await self._read(collection, lambda shard: shard.info())
        status = "yellow" if collection.building else "green"
        return CollectionInfo(status, info.points_count, info.points_count, info.segments_count)

    async def collection_config(self, name: str) -> CollectionConfig:
        """The settings the collection was created with (and updated to)."""
        return (await self._get(name)).config

    async def list_collections(self) -> list[str]:
        if not self._started:
            await self.start()
        return sorted(self._collections)

    async def update_collection(
        self, name: str, *, replicas: int | None = None, payload_on_disk: bool | None = None
    ) -> None:
        """Recorded in collection.json; `payload_on_disk` takes effect when the shard is next opened."""
        collection = await self._get(name)
        changes: dict[str, Any] = {}
        if replicas is not None:
            changes["replicas"] = replicas
        if payload_on_disk is not None:
            changes["payload_on_disk"] = payload_on_disk
        def record() -> None:  # under the lock: a build's swap rewrites the same file
            previous = collection.config
            collection.config = replace(previous, **changes)
            try:
                collection.write_settings()
            except BaseException:
                collection.config = previous
                raise

        await self._write(collection, record)

    # --------------------------------------------------------------------------------------- points

    async def upsert(self, name: str, points: Sequence[Point]) -> None:
        collection = await self._get(name)
        dimensions = collection.config.dimensions
        # Everything is checked before anything is written: all or nothing.
        prepared = [
            edge.Point(point_id(p.id), _edge_vector(p.vector, dimensions), _edge_payload(p.payload))
            for p in points
        ]
        if not prepared:
            return
        operation = edge.UpdateOperation.upsert_points(prepared)

        def write() -> Any:
            collection.apply(operation)
            return collection.shard.info()

        self._builder.consider(collection, await self._write(collection, write))

    async def query(
        self,
        name: str,
        vector: Sequence[float],
        *,
        top_k: int = 10,
        filter: Mapping[str, Any] | None = None,
        with_payload: bool = True,
        with_vector: bool = False,
        score_threshold: float | None = None,
        offset: int = 0,
        params: SearchParams | None = None,
    ) -> list[ScoredPoint]:
        collection = await self._get(name)
        dense = _edge_vector(vector, collection.config.dimensions)
        parsed = parse_filter(filter)
        search = self._search_params(params, filtered=parsed is not None, wanted=top_k + offset)
        request = edge.QueryRequest(
            limit=top_k,
            offset=offset,
            query=edge.Query.Nearest(dense),
            filter=to_edge(parsed) if parsed is not None else None,
            with_payload=with_payload,
            with_vector=with_vector,
            score_threshold=score_threshold,
            params=search,
        )
        if (parsed is None and not search.exact and search.hnsw_ef <= INLINE_MAX_EF
                and not collection.config.on_disk and collection.unindexed is not None
                and collection.unindexed * collection.config.dimensions * 4 <= INLINE_SCAN_BYTES):
            found = _read_now(collection, lambda shard: shard.query(request))
        else:
            found = await self._read(collection, lambda shard: shard.query(request))
        return [
            ScoredPoint(
                id=_public_id(p.id),
                score=float(p.score),
                payload=dict(p.payload or {}) if with_payload else None,
                vector=[float(x) for x in cast(list[float], p.vector)] if with_vector and isinstance(p.vector, list)
                else None,
            )
            for p in found
        ]

    def _search_params(self, params: SearchParams | None, *, filtered: bool, wanted: int) -> Any:
        """The caller's `params` unchanged where given; otherwise the engine's beam (widened to what the
        query asks for) and an exact search under a filter (the API promises every match up to top_k)."""
        exact = filtered if params is None or not params.exact else True
        hnsw_ef = max(self.index.ef, wanted) if params is None or params.hnsw_ef is None else params.hnsw_ef
        return edge.SearchParams(exact=exact, hnsw_ef=hnsw_ef)

    async def scroll(
        self,
        name: str,
        *,
        limit: int = 50,
        offset: PointId | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> tuple[list[Record], PointId | None]:
        collection = await self._get(name)
        parsed = parse_filter(filter)
        request = edge.ScrollRequest(
            offset=point_id(offset) if offset is not None else None,
            limit=limit,
            filter=to_edge(parsed) if parsed is not None else None,
            with_payload=True,
            with_vector=False,
        )
        records, next_offset = await self._read(collection, lambda shard: shard.scroll(request))
        page = [Record(_public_id(r.id), dict(r.payload or {})) for r in records]
        return page, _public_id(next_offset) if next_offset is not None else None

    async def delete_points(
        self, name: str, *, ids: Sequence[PointId] | None = None, filter: Mapping[str, Any] | None = None
    ) -> None:
        collection = await self._get(name)
        if filter is not None:
            parsed = parse_filter(filter)
            assert parsed is not None
            operation = edge.UpdateOperation.delete_points_by_filter(to_edge(parsed))
        else:
            operation = edge.UpdateOperation.delete_points([point_id(i) for i in ids or ()])
        await self._write(collection, lambda: collection.apply(operation))
