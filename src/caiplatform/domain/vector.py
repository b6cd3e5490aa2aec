"""Vector index rules of document 3: create defaults and aliases, PATCH rules, the data verbs' limits.

Every function here is pure: it takes a decoded JSON body and returns typed values, or raises
`BadRequest` with the specification's exact message.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import numpy as np

from caiplatform.clock import rfc3339
from caiplatform.domain.vector_filter import has_conditions
from caiplatform.errors import BadRequest
from caiplatform.ports.vector import (
    CollectionConfig,
    CollectionInfo,
    HnswConfig,
    Point,
    PointId,
    Quantization,
    SearchParams,
)

NAME_MAX = 48
NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
DEFAULT_DIMENSIONS = 1536
MAX_DIMENSIONS = 65536
MAX_REPLICAS = 8
MAX_SHARDS = 64
MAX_POINTS_PER_REQUEST = 1000
MAX_TOP_K = 1000
DEFAULT_TOP_K = 10
MAX_FILTER_BYTES = 64 * 1024
DEFAULT_SCROLL_LIMIT = 50
MAX_SCROLL_LIMIT = 1000
MAX_DELETE_IDS = 1000
MAX_CREDENTIAL_COLLECTIONS = 256
MAX_BODY_BYTES = 32 * 1024 * 1024
VERBS = ("upsert", "query", "scroll", "delete-points")
MUTABLE_FIELDS = ("replicas", "payload_on_disk")
IMMUTABLE_FIELDS = ("dimensions", "distance", "shards", "on_disk", "quantization", "hnsw_config",
                    "indexing_threshold", "optimizers_config")

NAME_REQUIRED = "name is required"
NAME_RULE = (
    "name must contain only lowercase letters, digits and hyphens, and start and end with a letter or digit"
)
NAME_TOO_LONG = f"name must be at most {NAME_MAX} characters"
DIMENSIONS_RULE = "dimensions must be between 1 and 65536, or omit it for the default of 1536"
DISTANCE_RULE = 'distance must be one of "cosine", "dot" or "euclid"'
QUANTIZATION_RULE = 'quantization.kind must be one of "none", "scalar" or "binary"'
REPLICAS_RULE = "replicas must be between 1 and 8"
SHARDS_RULE = f"shards must be between 1 and {MAX_SHARDS}"
EMPTY_PATCH = "no mutable fields to change; the editable fields are replicas and payload_on_disk"
NOT_READY = "index is not ready yet; its collection has not been created"
NAME_TAKEN = "an index with that name already exists"
NOT_FOUND = "index not found"
ENGINE_REJECTED = "vector database rejected the request: "
POINTS_EMPTY = "points must contain at least one point"
STRING_ID_RULE = "a string id must be a UUID (or use an unsigned integer)"
TOP_K_MAX = "top_k must be at most 1000"
FILTER_NOT_OBJECT = "filter must be a JSON object"
FILTER_TOO_LARGE = "filter is too large"
OFFSET_NEGATIVE = "offset must not be negative"
LIMIT_MAX = "limit must be at most 1000"
OFFSET_ID_RULE = "offset must be an unsigned integer or a UUID string"
EXACTLY_ONE = "provide exactly one of ids or filter"
IDS_MAX = "at most 1000 ids per request"
EMPTY_FILTER = "filter must not be empty: an empty filter would delete every point"

# Qdrant's own knobs (an extension of document 3; docs/decisions/vector.md). Qdrant's lower bounds
# (its REST schema: hnsw_ef >= 1, m >= 0, ef_construct >= 4, full_scan_threshold >= 10,
# indexing_threshold >= 0); the upper bounds are the platform's, so one request cannot ask for an
# unbounded build or beam.
MAX_HNSW_EF = 100_000
MAX_HNSW_M = 512
MAX_EF_CONSTRUCT = 10_000
MAX_THRESHOLD_KB = 2**40
SEARCH_PARAMS = ("hnsw_ef", "exact")
HNSW_FIELDS = ("m", "ef_construct", "full_scan_threshold")
HNSW_BOUNDS = {"m": (0, MAX_HNSW_M), "ef_construct": (4, MAX_EF_CONSTRUCT),
               "full_scan_threshold": (10, MAX_THRESHOLD_KB)}

_DISTANCE_ALIASES = {
    "cosine": "cosine",
    "dot": "dot",
    "dotproduct": "dot",
    "dot_product": "dot",
    "euclid": "euclid",
    "euclidean": "euclid",
    "l2": "euclid",
}
_QUANTIZATION_ALIASES = {"none": "none", "scalar": "scalar", "int8": "scalar", "binary": "binary"}


class State:
    PENDING = "pending"
    CREATING = "creating"
    READY = "ready"
    DEGRADED = "degraded"
    CONFLICT = "conflict"
    BLOCKED = "blocked"


def collection_name(project_short: str, name: str) -> str:
    return f"p_{project_short}_{name}"


def collection_prefix(project_short: str) -> str:
    return f"p_{project_short}_"


# ------------------------------------------------------------------------------------------ index


@dataclass(frozen=True)
class IndexSpec:
    """What create asked for (after defaults and aliases)."""

    name: str
    dimensions: int = DEFAULT_DIMENSIONS
    distance: str = "cosine"
    on_disk: bool = False
    payload_on_disk: bool = False
    quantization: Quantization = field(default_factory=Quantization)
    shards: int = 1
    replicas: int = 1
    hnsw: HnswConfig = field(default_factory=HnswConfig)
    indexing_threshold: int | None = None

    def collection_config(self) -> CollectionConfig:
        return CollectionConfig(
            dimensions=self.dimensions,
            distance=self.distance,
            on_disk=self.on_disk,
            payload_on_disk=self.payload_on_disk,
            quantization=self.quantization,
            shards=self.shards,
            replicas=self.replicas,
            hnsw=self.hnsw,
            indexing_threshold=self.indexing_threshold,
        )


def engine_settings_json(spec: IndexSpec) -> dict[str, Any]:
    """`{hnsw_config?: {m?, ef_construct?, full_scan_threshold?}, indexing_threshold?}`: what create set."""
    body: dict[str, Any] = {}
    hnsw = {key: getattr(spec.hnsw, key) for key in HNSW_FIELDS if getattr(spec.hnsw, key) is not None}
    if hnsw:
        body["hnsw_config"] = hnsw
    if spec.indexing_threshold is not None:
        body["indexing_threshold"] = spec.indexing_threshold
    return body


def engine_settings_of(data: Mapping[str, Any] | None) -> tuple[HnswConfig, int | None]:
    data = data or {}
    hnsw = data.get("hnsw_config") or {}
    return HnswConfig(**{key: hnsw.get(key) for key in HNSW_FIELDS}), data.get("indexing_threshold")


def quantization_json(q: Quantization) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": q.kind}
    if q.quantile is not None:
        body["quantile"] = _quantile_text(q.quantile)
    body["always_ram"] = q.always_ram
    return body


def quantization_of(data: Mapping[str, Any] | None) -> Quantization:
    data = data or {}
    quantile = data.get("quantile")
    return Quantization(
        kind=data.get("kind", "none"),
        quantile=float(quantile) if quantile not in (None, "") else None,
        always_ram=bool(data.get("always_ram", False)),
    )


def _quantile_text(value: float) -> str:
    return format(value, "g")


@dataclass(frozen=True)
class Index:
    """An index as the platform reports it: the record plus the engine's live view."""

    project_id: str
    project_short: str
    spec: IndexSpec
    collection: str
    state: str
    message: str
    created_at: datetime
    info: CollectionInfo | None = None

    @property
    def ready(self) -> bool:
        return self.state == State.READY

    @property
    def resource_path(self) -> str:
        return f"projects/{self.project_short}/indexes/{self.spec.name}"

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        body: dict[str, Any] = {
            "name": spec.name,
            "resource_path": self.resource_path,
            "collection": self.collection,
            "dimensions": spec.dimensions,
            "distance": spec.distance,
            "on_disk": spec.on_disk,
            "payload_on_disk": spec.payload_on_disk,
            "quantization": quantization_json(spec.quantization),
            "shards": spec.shards,
            "replicas": spec.replicas,
            **engine_settings_json(spec),
            "state": self.state,
            "ready": self.ready,
        }
        if self.info is not None:
            body["collection_status"] = self.info.status
        info = self.info or CollectionInfo("", 0, 0, 0)
        body["points_count"] = info.points_count
        body["vectors_count"] = info.vectors_count
        body["segments_count"] = info.segments_count
        if self.message and not self.ready:
            body["message"] = self.message
        body["created_at"] = rfc3339(self.created_at)
        return body


# ------------------------------------------------------------------------------------------ create


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool(body: Mapping[str, Any], key: str, default: bool, label: str | None = None) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{label or key} must be true or false")
    return value


def check_name(name: Any) -> str:
    if name is None or name == "":
        raise BadRequest(NAME_REQUIRED)
    if not isinstance(name, str):
        raise BadRequest(NAME_RULE)
    if len(name) > NAME_MAX:
        raise BadRequest(NAME_TOO_LONG)
    if not NAME_PATTERN.match(name):
        raise BadRequest(NAME_RULE)
    return name


def is_index_name(name: Any) -> bool:
    return isinstance(name, str) and len(name) <= NAME_MAX and bool(NAME_PATTERN.match(name))


def parse_replicas(value: Any) -> int:
    if not _is_int(value) or not 1 <= value <= MAX_REPLICAS:
        raise BadRequest(REPLICAS_RULE)
    return value


def parse_create(body: Mapping[str, Any]) -> IndexSpec:
    name = check_name(body.get("name"))

    dimensions = body.get("dimensions")
    if dimensions is None or (_is_int(dimensions) and dimensions == 0):
        dimensions = DEFAULT_DIMENSIONS
    if isinstance(dimensions, float) and dimensions.is_integer():
        dimensions = int(dimensions)
    if not _is_int(dimensions) or not 1 <= dimensions <= MAX_DIMENSIONS:
        raise BadRequest(DIMENSIONS_RULE)

    distance = body.get("distance")
    if distance is None or distance == "":
        distance = "cosine"
    if not isinstance(distance, str) or distance.strip().lower() not in _DISTANCE_ALIASES:
        raise BadRequest(DISTANCE_RULE)
    distance = _DISTANCE_ALIASES[distance.strip().lower()]

    quantization = body.get("quantization")
    if quantization is None:
        quantization = {}
    if not isinstance(quantization, Mapping):
        raise BadRequest("quantization must be an object")
    kind = quantization.get("kind")
    if kind is None or kind == "":
        kind = "none"
    if not isinstance(kind, str) or kind.strip().lower() not in _QUANTIZATION_ALIASES:
        raise BadRequest(QUANTIZATION_RULE)
    kind = _QUANTIZATION_ALIASES[kind.strip().lower()]
    quantile = quantization.get("quantile")
    if quantile in (None, ""):
        quantile = None
    else:
        try:
            quantile = float(quantile) if not isinstance(quantile, bool) else None
        except (TypeError, ValueError):
            quantile = None
        if quantile is None or not math.isfinite(quantile) or not 0.5 <= quantile <= 1.0:
            raise BadRequest("quantization.quantile must be a number between 0.5 and 1")
        if kind != "scalar":
            raise BadRequest("quantization.quantile applies only to scalar quantization")
    always_ram = _bool(quantization, "always_ram", False, "quantization.always_ram")

    shards = body.get("shards")
    if shards is None:
        shards = 1
    if not _is_int(shards) or not 1 <= shards <= MAX_SHARDS:
        raise BadRequest(SHARDS_RULE)
    replicas = body.get("replicas")
    replicas = 1 if replicas is None else parse_replicas(replicas)
    hnsw, indexing_threshold = parse_engine_settings(body)

    return IndexSpec(
        name=name,
        dimensions=dimensions,
        distance=distance,
        on_disk=_bool(body, "on_disk", False),
        payload_on_disk=_bool(body, "payload_on_disk", False),
        quantization=Quantization(kind, quantile, always_ram),
        shards=shards,
        replicas=replicas,
        hnsw=hnsw,
        indexing_threshold=indexing_threshold,
    )


def _bounded_int(value: Any, label: str, low: int, high: int) -> int:
    if not _is_int(value) or not low <= value <= high:
        raise BadRequest(f"{label} must be an integer between {low} and {high}")
    return value


def _only_keys(value: Any, label: str, allowed: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadRequest(f"{label} must be a JSON object")
    unknown = sorted(key for key in value if key not in allowed)
    if unknown:
        names = ", ".join(allowed[:-1]) + " and " + allowed[-1] if len(allowed) > 1 else allowed[0]
        raise BadRequest(f"{label}.{unknown[0]} is not supported; the supported fields are {names}")
    return value


def parse_engine_settings(body: Mapping[str, Any]) -> tuple[HnswConfig, int | None]:
    """`hnsw_config` and `indexing_threshold` (or Qdrant's `optimizers_config.indexing_threshold`)."""
    hnsw = HnswConfig()
    raw_hnsw = body.get("hnsw_config")
    if raw_hnsw is not None:
        raw_hnsw = _only_keys(raw_hnsw, "hnsw_config", HNSW_FIELDS)
        values = {}
        for key in HNSW_FIELDS:
            if raw_hnsw.get(key) is not None:
                low, high = HNSW_BOUNDS[key]
                values[key] = _bounded_int(raw_hnsw[key], f"hnsw_config.{key}", low, high)
        hnsw = HnswConfig(**values)
    threshold = body.get("indexing_threshold")
    optimizers = body.get("optimizers_config")
    if optimizers is not None:
        optimizers = _only_keys(optimizers, "optimizers_config", ("indexing_threshold",))
        if optimizers.get("indexing_threshold") is not None:
            if threshold is not None:
                raise BadRequest("send indexing_threshold or optimizers_config.indexing_threshold, not both")
            return hnsw, _bounded_int(optimizers["indexing_threshold"], "optimizers_config.indexing_threshold",
                                      0, MAX_THRESHOLD_KB)
    if threshold is not None:
        threshold = _bounded_int(threshold, "indexing_threshold", 0, MAX_THRESHOLD_KB)
    return hnsw, threshold


def parse_search_params(value: Any) -> SearchParams | None:
    """A query's `params: {hnsw_ef?, exact?}` (Qdrant's names and lower bound)."""
    if value is None:
        return None
    value = _only_keys(value, "params", SEARCH_PARAMS)
    hnsw_ef = value.get("hnsw_ef")
    if hnsw_ef is not None:
        hnsw_ef = _bounded_int(hnsw_ef, "params.hnsw_ef", 1, MAX_HNSW_EF)
    return SearchParams(hnsw_ef=hnsw_ef, exact=_bool(value, "exact", False, "params.exact"))


def parse_patch(body: Mapping[str, Any]) -> dict[str, Any]:
    """The changes a PATCH asks for: `replicas` and/or `payload_on_disk`."""
    for key in IMMUTABLE_FIELDS:
        if key in body:
            raise BadRequest(
                f"{key} is immutable and cannot be changed after create; "
                "the editable fields are replicas and payload_on_disk"
            )
    changes: dict[str, Any] = {}
    if body.get("replicas") is not None:
        changes["replicas"] = parse_replicas(body["replicas"])
    if body.get("payload_on_disk") is not None:
        changes["payload_on_disk"] = _bool(body, "payload_on_disk", False)
    if not changes:
        raise BadRequest(EMPTY_PATCH)
    return changes


# ------------------------------------------------------------------------------------------ data verbs


def parse_point_id(value: Any, *, message: str) -> PointId:
    """An unsigned integer or a UUID (canonical form). A non-UUID string gets the string-id message."""
    if _is_int(value):
        if 0 <= value < 2**64:
            return value
        raise BadRequest(message)
    if isinstance(value, str):
        try:
            return str(uuid.UUID(value))
        except ValueError:
            raise BadRequest(STRING_ID_RULE) from None
    raise BadRequest(message)


_NUMBER_TYPES = frozenset((int, float))


def _vector(value: Any, *, what: str) -> list[float] | np.ndarray:
    """A JSON array of finite numbers (booleans are not numbers): the list itself, or as float64 when
    it has to be converted to be checked."""
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{what} must be a non-empty array of numbers")
    # Exact types, not isinstance (bool is an int subclass); `map(type)` keeps the per-coordinate work in C.
    if not set(map(type, value)) <= _NUMBER_TYPES:
        raise BadRequest(f"{what} must contain only finite numbers")
    # A finite sum means every number is finite (an infinite or NaN term makes the sum so): the list is
    # then handed on as it is, not copied into an array the engine converts again. A sum that overflows,
    # or an integer too large for a float, takes the array's path, which words the refusal.
    try:
        if math.isfinite(sum(value)):
            return value
    except OverflowError:
        pass
    try:
        array = np.asarray(value, dtype=np.float64)
    except OverflowError:
        raise BadRequest(f"{what} must contain only finite numbers") from None
    if not np.isfinite(array).all():
        raise BadRequest(f"{what} must contain only finite numbers")
    return array


def parse_upsert(body: Mapping[str, Any], index_name: str, dimensions: int, max_points: int) -> list[Point]:
    points = body.get("points")
    if points is None or (isinstance(points, list) and not points):
        raise BadRequest(POINTS_EMPTY)
    if not isinstance(points, list):
        raise BadRequest("points must be an array of point objects")
    if len(points) > max_points:
        raise BadRequest(f"at most {max_points} points per request (got {len(points)})")
    parsed: list[Point] = []
    for i, point in enumerate(points):
        if not isinstance(point, Mapping):
            raise BadRequest(f"point {i} must be an object with a vector")
        raw_id = point.get("id")
        point_id = (
            str(uuid.uuid4())
            if raw_id is None
            else parse_point_id(raw_id, message=f"point {i}: id must be an unsigned integer or a UUID string")
        )
        vector = point.get("vector")
        if vector is None:
            raise BadRequest(f"point {i}: vector is required")
        vector = _vector(vector, what=f"point {i}: vector")
        if len(vector) != dimensions:
            raise BadRequest(f'point {i} has {len(vector)} dimensions; index "{index_name}" expects {dimensions}')
        payload = point.get("payload")
        if payload is None:
            payload = {}
        if not isinstance(payload, Mapping):
            raise BadRequest(f"point {i}: payload must be a JSON object")
        # the engines take any array of floats (np.asarray or iteration); the port says Sequence
        parsed.append(Point(point_id, cast(Sequence[float], vector), dict(payload)))
    return parsed


def parse_filter(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest(FILTER_NOT_OBJECT)
    if len(json.dumps(value, separators=(",", ":")).encode()) > MAX_FILTER_BYTES:
        raise BadRequest(FILTER_TOO_LARGE)
    return value


@dataclass(frozen=True)
class QueryRequest:
    vector: list[float] | np.ndarray
    top_k: int = DEFAULT_TOP_K
    filter: dict[str, Any] | None = None
    with_payload: bool = True
    with_vector: bool = False
    score_threshold: float | None = None
    offset: int = 0
    params: SearchParams | None = None


def parse_query(body: Mapping[str, Any], index_name: str, dimensions: int, max_top_k: int) -> QueryRequest:
    if body.get("vector") is None:
        raise BadRequest("vector is required")
    vector = _vector(body["vector"], what="vector")
    if len(vector) != dimensions:
        raise BadRequest(f'query vector has {len(vector)} dimensions; index "{index_name}" expects {dimensions}')
    top_k = body.get("top_k")
    if top_k is None:
        top_k = DEFAULT_TOP_K
    if not _is_int(top_k):
        raise BadRequest("top_k must be an integer")
    if top_k > max_top_k:
        raise BadRequest(TOP_K_MAX if max_top_k == MAX_TOP_K else f"top_k must be at most {max_top_k}")
    if top_k < 1:
        raise BadRequest("top_k must be at least 1")
    query_filter = parse_filter(body.get("filter"))
    threshold = body.get("score_threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)):
        raise BadRequest("score_threshold must be a number")
    offset = body.get("offset")
    if offset is None:
        offset = 0
    if not _is_int(offset):
        raise BadRequest("offset must be an integer")
    if offset < 0:
        raise BadRequest(OFFSET_NEGATIVE)
    return QueryRequest(
        vector=vector,
        top_k=top_k,
        filter=query_filter,
        with_payload=_bool(body, "with_payload", True),
        with_vector=_bool(body, "with_vector", False),
        score_threshold=None if threshold is None else float(threshold),
        offset=offset,
        params=parse_search_params(body.get("params")),
    )


def parse_scroll(body: Mapping[str, Any]) -> tuple[int, PointId | None, dict[str, Any] | None]:
    limit = body.get("limit")
    if limit is None:
        limit = DEFAULT_SCROLL_LIMIT
    if not _is_int(limit):
        raise BadRequest("limit must be an integer")
    if limit > MAX_SCROLL_LIMIT:
        raise BadRequest(LIMIT_MAX)
    if limit < 1:
        raise BadRequest("limit must be at least 1")
    offset = body.get("offset")
    if offset is not None and offset != "":
        if _is_int(offset) and offset >= 0:
            pass
        elif isinstance(offset, str):
            try:
                offset = str(uuid.UUID(offset))
            except ValueError:
                raise BadRequest(OFFSET_ID_RULE) from None
        else:
            raise BadRequest(OFFSET_ID_RULE)
    else:
        offset = None
    return limit, offset, parse_filter(body.get("filter"))


def parse_delete(body: Mapping[str, Any]) -> tuple[list[PointId] | None, dict[str, Any] | None]:
    ids, query_filter = body.get("ids"), body.get("filter")
    if (ids is None) == (query_filter is None):
        raise BadRequest(EXACTLY_ONE)
    if ids is not None:
        if not isinstance(ids, list):
            raise BadRequest("ids must be an array of point ids")
        if not ids:
            raise BadRequest("ids must contain at least one id")
        if len(ids) > MAX_DELETE_IDS:
            raise BadRequest(IDS_MAX)
        return [
            parse_point_id(value, message=f"ids[{i}]: id must be an unsigned integer or a UUID string")
            for i, value in enumerate(ids)
        ], None
    parsed = parse_filter(query_filter)
    assert parsed is not None
    if not has_conditions(parsed):
        raise BadRequest(EMPTY_FILTER)
    return None, parsed
