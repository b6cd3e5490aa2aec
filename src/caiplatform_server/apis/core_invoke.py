"""Core API, invoke (document 1, "Invoke", "Users and sessions browser", "Embed"): thin routes over
`InvokeService`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from caiplatform.errors import PlatformError
from caiplatform.models.invoke import (
    EmbedInvokeRequest,
    InvokeRequest,
    InvokeResponse,
    MemorizeResult,
    PublicEmbedConfig,
    SessionList,
    Transcript,
    UserList,
)
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.services.agent_directory import EmbedTarget
from caiplatform.services.invoke import AGENT_BODY_LIMIT, FUNCTION_BODY_LIMIT, TurnStream
from caiplatform.web.http import read_body
from caiplatform_server.apis.core_agents import OWNER, PROJECT, A, op, owner_gate_read, project_param
from caiplatform_server.app_deps import caller_of, platform_of, principal_of
from caiplatform_server.contract import ANONYMOUS, CALLERS, _schema_ref, operation, reply
from caiplatform_server.dispatch import prefetched_of, reads_with_credential

router = APIRouter(tags=["invoke"])

NDJSON = "application/x-ndjson"
PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type, Accept, X-Request-Id",
    "Access-Control-Expose-Headers": "X-CAI-Session-Id, X-CAI-User-Id, X-Request-Id",
    "Access-Control-Max-Age": "600",
}


class TurnStreamResponse(StreamingResponse):
    """An NDJSON stream whose upstream slot is released however the response ends (a client that
    goes away mid-stream included)."""

    def __init__(self, turn: TurnStream, headers: dict[str, str] | None = None):
        super().__init__(turn.lines, media_type=NDJSON, headers={**turn.headers, **(headers or {})})
        self.turn = turn

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._stream(receive, send)
        finally:
            await self.turn.aclose()

    async def _stream(self, receive: Receive, send: Send) -> None:
        """Starlette's stream, with the client's disconnect watched by one plain task rather than an anyio
        task group, whose setup came before the first line (the first line's latency is a target)."""
        streaming = asyncio.current_task()
        assert streaming is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            streaming.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self.stream_response(send)
        except OSError:  # a server that raises on a closed connection (ASGI 2.4), as Starlette says it
            raise ClientDisconnect() from None
        except asyncio.CancelledError:
            if not gone:
                raise
            streaming.uncancel()  # the client left: the stream ends, as Starlette's does
        finally:
            watcher.cancel()


def _invoke_operation(*, stream: bool | None, security: Sequence[str], query: Sequence[dict[str, Any]] = (),
                      body: type[Any] = InvokeRequest) -> dict[str, Any]:
    """An invoke route: the buffered answer is an agent's `InvokeResponse` or a function's own JSON value;
    the stream is NDJSON lines (`StreamEvent`); `stream=None`: either, as the caller asks. Both carry the
    minted ids as headers. Invoke is open by default (`INVOKE_AUTH_REQUIRED` closes it): a credential is
    optional, which OpenAPI says with an empty security requirement."""
    kwargs = operation(body=body, security=security, query=query, errors=(401, 403, 404, 409, 413, 502, 504),
                       content_type=NDJSON if stream else "application/json")
    headers = {name: {"schema": {"type": "string"}} for name in ("X-CAI-Session-Id", "X-CAI-User-Id")}
    content: dict[str, Any] = {}
    if stream is not False:
        content[NDJSON] = {"schema": {"type": "string", "description": "one StreamEvent per line, in turn order"}}
    if not stream:
        content["application/json"] = {"schema": {"anyOf": [
            _schema_ref(InvokeResponse), {"description": "a function's own return value"}]}}
    kwargs["responses"][200] = {"description": "The turn's answer", "headers": headers, "content": content}
    if security:
        kwargs["openapi_extra"]["security"].append({})
    return kwargs


USER_ID = {"name": "user_id", "in": "query", "required": True, "schema": {"type": "string"},
           "description": "Whose sessions."}


def _page_args(request: Request) -> tuple[str | None, str | None]:
    q = request.query_params
    return q.get("page_size", q.get("limit")), q.get("page_token")


# Both invoke routes take only `request` (and the name): the flat route table calls them directly.
@router.post(A + "/invoke", summary="One message in, one reply out",
             **_invoke_operation(stream=False, security=CALLERS, query=[PROJECT]))
@reads_with_credential(owner_gate_read)
async def invoke(name: str, request: Request) -> Response:
    platform, principal = caller_of(request)
    raw = await read_body(request, FUNCTION_BODY_LIMIT)
    answer = await platform.invoke.invoke(principal, name, project_param(request), raw, prefetched=prefetched_of(request))
    return Response(answer.content, status_code=answer.status, headers=answer.headers, media_type=answer.media_type)


@router.post(A + "/invoke/stream", summary="The same turn as an NDJSON stream",
             **_invoke_operation(stream=True, security=CALLERS, query=[PROJECT]))
@reads_with_credential(owner_gate_read)
async def invoke_stream(name: str, request: Request) -> Response:
    platform, principal = caller_of(request)
    raw = await read_body(request, FUNCTION_BODY_LIMIT)
    return TurnStreamResponse(await platform.invoke.stream(principal, name, project_param(request), raw,
                                                           prefetched=prefetched_of(request)))


@router.get(A + "/users", summary="Callers of the agent",
            **op(response=UserList, paginated=True, errors=(*OWNER, 502, 504)))
async def users(name: str, request: Request, principal: Principal = Depends(principal_of),
                platform: Platform = Depends(platform_of)) -> JSONResponse:
    size, token = _page_args(request)
    return reply(await platform.invoke.users(principal, name, project_param(request), page_size=size, page_token=token))


@router.get(A + "/sessions", summary="One user's sessions",
            **op(response=SessionList, paginated=True, errors=(*OWNER, 502, 504), query=[USER_ID]))
async def sessions(name: str, request: Request, principal: Principal = Depends(principal_of),
                   platform: Platform = Depends(platform_of)) -> JSONResponse:
    size, token = _page_args(request)
    return reply(await platform.invoke.sessions(principal, name, project_param(request),
                                                request.query_params.get("user_id"), page_size=size, page_token=token))


@router.get(A + "/sessions/{session_id}", summary="A session's transcript",
            **op(response=Transcript, errors=(*OWNER, 502, 504)))
async def transcript(name: str, session_id: str, request: Request, principal: Principal = Depends(principal_of),
                     platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.invoke.transcript(principal, name, project_param(request), session_id))


@router.delete(A + "/sessions/{session_id}", summary="Delete a session",
               **op(status=204, errors=(*OWNER, 502, 504)))
async def delete_session(name: str, session_id: str, request: Request, principal: Principal = Depends(principal_of),
                         platform: Platform = Depends(platform_of)) -> Response:
    await platform.invoke.delete_session(principal, name, project_param(request), session_id)
    return Response(status_code=204)


@router.post(A + "/sessions/{session_id}/memorize", summary="Commit a session to long-term memory",
             **op(response=MemorizeResult, no_body=True, errors=(*OWNER, 413, 502, 504)))
async def memorize(name: str, session_id: str, request: Request, principal: Principal = Depends(principal_of),
                   platform: Platform = Depends(platform_of)) -> JSONResponse:
    await read_body(request, AGENT_BODY_LIMIT)
    return reply(await platform.invoke.memorize(principal, name, project_param(request), session_id))


# -- public embed routes: anonymous, gated by the embed key and the Origin allowlist ----------------

@router.get("/v1/embed/{key}/config", summary="Public widget config",
            **operation(response=PublicEmbedConfig, security=ANONYMOUS, errors=(403, 404)))
async def embed_config(key: str, request: Request, platform: Platform = Depends(platform_of)) -> Response:
    config, cors = await platform.invoke.embed_config(key, request.headers.get("origin"))
    return reply(config, headers=cors)


STREAM_QUERY = {"name": "stream", "in": "query", "required": False, "schema": {"type": "string", "enum": ["1", "true"]},
                "description": "Answer as an NDJSON stream (as does Accept: application/x-ndjson)."}


@router.post("/v1/embed/{key}/invoke", summary="Public widget invoke (JSON, or NDJSON with ?stream=1)",
             **_invoke_operation(stream=None, security=ANONYMOUS, query=[STREAM_QUERY], body=EmbedInvokeRequest))
async def embed_invoke(key: str, request: Request, platform: Platform = Depends(platform_of)) -> Response:
    embed, cors = await platform.invoke.embed(key, request.headers.get("origin"))
    cors = {**cors, "Access-Control-Expose-Headers": PREFLIGHT_HEADERS["Access-Control-Expose-Headers"]}
    try:
        return await _embed_turn(embed, request, platform, cors)
    except PlatformError as exc:  # an allowed origin's page must be able to read the error too
        exc.headers = {**exc.headers, **cors}
        raise


async def _embed_turn(embed: EmbedTarget, request: Request, platform: Platform, cors: dict[str, str]) -> Response:
    raw = await read_body(request, AGENT_BODY_LIMIT)
    client_ip = request.client.host if request.client else None
    prepared = await platform.invoke.embed_prepare(embed, raw, client_ip)
    wants_stream = request.query_params.get("stream") in ("1", "true") or NDJSON in request.headers.get("accept", "")
    if wants_stream:
        turn = await platform.invoke.stream(Principal.anonymous(client_ip), prepared.target.agent, None, raw,
                                            prepared=prepared)
        return TurnStreamResponse(turn, cors)
    answer = await platform.invoke.invoke(Principal.anonymous(client_ip), prepared.target.agent, None, raw,
                                          prepared=prepared)
    return Response(answer.content, status_code=answer.status, headers={**answer.headers, **cors},
                    media_type=answer.media_type)


@router.options("/v1/embed/{key}/config", include_in_schema=False)
@router.options("/v1/embed/{key}/invoke", include_in_schema=False)
async def embed_preflight(key: str, request: Request, platform: Platform = Depends(platform_of)) -> Response:
    _, cors = await platform.invoke.embed(key, request.headers.get("origin"))
    return Response(status_code=204, headers={**cors, **PREFLIGHT_HEADERS})
