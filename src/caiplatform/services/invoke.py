"""The control plane's side of invoke: document 1's invoke rules, the users and sessions browser,
memorize, and the public embed routes.

`InvokeService` finds agents only through the `AgentDirectory` protocol (the agents area implements
it) and reaches them only through the `WorkloadRuntime` port: `acquire` gives a slot on an instance
(cold-starting one if needed), the request goes to that instance's harness (`caiplatform.harness`),
and `Endpoint.release()` frees the slot when the answer is complete or the caller went away.

The harness contract between the two sides:
- `POST /invoke` and `/invoke/stream` with the resolved ids in `X-CAI-Session-Id` / `X-CAI-User-Id`
  and, for agents, the body `{message, session_id, user_id}` (+ `memories`, recalled long-term memories);
  a function gets the caller's body as is (its `event`).
- `/internal/...` with `X-CAI-Internal` = `CAI_INTERNAL_TOKEN` for users, sessions and transcripts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import ValidationError

from caiplatform import json_input, logjson, tracing, validation
from caiplatform.db.prefetch import Prefetched
from caiplatform.errors import (
    BadGateway,
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    PlatformError,
    Unauthenticated,
    Unavailable,
)
from caiplatform.metrics import Metrics
from caiplatform.models.base import ResponseModel
from caiplatform.models.invoke import (
    STREAM_EVENT,
    InvokeRequest,
    InvokeResponse,
    MemorizeResult,
    PublicEmbedConfig,
    SessionList,
    StreamEvent,
    Transcript,
    UserList,
)
from caiplatform.ports.runtime import Endpoint, NoCapacity, WorkloadError, WorkloadRuntime
from caiplatform.principal import Principal
from caiplatform.redaction import one_line
from caiplatform.services import invoke_ids
from caiplatform.services.access import AUTH_REQUIRED
from caiplatform.services.agent_directory import AgentDirectory, EmbedTarget, InvokeTarget
from caiplatform.turns.browse import INTERNAL_HEADER, NOT_CONFIGURED, workload_internal_token
from caiplatform.web import harness_http

MiB = 1024 * 1024
AGENT_BODY_LIMIT = 1 * MiB  # invoke, stream, memorize (document 1, Limits)
FUNCTION_BODY_LIMIT = 8 * MiB  # a function's direct event body (DECISIONS.md)
UPSTREAM_LIMIT = 32 * MiB  # buffered upstream response; larger is 502
SESSION_HEADER = "X-CAI-Session-Id"
USER_HEADER = "X-CAI-User-Id"

MESSAGE_REQUIRED = "message is required"
INVOKE_AUTH_REQUIRED = "invoke requires authentication on this platform (INVOKE_AUTH_REQUIRED=true); sign in or use an API key"
MEMORIZE_NEEDS_AUTH = (
    "memorize requires authentication: invoke without 'memorize', then call "
    "POST /v1/agents/{name}/sessions/{session_id}/memorize with a session token or API key"
)
MEMORIZE_TYPE = "memorize must be a boolean"
NOT_ATTACHED = "agent invocation is not configured on this platform"
EMBED_UNKNOWN = "unknown embed key"
EMBED_ORIGIN = "origin {origin} is not allowed to use this embed"
EMBED_NO_ORIGIN = "an Origin header from an allowed origin is required to use this embed"
EMBED_NO_MEMORIZE = "memorize is not available on the embed route"
EMBED_FIELDS = ("message", "session_id", "user_id")
EMBED_CONFIG_FIELDS = ("title", "subtitle", "greeting", "accent_color", "launcher_text", "position")
UPSTREAM_MAX_DEPTH = 128  # nesting of a harness's answer: a transcript holds callers' bodies of up to 64

log = logging.getLogger(__name__)
V = TypeVar("V", bound=ResponseModel)


class AgentMemory(Protocol):
    """Long-term memory of agents (`caiplatform.services.invoke_memory`)."""

    async def commit(self, target: InvokeTarget, session: dict[str, Any]) -> None: ...

    async def recall(self, target: InvokeTarget, text: str) -> list[str]: ...

    async def forget(self, target: InvokeTarget) -> None: ...


@dataclass
class Prepared:
    """A validated invoke request with its target."""

    target: InvokeTarget
    ids: invoke_ids.InvokeIds
    message: str
    memorize: bool
    body: bytes  # what goes to the harness
    content_type: str = "application/json"

    @property
    def id_headers(self) -> dict[str, str]:
        return {SESSION_HEADER: self.ids.session_id, USER_HEADER: self.ids.user_id}


def _invoke_span(prepared: Prepared) -> tuple[str, dict[str, Any]]:
    """The service's span of one invoke, in the GenAI conventions (an agent invoked over the network)."""
    target = prepared.target
    return f"invoke_agent {target.agent}", {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": target.agent,
        "gen_ai.conversation.id": prepared.ids.session_id, "caiplatform.project": target.project_short,
        "caiplatform.kind": target.kind, "caiplatform.framework": target.framework}


@dataclass
class Reply:
    """A buffered answer, passed through as the harness gave it (the route sends its bytes as they are)."""

    status: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)
    media_type: str = "application/json"

    def value(self) -> Any:
        """The decoded JSON answer (a function's own return value)."""
        return json_input.decode(self.content, max_depth=UPSTREAM_MAX_DEPTH)

    def response(self) -> InvokeResponse:
        """An agent's answer as its model (`value()` for a function's own value)."""
        return InvokeResponse.model_validate(self.value())


@dataclass
class TurnStream:
    """An open NDJSON stream: `headers` are known before the first line; always `aclose()` it.

    `lines` are the harness's bytes as they arrive (what the route sends on); `events()` reads the same
    stream as typed lines, one `StreamEvent` per line."""

    headers: dict[str, str]
    lines: AsyncIterator[bytes]
    aclose: Callable[[], Awaitable[None]]

    async def events(self) -> AsyncIterator[StreamEvent]:
        buffered = b""
        try:
            async for chunk in self.lines:
                buffered += chunk
                *complete, buffered = buffered.split(b"\n")
                for line in complete:
                    if line.strip():
                        yield STREAM_EVENT.validate_json(line)
            if buffered.strip():
                yield STREAM_EVENT.validate_json(buffered)
        finally:
            await self.aclose()


def _upstream_message(content: bytes, status: int) -> str:
    try:
        body = json_input.decode(content, max_depth=UPSTREAM_MAX_DEPTH)
    except json_input.JSONInputError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    text = content.decode("utf-8", "replace").strip()
    return text[:500] if text else f"the agent answered HTTP {status}"


HARNESS_ORIGIN = "http://harness"  # the Host of a request to a harness on a Unix socket


@lru_cache(maxsize=4096)
def _internal_token(platform_token: str, workload_key: str) -> str:
    """`workload_internal_token` (an HMAC) once per workload, not once per invoke."""
    return workload_internal_token(platform_token, workload_key)


class Upstream(Protocol):
    """An answer from an instance whose head has been read (`harness_http.HarnessResponse` or
    `_HttpxUpstream`); read the body with `chunks()`, always `aclose()`."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...

    async def aclose(self) -> None: ...


class _HttpxUpstream:
    """An `httpx` streamed response as an `Upstream` (in-process transports and non-`http` addresses)."""

    def __init__(self, response: httpx.Response, owned: httpx.AsyncClient | None):
        self.response = response
        self.status_code = response.status_code
        self.headers: Mapping[str, str] = response.headers
        self._owned = owned

    def chunks(self) -> AsyncIterator[bytes]:
        return self.response.aiter_bytes()

    async def aread(self) -> bytes:
        return await self.response.aread()

    async def aclose(self) -> None:
        try:
            await self.response.aclose()
        finally:
            if self._owned is not None:
                await self._owned.aclose()


UPSTREAM_ERRORS = (httpx.HTTPError, harness_http.UpstreamError)


class InvokeService:
    def __init__(self, settings: Any, *, directory: AgentDirectory | None = None,
                 runtime: WorkloadRuntime | None = None, memory: AgentMemory | None = None,
                 wiring: Callable[[], tuple[AgentDirectory | None, WorkloadRuntime | None]] | None = None,
                 metrics: Metrics | None = None):
        """`wiring` (the platform's) names the directory and runtime on first use, for whatever
        `attach` has not set."""
        self.settings = settings
        self.directory = directory
        self.runtime = runtime
        self.memory = memory
        self._wiring = wiring
        self.prometheus = metrics or Metrics()
        self._client: httpx.AsyncClient | None = None
        self._harness: harness_http.HarnessClient | None = None

    def attach(self, *, directory: AgentDirectory | None = None, runtime: WorkloadRuntime | None = None,
               memory: AgentMemory | None = None) -> None:
        """Wire in the agents area's directory, the workload runtime and the memory bank."""
        if directory is not None:
            self.directory = directory
        if runtime is not None:
            self.runtime = runtime
        if memory is not None:
            self.memory = memory

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._harness is not None:
            await self._harness.aclose()
            self._harness = None

    # -- plumbing --------------------------------------------------------------------------------
    def _wired(self) -> tuple[AgentDirectory, WorkloadRuntime]:
        if (self.directory is None or self.runtime is None) and self._wiring is not None:
            directory, runtime = self._wiring()
            self.directory = self.directory or directory
            self.runtime = self.runtime or runtime
        if self.directory is None or self.runtime is None:
            raise Unavailable(NOT_ATTACHED)
        return self.directory, self.runtime

    @property
    def timeout(self) -> float:
        return float(self.settings.invoke_timeout_seconds)

    @property
    def internal_token(self) -> str | None:
        return self.settings.internal_token or None

    def _internal_headers(self, target: InvokeTarget) -> dict[str, str]:
        """The target agent's own internal credential (each agent holds only its own)."""
        token = self.internal_token
        return {INTERNAL_HEADER: _internal_token(token, target.workload.key)} if token else {}

    async def _send(self, endpoint: Endpoint, method: str, path: str, *, content: bytes | None = None,
                    headers: dict[str, str] | None = None, params: dict[str, Any] | None = None) -> Upstream:
        """Send one request to the endpoint and read the answer's head. A harness on an `http://` address
        goes through the pooled `HarnessClient`; in-process transports (and any other scheme) through
        `httpx`. A local instance's Unix socket goes through the pooled client too, with its secret."""
        if endpoint.socket is not None:
            if self._harness is None:
                self._harness = harness_http.HarnessClient()
            return await self._harness.request(method, HARNESS_ORIGIN + path, headers={**(headers or {}), **endpoint.credential},
                                               content=content, params=params, uds=endpoint.socket)
        if endpoint.transport is None and harness_http.supports(endpoint.base_url):
            if self._harness is None:
                self._harness = harness_http.HarnessClient()
            return await self._harness.request(method, self._url(endpoint, path), headers=headers, content=content,
                                               params=params)
        owned = endpoint.transport is not None
        if owned:
            client = endpoint.client()
        else:
            if self._client is None:
                self._client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_keepalive_connections=100))
            client = self._client
        try:
            request = client.build_request(method, self._url(endpoint, path), content=content, headers=headers,
                                           params=params)
            return _HttpxUpstream(await client.send(request, stream=True), client if owned else None)
        except BaseException:
            if owned:
                await client.aclose()
            raise

    @staticmethod
    def _url(endpoint: Endpoint, path: str) -> str:
        return path if endpoint.transport is not None else endpoint.base_url.rstrip("/") + path

    async def _acquire(self, target: InvokeTarget, deadline: float) -> Endpoint:
        runtime = self._wired()[1]
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                return await runtime.acquire(target.workload, timeout=max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise self._failed(target, f"timed out after {self.timeout:g}s waiting for an instance") from None
        except NoCapacity as exc:
            raise self._failed(target, exc.message) from None
        except LookupError:
            raise self._failed(target, "no revision of this agent is serving") from None
        except WorkloadError as exc:
            raise self._failed(target, exc.message) from None

    def _failed(self, target: InvokeTarget, detail: str) -> BadGateway:
        """Document 1's 502: one line for the caller; tracebacks and paths only in the server's log (the
        instance's own output is in the agent's logs already)."""
        reason = one_line(detail) or "the agent failed without a message"  # the harness named a missing model
        if reason != detail:
            log.warning("invoke agent %s (project %s) failed: %s", target.agent, target.project_short, detail)
        return BadGateway(f"invoke agent {target.agent}: {reason}")

    async def _exchange(self, target: InvokeTarget, method: str, path: str, *, deadline: float,
                        content: bytes | None = None, headers: dict[str, str] | None = None,
                        params: dict[str, Any] | None = None, limit: int | None = None) -> tuple[int, bytes, Mapping[str, str]]:
        """One buffered request to an instance of the target, within the deadline and the size limit."""
        limit = UPSTREAM_LIMIT if limit is None else limit
        endpoint = await self._acquire(target, deadline)
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                response = await self._send(endpoint, method, path, content=content, headers=headers, params=params)
                try:
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in response.chunks():
                        size += len(chunk)
                        if size > limit:
                            raise self._failed(target, f"the response is larger than {limit} bytes")
                        chunks.append(chunk)
                finally:
                    await response.aclose()
            return response.status_code, chunks[0] if len(chunks) == 1 else b"".join(chunks), response.headers
        except TimeoutError:
            raise self._failed(target, f"timed out after {self.timeout:g}s") from None
        except UPSTREAM_ERRORS as exc:
            raise self._failed(target, f"{type(exc).__name__}: {exc}") from None
        finally:
            await endpoint.release()

    def _raise_upstream(self, target: InvokeTarget, status: int, content: bytes) -> None:
        """Caller mistakes the harness found (400, 409, 413) keep their status; the rest is 502."""
        message = _upstream_message(content, status)
        for cls in (BadRequest, Conflict, PayloadTooLarge):
            if status == cls.status:
                raise cls(one_line(message))
        raise self._failed(target, message)

    # -- invoke ----------------------------------------------------------------------------------
    async def prepare(self, principal: Principal, name: str, project: str | None, raw: bytes | InvokeRequest, *,
                      target: InvokeTarget | None = None, allow_memorize: bool = True,
                      prefetched: Prefetched | None = None) -> Prepared:
        """Invoke rules 1 to 7 up to the call itself (`target` given: the embed route found it). `raw` is the
        body as sent (a function's event is any JSON) or, from the library, an `InvokeRequest`. `prefetched`:
        the target's read made with the credential (`AgentService.gate_read`), if the route made it."""
        if isinstance(raw, InvokeRequest):
            raw = json.dumps(raw.model_dump(exclude_unset=True), ensure_ascii=False).encode()
        directory = self._wired()[0]
        if target is None and self.settings.invoke_auth_required and not principal.authenticated:
            raise Unauthenticated(INVOKE_AUTH_REQUIRED)
        if len(raw) > FUNCTION_BODY_LIMIT:
            raise PayloadTooLarge(f"request body too large (limit {FUNCTION_BODY_LIMIT} bytes)")
        body = self._decode(raw)
        fields = body if isinstance(body, dict) else {}
        raw_message = fields.get("message")
        message = raw_message if isinstance(raw_message, str) else ""
        has_message = bool(message.strip())
        if not has_message and target is None:
            # Functions take any event; for everything else (and for a name that resolves to nothing,
            # since validation comes before lookup) rule 1 holds.
            try:
                target = await directory.invoke_target(principal, name, project, prefetched)
            except (NotFound, Conflict, Forbidden):
                raise BadRequest(MESSAGE_REQUIRED) from None
        if not has_message and (target is None or target.kind != "function"):
            raise BadRequest(MESSAGE_REQUIRED)
        if not isinstance(body, dict) and (target is None or target.kind != "function"):
            raise BadRequest("invalid JSON body: expected a JSON object")
        session_id = fields.get("session_id")
        user_id = fields.get("user_id")
        function_ids = target is not None and target.kind == "function"
        if function_ids:  # an event's own fields need not be ids
            session_id = session_id if isinstance(session_id, str) else None
            user_id = user_id if isinstance(user_id, str) and validation.USER_ID.match(user_id) else None
        ids = invoke_ids.resolve(session_id, user_id, authenticated=principal.authenticated)
        memorize = fields.get("memorize", False)
        if memorize is None:
            memorize = False
        if not isinstance(memorize, bool):
            raise BadRequest(MEMORIZE_TYPE)
        if memorize and not allow_memorize:
            raise BadRequest(EMBED_NO_MEMORIZE)
        if memorize and not principal.authenticated:
            raise Unauthenticated(MEMORIZE_NEEDS_AUTH)
        if target is None:
            target = await directory.invoke_target(principal, name, project, prefetched)
        if target.kind != "function" and len(raw) > AGENT_BODY_LIMIT:
            raise PayloadTooLarge(f"request body too large (limit {AGENT_BODY_LIMIT} bytes)")
        if target.kind == "function":
            return Prepared(target, ids, message if has_message else "", memorize, raw)
        upstream: dict[str, Any] = {"message": message, "session_id": ids.session_id, "user_id": ids.user_id}
        if self.memory is not None:
            memories = await self.memory.recall(target, message)
            if memories:
                upstream["memories"] = memories
        return Prepared(target, ids, message, memorize, json.dumps(upstream, ensure_ascii=False).encode())

    @staticmethod
    def _decode(raw: bytes) -> Any:
        if not raw.strip():
            return {}
        try:
            return json_input.decode(raw)
        except json_input.JSONInputError as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from None

    def _turn_headers(self, prepared: Prepared) -> dict[str, str]:
        headers = {"Content-Type": prepared.content_type, **prepared.id_headers, **self._internal_headers(prepared.target)}
        request_id = logjson.request_id.get()
        if request_id:  # the harness's log lines and spans carry the caller's request id
            headers["X-Request-Id"] = request_id
        return headers

    async def invoke(self, principal: Principal, name: str, project: str | None, raw: bytes | InvokeRequest, *,
                     prepared: Prepared | None = None, prefetched: Prefetched | None = None) -> Reply:
        """POST /v1/agents/{name}/invoke: one message, one reply (a function's own return value)."""
        deadline = time.monotonic() + self.timeout
        prepared = prepared or await self.prepare(principal, name, project, raw, prefetched=prefetched)
        began, ok = time.monotonic(), False
        try:
            with tracing.span(*_invoke_span(prepared), kind="CLIENT") if tracing.tracer() else tracing.NULL:
                turn_headers = self._turn_headers(prepared)
                tracing.inject(turn_headers)  # the harness's spans join this trace
                status, content, headers = await self._exchange(
                    prepared.target, "POST", "/invoke", deadline=deadline, content=prepared.body,
                    headers=turn_headers)
                if status != 200:
                    self._raise_upstream(prepared.target, status, content)
                if prepared.memorize:
                    await self._memorize(prepared.target, prepared.ids.session_id, deadline)
            ok = True
        finally:
            self._observe(prepared.target, ok, began)
        return Reply(200, content, prepared.id_headers, headers.get("content-type", "application/json"))

    def _observe(self, target: InvokeTarget, ok: bool, began: float) -> None:
        """`cai_agent_invokes_total` and its duration: one invocation the agent was reached for (or not)."""
        self.prometheus.observe_invoke(target.project_short, target.agent, ok, time.monotonic() - began)

    async def stream(self, principal: Principal, name: str, project: str | None, raw: bytes | InvokeRequest, *,
                     prepared: Prepared | None = None, prefetched: Prefetched | None = None) -> TurnStream:
        """POST /v1/agents/{name}/invoke/stream. Errors before the first line are raised; later ones
        (timeout, oversized stream) end the stream with an `error` line."""
        deadline = time.monotonic() + self.timeout
        prepared = prepared or await self.prepare(principal, name, project, raw, prefetched=prefetched)
        target = prepared.target
        began = time.monotonic()
        # The service's span lasts as long as the stream (ended in finish); None when tracing is off.
        traced = tracing.start(*_invoke_span(prepared), kind="CLIENT") if tracing.tracer() else None
        try:
            with tracing.current(traced):
                endpoint = await self._acquire(target, deadline)
        except BaseException as exc:
            self._observe(target, False, began)
            tracing.finish(traced, exc)
            raise
        response: Upstream | None = None
        finished = False
        failed = True  # until the stream ends without an error line

        async def finish() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            self._observe(target, not failed, began)
            tracing.finish(traced, "the stream ended with an error" if failed else None)
            try:
                if response is not None:
                    await response.aclose()
            finally:
                await endpoint.release()

        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                turn_headers = self._turn_headers(prepared)
                tracing.inject(turn_headers, traced)  # the harness's spans join this trace
                response = await self._send(endpoint, "POST", "/invoke/stream", content=prepared.body,
                                            headers=turn_headers)
                if response.status_code != 200:
                    content = await response.aread()
                    self._raise_upstream(target, response.status_code, content)
        except TimeoutError:
            await finish()
            raise self._failed(target, f"timed out after {self.timeout:g}s") from None
        except UPSTREAM_ERRORS as exc:
            await finish()
            raise self._failed(target, f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            await finish()
            raise

        upstream = response

        async def lines() -> AsyncGenerator[bytes, None]:
            nonlocal failed
            size = 0
            at_line_start = True
            chunks = upstream.chunks().__aiter__()
            problem: str | None = None
            try:
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        problem = f"timed out after {self.timeout:g}s"
                        break
                    try:
                        async with asyncio.timeout(remaining):
                            chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        problem = f"timed out after {self.timeout:g}s"
                        break
                    except UPSTREAM_ERRORS as exc:
                        problem = f"{type(exc).__name__}: {exc}"
                        break
                    size += len(chunk)
                    if size > UPSTREAM_LIMIT:
                        problem = f"the response is larger than {UPSTREAM_LIMIT} bytes"
                        break
                    if chunk:
                        at_line_start = chunk.endswith(b"\n")
                        yield chunk
                if problem is not None:
                    line = json.dumps({"type": "error", "message": self._failed(target, problem).message})
                    yield (b"" if at_line_start else b"\n") + line.encode() + b"\n"
                elif prepared.memorize:
                    try:
                        await self._memorize(target, prepared.ids.session_id, deadline)
                        failed = False
                    except PlatformError as exc:
                        yield (json.dumps({"type": "error", "message": exc.message}) + "\n").encode()
                else:
                    failed = False
            finally:
                await finish()

        iterator = lines()

        async def close() -> None:
            await iterator.aclose()
            await finish()

        return TurnStream(prepared.id_headers, iterator, close)

    # -- users and sessions browser ----------------------------------------------------------------
    async def gate(self, principal: Principal, name: str, project: str | None) -> None:
        """The caller's checks of the browse and memorize routes and nothing else (their 401, 403 or 404),
        for a request refused for its shape first (`caiplatform_server.checks_first`)."""
        if not principal.authenticated:
            raise Unauthenticated(AUTH_REQUIRED)
        await self._wired()[0].manage_target(principal, name, project)

    async def _browse(self, principal: Principal, name: str, project: str | None, method: str, path: str,
                      params: dict[str, Any] | None = None, *, manage: bool = True) -> tuple[int, bytes, InvokeTarget]:
        if not principal.authenticated:
            raise Unauthenticated(AUTH_REQUIRED)
        directory = self._wired()[0]
        if not self.internal_token:
            raise Unavailable(NOT_CONFIGURED)
        if manage:
            target = await directory.manage_target(principal, name, project)
        else:
            target = await directory.invoke_target(principal, name, project)
        deadline = time.monotonic() + self.timeout
        status, content, _ = await self._exchange(target, method, path, deadline=deadline, params=params,
                                                  headers=self._internal_headers(target))
        return status, content, target

    def _browse_result(self, target: InvokeTarget, status: int, content: bytes) -> Any:
        if status == 204:
            return None
        if status == 200:
            try:
                return json_input.decode(content, max_depth=UPSTREAM_MAX_DEPTH)
            except json_input.JSONInputError as exc:
                raise BadGateway(f"agent {target.agent}: the answer is not JSON the platform accepts: {exc}") from None
        message = one_line(_upstream_message(content, status))
        if status == 400:
            raise BadRequest(message)
        if status == 404:
            raise NotFound(message)
        raise BadGateway(f"agent {target.agent}: {message}")

    @staticmethod
    def _paging(page_size: Any, page_token: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if page_size is not None:
            params["page_size"] = page_size
        if page_token:
            params["page_token"] = page_token
        return params

    def _browse_view(self, model: type[V], target: InvokeTarget, status: int, content: bytes) -> V:
        answer = self._browse_result(target, status, content)
        try:
            return model.model_validate(answer)
        except ValidationError as exc:
            detail = exc.errors(include_url=False)[0].get("msg", "") if exc.errors() else ""
            raise BadGateway(f"agent {target.agent}: the answer is not the {model.__name__} the platform expects: "
                             f"{detail}") from None

    async def users(self, principal: Principal, name: str, project: str | None, *, page_size: int | str | None = None,
                    page_token: str | None = None) -> UserList:
        status, content, target = await self._browse(principal, name, project, "GET", "/internal/users",
                                                      self._paging(page_size, page_token))
        return self._browse_view(UserList, target, status, content)

    async def sessions(self, principal: Principal, name: str, project: str | None, user_id: str | None, *,
                       page_size: int | str | None = None, page_token: str | None = None) -> SessionList:
        if not principal.authenticated:
            raise Unauthenticated(AUTH_REQUIRED)
        if not user_id:
            from caiplatform.turns.browse import USER_ID_REQUIRED

            raise BadRequest(USER_ID_REQUIRED)
        params = {"user_id": user_id, **self._paging(page_size, page_token)}
        status, content, target = await self._browse(principal, name, project, "GET", "/internal/sessions", params)
        return self._browse_view(SessionList, target, status, content)

    async def transcript(self, principal: Principal, name: str, project: str | None, session_id: str) -> Transcript:
        self._session_path(principal, session_id)
        status, content, target = await self._browse(principal, name, project, "GET", f"/internal/sessions/{session_id}")
        return self._browse_view(Transcript, target, status, content)

    async def delete_session(self, principal: Principal, name: str, project: str | None, session_id: str) -> None:
        self._session_path(principal, session_id)
        status, content, target = await self._browse(principal, name, project, "DELETE",
                                                     f"/internal/sessions/{session_id}")
        self._browse_result(target, status, content)

    @staticmethod
    def _session_path(principal: Principal, session_id: str) -> None:
        if not principal.authenticated:
            raise Unauthenticated(AUTH_REQUIRED)
        validation.session_id(session_id)

    # -- long-term memory ----------------------------------------------------------------------------
    async def memorize(self, principal: Principal, name: str, project: str | None, session_id: str) -> MemorizeResult:
        """POST /v1/agents/{name}/sessions/{id}/memorize: always authenticated, any caller of the agent."""
        self._session_path(principal, session_id)
        status, content, target = await self._browse(principal, name, project, "GET",
                                                     f"/internal/sessions/{session_id}", manage=False)
        session = self._browse_result(target, status, content)
        await self._commit(target, session)
        return MemorizeResult(status="ok")

    async def _memorize(self, target: InvokeTarget, session_id: str, deadline: float) -> None:
        if not self.internal_token:
            raise Unavailable(NOT_CONFIGURED)
        status, content, _ = await self._exchange(target, "GET", f"/internal/sessions/{session_id}",
                                                  deadline=deadline, headers=self._internal_headers(target))
        await self._commit(target, self._browse_result(target, status, content))

    async def _commit(self, target: InvokeTarget, session: dict[str, Any]) -> None:
        if self.memory is None:
            raise Unavailable("long-term memory is not configured on this platform")
        await self.memory.commit(target, session)

    async def forget_agent(self, target: InvokeTarget) -> None:
        """Deleting an agent removes its long-term memory collection (the agents area calls this)."""
        if self.memory is not None:
            await self.memory.forget(target)

    # -- published address ---------------------------------------------------------------------------
    async def public_upstream(self, target: InvokeTarget) -> Any:
        """Where the published address `<name>-<short>.<apps_domain>` sends a request: a slot on an
        instance of the agent, which serves the harness routes itself (`/invoke`, `/invoke/stream`,
        `/healthz`, `/debug/config`; the internal routes refuse outside callers). Register it with
        `platform.hosts.register(host, lambda: platform.invoke.public_upstream(target))`."""
        from caiplatform.routing import Upstream

        deadline = time.monotonic() + self.timeout
        endpoint = await self._acquire(target, deadline)
        return Upstream(endpoint.base_url, endpoint.release, self.timeout, transport=endpoint.transport)

    # -- embed -------------------------------------------------------------------------------------
    async def embed(self, key: str, origin: str | None) -> tuple[EmbedTarget, dict[str, str]]:
        """The enabled embed behind `key`, if `origin` is on its allowlist; plus the CORS headers."""
        directory = self._wired()[0]
        embed = await directory.embed_target(key)
        if embed is None:
            raise NotFound(EMBED_UNKNOWN)
        allowed = list(embed.allowed_origins or embed.config.get("allowed_origins") or [])
        if "*" in allowed:
            return embed, {"Access-Control-Allow-Origin": origin or "*", "Vary": "Origin"}
        if not origin:
            raise Forbidden(EMBED_NO_ORIGIN)
        if origin.rstrip("/") not in {o.rstrip("/") for o in allowed}:
            raise Forbidden(EMBED_ORIGIN.format(origin=origin))
        return embed, {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    async def embed_config(self, key: str, origin: str | None) -> tuple[PublicEmbedConfig, dict[str, str]]:
        embed, cors = await self.embed(key, origin)
        config = embed.config
        body: dict[str, Any] = {"agent": embed.target.agent}
        for name in EMBED_CONFIG_FIELDS:
            body[name] = config.get(name, "right" if name == "position" else "")
        body["position"] = body["position"] or "right"
        body["streaming"] = True
        return PublicEmbedConfig.of(body), cors

    async def embed_prepare(self, embed: EmbedTarget, raw: bytes | InvokeRequest, client_ip: str | None) -> Prepared:
        """POST /v1/embed/{key}/invoke (after `embed()` admitted the origin): an anonymous invoke of the
        embed's agent, without memorize."""
        return await self.prepare(Principal.anonymous(client_ip), embed.target.agent, None, raw,
                                  target=embed.target, allow_memorize=False)
