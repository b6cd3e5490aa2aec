"""In-process vector engine with Qdrant's semantics: exact (brute-force) search over numpy arrays.

Vectors are float32 like Qdrant's; cosine collections store unit-normalised vectors (as Qdrant does, so
`with_vector` returns them normalised); euclid scores are distances (smaller is better). Filters use
Qdrant's grammar through `caiplatform.domain.vector_filter`, a hand-written evaluator kept so that this
engine (the unit tests' and `Platform.in_memory()`'s) needs nothing beyond numpy; the conformance suite
and a hypothesis test hold its answers to Qdrant Edge's. Nothing survives the process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from caiplatform.domain.vector_filter import FilterError, compile_filter, normalize_point_id
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

EPSILON = np.float32(1.1920929e-7)  # f32::EPSILON, the guard Qdrant uses against zero norms


def id_order(point_id: PointId) -> tuple[str, int]:
    """Qdrant's id order: every integer id before every UUID; integers by value, UUIDs by text."""
    return (point_id, 0) if isinstance(point_id, str) else ("", point_id)


@dataclass
class _Collection:
    config: CollectionConfig
    ids: list[PointId] = field(default_factory=list)
    rows: dict[PointId, int] = field(default_factory=dict)
    payloads: list[dict[str, Any]] = field(default_factory=list)
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    size: int = 0

    def __post_init__(self) -> None:
        self.vectors = np.zeros((16, self.config.dimensions), dtype=np.float32)

    def prepare(self, vector: Sequence[float], *, stored: bool = True) -> np.ndarray:
        """Check a vector's width and values; a stored cosine vector is unit-normalised, as Qdrant does."""
        row = checked_vector(vector, self.config.dimensions)
        if stored and self.config.distance == "cosine":
            norm = np.linalg.norm(row)
            row = row / norm if norm > EPSILON else row
        return row

    def put(self, point_id: PointId, row: np.ndarray, payload: dict[str, Any]) -> None:
        at = self.rows.get(point_id)
        if at is None:
            if self.size == len(self.vectors):
                grown = np.zeros((max(16, 2 * self.size), self.config.dimensions), dtype=np.float32)
                grown[: self.size] = self.vectors[: self.size]
                self.vectors = grown
            at = self.size
            self.size += 1
            self.rows[point_id] = at
            self.ids.append(point_id)
            self.payloads.append(payload)
        else:
            self.payloads[at] = payload
        self.vectors[at] = row

    def remove(self, point_id: PointId) -> None:
        at = self.rows.pop(point_id, None)
        if at is None:
            return
        last = self.size - 1
        if at != last:  # move the last row into the hole
            moved = self.ids[last]
            self.ids[at] = moved
            self.payloads[at] = self.payloads[last]
            self.vectors[at] = self.vectors[last]
            self.rows[moved] = at
        self.ids.pop()
        self.payloads.pop()
        self.size -= 1

    def scores(self, query: np.ndarray) -> np.ndarray:
        live = self.vectors[: self.size]
        if self.config.distance == "euclid":
            return np.linalg.norm(live - query, axis=-1)
        if self.config.distance == "cosine":
            norm = np.linalg.norm(query)
            query = query / (norm if norm != 0.0 else EPSILON)
        return live @ query

    def mask(self, spec: Mapping[str, Any] | None) -> np.ndarray | None:
        if spec is None:
            return None
        predicate = _compile(spec)
        return np.fromiter(
            (predicate(pid, payload) for pid, payload in zip(self.ids, self.payloads, strict=True)),
            dtype=bool,
            count=self.size,
        )


def checked_vector(vector: Sequence[float], dimensions: int) -> np.ndarray:
    """The vector as float32 (what Qdrant stores), refused in Qdrant's words when its width or values are wrong."""
    try:
        row = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError):
        raise VectorEngineRejected("Format error in JSON body: a vector is an array of numbers") from None
    if row.shape != (dimensions,):
        raise VectorEngineRejected(f"Wrong input: Vector dimension error: expected dim: {dimensions}, got {row.size}")
    if not np.isfinite(row).all():
        raise VectorEngineRejected("Wrong input: vector must contain only finite numbers")
    return row


def _compile(spec: Mapping[str, Any]):  # noqa: ANN202 - a predicate
    try:
        return compile_filter(spec)
    except FilterError as exc:
        raise VectorEngineRejected(f"Format error in JSON body: {exc}") from None


def json_payload(payload: Mapping[str, Any] | None) -> dict[str, Any]:
    """A private copy of the payload as JSON sees it (what Qdrant stores): tuples become lists."""
    try:
        return json.loads(json.dumps(dict(payload or {}), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise VectorEngineRejected(f"Format error in JSON body: payload is not JSON: {exc}") from None


class InMemoryVectorEngine(VectorEngine):
    """Exact search in numpy; filters by `caiplatform.domain.vector_filter` (no engine to install)."""

    name = "memory"

    def __init__(self) -> None:
        self._collections: dict[str, _Collection] = {}

    def service_url(self) -> str:
        return "memory://in-process"

    async def health(self) -> None:
        return None

    def _get(self, name: str) -> _Collection:
        collection = self._collections.get(name)
        if collection is None:
            raise VectorEngineRejected(f"Not found: Collection `{name}` doesn't exist!")
        return collection

    async def create_collection(self, name: str, config: CollectionConfig) -> None:
        if name in self._collections:
            raise VectorEngineRejected(f"Wrong input: Collection `{name}` already exists!")
        self._collections[name] = _Collection(config)

    async def drop_collection(self, name: str) -> bool:
        if name not in self._collections:
            return False
        del self._collections[name]
        return True

    async def collection_info(self, name: str) -> CollectionInfo | None:
        collection = self._collections.get(name)
        if collection is None:
            return None
        return CollectionInfo("green", collection.size, collection.size, 1)

    async def list_collections(self) -> list[str]:
        return sorted(self._collections)

    async def update_collection(
        self, name: str, *, replicas: int | None = None, payload_on_disk: bool | None = None
    ) -> None:
        collection = self._get(name)
        changes: dict[str, Any] = {}
        if replicas is not None:
            changes["replicas"] = replicas
        if payload_on_disk is not None:
            changes["payload_on_disk"] = payload_on_disk
        config = replace(collection.config, **changes)
        collection.config = config

    async def upsert(self, name: str, points: Sequence[Point]) -> None:
        collection = self._get(name)
        # Check everything before writing anything: all or nothing.
        prepared: list[tuple[PointId, np.ndarray, dict[str, Any]]] = []
        for point in points:
            try:
                point_id = normalize_point_id(point.id)
            except FilterError as exc:
                raise VectorEngineRejected(f"Format error in JSON body: {exc}") from None
            prepared.append((point_id, collection.prepare(point.vector), json_payload(point.payload)))
        for point_id, row, payload in prepared:
            collection.put(point_id, row, payload)

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
        # Always an exact scan: `params.exact` is what it does anyway, and `hnsw_ef` has no graph to widen.
        collection = self._get(name)
        query = collection.prepare(vector, stored=False)
        mask = collection.mask(filter)
        if collection.size == 0:
            return []
        scores = collection.scores(query)
        smaller_is_better = collection.config.distance == "euclid"
        ranked = scores if smaller_is_better else -scores
        if mask is not None:
            ranked = np.where(mask, ranked, np.inf)
        wanted = min(top_k + offset, collection.size)
        if wanted <= 0:
            return []
        if wanted < collection.size:
            head = np.argpartition(ranked, wanted - 1)[:wanted]
        else:
            head = np.arange(collection.size)
        order = head[np.argsort(ranked[head], kind="stable")]
        results: list[ScoredPoint] = []
        for row in order:
            if not np.isfinite(ranked[row]):
                break  # filtered out
            score = float(scores[row])
            if score_threshold is not None:
                if smaller_is_better and score >= score_threshold:
                    break
                if not smaller_is_better and score <= score_threshold:
                    break
            results.append(
                ScoredPoint(
                    id=collection.ids[row],
                    score=score,
                    payload=dict(collection.payloads[row]) if with_payload else None,
                    vector=collection.vectors[row].tolist() if with_vector else None,
                )
            )
        return results[offset:]

    async def scroll(
        self,
        name: str,
        *,
        limit: int = 50,
        offset: PointId | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> tuple[list[Record], PointId | None]:
        collection = self._get(name)
        predicate = _compile(filter) if filter is not None else None
        start = None
        if offset is not None:
            try:
                start = id_order(normalize_point_id(offset))
            except FilterError as exc:
                raise VectorEngineRejected(f"Format error in JSON body: {exc}") from None
        page: list[Record] = []
        for point_id in sorted(collection.ids, key=id_order):
            if start is not None and id_order(point_id) < start:
                continue
            payload = collection.payloads[collection.rows[point_id]]
            if predicate is not None and not predicate(point_id, payload):
                continue
            if len(page) == limit:
                return page, point_id
            page.append(Record(point_id, dict(payload)))
        return page, None

    async def delete_points(
        self, name: str, *, ids: Sequence[PointId] | None = None, filter: Mapping[str, Any] | None = None
    ) -> None:
        collection = self._get(name)
        if filter is not None:
            predicate = _compile(filter)
            doomed = [
                pid for pid, payload in zip(collection.ids, collection.payloads, strict=True) if predicate(pid, payload)
            ]
        else:
            try:
                doomed = [normalize_point_id(i) for i in ids or ()]
            except FilterError as exc:
                raise VectorEngineRejected(f"Format error in JSON body: {exc}") from None
        for point_id in doomed:
            collection.remove(point_id)

