"""Qdrant through `qdrant-client`: a Qdrant server at a URL, or Qdrant's local mode in a directory.

The client is synchronous and runs in worker threads; local mode is not thread-safe and holds a file
lock on its directory, so its calls go one at a time and `close()` releases the lock (a restarted
platform reopens the same directory). The same code serves both modes: only the client differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import anyio.to_thread
import httpx
from pydantic import ValidationError
from qdrant_client import QdrantClient
from qdrant_client.http import models
from qdrant_client.http.exceptions import UnexpectedResponse

from caiplatform.adapters.qdrant.grammar import parse_filter, point_id
from caiplatform.ports.vector import (
    CollectionConfig,
    CollectionInfo,
    Point,
    PointId,
    Record,
    ScoredPoint,
    SearchParams,
    VectorEngine,
    VectorEngineRejected,
)

T = TypeVar("T")

_DISTANCE = {"cosine": models.Distance.COSINE, "dot": models.Distance.DOT, "euclid": models.Distance.EUCLID}


def _quantization(config: CollectionConfig) -> models.QuantizationConfig | None:
    q = config.quantization
    if q.kind == "scalar":
        return models.ScalarQuantization(
            scalar=models.ScalarQuantizationConfig(
                type=models.ScalarType.INT8, quantile=q.quantile, always_ram=q.always_ram
            )
        )
    if q.kind == "binary":
        return models.BinaryQuantization(binary=models.BinaryQuantizationConfig(always_ram=q.always_ram))
    return None


def _engine_error(exc: UnexpectedResponse) -> Exception:
    """A refusal of the request (4xx but 401, 403 and 429) in Qdrant's words; anything else means the
    engine cannot serve (a key it refuses, overload, its own failure) and is not the caller's fault."""
    try:
        words = str(json.loads(exc.content)["status"]["error"])
    except (ValueError, KeyError, TypeError):
        words = f"{exc.status_code} {exc.reason_phrase}".strip()
    status = exc.status_code or 0
    if 400 <= status < 500 and status not in (401, 403, 429):
        return VectorEngineRejected(words)
    return QdrantUnavailable(f"Qdrant answered {status}: {words}")


class QdrantUnavailable(Exception):
    """The Qdrant server did not serve the request for a reason of its own (the API answers 503)."""


class QdrantVectorEngine(VectorEngine):
    name = "qdrant"

    def __init__(
        self,
        url: str | None = None,
        *,
        path: str | Path | None = None,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        """`transport`: the httpx transport to a server (tests: `caiplatform.testing.qdrant_rest`)."""
        if (url is None) == (path is None):
            raise ValueError("give exactly one of a Qdrant server url or a local-mode path")
        self.url = url
        self.path = Path(path) if path is not None else None
        self.api_key = api_key
        self.transport = transport
        self._client: QdrantClient | None = None
        # Local mode is one in-process engine guarded by nothing: one call at a time.
        self._limiter = anyio.CapacityLimiter(1 if self.path is not None else 16)

    @property
    def local(self) -> bool:
        return self.path is not None

    def _open(self) -> QdrantClient:
        if self._client is None:
            if self.path is not None:
                self.path.mkdir(parents=True, exist_ok=True)
                self._client = QdrantClient(path=str(self.path))
            else:
                # No version handshake at connect: a server that is down must not delay the start.
                self._client = QdrantClient(
                    url=self.url, api_key=self.api_key, timeout=30, check_compatibility=False, transport=self.transport
                )
        return self._client

    async def _call(self, fn: Callable[[QdrantClient], T]) -> T:
        def run() -> T:
            client = self._open()
            try:
                return fn(client)
            except UnexpectedResponse as exc:
                raise _engine_error(exc) from None
            except ValidationError as exc:
                raise VectorEngineRejected(f"Format error in JSON body: {exc.errors()[0]['msg']}") from None
            except ValueError as exc:  # local mode refuses with ValueError
                raise VectorEngineRejected(str(exc)) from None

        return await anyio.to_thread.run_sync(run, limiter=self._limiter)

    async def start(self) -> None:
        await self._call(lambda client: None)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await anyio.to_thread.run_sync(client.close, limiter=self._limiter)

    def service_url(self) -> str:
        if self.url is not None:
            return self.url.rstrip("/")
        return self.path.resolve().as_uri() if self.path is not None else ""

    async def health(self) -> None:
        await self._call(lambda client: client.get_collections())

    async def create_collection(self, name: str, config: CollectionConfig) -> None:
        def create(client: QdrantClient) -> None:
            if client.collection_exists(name):
                raise VectorEngineRejected(f"Wrong input: Collection `{name}` already exists!")
            client.create_collection(
                name,
                vectors_config=models.VectorParams(
                    size=config.dimensions, distance=_DISTANCE[config.distance], on_disk=config.on_disk
                ),
                shard_number=config.shards,
                replication_factor=config.replicas,
                on_disk_payload=config.payload_on_disk,
                quantization_config=_quantization(config),
                hnsw_config=None if config.hnsw.is_default() else models.HnswConfigDiff(
                    m=config.hnsw.m, ef_construct=config.hnsw.ef_construct,
                    full_scan_threshold=config.hnsw.full_scan_threshold),
                optimizers_config=None if config.indexing_threshold is None
                else models.OptimizersConfigDiff(indexing_threshold=config.indexing_threshold),
            )

        await self._call(create)

    async def drop_collection(self, name: str) -> bool:
        def drop(client: QdrantClient) -> bool:
            if not client.collection_exists(name):
                return False
            return bool(client.delete_collection(name))

        return await self._call(drop)

    async def collection_info(self, name: str) -> CollectionInfo | None:
        def info(client: QdrantClient) -> CollectionInfo | None:
            if not client.collection_exists(name):
                return None
            got = client.get_collection(name)
            points = got.points_count or 0
            status = got.status.value if hasattr(got.status, "value") else str(got.status)
            return CollectionInfo(status, points, points, got.segments_count or 0)

        return await self._call(info)

    async def list_collections(self) -> list[str]:
        return await self._call(lambda client: sorted(c.name for c in client.get_collections().collections))

    async def update_collection(
        self, name: str, *, replicas: int | None = None, payload_on_disk: bool | None = None
    ) -> None:
        def update(client: QdrantClient) -> None:
            if not client.collection_exists(name):
                raise VectorEngineRejected(f"Not found: Collection `{name}` doesn't exist!")
            client.update_collection(
                name,
                collection_params=models.CollectionParamsDiff(
                    replication_factor=replicas, on_disk_payload=payload_on_disk
                ),
            )

        await self._call(update)

    async def upsert(self, name: str, points: Sequence[Point]) -> None:
        structs = [
            models.PointStruct(id=p.id, vector=[float(x) for x in p.vector], payload=dict(p.payload or {}))
            for p in points
        ]
        await self._call(lambda client: client.upsert(name, points=structs, wait=True))

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
        query_filter = parse_filter(filter)
        # Passed through unchanged: the server's defaults apply to what the caller did not set. Local mode
        # always searches exactly and warns on every query that has them, so it gets none.
        search_params = None if params is None or self.path is not None else models.SearchParams(
            hnsw_ef=params.hnsw_ef, exact=params.exact)
        dense = [float(x) for x in vector]

        def search(client: QdrantClient) -> list[ScoredPoint]:
            found = client.query_points(
                name,
                query=dense,
                limit=top_k,
                offset=offset,
                query_filter=query_filter,
                with_payload=with_payload,
                with_vectors=with_vector,
                score_threshold=score_threshold,
                search_params=search_params,
            ).points
            return [
                ScoredPoint(
                    id=point_id(p.id),
                    score=float(p.score),
                    payload=dict(p.payload or {}) if with_payload else None,
                    vector=[float(x) for x in cast(list[float], p.vector)]
                    if with_vector and isinstance(p.vector, list) else None,
                )
                for p in found
            ]

        return await self._call(search)

    async def scroll(
        self,
        name: str,
        *,
        limit: int = 50,
        offset: PointId | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> tuple[list[Record], PointId | None]:
        scroll_filter = parse_filter(filter)

        def browse(client: QdrantClient) -> tuple[list[Record], PointId | None]:
            records, next_offset = client.scroll(
                name, scroll_filter=scroll_filter, limit=limit, offset=offset, with_payload=True, with_vectors=False
            )
            page = [Record(point_id(r.id), dict(r.payload or {})) for r in records]
            return page, point_id(next_offset) if next_offset is not None else None

        return await self._call(browse)

    async def delete_points(
        self, name: str, *, ids: Sequence[PointId] | None = None, filter: Mapping[str, Any] | None = None
    ) -> None:
        if filter is not None:
            selector: models.PointsSelector = models.FilterSelector(filter=parse_filter(filter) or models.Filter())
        else:
            selector = models.PointIdsList(points=list(ids or ()))
        await self._call(lambda client: client.delete(name, points_selector=selector, wait=True))
