"""Memory store instances: size classes, eviction policies, the instance record and its wire shapes.

A memory store is a provisioned single-node Redis-compatible server. The provisioner (a port) owns the
instance records, the way the cluster owns its custom resources; the service turns a record into the
spec's instance object and never lets a password reach it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from caiplatform.clock import rfc3339

NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 40
MAX_CREATE_BODY_BYTES = 16 * 1024
STATS_BUDGET_SECONDS = 3.0
USERNAME = "default"
DEFAULT_PERSISTENCE_SIZE = "2Gi"
REACHABLE_SCOPE = "vpc"

Mi = 1024 * 1024
# Document 3: `connection.port` is 6379. On one machine each instance has its own loopback address for it;
# where the system cannot bind one, the instance's view says so with this note.
DOCUMENTED_PORT = 6379
FALLBACK_NOTE = (
    "this system cannot listen on another loopback address than 127.0.0.1, so the instance listens on "
    "127.0.0.1 and a free port instead of its own address and the documented port 6379"
)


@dataclass(frozen=True)

class SizeClass:
    name: str
    memory_limit: str  # the container limit, as a quantity
    limit_bytes: int

    @property
    def maxmemory_bytes(self) -> int:
        """The dataset cap: 75% of the container limit."""
        return self.limit_bytes * 3 // 4

    @property
    def maxmemory(self) -> str:
        return quantity(self.maxmemory_bytes)


SIZE_CLASSES: dict[str, SizeClass] = {
    "small": SizeClass("small", "256Mi", 256 * Mi),
    "medium": SizeClass("medium", "1Gi", 1024 * Mi),
    "large": SizeClass("large", "4Gi", 4096 * Mi),
}
DEFAULT_SIZE_CLASS = "small"

EVICTION_POLICIES: tuple[str, ...] = (
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
)
DEFAULT_EVICTION_POLICY = "noeviction"

_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_QUANTITY_FACTORS = {
    None: 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
}


def parse_quantity(text: str) -> int | None:
    """Bytes of a Kubernetes-style quantity (`2Gi`, `512Mi`, `1000`), or None when it is not one."""
    match = _QUANTITY.match(text)
    if not match:
        return None
    return int(match.group(1)) * _QUANTITY_FACTORS[match.group(2)]


def quantity(n_bytes: int) -> str:
    """The shortest binary quantity that states `n_bytes` exactly (192Mi, 3Gi)."""
    for suffix in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _QUANTITY_FACTORS[suffix]
        if n_bytes and n_bytes % factor == 0:
            return f"{n_bytes // factor}{suffix}"
    return str(n_bytes)


class State(StrEnum):
    PROVISIONING = "Provisioning"
    READY = "Ready"
    DEGRADED = "Degraded"
    UNKNOWN = "Unknown"
    DELETING = "Deleting"


@dataclass(frozen=True)
class InstanceSpec:
    """What was asked for at create; fixed for the instance's life."""

    project_id: str
    project_short: str
    name: str
    size_class: str = DEFAULT_SIZE_CLASS
    version: str = ""  # blank: the platform default runs
    maxmemory_policy: str = DEFAULT_EVICTION_POLICY
    external_exposure: bool = False
    persistence_enabled: bool = True
    persistence_size: str = DEFAULT_PERSISTENCE_SIZE
    storage_class_name: str = ""

    @property
    def size(self) -> SizeClass:
        return SIZE_CLASSES[self.size_class]

    @property
    def resource_path(self) -> str:
        return f"projects/{self.project_short}/memorystores/{self.name}"

    @property
    def credential_secret(self) -> str:
        return f"ms-{self.name}-credential"

    def to_json(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "project_short": self.project_short,
            "name": self.name,
            "size_class": self.size_class,
            "version": self.version,
            "maxmemory_policy": self.maxmemory_policy,
            "external_exposure": self.external_exposure,
            "persistence_enabled": self.persistence_enabled,
            "persistence_size": self.persistence_size,
            "storage_class_name": self.storage_class_name,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InstanceSpec:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True", "False", "Unknown"
    reason: str
    message: str
    last_transition_time: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "last_transition_time": rfc3339(self.last_transition_time),
        }


@dataclass(frozen=True)
class Instance:
    """One instance as the provisioner observes it now (never carries a password)."""

    spec: InstanceSpec
    created_at: datetime
    state: State
    host: str
    port: int
    credential_ready: bool = True
    service_ready: bool = False
    workload_ready: bool = False
    externally_reachable: bool = False
    external_endpoint: str | None = None
    message: str = ""  # why it is not ready, when known
    transitions: dict[str, datetime] = field(default_factory=dict)  # condition type -> last change
    note: str = ""  # something a client must know about this instance's connection (omitted when empty)

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    def with_state(self, state: State, **changes: Any) -> Instance:
        return replace(self, state=state, **changes)

    def conditions(self) -> list[Condition]:
        def cond(kind: str, ok: bool, reason_ok: str, reason_not: str, msg_ok: str, msg_not: str) -> Condition:
            when = self.transitions.get(kind, self.created_at)
            return Condition(kind, "True" if ok else "False", reason_ok if ok else reason_not,
                             msg_ok if ok else msg_not, when)

        not_ready = self.message or "the server is starting"
        out = [
            cond("CredentialReady", self.credential_ready, "SecretCreated", "SecretMissing",
                 f"credential stored as {self.spec.credential_secret}", "the credential is not stored yet"),
            cond("ServiceReady", self.service_ready, "Listening", "NotListening",
                 f"accepting connections on {self.host}:{self.port}", "the endpoint does not accept connections yet"),
            cond("WorkloadReady", self.workload_ready, "Running", "NotRunning",
                 "the server process is running", not_ready),
            cond("Ready", self.ready, "Ready", self.state.value,
                 "ready to accept connections", not_ready),
        ]
        if self.spec.external_exposure:
            out.append(cond("ExternallyReachable", self.externally_reachable, "RouteProgrammed", "NoRoute",
                            f"TLS endpoint {self.external_endpoint}",
                            "no TLS route is programmed for this instance on this platform"))
        return out

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        body: dict[str, Any] = {
            "name": spec.name,
            "resource_path": spec.resource_path,
            "project_id": spec.project_id,
            "size_class": spec.size_class,
        }
        if spec.version:
            body["version"] = spec.version
        body.update(
            {
                "maxmemory_policy": spec.maxmemory_policy,
                "persistence": {"enabled": spec.persistence_enabled, "size": spec.persistence_size},
                "state": self.state.value,
                "ready": self.ready,
                "external_exposure": spec.external_exposure,
                "externally_reachable": self.externally_reachable,
            }
        )
        if spec.persistence_enabled and spec.storage_class_name:
            body["persistence"]["storage_class_name"] = spec.storage_class_name
        if self.external_endpoint and self.externally_reachable:
            body["external_endpoint"] = self.external_endpoint
        body.update(
            {
                "reachable_scope": REACHABLE_SCOPE,
                "memory_limit": spec.size.memory_limit,
                "maxmemory": spec.size.maxmemory,
                "ready_replicas": 1 if self.ready else 0,
                "replicas": 1,
                "connection": {
                    "host": self.host,
                    "port": self.port,
                    "username": USERNAME,
                    "credential_secret": spec.credential_secret,
                },
                "conditions": [c.to_json() for c in self.conditions()],
                "created_at": rfc3339(self.created_at),
            }
        )
        if self.note:
            body["note"] = self.note
        return body


def connection_uri(host: str, port: int, password: str, *, scheme: str = "redis") -> str:
    return f"{scheme}://{USERNAME}:{password}@{host}:{port}/0"


# ---------------------------------------------------------------------------------------------- stats

_INT_FIELDS = {
    # stats field: INFO field
    "used_memory_bytes": "used_memory",
    "maxmemory_bytes": "maxmemory",
    "connected_clients": "connected_clients",
    "blocked_clients": "blocked_clients",
    "keyspace_hits": "keyspace_hits",
    "keyspace_misses": "keyspace_misses",
    "evicted_keys": "evicted_keys",
    "expired_keys": "expired_keys",
    "total_commands_processed": "total_commands_processed",
    "instantaneous_ops_per_sec": "instantaneous_ops_per_sec",
    "uptime_in_seconds": "uptime_in_seconds",
}
STATS_NOTE = (
    "a live INFO snapshot taken now; fields the server did not report are omitted, never zeroed; "
    "hit_rate appears after the first lookup and used_memory_pct only when maxmemory is set; no history is kept"
)


def parse_info(raw: str) -> tuple[dict[str, str], set[str]]:
    """INFO text into (flat `field -> value`, names of the sections present)."""
    fields: dict[str, str] = {}
    sections: set[str] = set()
    for line in raw.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            sections.add(line[1:].strip().lower())
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value
    return fields, sections


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        try:
            return int(float(value))
        except ValueError:
            return None


def stats_from_info(spec: InstanceSpec, raw: str) -> dict[str, Any]:
    """The stats body for one INFO snapshot. Absent fields stay absent; nothing is invented."""
    fields, sections = parse_info(raw)
    body: dict[str, Any] = {"memorystore": spec.resource_path, "name": spec.name}
    ints: dict[str, int] = {}
    for out_name, info_name in _INT_FIELDS.items():
        value = _int(fields.get(info_name))
        if value is not None:
            ints[out_name] = value
    if "used_memory_bytes" in ints:
        body["used_memory_bytes"] = ints["used_memory_bytes"]
    if "used_memory_human" in fields:
        body["used_memory_human"] = fields["used_memory_human"]
    if "maxmemory_bytes" in ints:
        body["maxmemory_bytes"] = ints["maxmemory_bytes"]
    if "maxmemory_policy" in fields:
        body["maxmemory_policy"] = fields["maxmemory_policy"]
    maxmemory = ints.get("maxmemory_bytes", 0)
    if maxmemory > 0 and "used_memory_bytes" in ints:
        body["used_memory_pct"] = round(100.0 * ints["used_memory_bytes"] / maxmemory, 2)
    for name in ("connected_clients", "blocked_clients", "keyspace_hits", "keyspace_misses"):
        if name in ints:
            body[name] = ints[name]
    hits, misses = ints.get("keyspace_hits"), ints.get("keyspace_misses")
    if hits is not None and misses is not None and hits + misses > 0:
        body["hit_rate"] = round(hits / (hits + misses), 4)
    for name in ("evicted_keys", "expired_keys", "total_commands_processed",
                 "instantaneous_ops_per_sec", "uptime_in_seconds"):
        if name in ints:
            body[name] = ints[name]
    if "keyspace" in sections:
        total = 0
        for key, line in fields.items():
            if re.fullmatch(r"db[0-9]+", key):
                parts = dict(p.split("=", 1) for p in line.split(",") if "=" in p)
                total += _int(parts.get("keys")) or 0
        body["db_keys"] = total
    body["note"] = STATS_NOTE
    return body
