"""The workload runtime port: immutable revisions of a workload, a traffic split, scale to zero.

Agents, functions, serverless services and hosted MCP servers all run through this one port. A
*workload* (`WorkloadRef`) is a name in a project; every change to what it runs (image, env, secrets,
resources, scaling, timeout) is applied as a new immutable *revision* (`<name>-00001` upward, chosen
by the caller). Traffic is split among revisions by percent; an entry with `latest_revision=True`
follows the newest ready revision (Knative's semantics).

Scale to zero: a revision has no instance until a request needs one (a cold start), keeps at least
`min_scale` instances, at most `max_scale` (0 meaning the runtime's default ceiling), and each instance
serves at most `container_concurrency` requests at once (0: unbounded). An instance idle for the
runtime's idle period (about 90 s) stops.

A revision is `ready` once one instance of it has started and answered its health check; a revision
that scaled to zero stays ready. `state` is `unknown` until the runtime has tried.

Requests reach a workload through `acquire`: it picks a revision by the split, starts an instance if
none is free (within `timeout`), and returns an `Endpoint` whose `release()` frees the slot. An
in-process runtime returns an httpx transport instead of a network address.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import httpx

#: The per-instance secret's header (caiplatform.harness.app checks it).
HARNESS_TOKEN_HEADER = "X-CAI-Harness-Token"

RevisionState = Literal["ready", "not_ready", "unknown"]

#: Defaults a runtime applies when a revision does not say (serverless document's numbers).
DEFAULT_MIN_SCALE = 0
DEFAULT_MAX_SCALE = 10
DEFAULT_CONTAINER_CONCURRENCY = 80
DEFAULT_TIMEOUT_SECONDS = 300
DEFAULT_PORT = 8080


class WorkloadError(Exception):
    """The runtime refused or failed an operation; `message` is shown to the caller as is."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)


class NoCapacity(WorkloadError):
    """No instance could take the request within the timeout (all at `max_scale` and busy, or a cold
    start that did not become healthy in time)."""


@dataclass(frozen=True)
class WorkloadRef:
    project_id: str
    project_short: str
    name: str
    kind: str = "agent"  # agent | function | service | mcp

    @property
    def namespace(self) -> str:
        return f"cai-p-{self.project_short}"

    @property
    def key(self) -> str:
        """Unique across projects and kinds; safe in file names and process names. Agents and functions
        share one name space (document 1); a service or an MCP server may bear an agent's name."""
        space = "agent" if self.kind in ("agent", "function") else self.kind
        return f"{self.project_short}-{space}-{self.name}"


@dataclass(frozen=True)
class Scaling:
    min_scale: int = DEFAULT_MIN_SCALE
    max_scale: int = DEFAULT_MAX_SCALE  # 0: the runtime's default ceiling
    container_concurrency: int = DEFAULT_CONTAINER_CONCURRENCY  # 0: unbounded


@dataclass(frozen=True)
class Resources:
    """Resource quantity strings, e.g. {"cpu": "250m", "memory": "512Mi"}."""

    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RevisionSpec:
    workload: WorkloadRef
    revision: str  # "<name>-00001"
    generation: int  # 1, 2, ... (the number in the revision name)
    image: str  # an image reference the runtime can run (see ports.builder.Image)
    env: dict[str, str] = field(default_factory=dict)  # plain variables
    secret_env: dict[str, str] = field(default_factory=dict)  # values a cluster keeps in a Secret
    command: list[str] | None = None  # entrypoint override (serverless)
    args: list[str] | None = None
    port: int = DEFAULT_PORT
    port_name: str = "http1"  # http1 | h2c
    resources: Resources = field(default_factory=Resources)
    scaling: Scaling = field(default_factory=Scaling)
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    runtime_class_name: str = ""
    service_account_name: str = ""
    # Free-form labels recorded on the revision (e.g. who deployed it, the config generation).
    labels: dict[str, str] = field(default_factory=dict)
    # Host directories holding the workload's own state (its session database): on the local runtime the
    # only ones its sandbox may write besides its home and /tmp (a cluster would mount a volume).
    state_dirs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TrafficTarget:
    percent: int
    revision_name: str | None = None
    latest_revision: bool = False
    tag: str | None = None


@dataclass(frozen=True)
class RevisionStatus:
    name: str
    generation: int
    image: str
    created_at: datetime
    state: RevisionState = "unknown"
    reason: str = ""
    message: str = ""
    replicas: int = 0  # instances running now
    traffic_percent: int = 0  # live share of traffic
    tag: str | None = None
    url: str = ""

    @property
    def ready(self) -> bool:
        return self.state == "ready"


@dataclass(frozen=True)
class ResolvedTraffic:
    """A traffic entry as it routes now (latest_revision resolved to a name when one is ready)."""

    percent: int
    revision_name: str | None
    latest_revision: bool = False
    tag: str | None = None
    url: str = ""


@dataclass(frozen=True)
class WorkloadStatus:
    ref: WorkloadRef
    url: str  # internal address
    revisions: list[RevisionStatus]  # newest first
    traffic: list[ResolvedTraffic]
    latest_created_revision: str = ""
    latest_ready_revision: str = ""
    ready: bool = False
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class LogLine:
    ts: datetime
    revision: str
    pod: str  # instance name
    stream: str  # stdout | stderr
    message: str


@dataclass(frozen=True)
class WorkloadMetrics:
    instances: int  # running now across revisions
    revisions: list[RevisionStatus]
    target_concurrency: int


@dataclass
class Endpoint:
    """Where one request goes. Call `release()` when the response is finished (or abandoned)."""

    revision: str
    base_url: str
    release: Callable[[], Awaitable[None]]
    transport: httpx.AsyncBaseTransport | None = None  # in-process runtimes; the local runtime's socket
    # The local runtime's instance: its Unix socket and the per-instance secret to present (the transport
    # does both; these let the platform's own HTTP/1.1 client do the same).
    socket: str | None = None
    credential: dict[str, str] = field(default_factory=dict)

    def client(self, timeout: float | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, transport=self.transport, timeout=timeout)




class InstanceTransport(httpx.AsyncBaseTransport):
    """The platform's only way to one instance: its per-instance secret on every request, over its Unix
    socket (or `inner`, an in-process transport). Shared by every client of the instance: `aclose()` of a
    client leaves it open; the runtime closes it with the instance (`close()`)."""

    def __init__(self, token: str, *, uds: str | None = None, inner: httpx.AsyncBaseTransport | None = None):
        self.token = token
        self.uds = uds
        # Plain HTTP to a local socket: no certificates to load.
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport(uds=uds, verify=False)

    @property
    def credential(self) -> dict[str, str]:
        return {HARNESS_TOKEN_HEADER: self.token}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers[HARNESS_TOKEN_HEADER] = self.token  # replaces whatever a forwarded request carried
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        return None

    async def close(self) -> None:
        await self._inner.aclose()


class WorkloadRuntime(ABC):
    #: adapter name as registered (`memory`, `local`, `kubernetes`)
    name: str = ""
    #: True when every replica of the platform writes to the same runtime (a cluster): what one replica
    #: applied is there for all, so no replica re-applies another's revisions.
    shared: bool = False

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Reap what a previous run left behind and bring back instances that `min_scale` keeps warm."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop every instance (revisions stay recorded)."""

    @abstractmethod
    async def apply(self, spec: RevisionSpec, traffic: list[TrafficTarget] | None = None) -> None:
        """Record a new revision and start making it ready. `traffic` None means 100% to the latest
        ready revision (a new revision supersedes an earlier pin)."""

    @abstractmethod
    async def set_traffic(self, ref: WorkloadRef, traffic: list[TrafficTarget]) -> None:
        """Replace the split (already validated by the caller: it sums to 100, names exist)."""

    @abstractmethod
    async def status(self, ref: WorkloadRef) -> WorkloadStatus | None:
        """The workload as it runs now, or None when the runtime has nothing for it."""

    async def address(self, ref: WorkloadRef) -> str | None:
        """`status(ref).url`, or None when the runtime has nothing for it: for a view that shows only the
        address (an agent's GET), which a runtime may answer without building the whole status."""
        status = await self.status(ref)
        return status.url if status is not None else None

    @abstractmethod
    async def acquire(self, ref: WorkloadRef, *, timeout: float, tag: str | None = None) -> Endpoint:
        """A slot on an instance of a revision picked by the split (or by `tag`), cold-starting one if
        needed. Raises `NoCapacity` when none is available within `timeout`, `LookupError` when the
        workload has no revision."""

    @abstractmethod
    def logs(self, ref: WorkloadRef, *, tail: int = 500, follow: bool = False) -> AsyncIterator[str] | None:
        """Lines of the newest live instance (the last `tail`, then new ones while `follow`), or None
        when no instance runs."""

    @abstractmethod
    async def log_history(self, ref: WorkloadRef, *, since: datetime | None = None, limit: int = 500) -> list[LogLine]:
        """Persisted lines, oldest first, at most `limit` (the newest ones when there are more)."""

    @abstractmethod
    async def erase_log_lines(self, ref: WorkloadRef, needles: Sequence[str]) -> int:
        """Delete the persisted history lines whose message contains any of `needles` (a user's erasure),
        all or nothing; how many were removed. Lines still held only by a live instance's own output are
        not history yet: they are ingested and judged with the rest."""

    @abstractmethod
    async def spec_document(self, ref: WorkloadRef) -> dict[str, Any] | None:
        """The live object as the runtime holds it (a Knative-Service-shaped mapping); callers sanitize."""

    @abstractmethod
    async def metrics(self, ref: WorkloadRef) -> WorkloadMetrics | None:
        """Live counts, no history."""

    @abstractmethod
    async def delete(self, ref: WorkloadRef) -> None:
        """Stop every instance and forget the workload, its revisions and its log history. Idempotent."""

    @abstractmethod
    async def usage(self, namespace: str) -> dict[str, int]:
        """What the project's workloads hold now, by quota resource name (`pods`, `services`,
        `count/deployments.apps`, ...): the "used" side of the quota view."""
