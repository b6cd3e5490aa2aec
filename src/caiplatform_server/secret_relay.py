"""The platform API's narrow relay to the secret store: `GET /v1/secret-store/v1/<mount>/data/<path>`.

A read token (`secrets:issue-token`, document 2) is presented directly to the secret store at
`read.addr`. On the local runtime a workload's network reaches no engine (caiplatform.sandbox.network),
so `read.addr` is this relay on the platform's public route (`<CAI_BASE_URL>/v1/secret-store`): it
forwards exactly one kind of request, a KV v2 read (`GET`, a `data/` path, the `version` query) with the
caller's `X-Vault-Token`, to the store the platform uses, unchanged, and hands back the store's answer.
The store checks the token and its policy as it would directly; the relay adds no right and sees no
credential of its own (it sends none). Everything else is 404; another method is 405.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode

import httpx
from starlette.types import Receive, Scope, Send

from caiplatform.web.envelope import envelope_bytes

PREFIX = "/v1/secret-store"
# `/v1/<mount>/data/<path...>`: names, no dot segments, no empty segments.
READ_PATH = re.compile(r"^/v1/[A-Za-z0-9_-]+/data(/[A-Za-z0-9_][A-Za-z0-9_.-]*)+$")
TOKEN_HEADER = b"x-vault-token"
TIMEOUT_SECONDS = 10.0


def is_relay_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


async def _answer(send: Send, status: int, body: bytes, request_id: str, content_type: bytes = b"application/json",
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"x-request-id", request_id.encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def _error(message: str, request_id: str) -> bytes:
    return envelope_bytes(message, request_id)


async def relay(store_addr: str | None, client: httpx.AsyncClient, scope: Scope, receive: Receive, send: Send,
                request_id: str) -> None:
    path = scope["path"][len(PREFIX):]
    if store_addr is None:
        await _answer(send, 404, _error("not found: no secret store is relayed here", request_id), request_id)
        return
    if not READ_PATH.match(path) or "%" in scope.get("raw_path", b"").decode("latin-1"):
        await _answer(send, 404, _error("not found: the relay forwards only secret reads (/v1/<mount>/data/<path>)",
                                        request_id), request_id)
        return
    if scope["method"] != "GET":
        await _answer(send, 405, _error("method not allowed", request_id), request_id, extra=[(b"allow", b"GET")])
        return
    tokens = [v for k, v in scope.get("headers", ()) if k.lower() == TOKEN_HEADER]
    if len(tokens) != 1 or not tokens[0].strip():
        await _answer(send, 401, _error("present the read token in X-Vault-Token", request_id), request_id)
        return
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    version = query.get("version", [])
    params = ""
    if version:
        if len(version) != 1 or not version[0].isdigit():
            await _answer(send, 400, _error("version must be a whole number", request_id), request_id)
            return
        params = "?" + urlencode({"version": version[0]})
    try:
        response = await client.get(store_addr.rstrip("/") + path + params,
                                    headers={"X-Vault-Token": tokens[0].decode("latin-1")}, timeout=TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        await _answer(send, 502, _error(f"the secret store did not answer: {type(exc).__name__}", request_id), request_id)
        return
    await _answer(send, response.status_code, response.content, request_id,
                  response.headers.get("content-type", "application/json").encode("latin-1"))
