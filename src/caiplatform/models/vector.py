"""The vector index API's models (document 3): create and edit an index, its view, the four data verbs.

The rules with the specification's messages live in `caiplatform.domain.vector`; each request model runs
them before its own fields are checked, so a caller sees the spec's message and never pydantic's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, SkipValidation, model_validator

from caiplatform.domain import vector as rules
from caiplatform.errors import BadRequest
from caiplatform.models.base import ListPage, RequestModel, ResponseModel

PointId = int | str
Distance = Literal["cosine", "dot", "euclid"]
QuantizationKind = Literal["none", "scalar", "binary"]


# ------------------------------------------------------------------------------------------ requests


class QuantizationSpec(RequestModel):
    kind: QuantizationKind = "none"
    quantile: float | None = Field(None, ge=0.5, le=1.0, description="scalar quantization only")
    always_ram: bool = False


class HnswConfigSpec(RequestModel):
    """Qdrant's `hnsw_config` (an extension of document 3): unset fields keep the engine's defaults."""

    m: int | None = Field(None, ge=0, le=rules.MAX_HNSW_M, description="edges per node; 0 builds no graph")
    ef_construct: int | None = Field(None, ge=4, le=rules.MAX_EF_CONSTRUCT, description="the build's beam")
    full_scan_threshold: int | None = Field(None, ge=10, le=rules.MAX_THRESHOLD_KB,
                                            description="KB of vectors below which a segment is scanned")


class OptimizersConfigSpec(RequestModel):
    """Qdrant's `optimizers_config`; only `indexing_threshold` is taken."""

    indexing_threshold: int | None = Field(None, ge=0, le=rules.MAX_THRESHOLD_KB)


class SearchParamsSpec(RequestModel):
    """Qdrant's search `params` (an extension of document 3)."""

    hnsw_ef: int | None = Field(None, ge=1, le=rules.MAX_HNSW_EF, description="the search beam; default 128")
    exact: bool = Field(False, description="scan every point instead of walking the graph")


class IndexCreate(RequestModel):
    """`POST .../indexes`. Aliases are accepted and normalized: `dotproduct`, `l2`, `int8`, …"""

    name: str = Field(max_length=rules.NAME_MAX, pattern=rules.NAME_PATTERN.pattern)
    dimensions: int = Field(rules.DEFAULT_DIMENSIONS, ge=1, le=rules.MAX_DIMENSIONS, description="0 means the default")
    distance: Distance = "cosine"
    on_disk: bool = False
    payload_on_disk: bool = False
    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec)
    shards: int = Field(1, ge=1, le=rules.MAX_SHARDS)
    replicas: int = Field(1, ge=1, le=rules.MAX_REPLICAS)
    hnsw_config: HnswConfigSpec | None = Field(None, description="Qdrant's HNSW settings (extension)")
    indexing_threshold: int | None = Field(
        None, ge=0, le=rules.MAX_THRESHOLD_KB,
        description="KB of unindexed vectors that start an HNSW build; 0 never builds one (extension)")
    optimizers_config: OptimizersConfigSpec | None = Field(
        None, description="Qdrant's spelling of indexing_threshold (extension)")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        spec = rules.parse_create(data)
        settings = rules.engine_settings_json(spec)
        quantization = {"kind": spec.quantization.kind, "always_ram": spec.quantization.always_ram}
        if spec.quantization.quantile is not None:
            quantization["quantile"] = spec.quantization.quantile
        extra_quantization = {k: v for k, v in (data.get("quantization") or {}).items() if k not in quantization}
        return {**data, "name": spec.name, "dimensions": spec.dimensions, "distance": spec.distance,
                "on_disk": spec.on_disk, "payload_on_disk": spec.payload_on_disk, "shards": spec.shards,
                "replicas": spec.replicas, "quantization": {**extra_quantization, **quantization},
                "hnsw_config": settings.get("hnsw_config"), "indexing_threshold": settings.get("indexing_threshold"),
                "optimizers_config": None}

    def spec(self) -> rules.IndexSpec:
        from caiplatform.ports.vector import HnswConfig, Quantization

        q = self.quantization
        h = self.hnsw_config or HnswConfigSpec()
        return rules.IndexSpec(name=self.name, dimensions=self.dimensions, distance=self.distance,
                               on_disk=self.on_disk, payload_on_disk=self.payload_on_disk,
                               quantization=Quantization(q.kind, q.quantile, q.always_ram),
                               shards=self.shards, replicas=self.replicas,
                               hnsw=HnswConfig(h.m, h.ef_construct, h.full_scan_threshold),
                               indexing_threshold=self.indexing_threshold)


class IndexPatch(RequestModel):
    """`PATCH .../indexes/{name}` (admin): only these two fields change after create."""

    replicas: int | None = Field(None, ge=1, le=rules.MAX_REPLICAS)
    payload_on_disk: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        rules.parse_patch(data)
        return data

    def changes(self) -> dict[str, Any]:
        return {key: value for key, value in (("replicas", self.replicas), ("payload_on_disk", self.payload_on_disk))
                if value is not None}


# ------------------------------------------------------------------------------------------ data verbs
#
# The rules of :upsert and :query need the index (its dimensions) and the service's limits, so they run in
# `IndexService` with `caiplatform.domain.vector`'s messages; these models declare the fields, refuse
# unknown ones and carry the values. Vectors are not validated here (`SkipValidation`): the domain checks
# and converts each one once, in C, which keeps a 1,000-point upsert off a per-coordinate Python path.

Vector = SkipValidation[list[float]]


class IndexPoint(RequestModel):
    id: SkipValidation[PointId | None] = Field(None, description="an unsigned integer or a UUID; omitted: a new UUID")
    vector: Vector = Field(description="as many numbers as the index has dimensions")
    payload: SkipValidation[dict[str, Any] | None] = None


class IndexUpsert(RequestModel):
    """`:upsert`: 1 to 1000 points, all or nothing."""

    verb: ClassVar[str] = "upsert"
    # the service's limit (1000 by default) is checked there, with the spec's message
    points: list[IndexPoint] = Field(min_length=1, json_schema_extra={"maxItems": rules.MAX_POINTS_PER_REQUEST})

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        points = data.get("points")
        if points is None or (isinstance(points, list) and not points):
            raise BadRequest(rules.POINTS_EMPTY)
        if not isinstance(points, list):
            raise BadRequest("points must be an array of point objects")
        for i, point in enumerate(points):
            if isinstance(point, IndexPoint):
                continue
            if not isinstance(point, Mapping):
                raise BadRequest(f"point {i} must be an object with a vector")
            if point.get("id") is not None:
                rules.parse_point_id(point["id"], message=f"point {i}: id must be an unsigned integer or a UUID string")
            if point.get("vector") is None:
                raise BadRequest(f"point {i}: vector is required")
        return data

    def as_body(self) -> dict[str, Any]:
        """The body the domain's rules read (the vectors by reference, not copied)."""
        return {"points": [{"id": p.id, "vector": p.vector, "payload": p.payload} for p in self.points]}


class IndexQuery(RequestModel):
    """`:query`: the nearest points to `vector`."""

    verb: ClassVar[str] = "query"
    vector: Vector
    top_k: SkipValidation[int | None] = Field(None, ge=1, le=rules.MAX_TOP_K, description="default 10")
    filter: SkipValidation[dict[str, Any] | None] = Field(None, description="the engine's payload filter, max 64 KiB")
    with_payload: SkipValidation[bool | None] = Field(None, description="default true")
    with_vector: SkipValidation[bool | None] = Field(None, description="default false")
    score_threshold: SkipValidation[float | None] = None
    offset: SkipValidation[int | None] = Field(None, ge=0, description="default 0")
    params: SkipValidation[SearchParamsSpec | None] = Field(
        None, description="Qdrant's search params: hnsw_ef, exact (extension)")

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("vector") is None:
            raise BadRequest("vector is required")
        return data

    def as_body(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.model_fields_set}


class IndexScroll(RequestModel):
    """`:scroll`: points in id order, without vectors."""

    verb: ClassVar[str] = "scroll"
    limit: int = Field(rules.DEFAULT_SCROLL_LIMIT, ge=1, le=rules.MAX_SCROLL_LIMIT)
    offset: PointId | None = Field(None, description="the previous page's next_offset")
    filter: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        limit, offset, scroll_filter = rules.parse_scroll(data)
        return {**data, "limit": limit, "offset": offset, "filter": scroll_filter}


class IndexDeletePoints(RequestModel):
    """`:delete-points`: exactly one of `ids` or a non-empty `filter`."""

    verb: ClassVar[str] = "delete-points"
    ids: list[PointId] | None = Field(None, min_length=1, max_length=rules.MAX_DELETE_IDS)
    filter: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ids, delete_filter = rules.parse_delete(data)
        return {**data, "ids": ids, "filter": delete_filter}


IndexDataRequest = IndexUpsert | IndexQuery | IndexScroll | IndexDeletePoints
DATA_VERBS: dict[str, type[IndexUpsert] | type[IndexQuery] | type[IndexScroll] | type[IndexDeletePoints]] = {
    "upsert": IndexUpsert, "query": IndexQuery, "scroll": IndexScroll, "delete-points": IndexDeletePoints,
}
UNKNOWN_VERB = "unknown verb ':{verb}'; the supported verbs are :upsert, :query, :scroll and :delete-points"
MISSING_VERB = (
    "missing verb: data operations are POSTs to the index path with a verb suffix: "
    ":upsert, :query, :scroll or :delete-points"
)


def data_request(verb: str | None, body: Any) -> IndexDataRequest:
    """The request model of `POST .../indexes/{name}:{verb}`, or 400 for a missing or unknown verb."""
    if verb is None:
        raise BadRequest(MISSING_VERB)
    model = DATA_VERBS.get(verb)
    if model is None:
        raise BadRequest(UNKNOWN_VERB.format(verb=verb))
    return model.parse(body)


# ------------------------------------------------------------------------------------------ views


class Quantization(ResponseModel):
    kind: QuantizationKind
    quantile: str | None = None
    always_ram: bool


class HnswSettings(ResponseModel):
    m: int | None = None
    ef_construct: int | None = None
    full_scan_threshold: int | None = None


class Index(ResponseModel):
    name: str
    resource_path: str
    collection: str
    dimensions: int
    distance: Distance
    on_disk: bool
    payload_on_disk: bool
    quantization: Quantization
    shards: int
    replicas: int
    hnsw_config: HnswSettings | None = Field(None, description="present when create set it")
    indexing_threshold: int | None = Field(None, description="present when create set it")
    state: Literal["pending", "creating", "ready", "degraded", "conflict", "blocked"]
    ready: bool
    collection_status: str | None = Field(None, description="the engine's own status, once the collection exists")
    points_count: int
    vectors_count: int
    segments_count: int
    message: str | None = Field(None, description="why the index is not ready")
    created_at: str


class IndexList(ListPage):
    items_field: ClassVar[str] = "indexes"
    indexes: list[Index]


class IndexCredential(ResponseModel):
    service_url: str
    token: str = Field(description="empty when the engine does not enforce per-project access")
    collection_prefix: str
    collections: list[str]
    truncated: bool
    note: str


class IndexUpsertResult(ResponseModel):
    index: str
    upserted_count: int


class IndexQueryHit(ResponseModel):
    id: PointId
    score: float
    payload: dict[str, Any] | None = Field(None, description="present unless with_payload is false")
    vector: list[float] | None = Field(None, description="present with with_vector")


class IndexQueryResult(ResponseModel):
    index: str
    results: list[IndexQueryHit]


class IndexScrollPoint(ResponseModel):
    id: PointId
    payload: dict[str, Any] | None


class IndexScrollResult(ResponseModel):
    index: str
    points: list[IndexScrollPoint]
    next_offset: PointId | None = Field(None, description="omitted when the index is exhausted")


class IndexDeletePointsResult(ResponseModel):
    index: str
    status: Literal["ok"]
    ids_requested: int | None = Field(None, description="omitted for a filter delete")


IndexDataResult = IndexUpsertResult | IndexQueryResult | IndexScrollResult | IndexDeletePointsResult


class VectorDependency(ResponseModel):
    ok: bool
    latency_ms: float
    error: str | None = None
    status: Literal["not configured"] | None = None
    detail: str | None = None


class VectorDependencies(ResponseModel):
    vector_store: VectorDependency
    kubernetes: VectorDependency
    database: VectorDependency


class VectorHealth(ResponseModel):
    status: Literal["ok", "degraded"]
    dependencies: VectorDependencies
