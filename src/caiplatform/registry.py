"""Where backend adapters are found.

An adapter is named by a port kind (`vector`, `broker`, ...) and an adapter name (`memory`, `qdrant`, ...).
Built-in adapters are listed here by import path, so nothing is imported until it is asked for; third
parties add theirs through the entry-point group `caiplatform.backends`, whose entry names are
`<kind>.<name>` and whose values are `module:attribute`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from caiplatform.errors import MissingDriver, NotFound

ENTRY_POINT_GROUP = "caiplatform.backends"


@dataclass(frozen=True)
class AdapterRef:
    kind: str
    name: str
    target: str  # "package.module:Attribute"
    extra: str | None = None  # the distribution extra that brings its driver

    def load(self) -> Any:
        module_name, _, attribute = self.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
                raise
            raise MissingDriver(missing_driver_message(self, exc.name)) from exc
        return getattr(module, attribute)


def missing_driver_message(ref: AdapterRef, module: str | None) -> str:
    install = f"pip install 'caiplatform[{ref.extra}]'" if ref.extra else "pip install caiplatform"
    return f"the {ref.kind} backend {ref.name!r} needs the Python module {module!r}; install it with: {install}"


_BUILTIN: list[AdapterRef] = [
    AdapterRef("secrets", "memory", "caiplatform.adapters.memory.secrets:InMemorySecretBackend"),
    AdapterRef("secrets", "openbao", "caiplatform.adapters.openbao.secrets:OpenBaoSecretBackend", "openbao"),
    AdapterRef("broker", "memory", "caiplatform.adapters.memory.broker:InMemoryBroker"),
    AdapterRef("broker", "nats", "caiplatform.adapters.nats.broker:JetStreamBroker", "nats"),
    AdapterRef("vector", "memory", "caiplatform.adapters.memory.vector:InMemoryVectorEngine"),
    AdapterRef("vector", "qdrant", "caiplatform.adapters.qdrant.vector:QdrantVectorEngine", "qdrant"),
    AdapterRef("vector", "edge", "caiplatform.adapters.edge.vector:EdgeVectorEngine", "qdrant"),
    # the former embedded engine's name: its data is imported by the Edge engine on start
    AdapterRef("vector", "local", "caiplatform.adapters.edge.vector:EdgeVectorEngine", "qdrant"),
    AdapterRef("memorystore", "memory", "caiplatform.adapters.memory.memorystore:InMemoryProvisioner", "redis"),
    AdapterRef("memorystore", "local", "caiplatform.adapters.local.memorystore:LocalValkeyProvisioner", "redis"),
    # the local provisioner of replicas sharing one PostgreSQL database (records in the database)
    AdapterRef("memorystore", "replicas", "caiplatform.adapters.local.memorystore_cluster:ClusterValkeyProvisioner", "redis"),
    AdapterRef("builder", "memory", "caiplatform.adapters.memory.builder:InMemoryBuilder"),
    AdapterRef("builder", "local", "caiplatform.adapters.local.builder:LocalBuilder"),
    AdapterRef("runtime", "memory", "caiplatform.adapters.memory.runtime:InMemoryRuntime"),
    AdapterRef("runtime", "local", "caiplatform.adapters.local.runtime:LocalProcessRuntime"),
    AdapterRef("projects", "memory", "caiplatform.adapters.memory.projects:InMemoryProjectProvisioner"),
    AdapterRef("projects", "local", "caiplatform.adapters.local.projects:LocalProjectProvisioner"),
    AdapterRef("sessions", "memory", "caiplatform.adapters.memory.sessions:InMemorySessionStore"),
    AdapterRef("sessions", "sqlite", "caiplatform.adapters.sqlite.sessions:SQLiteSessionStore"),
    AdapterRef("sessions", "redis", "caiplatform.adapters.redis.sessions:RedisSessionStore", "redis"),
    AdapterRef("projects", "kubernetes", "caiplatform.adapters.kubernetes.projects:KubernetesProjectProvisioner", "kubernetes"),
    AdapterRef("memorystore", "kubernetes", "caiplatform.adapters.kubernetes.memorystore:ValkeyStatefulSetProvisioner", "kubernetes"),
    AdapterRef("builder", "kubernetes", "caiplatform.adapters.kubernetes.builder:BuildKitJobBuilder", "kubernetes"),
    AdapterRef("runtime", "kubernetes", "caiplatform.adapters.kubernetes.runtime:KnativeRuntime", "kubernetes"),
    AdapterRef("mcp_host", "memory", "caiplatform.adapters.memory.mcp_host:InMemoryMcpHost"),
    AdapterRef("mcp_host", "local", "caiplatform.adapters.local.mcp_host:LocalMcpHost", "mcp"),
    AdapterRef("mcp_host", "kubernetes", "caiplatform.adapters.kubernetes.mcp_host:KnativeMcpHost", "kubernetes"),
]


class Registry:
    def __init__(self, refs: list[AdapterRef] | None = None, *, read_entry_points: bool = True):
        self._refs: dict[tuple[str, str], AdapterRef] = {}
        for ref in refs if refs is not None else _BUILTIN:
            self.register(ref)
        if read_entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                kind, _, name = ep.name.partition(".")
                if kind and name:
                    self.register(AdapterRef(kind, name, ep.value))

    def register(self, ref: AdapterRef) -> None:
        self._refs[(ref.kind, ref.name)] = ref

    def names(self, kind: str) -> list[str]:
        return sorted(name for (k, name) in self._refs if k == kind)

    def ref(self, kind: str, name: str) -> AdapterRef:
        try:
            return self._refs[(kind, name)]
        except KeyError:
            known = ", ".join(self.names(kind)) or "none"
            raise NotFound(f"no {kind} backend named {name!r} (known: {known})") from None

    def load(self, kind: str, name: str) -> Any:
        return self.ref(kind, name).load()


default_registry = Registry()
