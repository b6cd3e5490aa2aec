"""`create_app(platform)`: the ASGI app serving one or more of the five APIs on one port.

The conventions shared by every route live here, once: request ids, the error envelope (also for
unrouted paths and wrong methods), credential parsing into a `Principal`, and per-principal rate limits.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from caiplatform import logjson, tracing
from caiplatform.db.database import DATABASE_UNAVAILABLE_MESSAGE, is_database_unavailable
from caiplatform.errors import MethodNotAllowed, PlatformError, RateLimited
from caiplatform.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from caiplatform.metrics import UNMATCHED, route_template
from caiplatform.models.health import Liveness, PlatformHealth
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.redaction import one_line
from caiplatform.routing import HostRouter, Upstream, upstream_at
from caiplatform.services.mcp import MCP_ROUTE_PREFIX
from caiplatform.web.envelope import error_response, request_id_from
from caiplatform.web.http import head_refusal
from caiplatform_server.checks_first import checked_first
from caiplatform_server.contract import ANONYMOUS, openapi_document, operation, reply
from caiplatform_server.dispatch import RouteTable
from caiplatform_server.docs import mount_docs
from caiplatform_server.proxy import proxy
from caiplatform_server.secret_relay import is_relay_path, relay

log = logging.getLogger(__name__)

ALL_APIS = ("core", "serverless", "pubsub", "memorystore", "vectordb")
HealthFn = Callable[[Platform], Awaitable[tuple[int, dict[str, Any]]]]

# Paths that are never rate limited and never need a credential.
UNMETERED_PATHS = {"/healthz", "/livez", "/openapi.json", "/docs", "/metrics"}
# Prometheus' scrape (docs/observability.md): an extension beside /healthz, outside /v1 and the API document.
METRICS_PATH = "/metrics"
DOCS_ASSETS = "/docs/assets/"
# The messaging API has no rate limit in document 3 (no 429 in its error table, none in its limits): a
# signed-in caller publishes, pulls and acknowledges unmetered; anonymous callers stay metered per IP.
UNMETERED_FOR_CALLERS = re.compile(r"^/v1/projects/[^/]+/(topics|pubsub)(/|$)")

# While the platform starts (`create_app(answer_while_starting=True)`, as `caiplatform serve` runs it), a
# request waits for the engines its route needs, at most this long, then answers 503 (docs/performance.md,
# "Restart"). Invoke needs the runtime, not the secret store, the broker or the other areas (agents'
# long-term memory waits for the vector engine itself: `Platform._vector_open`); liveness, the API document and the docs need nothing started; every
# other route, /healthz included, waits for the whole start, so a route never answers from an engine
# that is not there yet.
START_WAIT_SECONDS = 60.0
STARTING_MESSAGE = "the platform is starting; retry shortly"
START_FAILED_MESSAGE = "the platform could not start; see its log"
INVOKE_GATES = ("workloads",)
# Workloads' secret reads (the relay): the secret store only, not the rest of the start (an MCP server or an
# instance the start waits for may read its secrets while it starts).
RELAY_GATES = ("engines",)
ALL_STARTED = ("started",)
NOTHING_NEEDED: tuple[str, ...] = ()
INVOKE_PATH = re.compile(r"^/v1/agents/[^/]+/invoke(/stream)?$")
# /healthz answers at once: 503 `starting` until the whole start is done (a load balancer's readiness).
UNGATED_PATHS = {"/healthz", "/livez", "/openapi.json", "/docs", "/metrics"}


def gates_of(path: str) -> tuple[str, ...]:
    """The start gates (`Platform.gates`) a request to `path` waits for."""
    if path in UNGATED_PATHS or path.startswith(DOCS_ASSETS):
        return NOTHING_NEEDED
    if INVOKE_PATH.match(path):
        return INVOKE_GATES
    if is_relay_path(path):
        return RELAY_GATES
    return ALL_STARTED


def request_id_of(request: Request) -> str:
    return getattr(request.state, "request_id", "") or request.headers.get("x-request-id", "")


def client_ip(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


def _bearer(authorization: bytes | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


class ConventionsMiddleware:
    """Request id on every response; credential → principal; rate limit; envelope for early refusals."""

    def __init__(self, app: FastAPI, platform: Platform, *, gated: bool = False):
        self.app = app
        self.routes = RouteTable(app)
        self.platform = platform
        self.gated = gated  # requests may arrive before the platform has started: they wait for their gates
        self._client: httpx.AsyncClient | None = None

    async def _starting_refusal(self, path: str) -> str | None:
        """None once the engines `path` needs are up (waiting for them, bounded), else why not."""
        gates = self.platform.gates
        if gates.is_open("started"):  # every gate is: no request of a started server classifies its path
            return None
        needed = gates_of(path)
        if not needed or all(gates.is_open(name) for name in needed):
            return None
        try:
            await gates.wait(needed, START_WAIT_SECONDS)
        except TimeoutError:
            return STARTING_MESSAGE
        except Exception:  # noqa: BLE001 - the start's own error is in the log; the server is stopping
            return START_FAILED_MESSAGE
        return None

    async def _mcp_route(self, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        """`/mcp/<project short>/<server>/<path>` to `<path>` of the replica process that serves it now."""
        parts = scope["path"][len(MCP_ROUTE_PREFIX):].split("/", 2)
        short, name = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
        base = await self.platform.mcp.upstream_of(short, name) if short and name else None
        rest = "/" + (parts[2] if len(parts) == 3 else "")
        inner = {**scope, "path": rest, "raw_path": rest.encode("latin-1")}
        await proxy(cast(HostRouter, _FixedUpstream(base)), self._proxy_client(), inner, receive, send, request_id)

    def _proxy_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_keepalive_connections=50))
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        began = time.perf_counter()
        # The trace's root span when tracing is on (caiplatform.tracing); one test when it is off.
        traced = tracing.ServerSpan(scope) if tracing.tracer() is not None else None
        error: BaseException | None = None
        try:
            await self._serve(scope, receive, counted)
        except BaseException as exc:
            error = exc
            raise
        finally:
            # The route's template (set by whichever router answered), never the raw path.
            state = scope.get("state") or {}
            route = state.get("metrics_route") or route_template(scope)
            if route == UNMATCHED and scope["path"].startswith(DOCS_ASSETS):  # a mount: no route of its own
                route = DOCS_ASSETS + "{path}"
            self.platform.metrics.observe_http(scope["method"], route, status, time.perf_counter() - began)
            if traced is not None:
                traced.close(route, status, state.get("request_id", ""), error)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send, principal: Principal) -> None:
        """GET /metrics: the service decides who may read it (`ObservabilityService.scrape`)."""
        scope["state"]["metrics_route"] = METRICS_PATH
        if scope["method"] != "GET":
            raise MethodNotAllowed("method not allowed")
        body = await self.platform.observability.scrape(principal)
        await Response(body, media_type=METRICS_CONTENT_TYPE)(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        # One pass over the headers: the last x-request-id and host win (as a dict of them would), the
        # first authorization (as the credential).
        incoming_raw = host_raw = b""
        authorization: bytes | None = None
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                incoming_raw = value
            elif name == b"host":
                host_raw = value
            elif name == b"authorization" and authorization is None:
                authorization = value
        incoming = incoming_raw.decode("latin-1")
        request_id = request_id_from(incoming)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        logjson.request_id.set(request_id)  # every log line of this request carries it (its own task's context)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        refusal = head_refusal(scope)
        if refusal is not None:  # before anything reads the query or the headers, the published host too
            await error_response(*refusal, request_id)(scope, receive, send_with_id)
            return

        if self.gated:
            refused = await self._starting_refusal(scope["path"])
            if refused is not None:
                await error_response(503, refused, request_id, {"Retry-After": "1"})(scope, receive, send_with_id)
                return

        host = host_raw.decode("latin-1")
        if host and self.platform.hosts.is_apps_host(host):
            # A published workload's own address: its routes, its auth mode; never the platform API.
            state["metrics_route"] = "<apps>"
            await proxy(self.platform.hosts, self._proxy_client(), scope, receive, send, request_id)
            return
        if is_relay_path(scope["path"]):
            # Workloads' secret reads (their read token, for the store; docs/decisions/sandbox.md).
            state["metrics_route"] = "<secret-relay>"
            await relay(self.platform.secret_store_address(), self._proxy_client(), scope, receive, send, request_id)
            return
        if scope["path"].startswith(MCP_ROUTE_PREFIX):
            # A hosted MCP server through the platform's own route (its bearer token is the server's to check).
            state["metrics_route"] = "<mcp>"
            await self._mcp_route(scope, receive, send, request_id)
            return

        ip = client_ip(scope)
        bearer = _bearer(authorization)
        found = self.routes.find(scope)
        if bearer:
            then = self.routes.prefetch(found, scope) if found is not None else None
            try:
                principal, prefetched = await self.platform.auth.authenticate_with(bearer, ip, then)
                if prefetched is not None:
                    state["prefetched"] = prefetched
            except Exception as exc:
                if not is_database_unavailable(exc):
                    raise
                # Who is calling cannot be known without the database: refuse cleanly, retryable.
                await error_response(503, DATABASE_UNAVAILABLE_MESSAGE, request_id)(scope, receive, send_with_id)
                return
        else:
            principal = Principal.anonymous(ip)
        state["principal"] = principal

        metered = scope["path"] not in UNMETERED_PATHS and not scope["path"].startswith(DOCS_ASSETS) and not (
            principal.authenticated and UNMETERED_FOR_CALLERS.match(scope["path"]))
        if metered:
            wait = await self.platform.rate_limiter.acquire(principal.rate_key)
            if wait is not None:
                err = RateLimited(retry_after=wait)
                response = error_response(err.status, err.message, request_id, err.headers)
                await response(scope, receive, send_with_id)
                return
        try:
            if scope["path"] == METRICS_PATH:
                try:
                    await self._metrics(scope, receive, send_with_id, principal)
                except PlatformError as exc:
                    await error_response(exc.status, exc.message, request_id, exc.headers)(scope, receive, send_with_id)
            elif found is not None:
                await self.routes.call(found, scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except Exception:
            # The app's own handler already answered (Starlette re-raises after a 500); keep the
            # server alive and answer in the envelope if nothing was sent yet.
            if not started:
                log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
                await error_response(500, "internal error", request_id)(scope, receive, send_with_id)


health_router = APIRouter(tags=["health"])
liveness_router = APIRouter(tags=["health"])


@health_router.get("/healthz", summary="Health of the served APIs",
                   **operation(response=PlatformHealth, errors=(503,), security=ANONYMOUS))
async def healthz(request: Request) -> JSONResponse:
    platform: Platform = request.app.state.platform
    health_fns: dict[str, HealthFn] = request.app.state.health_fns
    if request.app.state.answer_while_starting and not platform.gates.is_open("started"):
        body: dict[str, Any] = {"status": "starting"}
        if len(health_fns) > 1:
            body["sandbox"] = platform.sandbox_status()
        return JSONResponse(body, status_code=503)
    if len(health_fns) == 1:
        ((name, fn),) = health_fns.items()
        status, body = await fn(platform)
        platform.metrics.observe_health(name, body)  # cai_engine_up
        return JSONResponse(body, status_code=status)
    bodies = {}
    ok = True
    for name, fn in health_fns.items():
        status, body = await fn(platform)
        platform.metrics.observe_health(name, body)
        bodies[name] = body
        ok = ok and status < 400 and body.get("status", "ok") == "ok"
    return JSONResponse({"status": "ok" if ok else "degraded", "apis": bodies, "sandbox": platform.sandbox_status()},
                        status_code=200 if ok else 503)


@liveness_router.get("/livez", summary="Liveness", **operation(response=Liveness, security=ANONYMOUS))
async def livez() -> JSONResponse:
    return reply(Liveness(status="ok"))


@functools.cache
def _load_api(name: str) -> tuple[Any, list[Any]]:
    """An API's main module (`apis/<name>.py`, which owns its health) and its parts (`apis/<name>_*.py`)."""
    import pkgutil

    import caiplatform_server.apis as package

    main = importlib.import_module(f"{package.__name__}.{name}")
    parts = [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name)
        if info.name.startswith(f"{name}_")
    ]
    return main, parts


def create_app(platform: Platform, apis: Sequence[str] = ALL_APIS, *, manage_lifecycle: bool = True,
               answer_while_starting: bool = False,
               on_start_failed: Callable[[BaseException], None] | None = None) -> FastAPI:
    """The app. `answer_while_starting` (with `manage_lifecycle`): the lifespan starts the platform in the
    background and the app answers at once, each request waiting for the engines its route needs
    (`gates_of`); a start that fails calls `on_start_failed` (the server stops) and refuses what waits."""
    unknown = [a for a in apis if a not in ALL_APIS]
    if unknown:
        raise ValueError(f"unknown API {unknown[0]!r}; choose from {', '.join(ALL_APIS)}")
    modules = {name: _load_api(name) for name in dict.fromkeys(apis)}
    early = manage_lifecycle and answer_while_starting

    def started(task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("the platform could not start", exc_info=exc)
            if on_start_failed is not None:
                on_start_failed(exc)

    async def build_routes() -> None:
        """The route table (FastAPI builds every route's context again for the app) in a worker thread once
        the workloads are on their way, rather than on the first request."""
        try:
            await platform.gates.wait(("workloads",), START_WAIT_SECONDS)
        except Exception:  # noqa: BLE001 - not started: the first request builds it
            return
        await asyncio.to_thread(middleware.routes.build)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # type: ignore[no-untyped-def]
        starting: asyncio.Task[None] | None = None
        if early:
            starting = platform.start_soon()  # the server may have started it already
            starting.add_done_callback(started)
            routes_built = asyncio.create_task(build_routes(), name="route-table")
        elif manage_lifecycle:
            await platform.start()
        try:
            yield
        finally:
            if starting is not None:
                starting.cancel()
                await asyncio.gather(starting, routes_built, return_exceptions=True)
            if manage_lifecycle:
                await platform.aclose()

    app = FastAPI(
        title="caiplatform",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by `mount_docs`, as `/docs` is
    )
    app.state.platform = platform
    app.openapi_version = "3.1.0"
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]

    @app.exception_handler(PlatformError)
    async def _platform_error(request: Request, exc: PlatformError) -> JSONResponse:
        exc = await checked_first(request, exc.status) or exc
        message = exc.message
        if exc.status >= 500 and one_line(message) != message:  # an engine's or a workload's detail
            log.warning("%s %s answered %d: %s", request.method, request.url.path, exc.status, message)
            message = one_line(message)
        return error_response(exc.status, message, request_id_of(request), exc.headers, **exc.body)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        refusal = await checked_first(request, exc.status_code)
        if refusal is not None:
            return await _platform_error(request, refusal)
        message = {404: "not found", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, request_id_of(request), dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        refusal = await checked_first(request, 400)
        if refusal is not None:
            return await _platform_error(request, refusal)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        message = f"invalid {where}: {first.get('msg', 'invalid request')}" if where else "invalid request"
        return error_response(400, message, request_id_of(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_database_unavailable(exc):
            log.warning("%s %s: %s", request.method, request.url.path, exc)
            return error_response(503, DATABASE_UNAVAILABLE_MESSAGE, request_id_of(request))
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error", request_id_of(request))

    health_fns: dict[str, HealthFn] = {}
    for name, (module, parts) in modules.items():
        app.include_router(module.router)
        for part in parts:
            app.include_router(part.router)
        health_fns[name] = module.health

    app.state.health_fns = health_fns
    app.state.answer_while_starting = early
    mount_docs(app)
    app.include_router(health_router)
    if "memorystore" in modules:
        app.include_router(liveness_router)

    middleware = ConventionsMiddleware(app, platform, gated=early)
    return middleware  # type: ignore[return-value]


class _FixedUpstream:
    """The part of a `HostRouter` that `proxy` reads, for one upstream found by the caller (None: 404)."""

    def __init__(self, base: str | None):
        self.base = base

    def lookup(self, host: str) -> Callable[[], Awaitable[Upstream]] | None:
        if self.base is None:
            return None
        base = self.base

        async def upstream() -> Upstream:
            return upstream_at(base)

        return upstream

    def guard_for(self, host: str) -> None:
        return None
