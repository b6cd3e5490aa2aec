"""The harness: what runs inside every agent or function revision (`create_harness_app(env)`).

One ASGI app serves one agent or function, configured only by the mapping it is given (the variables of
the harness contract; `python -m caiplatform.harness` passes `os.environ`, the in-memory runtime a
mapping per instance):

- `POST /invoke` (buffered) and `POST /invoke/stream` (NDJSON), `GET /healthz`, `GET /debug/config`;
- the internal read surface under `/internal/` (users, a user's sessions, a transcript, delete), which
  only answers callers presenting `X-CAI-Internal` = `CAI_INTERNAL_TOKEN` (503 when the harness has no
  token, 401 when it is missing or wrong).

Who may call: where the runtime gives the harness a per-instance secret (`CAI_HARNESS_TOKEN`: the local
and in-memory runtimes), every request must present it in `X-CAI-Harness-Token`, `/healthz` included
(the readiness probe is the platform's own), or is refused with 401 before anything else; only the
platform holds it. No header's absence grants anything.

Who picked the session id: the control plane resolves ids (minting, deriving, the anonymous 24-character
rule) before it calls. A caller is the control plane when it presents the internal credential, or the
per-instance secret without `X-Forwarded-Host` (the platform's host proxy sets that header on every
request of the published address, whose callers are anonymous outsiders and get the same rules here).
A harness without a per-instance secret (Kubernetes: the published address reaches the pod directly)
trusts the internal credential only. `memories` in the body (recalled long-term memories, see
`caiplatform.services.invoke_memory`) are only honoured from the control plane.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from caiplatform import json_input, logjson, tracing
from caiplatform.errors import BadRequest, MethodNotAllowed, NotFound, PlatformError, Unavailable
from caiplatform.metrics import UNMATCHED, route_template
from caiplatform.pagination import Pager
from caiplatform.ports.builder import FUNCTION_FRAMEWORKS
from caiplatform.ports.runtime import HARNESS_TOKEN_HEADER
from caiplatform.ports.sessions import SessionStore
from caiplatform.redaction import one_line
from caiplatform.services import invoke_ids
from caiplatform.services.invoke_errors import upstream_reason
from caiplatform.turns import Conversation, TurnError, TurnRunner, debug_config, load_runner, tool_sandbox
from caiplatform.turns.base import ran_out_of_memory
from caiplatform.turns.browse import INTERNAL_HEADER, SessionBrowser, check_internal
from caiplatform.turns.models import agent_env
from caiplatform.web.envelope import error_response, request_id_from
from caiplatform.web.http import read_body

log = logging.getLogger(__name__)

MiB = 1024 * 1024
AGENT_BODY_LIMIT = 1 * MiB  # invoke request body (document 1, Limits)
FUNCTION_BODY_LIMIT = 8 * MiB  # function direct event body (DECISIONS.md)
MESSAGE_REQUIRED = "message is required"
NDJSON = "application/x-ndjson"
SESSION_HEADER = "X-CAI-Session-Id"
BAD_HARNESS_TOKEN = f"this harness answers only the platform: present its per-instance secret in {HARNESS_TOKEN_HEADER}"
USER_HEADER = "X-CAI-User-Id"
HARNESS_SPAN_SERVICE = "harness"

# What the platform injects; everything else in the environment is the agent's own configuration.
PLATFORM_VARIABLES = frozenset({
    "CAI_FRAMEWORK", "CAI_CODE_DIR", "AGENT_NAME", "AGENT_IMAGE", "CAI_INTERNAL_TOKEN", "CAI_SESSION_STORE",
    "MODEL_BASE_URL", "MODEL_API_KEY", "MODEL_NAME", "EMBED_BASE_URL", "CAI_API_URL", "CAI_PROJECT_ID",
    "CAI_PROJECT_KEY", "SANDBOX_URL", "PLATFORM_REQUEST_TIMEOUT_SECONDS", "PORT", "K_REVISION", "CAI_HARNESS_TOKEN", "CAI_HARNESS_SOCKET", "PATH", "HOME", "PYTHONPATH",
    "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "CAI_SECRET_NAMES", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    tracing.WORKLOAD_ENDPOINT, tracing.WORKLOAD_CAPTURE, logjson.ENV,
})

# Paths of the session, memory and browsing family that the harness does not serve itself; they still
# answer the internal-credential refusal first, like every internal route.
ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]
LOCKED_PATHS = ("/internal/{rest:path}", "/sessions/{session_id}/{rest:path}", "/memorize", "/memory",
                "/memory/{rest:path}", "/recall", "/users/{rest:path}")

# `memory` session stores are per process and per agent, so that instances of one agent in one process
# (the in-memory runtime starting a new instance after scale to zero) share their sessions.
_memory_stores: dict[tuple[str, str], SessionStore] = {}


def open_store(env: Mapping[str, str], agent: str) -> SessionStore:
    """The session store named by `CAI_SESSION_STORE`: `memory`, `sqlite:///<path>` or a `redis://` URL."""
    spec = (env.get("CAI_SESSION_STORE") or "memory").strip()
    project = env.get("CAI_PROJECT_ID") or ""
    if spec == "memory":
        from caiplatform.adapters.memory.sessions import InMemorySessionStore

        return _memory_stores.setdefault((project, agent), InMemorySessionStore())
    if spec.startswith("sqlite:///"):
        from caiplatform.adapters.sqlite.sessions import SQLiteSessionStore

        return SQLiteSessionStore(spec.removeprefix("sqlite:///") or "sessions.sqlite3")
    if spec.startswith(("redis://", "rediss://", "unix://")):
        from caiplatform.adapters.redis.sessions import RedisSessionStore

        return RedisSessionStore(spec, prefix=f"cai:sessions:{project}" if project else "cai:sessions")
    raise ValueError(f"unknown CAI_SESSION_STORE {spec!r} (memory, sqlite:///<path>, redis://...)")


def _json(raw: bytes, *, allow_any: bool = False) -> Any:
    if not raw.strip():
        return {}
    try:
        value = json_input.decode(raw)
    except json_input.JSONInputError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from None
    if not allow_any and not isinstance(value, dict):
        raise BadRequest("invalid JSON body: expected a JSON object")
    return value


def memory_preamble(memories: list[str]) -> str:
    """How recalled long-term memories reach the model: a short block before the user's message."""
    listed = "\n".join(f"- {m}" for m in memories)
    return f"Relevant long-term memories (from earlier conversations):\n{listed}\n\n"


class Harness:
    """One agent or function, its session store and its conversation; shared by every request."""

    def __init__(self, env: Mapping[str, str]):
        self.env = dict(env)
        self.framework = self.env.get("CAI_FRAMEWORK") or "adk"
        self.code_dir = self.env.get("CAI_CODE_DIR") or "."
        self.agent = self.env.get("AGENT_NAME") or "agent"
        self.internal_token = self.env.get("CAI_INTERNAL_TOKEN") or None
        self.harness_token = self.env.get("CAI_HARNESS_TOKEN") or None
        self.is_function = self.framework in FUNCTION_FRAMEWORKS
        self.store = open_store(self.env, self.agent)
        page_key = hashlib.sha256(f"{self.internal_token or uuid.uuid4()}/{self.agent}/page-token".encode()).digest()
        self.browser = SessionBrowser(self.store, self.agent, Pager(page_key))
        self.runner: TurnRunner | None = None
        self.conversation: Conversation | None = None
        self.load_error: str | None = None
        self._lock = anyio.Lock()
        self._out_of_memory = False
        # Called once a request ran out of memory: `python -m caiplatform.harness` under a memory rlimit ends
        # the instance there, as the kernel ends a container over its cgroup's limit.
        self.on_out_of_memory: Callable[[], None] | None = None

    @property
    def out_of_memory(self) -> bool:
        """An allocation failed: in the harness itself, in a turn (MemoryError), or in a function's own
        language process."""
        return self._out_of_memory or bool(self.runner is not None and self.runner.out_of_memory)

    def request_ended(self, error: BaseException | None = None) -> None:
        if error is not None and ran_out_of_memory(error):
            self._out_of_memory = True
        if self.out_of_memory and self.on_out_of_memory is not None:
            self.on_out_of_memory()

    # -- loading ---------------------------------------------------------------------------------
    def _load_python(self) -> TurnRunner:
        with agent_env(self.env):
            runner = load_runner(self.framework, self.code_dir, agent=self.agent, sessions=self.store)
            if tool_sandbox.enabled(self.env):  # the agent's own tools run in the tool sandbox
                tool_sandbox.sandbox_tools(runner, self.code_dir)
            return runner

    async def load(self) -> None:
        """Import the entry file once (raises with the reason when it cannot)."""
        async with self._lock:
            if self.conversation is not None:
                return
            if self.load_error is not None:
                raise Unavailable(self.load_error)
            try:
                runner = await self._make_runner()
            except Exception as exc:  # the agent's own import failed: report it, keep answering
                detail = f"the {self.framework} entry could not be loaded: {type(exc).__name__}: {exc}"
                log.error("%s", detail, exc_info=True)  # the agent's logs get the whole traceback
                self.load_error = one_line(detail)
                raise Unavailable(self.load_error) from exc
            self.runner = runner
            self.conversation = Conversation(runner, self.store, agent=self.agent)

    async def _make_runner(self) -> TurnRunner:
        if self.framework in FUNCTION_FRAMEWORKS and self.framework != "function":
            from caiplatform.turns.line_function import runner_class

            runner = runner_class(self.framework).from_dir(self.code_dir, env=self.env, agent=self.agent)
            await runner.start()
            return runner
        return await anyio.to_thread.run_sync(self._load_python)

    async def aclose(self) -> None:
        if self.runner is not None:
            await self.runner.aclose()
        if self.store not in _memory_stores.values():  # a shared in-process store outlives the instance
            await self.store.aclose()

    def caller_reason(self, detail: str) -> str:
        """A failure as the caller reads it (one line, no paths, the missing model setting named)."""
        return upstream_reason(detail, agent=not self.is_function, model_base_url=self.env.get("MODEL_BASE_URL"))

    def turn_span(self, ids: invoke_ids.InvokeIds, *, start: bool = False) -> Any:
        """The span of the framework's turn (GenAI `invoke_agent`); only called while tracing is on."""
        name, attributes = f"turn {self.framework}", {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": self.agent,
            "gen_ai.conversation.id": ids.session_id, "caiplatform.framework": self.framework}
        return tracing.start(name, attributes) if start else tracing.span(name, attributes)

    # -- callers ---------------------------------------------------------------------------------
    def internal_presented(self, request: Request) -> bool:
        presented = request.headers.get(INTERNAL_HEADER)
        return bool(self.internal_token and presented
                    and hmac.compare_digest(presented.encode(), self.internal_token.encode()))

    def caller_admitted(self, headers: Mapping[str, str]) -> bool:
        """The per-instance secret, where the harness has one (else every caller is let in)."""
        if self.harness_token is None:
            return True
        presented = headers.get(HARNESS_TOKEN_HEADER.lower()) or ""
        return bool(presented) and hmac.compare_digest(presented.encode(), self.harness_token.encode())

    def trusted(self, request: Request) -> bool:
        """The control plane, not an outside caller of the published address."""
        if self.internal_presented(request):
            return True
        return (self.harness_token is not None and self.caller_admitted(request.headers)
                and "x-forwarded-host" not in request.headers)


def _ids_headers(ids: invoke_ids.InvokeIds) -> dict[str, str]:
    return {SESSION_HEADER: ids.session_id, USER_HEADER: ids.user_id}


def create_harness_app(env: Mapping[str, str]) -> ASGIApp:
    """The harness for the agent described by `env` (the harness contract's variables)."""
    harness = Harness(env)

    async def turn_input(request: Request) -> tuple[str, invoke_ids.InvokeIds, dict[str, Any] | None, Any]:
        """(message, ids, function event, memories) of an invoke request, validated."""
        await harness.load()
        trusted = harness.trusted(request)
        raw = await read_body(request, FUNCTION_BODY_LIMIT if harness.is_function else AGENT_BODY_LIMIT)
        body = _json(raw, allow_any=harness.is_function)
        fields = body if isinstance(body, dict) else {}
        session_id = request.headers.get(SESSION_HEADER) if trusted else None
        user_id = request.headers.get(USER_HEADER) if trusted else None
        raw_message = fields.get("message")
        if harness.is_function:
            session_id = session_id or (fields.get("session_id") if isinstance(fields.get("session_id"), str) else None)
            user_id = user_id or (fields.get("user_id") if isinstance(fields.get("user_id"), str) else None)
            message = raw_message if isinstance(raw_message, str) else ""
        else:
            if not isinstance(raw_message, str) or not raw_message.strip():
                raise BadRequest(MESSAGE_REQUIRED)
            message = raw_message
            session_id = session_id or fields.get("session_id")
            user_id = user_id or fields.get("user_id")
        ids = invoke_ids.resolve(session_id, user_id, authenticated=trusted)
        memories = fields.get("memories") if trusted else None
        if not (isinstance(memories, list) and all(isinstance(m, str) for m in memories)):
            memories = None
        # Claims the session for this user before anything is sent (409 when it is someone else's).
        await harness.store.claim(harness.agent, ids.user_id, ids.session_id)
        return message, ids, (body if harness.is_function else None), memories

    async def invoke(request: Request) -> Response:
        message, ids, event, memories = await turn_input(request)
        assert harness.conversation is not None
        try:
            with harness.turn_span(ids) if tracing.tracer() else tracing.NULL:
                result = await harness.conversation.invoke(message, ids.session_id, ids.user_id, body=event,
                                                           preamble=memory_preamble(memories) if memories else "")
        except TurnError as exc:
            log.error("turn failed: %s", exc)
            raise TurnFailed(harness.caller_reason(str(exc))) from None
        headers = _ids_headers(ids)
        if harness.is_function:
            return JSONResponse(result.value, headers=headers)
        return JSONResponse(result.to_dict(), headers=headers)

    async def invoke_stream(request: Request) -> Response:
        message, ids, event, memories = await turn_input(request)
        conversation = harness.conversation
        assert conversation is not None

        async def lines() -> AsyncIterator[bytes]:
            traced = harness.turn_span(ids, start=True) if tracing.tracer() else None
            failed: str | None = None
            try:
                with tracing.current(traced):
                    async for line in conversation.stream(message, ids.session_id, ids.user_id, body=event,
                                                          preamble=memory_preamble(memories) if memories else ""):
                        if line.get("type") == "error":
                            line = {**line, "message": harness.caller_reason(str(line.get("message", "")))}
                            failed = line["message"]
                        yield (json.dumps(line, ensure_ascii=False) + "\n").encode()
            finally:
                tracing.finish(traced, failed)

        return StreamingResponse(lines(), media_type=NDJSON, headers=_ids_headers(ids))

    async def healthz(request: Request) -> Response:
        try:
            await harness.load()
        except Unavailable as exc:
            return JSONResponse({"status": "error", "error": exc.message}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def debug(request: Request) -> Response:
        # `CAI_SECRET_NAMES` (set by the control plane) names the agent's secrets, which arrive as plain
        # environment variables: they are not config keys, whatever they are called.
        secret_names = set(filter(None, (harness.env.get("CAI_SECRET_NAMES") or "").split(",")))
        keys = [k for k in harness.env
                if k not in PLATFORM_VARIABLES and k not in secret_names and not k.startswith("K_")]
        return JSONResponse(debug_config(harness.agent, harness.framework, harness.env, keys))

    def internal(request: Request, *methods: str) -> None:
        check_internal(request.headers.get(INTERNAL_HEADER), harness.internal_token)
        if methods and request.method not in methods:
            raise MethodNotAllowed("method not allowed")

    def page_args(request: Request) -> tuple[Any, str | None]:
        query = request.query_params
        return query.get("page_size", query.get("limit")), query.get("page_token")

    async def users(request: Request) -> Response:
        internal(request, "GET")
        return JSONResponse(await harness.browser.users(*page_args(request)))

    async def sessions(request: Request) -> Response:
        internal(request, "GET")
        return JSONResponse(await harness.browser.sessions(request.query_params.get("user_id"), *page_args(request)))

    async def transcript(request: Request) -> Response:
        internal(request, "GET", "DELETE")
        session_id = request.path_params["session_id"]
        if request.method == "DELETE":
            await harness.browser.delete(session_id)
            return Response(status_code=204)
        return JSONResponse(await harness.browser.transcript(session_id))

    async def locked(request: Request) -> Response:
        internal(request)
        raise NotFound("not found: long-term memory is committed through the control plane's memorize route")

    @asynccontextmanager
    async def lifespan(_app: Starlette):  # type: ignore[no-untyped-def]
        await harness.load()  # a process that cannot load its agent fails at start, visibly
        try:
            yield
        finally:
            await harness.aclose()

    async def platform_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PlatformError)
        return error_response(exc.status, exc.message, request_id_of(request), exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = {404: "not found", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, request_id_of(request), dict(exc.headers or {}))

    app = Starlette(
        exception_handlers={PlatformError: platform_error, HTTPException: http_error},
        routes=[
            Route("/invoke", invoke, methods=["POST"]),
            Route("/invoke/stream", invoke_stream, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/debug/config", debug, methods=["GET"]),
            # The internal surface, also under the control plane's names, and every session, memory and
            # browsing path a caller of the published address might try: the internal credential is
            # checked before anything else, the method included.
            *[Route(prefix + "/users", users, methods=ANY_METHOD) for prefix in ("/internal", "")],
            *[Route(prefix + "/sessions", sessions, methods=ANY_METHOD) for prefix in ("/internal", "")],
            *[Route(prefix + "/sessions/{session_id}", transcript, methods=ANY_METHOD) for prefix in ("/internal", "")],
            *[Route(path, locked, methods=ANY_METHOD) for path in LOCKED_PATHS],
        ],
        lifespan=lifespan,
    )
    wrapped = HarnessMiddleware(app, harness)
    wrapped.harness = harness  # type: ignore[attr-defined]
    return wrapped


class TurnFailed(PlatformError):
    """The agent's turn raised; the control plane turns this into its 502 `invoke agent <name>: ...`."""

    status = 500
    code = "turn_failed"


def request_id_of(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", ""))


def _route(scope: Scope) -> str:
    route = route_template(scope)
    return scope.get("path", "") if route == UNMATCHED else route


class HarnessMiddleware:
    """Sets the agent's environment for the whole request; request ids like the platform's."""

    def __init__(self, app: ASGIApp, harness: Harness):
        self.app = app
        self.harness = harness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode("latin-1")
        request_id = request_id_from(incoming)
        scope.setdefault("state", {})["request_id"] = request_id
        logjson.request_id.set(request_id)
        if self.harness.harness_token is not None:
            presented = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
                         if k.lower() == HARNESS_TOKEN_HEADER.lower().encode()}
            if not self.harness.caller_admitted(presented):
                await error_response(401, BAD_HARNESS_TOKEN, request_id)(scope, receive, send)
                return
        started = False
        status = 0

        async def tracking_send(message: Any) -> None:
            nonlocal started, status
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", request_id.encode("latin-1"))]}
            await send(message)

        # The harness's server span, a child of the platform's (its `traceparent`); none when tracing is off.
        traced = tracing.ServerSpan(scope, HARNESS_SPAN_SERVICE) if tracing.tracer() is not None else None
        try:
            with agent_env(self.harness.env):
                await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.exception("harness error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await error_response(500, "internal error", request_id)(scope, receive, send)
            self.harness.request_ended(exc)
            if traced is not None:
                traced.close(_route(scope), 500, request_id, exc)
            return
        if traced is not None:
            traced.close(_route(scope), status, request_id)
        self.harness.request_ended()
