"""Streaming reverse proxy for host-routed requests (published agents, services and MCP servers)."""

from __future__ import annotations

import logging

import httpx
from starlette.types import Receive, Scope, Send

from caiplatform import tracing
from caiplatform.redaction import one_line
from caiplatform.routing import HostRouter
from caiplatform.web.envelope import envelope_bytes

log = logging.getLogger(__name__)

HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailers",
    b"transfer-encoding", b"upgrade", b"host", b"content-length",
}
# What a caller says about where it came from is not passed on: the workload gets the platform's own
# account of it (the client address `caiplatform serve` resolved, believing `X-Forwarded-For` only from the
# proxies the operator names in CAI_FORWARDED_ALLOW_IPS), so a caller cannot pick the address a published
# workload throttles or logs, nor claim to have come through another published host.
FORWARDING = {b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-port", b"x-real-ip",
              b"forwarded"}


async def _json(send: Send, status: int, message: str, request_id: str, extra: dict[str, str] | None = None) -> None:
    """The error envelope (`caiplatform.web.envelope`) as a raw ASGI answer."""
    body = envelope_bytes(message, request_id)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"x-request-id", request_id.encode()),
        *[(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items()]]})
    await send({"type": "http.response.body", "body": body})


async def proxy(router: HostRouter, client: httpx.AsyncClient, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
    host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
    factory = router.lookup(host)
    if factory is None:
        await _json(send, 404, "not found", request_id)
        return
    guard = router.guard_for(host)
    if guard is not None:  # the published address's auth mode and rate budget
        guard_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = await guard(scope["method"], scope["path"], guard_headers)
        if refusal is not None:
            status, message, extra = refusal
            await _json(send, status, message, request_id, extra)
            return
    try:
        upstream = await factory()
    except Exception as exc:  # noqa: BLE001 - an unavailable upstream is the client's 503, not a crash
        log.warning("upstream of %s unavailable: %s", host, exc)
        await _json(send, 503, f"upstream unavailable: {one_line(str(exc))}", request_id)
        return

    async def body_stream():  # type: ignore[no-untyped-def]
        while True:
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    return
            elif message["type"] == "http.disconnect":
                return

    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    url = upstream.base_url.rstrip("/") + path.decode("latin-1") + (("?" + query.decode("latin-1")) if query else "")
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP and k.lower() not in FORWARDING]
    headers.append((b"x-forwarded-host", host.encode("latin-1")))
    headers.append((b"x-forwarded-proto", str(scope.get("scheme") or "http").encode("latin-1")))
    if scope.get("client"):
        headers.append((b"x-forwarded-for", str(scope["client"][0]).encode("latin-1")))
    if tracing.tracer() is not None:  # the workload's spans continue this request's trace, not the caller's
        carrier: dict[str, str] = {}
        tracing.inject(carrier)
        headers = [(k, v) for k, v in headers if k.lower() not in (b"traceparent", b"tracestate")]
        headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items())
    if upstream.transport is not None:  # in-process upstream: a client of its own over its transport
        client = httpx.AsyncClient(transport=upstream.transport, timeout=None)
    try:
        request = client.build_request(scope["method"], url, headers=headers, content=body_stream(),
                                       timeout=upstream.timeout_seconds)
        response = await client.send(request, stream=True, follow_redirects=False)
    except httpx.HTTPError as exc:
        await upstream.release()
        if upstream.transport is not None:
            await client.aclose()
        log.warning("upstream of %s failed: %s", host, exc)
        await _json(send, 502, f"upstream failed: {one_line(str(exc))}", request_id)
        return
    try:
        out_headers = [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
        out_headers.append((b"x-request-id", request_id.encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": out_headers})
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()
        if upstream.transport is not None:
            await client.aclose()
        await upstream.release()
