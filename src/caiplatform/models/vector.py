"""The vector index API's models (document 3): create and edit an index, its view, the four data verbs.

The rules with the specification's messages live in `caiplatform.domain.vector`; each request model runs
them before its own fields are checked, so a caller sees the spec's message and never pydantic's.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from caiplatform.domain import vector as rules
from caiplatform.models.base import ListPage, RequestModel, ResponseModel

PointId = int | str
Distance = Literal["cosine", "dot", "euclid"]
QuantizationKind = Literal["none", "scalar", "binary"]


# ------------------------------------------------------------------------------------------ requests


class QuantizationSpec(RequestModel):
    kind: QuantizationKind = "none"
    quantile: float | None = Field(None, ge=0.5, le=1.0, description="scalar quantization only")
    always_ram: bool = False


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

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        spec = rules.parse_create(data)
        quantization = {"kind": spec.quantization.kind, "always_ram": spec.quantization.always_ram}
        if spec.quantization.quantile is not None:
            quantization["quantile"] = spec.quantization.quantile
        extra_quantization = {k: v for k, v in (data.get("quantization") or {}).items() if k not in quantization}
        return {**data, "name": spec.name, "dimensions": spec.dimensions, "distance": spec.distance,
                "on_disk": spec.on_disk, "payload_on_disk": spec.payload_on_disk, "shards": spec.shards,
                "replicas": spec.replicas, "quantization": {**extra_quantization, **quantization}}

    def spec(self) -> rules.IndexSpec:
        from caiplatform.ports.vector import Quantization

        q = self.quantization
        return rules.IndexSpec(name=self.name, dimensions=self.dimensions, distance=self.distance,
                               on_disk=self.on_disk, payload_on_disk=self.payload_on_disk,
                               quantization=Quantization(q.kind, q.quantile, q.always_ram),
                               shards=self.shards, replicas=self.replicas)


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


# ------------------------------------------------------------------------------------------ views


class Quantization(ResponseModel):
    kind: QuantizationKind
    quantile: str | None = None
    always_ram: bool


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
