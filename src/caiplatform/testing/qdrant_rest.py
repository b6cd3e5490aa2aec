"""A Qdrant server's REST API in process, for tests of the server path of the Qdrant adapter.

No Qdrant server installs here, so `QdrantRestFake` answers the REST calls qdrant-client makes, as an
httpx transport: `QdrantClient(url=..., transport=QdrantRestFake(...))` (the adapter:
`QdrantVectorEngine(url, transport=fake)`). Every request body is read with qdrant-client's REST models
(generated from Qdrant's OpenAPI), so a request the adapter builds wrongly is refused as Qdrant would;
answers are those models too, in Qdrant's envelope (`{result, status, time}`, errors as
`{status: {error}}`). The points live in Qdrant Edge (Qdrant's own engine), so filters, scoring and
scroll order are Qdrant's. With an API key it applies Qdrant's JWT RBAC: the master key manages
everything; a token (HS256, signed with the key) reads or writes the collections its `access` claim
lists and cannot create or drop collections.

The calls it speaks must be made from a worker thread of anyio (as the adapter makes them): the engine
behind it is asynchronous and is reached with `anyio.from_thread`.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import anyio.from_thread
import httpx
import jwt
from pydantic import TypeAdapter, ValidationError
from qdrant_client.http import models

from caiplatform.adapters.edge.vector import EdgeVectorEngine
from caiplatform.ports.vector import (
    CollectionConfig,
    HnswConfig,
    Point,
    Quantization,
    SearchParams,
    VectorEngineRejected,
)

_ROUTE = re.compile(r"^/collections(?:/(?P<name>[^/]+)(?P<rest>/.*)?)?$")
_DISTANCE = {models.Distance.COSINE: "cosine", models.Distance.DOT: "dot", models.Distance.EUCLID: "euclid"}


class QdrantError(Exception):
    def __init__(self, status: int, error: str):
        super().__init__(error)
        self.status, self.error = status, error


def _body(request: httpx.Request, model: Any) -> Any:
    try:
        return TypeAdapter(model).validate_python(json.loads(request.content or b"{}"))
    except (ValidationError, ValueError) as exc:
        raise QdrantError(400, f"Format error in JSON body: {exc}") from None


# Qdrant's range validators on these fields (lib/segment/src/types.rs `SearchParams`:
# `#[validate(range(min = 1))] hnsw_ef`; lib/collection/src/operations/config_diff.rs `HnswConfigDiff`:
# `range(min = 4)` on ef_construct, `range(min = 10)` on full_scan_threshold; `m`, `indexing_threshold`
# and the rest are `usize`, so any unsigned integer), reported as its REST API words them:
# `Validation error in JSON body: [<path>: value <v> invalid, must be <min> or larger]`.
_MINIMUMS = {("params", "hnsw_ef"): 1, ("hnsw_config", "ef_construct"): 4,
             ("hnsw_config", "full_scan_threshold"): 10}


def _validate_ranges(raw: Any) -> None:
    if not isinstance(raw, dict):
        return
    problems = []
    for (parent, key), minimum in _MINIMUMS.items():
        value = (raw.get(parent) or {}).get(key) if isinstance(raw.get(parent), dict) else None
        if isinstance(value, int) and value < minimum:
            problems.append(f"{parent}.{key}: value {value} invalid, must be {minimum} or larger")
    if problems:
        raise QdrantError(400, f"Validation error in JSON body: [{'; '.join(problems)}]")


def _unsigned(model: Any, fields: tuple[str, ...], where: str) -> None:
    """Qdrant reads these as `usize`: a negative number is a format error before any validation."""
    for key in fields:
        value = getattr(model, key, None) if model is not None else None
        if isinstance(value, int) and value < 0:
            raise QdrantError(400, f"Format error in JSON body: {where}.{key}: invalid value: integer `{value}`, "
                                   "expected usize")


def _quantization(config: models.QuantizationConfig | None) -> Quantization:
    if isinstance(config, models.ScalarQuantization):
        return Quantization("scalar", config.scalar.quantile, bool(config.scalar.always_ram))
    if isinstance(config, models.BinaryQuantization):
        return Quantization("binary", None, bool(config.binary.always_ram))
    return Quantization()


class QdrantRestFake(httpx.BaseTransport):
    def __init__(self, api_key: str | None = None, *, now: Callable[[], float] = time.time,
                 directory: str | Path | None = None):
        self.api_key = api_key
        self.now = now  # the clock a token's `exp` is read against
        # Under the test's own directory when it gives one (pytest's, on a memory file system in the unit
        # runs): each collection is an Edge shard with some 32 MB of files to write and remove.
        self._directory = tempfile.TemporaryDirectory(prefix="qdrant-rest-fake-", dir=directory)
        self.engine = EdgeVectorEngine(self._directory.name)
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, JSON body) as received
        self.fail_next: tuple[int, bytes] | None = None  # the next answer, raw (status, body)

    def close(self) -> None:
        """httpx closes its transport with each client; the fake outlives its clients (see `shutdown`)."""

    def shutdown(self) -> None:
        """Close the engine behind it and remove its files (from a worker thread, like every call)."""
        anyio.from_thread.run(self.engine.close)
        self._directory.cleanup()

    # -------------------------------------------------------------------------------------- transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        if self.fail_next is not None:
            (status, content), self.fail_next = self.fail_next, None
            return httpx.Response(status, content=content, headers={"content-type": "application/json"})
        try:
            result = self._route(request)
        except QdrantError as exc:
            return httpx.Response(exc.status, json={"status": {"error": exc.error}, "time": 0.0})
        return httpx.Response(200, json={"result": result, "status": "ok", "time": 0.0})

    def _route(self, request: httpx.Request) -> Any:
        match = _ROUTE.match(request.url.path)
        if match is None:
            raise QdrantError(404, f"Not found: {request.url.path}")
        name, rest = match.group("name"), match.group("rest") or ""
        handlers: dict[tuple[str, str], Callable[[httpx.Request, str], Any]] = {
            ("GET", ""): self._collection,
            ("PUT", ""): self._create,
            ("PATCH", ""): self._update,
            ("DELETE", ""): self._drop,
            ("GET", "/exists"): lambda r, n: {"exists": n in self._call(self.engine.list_collections)},
            ("PUT", "/points"): self._upsert,
            ("POST", "/points/query"): self._query,
            ("POST", "/points/scroll"): self._scroll,
            ("POST", "/points/delete"): self._delete,
        }
        if name is None:  # a token lists the collections it may read
            names = self._call(self.engine.list_collections)
            return {"collections": [{"name": n} for n in names if self._may_read(request, n)]}
        handler = handlers.get((request.method, rest))
        if handler is None:
            raise QdrantError(404, f"Not found: {request.method} {request.url.path}")
        manage = rest == "" and request.method != "GET"
        self._authorize(request, name, write=request.method != "GET" and rest != "/points/query"
                        and rest != "/points/scroll", manage=manage)
        return handler(request, name)

    def _authorize(self, request: httpx.Request, collection: str | None, *, write: bool, manage: bool) -> None:
        """Qdrant's JWT RBAC: the master key may do anything; a token only what its claims grant."""
        if self.api_key is None:
            return
        presented = request.headers.get("api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
        if not presented:
            raise QdrantError(401, "Must provide an API key or an Authorization bearer token")
        if presented == self.api_key:
            return
        try:
            claims = jwt.decode(presented, self.api_key, algorithms=["HS256"], options={"verify_exp": False})
        except jwt.PyJWTError as exc:
            raise QdrantError(401, f"Invalid API key or token: {exc}") from None
        if "exp" in claims and claims["exp"] <= self.now():
            raise QdrantError(401, "Invalid API key or token: the token has expired")
        access = claims.get("access")
        if access == "m":
            return
        grants = {g.get("collection"): g.get("access") for g in access or [] if isinstance(g, dict)}
        granted = grants.get(collection)
        if manage or collection is None or granted is None or (write and granted != "rw"):
            raise QdrantError(403, f"Forbidden: Access to collection {collection} is required")

    def _may_read(self, request: httpx.Request, collection: str) -> bool:
        try:
            self._authorize(request, collection, write=False, manage=False)
        except QdrantError as exc:
            if exc.status == 401:
                raise
            return False
        return True

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return anyio.from_thread.run(lambda: fn(*args, **kwargs))
        except VectorEngineRejected as exc:
            text = str(exc)
            raise QdrantError(404 if text.startswith("Not found") else 400, text) from None

    # ------------------------------------------------------------------------------------ collections

    def _create(self, request: httpx.Request, name: str) -> bool:
        create = _body(request, models.CreateCollection)
        _unsigned(create.hnsw_config, ("m", "ef_construct", "full_scan_threshold"), "hnsw_config")
        _unsigned(create.optimizers_config, ("indexing_threshold",), "optimizers_config")
        _validate_ranges(json.loads(request.content or b"{}"))
        hnsw = create.hnsw_config or models.HnswConfigDiff()
        vectors = create.vectors
        if not isinstance(vectors, models.VectorParams):
            raise QdrantError(400, "Wrong input: this fake serves one unnamed dense vector per point")
        config = CollectionConfig(
            dimensions=vectors.size, distance=_DISTANCE[vectors.distance], on_disk=bool(vectors.on_disk),
            payload_on_disk=bool(create.on_disk_payload), quantization=_quantization(create.quantization_config),
            shards=create.shard_number or 1, replicas=create.replication_factor or 1,
            hnsw=HnswConfig(m=hnsw.m, ef_construct=hnsw.ef_construct, full_scan_threshold=hnsw.full_scan_threshold),
            indexing_threshold=create.optimizers_config.indexing_threshold if create.optimizers_config else None,
        )
        self._call(self.engine.create_collection, name, config)
        return True

    def _drop(self, request: httpx.Request, name: str) -> bool:
        return bool(self._call(self.engine.drop_collection, name))

    def _update(self, request: httpx.Request, name: str) -> bool:
        params = _body(request, models.UpdateCollection).params or models.CollectionParamsDiff()
        self._call(self.engine.update_collection, name, replicas=params.replication_factor,
                   payload_on_disk=params.on_disk_payload)
        return True

    def _collection(self, request: httpx.Request, name: str) -> Any:
        info = self._call(self.engine.collection_info, name)
        if info is None:
            raise QdrantError(404, f"Not found: Collection `{name}` doesn't exist!")
        config = self._call(self.engine.collection_config, name)
        distance = {v: k for k, v in _DISTANCE.items()}[config.distance]
        described = models.CollectionInfo(
            status=models.CollectionStatus(info.status), optimizer_status=models.OptimizersStatusOneOf.OK,
            points_count=info.points_count, indexed_vectors_count=0, segments_count=info.segments_count,
            payload_schema={},
            config=models.CollectionConfig(
                params=models.CollectionParams(
                    vectors=models.VectorParams(size=config.dimensions, distance=distance, on_disk=config.on_disk),
                    shard_number=config.shards, replication_factor=config.replicas,
                    on_disk_payload=config.payload_on_disk),
                hnsw_config=models.HnswConfig(
                    m=16 if config.hnsw.m is None else config.hnsw.m,
                    ef_construct=config.hnsw.ef_construct or 100,
                    full_scan_threshold=config.hnsw.full_scan_threshold or 10000),
                optimizer_config=models.OptimizersConfig(default_segment_number=0, flush_interval_sec=5),
            ),
        )
        return described.model_dump(mode="json", by_alias=True, exclude_none=True)

    # ----------------------------------------------------------------------------------------- points

    def _upsert(self, request: httpx.Request, name: str) -> Any:
        operation = _body(request, models.PointInsertOperations)
        if not isinstance(operation, models.PointsList):
            raise QdrantError(400, "Wrong input: this fake takes points as a list")
        points = []
        for p in operation.points:
            if not isinstance(p.vector, list) or (p.vector and not isinstance(p.vector[0], float | int)):
                raise QdrantError(400, "Wrong input: this fake serves one unnamed dense vector per point")
            vector = cast(list[float], p.vector)
            points.append(Point(str(p.id) if isinstance(p.id, uuid.UUID) else p.id, vector, p.payload or {}))
        self._call(self.engine.upsert, name, points)
        return {"operation_id": len(self.requests), "status": "completed"}

    def _query(self, request: httpx.Request, name: str) -> Any:
        query = _body(request, models.QueryRequest)
        raw = json.loads(request.content)
        _unsigned(query.params, ("hnsw_ef",), "params")
        _validate_ranges(raw)
        params = None if query.params is None else SearchParams(hnsw_ef=query.params.hnsw_ef,
                                                                exact=bool(query.params.exact))
        vector = query.query.nearest if isinstance(query.query, models.NearestQuery) else query.query
        if not isinstance(vector, list):
            raise QdrantError(400, "Wrong input: this fake answers nearest-vector queries only")
        found = self._call(
            self.engine.query, name, vector, top_k=query.limit or 10, filter=raw.get("filter"),
            with_payload=bool(query.with_payload), with_vector=bool(query.with_vector),
            score_threshold=query.score_threshold, offset=query.offset or 0, params=params,
        )
        points = [models.ScoredPoint(id=p.id, version=0, score=p.score, payload=p.payload, vector=p.vector) for p in found]
        return models.QueryResponse(points=points).model_dump(mode="json", exclude_none=True)

    def _scroll(self, request: httpx.Request, name: str) -> Any:
        scroll = _body(request, models.ScrollRequest)
        raw = json.loads(request.content)
        records, next_offset = self._call(self.engine.scroll, name, limit=scroll.limit or 10, offset=scroll.offset,
                                          filter=raw.get("filter"))
        page = [models.Record(id=r.id, payload=r.payload) for r in records]
        return models.ScrollResult(points=page, next_page_offset=next_offset).model_dump(mode="json", exclude_none=True)

    def _delete(self, request: httpx.Request, name: str) -> Any:
        selector = _body(request, models.PointsSelector)
        if isinstance(selector, models.FilterSelector):
            raw = json.loads(request.content)["filter"]
            self._call(self.engine.delete_points, name, filter=raw)
        else:
            self._call(self.engine.delete_points, name, ids=list(selector.points))
        return {"operation_id": len(self.requests), "status": "completed"}
