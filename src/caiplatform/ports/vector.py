"""The vector-engine port: named collections of dense vectors with payloads, searched by similarity.

The port knows nothing of projects or index records, so other areas use it directly (agents' long-term
memory keeps one collection per agent). Call pattern:

    engine = platform.vector_engine
    await engine.create_collection("mem_x", CollectionConfig(dimensions=384))
    await engine.upsert("mem_x", [Point(id=str(uuid4()), vector=[...], payload={"user": "u1"})])
    hits = await engine.query("mem_x", [...], top_k=5, filter={"must": [{"key": "user", "match": {"value": "u1"}}]})
    await engine.delete_points("mem_x", filter={"must": [{"key": "user", "match": {"value": "u1"}}]})
    await engine.drop_collection("mem_x")

Filters are JSON objects in Qdrant's payload filter grammar. Point ids are unsigned integers or UUID
strings (canonical hyphenated form). An engine refusing a request (a malformed filter, a missing
collection, a wrong vector width) raises `VectorEngineRejected` with the engine's own words.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PointId = int | str

DISTANCES = ("cosine", "dot", "euclid")
QUANTIZATION_KINDS = ("none", "scalar", "binary")


class VectorEngineRejected(Exception):
    """The engine refused the request; the message is the engine's reason."""


@dataclass(frozen=True)
class Quantization:
    kind: str = "none"  # none | scalar | binary
    quantile: float | None = None  # scalar only: the fraction of values kept inside the int8 range
    always_ram: bool = False


@dataclass(frozen=True)
class HnswConfig:
    """Qdrant's `hnsw_config` (each unset field: the engine's default). `m` 0 builds no graph;
    `full_scan_threshold` is in KB of vectors (Qdrant's unit)."""

    m: int | None = None
    ef_construct: int | None = None
    full_scan_threshold: int | None = None

    def is_default(self) -> bool:
        return self.m is None and self.ef_construct is None and self.full_scan_threshold is None


@dataclass(frozen=True)
class CollectionConfig:
    dimensions: int
    distance: str = "cosine"  # cosine | dot | euclid
    on_disk: bool = False
    payload_on_disk: bool = False
    quantization: Quantization = field(default_factory=Quantization)
    shards: int = 1
    replicas: int = 1
    hnsw: HnswConfig = field(default_factory=HnswConfig)
    # Qdrant's `optimizers_config.indexing_threshold`: KB of unindexed vectors that start an HNSW build
    # (0: never build one); None: the engine's default
    indexing_threshold: int | None = None


@dataclass(frozen=True)
class SearchParams:
    """Qdrant's search `params`: `hnsw_ef` the beam (None: the engine's default), `exact` a full scan."""

    hnsw_ef: int | None = None
    exact: bool = False


@dataclass(frozen=True)
class CollectionInfo:
    status: str  # green | yellow | red | grey
    points_count: int
    vectors_count: int
    segments_count: int


@dataclass(frozen=True)
class Point:
    id: PointId
    vector: Sequence[float]
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScoredPoint:
    id: PointId
    score: float
    payload: dict[str, Any] | None = None
    vector: list[float] | None = None


@dataclass(frozen=True)
class Record:
    id: PointId
    payload: dict[str, Any]


class VectorEngine(ABC):
    """Async interface every vector engine adapter implements."""

    #: adapter name as registered (`memory`, `qdrant`)
    name: str = ""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections or local files."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and file locks; data stays."""

    @abstractmethod
    def service_url(self) -> str:
        """Where a direct client reaches this engine."""

    @abstractmethod
    async def health(self) -> None:
        """Return when the engine answers; raise with the reason otherwise."""

    @abstractmethod
    async def create_collection(self, name: str, config: CollectionConfig) -> None:
        """Create an empty collection. Raises `VectorEngineRejected` when the name is taken."""

    @abstractmethod
    async def drop_collection(self, name: str) -> bool:
        """Destroy the collection and every point in it; False when it did not exist."""

    @abstractmethod
    async def collection_info(self, name: str) -> CollectionInfo | None:
        """Live status and counts, or None when the collection does not exist."""

    @abstractmethod
    async def list_collections(self) -> list[str]:
        """Every collection name, sorted."""

    @abstractmethod
    async def update_collection(
        self, name: str, *, replicas: int | None = None, payload_on_disk: bool | None = None
    ) -> None:
        """Change the editable settings of an existing collection."""

    @abstractmethod
    async def upsert(self, name: str, points: Sequence[Point]) -> None:
        """Insert or replace points, all or nothing."""

    @abstractmethod
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
        """The nearest points, best first; `offset` skips that many of the best; `params` as Qdrant's."""

    @abstractmethod
    async def scroll(
        self,
        name: str,
        *,
        limit: int = 50,
        offset: PointId | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> tuple[list[Record], PointId | None]:
        """Points in id order (integers first, then UUIDs) from `offset`; the next offset or None."""

    @abstractmethod
    async def delete_points(
        self, name: str, *, ids: Sequence[PointId] | None = None, filter: Mapping[str, Any] | None = None
    ) -> None:
        """Delete the listed points, or every point the filter matches."""
