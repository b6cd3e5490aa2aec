"""The memory store API's models (document 3): create, the instance view, stats, delete, the credential, health.

`MemoryStoreCreate` runs the specification's rules (messages in `caiplatform.services.memorystore` and
`caiplatform.domain.memorystore`) before its own fields are checked. The camelCase spellings the platform
has always read (`sizeClass`, `maxmemoryPolicy`, `externalExposure`, `storageClassName`) are accepted and
read as their snake_case fields; which versions exist depends on the provisioner, so the service checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from caiplatform.domain.memorystore import (
    DEFAULT_EVICTION_POLICY,
    DEFAULT_PERSISTENCE_SIZE,
    DEFAULT_SIZE_CLASS,
    EVICTION_POLICIES,
    NAME_MAX,
    NAME_PATTERN,
    SIZE_CLASSES,
    parse_quantity,
)
from caiplatform.errors import BadRequest
from caiplatform.models.base import ListPage, RequestModel, ResponseModel

SizeClass = Literal["small", "medium", "large"]  # the default: DEFAULT_SIZE_CLASS
EvictionPolicy = Literal["noeviction", "allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru",
                         "volatile-lfu", "volatile-random", "volatile-ttl"]
InstanceState = Literal["Provisioning", "Ready", "Degraded", "Unknown", "Deleting"]

NAME_RULE = (
    "name must be 1 to 40 characters of lowercase letters, digits and hyphens, "
    "starting with a letter and ending with a letter or digit"
)
SIZE_CLASS_RULE = "sizeClass must be one of small, medium, large"
POLICY_RULE = "maxmemoryPolicy must be one of " + ", ".join(EVICTION_POLICIES)

#: camelCase spellings read as their fields (the snake_case one wins when both are sent)
_ALIASES = {"sizeClass": "size_class", "maxmemoryPolicy": "maxmemory_policy", "externalExposure": "external_exposure"}


def _unaliased(data: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    out = {key: value for key, value in data.items() if key not in aliases}
    for alias, key in aliases.items():
        if out.get(key) is None and data.get(alias) is not None:
            out[key] = data[alias]
    return out


class MemoryStorePersistence(RequestModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    enabled: bool | None = Field(None, description="on unless `false` is sent")
    size: str | None = Field(None, description="volume size (default 2Gi), fixed after create", examples=["2Gi"])
    storage_class_name: str | None = None


class MemoryStoreCreate(RequestModel):
    """`POST .../memorystores`: only `name` is required. Fields it does not know are ignored, as they always
    were here (docs/decisions.md, "Typed contract: data areas")."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN.pattern)
    size_class: SizeClass = "small"
    version: str = Field("", description="blank means the platform default")
    maxmemory_policy: EvictionPolicy = "noeviction"
    external_exposure: bool = Field(False, description="a TLS endpoint reachable only inside the cloud network")
    persistence: MemoryStorePersistence | None = None

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = _unaliased(data, _ALIASES)
        name = data.get("name")
        if name is None or name == "":
            raise BadRequest("name is required")
        if not isinstance(name, str) or len(name) > NAME_MAX or not NAME_PATTERN.match(name):
            raise BadRequest(NAME_RULE)
        size_class = data.get("size_class")
        if size_class is None or size_class == "":
            size_class = DEFAULT_SIZE_CLASS
        if not isinstance(size_class, str) or size_class not in SIZE_CLASSES:
            raise BadRequest(SIZE_CLASS_RULE)
        policy = data.get("maxmemory_policy")
        if policy is None or policy == "":
            policy = DEFAULT_EVICTION_POLICY
        if not isinstance(policy, str) or policy not in EVICTION_POLICIES:
            raise BadRequest(POLICY_RULE)
        version = data.get("version")
        if version is None:
            version = ""
        if not isinstance(version, str):
            raise BadRequest("version must be a string; leave it blank for the platform default")
        exposure = data.get("external_exposure")
        if exposure is None:
            exposure = False
        if not isinstance(exposure, bool):
            raise BadRequest("external_exposure must be true or false")
        persistence = data.get("persistence")
        if persistence is not None:
            if not isinstance(persistence, Mapping):
                raise BadRequest("persistence must be an object")
            persistence = _unaliased(persistence, {"storageClassName": "storage_class_name"})
            enabled = persistence.get("enabled")
            if enabled is not None and not isinstance(enabled, bool):
                raise BadRequest("persistence.enabled must be true or false")
            size = persistence.get("size")
            if size is not None and size != "" and (not isinstance(size, str) or not parse_quantity(size)):
                raise BadRequest(f"persistence.size {size!r} is not a valid quantity (for example 2Gi)")
            if size == "":
                persistence["size"] = None
            storage_class = persistence.get("storage_class_name")
            if storage_class is not None and not isinstance(storage_class, str):
                raise BadRequest("persistence.storage_class_name must be a string")
        return {**data, "size_class": size_class, "maxmemory_policy": policy, "version": version.strip(),
                "external_exposure": exposure, "persistence": persistence}

    @property
    def persistence_enabled(self) -> bool:
        """Off only when `enabled: false` was sent."""
        return self.persistence is None or self.persistence.enabled is not False

    @property
    def persistence_size(self) -> str:
        return (self.persistence.size if self.persistence else None) or DEFAULT_PERSISTENCE_SIZE

    @property
    def storage_class_name(self) -> str:
        return (self.persistence.storage_class_name if self.persistence else None) or ""


# ------------------------------------------------------------------------------------------ views


class MemoryStoreSummary(ResponseModel):
    name: str
    state: InstanceState
    ready: bool


class MemoryStoreCredential(ResponseModel):
    username: str
    password: str = Field(description="24 random bytes, base64url; shown by create and rotate only")
    uri: str
    external_uri: str | None = Field(None, description="only when exposure is on and the endpoint is published")


class MemoryStoreCreated(ResponseModel):
    memorystore: MemoryStoreSummary
    credential: MemoryStoreCredential
    note: str


class MemoryStoreRotated(ResponseModel):
    """The new credential, at the top level and under `credential`; it applies when the instance restarts."""

    memorystore: MemoryStoreSummary
    username: str
    password: str
    uri: str
    external_uri: str | None = None
    credential: MemoryStoreCredential
    note: str


class MemoryStorePersistenceView(ResponseModel):
    enabled: bool
    size: str
    storage_class_name: str | None = None


class MemoryStoreConnection(ResponseModel):
    host: str
    port: int
    username: str
    credential_secret: str


class MemoryStoreCondition(ResponseModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    last_transition_time: str


class MemoryStore(ResponseModel):
    name: str
    resource_path: str
    project_id: str
    size_class: SizeClass
    version: str | None = Field(None, description="omitted when the platform default runs")
    maxmemory_policy: EvictionPolicy
    persistence: MemoryStorePersistenceView
    state: InstanceState
    ready: bool
    external_exposure: bool
    externally_reachable: bool
    external_endpoint: str | None = None
    reachable_scope: Literal["vpc"]
    memory_limit: str
    maxmemory: str
    ready_replicas: int
    replicas: int
    connection: MemoryStoreConnection
    conditions: list[MemoryStoreCondition]
    created_at: str
    note: str | None = None


class MemoryStoreList(ListPage):
    items_field: ClassVar[str] = "memorystores"
    memorystores: list[MemoryStore]


class MemoryStoreStats(ResponseModel):
    """Fields absent from the server's INFO are omitted, never zeroed."""

    memorystore: str
    name: str
    used_memory_bytes: int | None = None
    used_memory_human: str | None = None
    maxmemory_bytes: int | None = None
    maxmemory_policy: str | None = None
    used_memory_pct: float | None = None
    connected_clients: int | None = None
    blocked_clients: int | None = None
    keyspace_hits: int | None = None
    keyspace_misses: int | None = None
    hit_rate: float | None = None
    evicted_keys: int | None = None
    expired_keys: int | None = None
    total_commands_processed: int | None = None
    instantaneous_ops_per_sec: int | None = None
    uptime_in_seconds: int | None = None
    db_keys: int | None = None
    note: str


class MemoryStoreDeletion(ResponseModel):
    name: str
    resource_path: str
    state: Literal["Deleting"]
    note: str


class MemoryStoreCheck(ResponseModel):
    status: str = Field(description="ok, or unreachable, missing or unconfigured")
    detail: str | None = None


class MemoryStoreChecks(ResponseModel):
    kubernetes: MemoryStoreCheck
    memorystore_crd: MemoryStoreCheck
    database: MemoryStoreCheck
    session_key: MemoryStoreCheck


class MemoryStoreHealth(ResponseModel):
    status: Literal["ok", "degraded"]
    checks: MemoryStoreChecks
