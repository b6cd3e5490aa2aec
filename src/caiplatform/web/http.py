"""Request decoding shared by the routes: bounded bodies, JSON with the spec's messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Starlette's Request (what fastapi re-exports): the harness imports this module, and fastapi would add a
# second to every cold start.
from starlette.requests import Request

from caiplatform import json_input
from caiplatform.errors import BadRequest, PayloadTooLarge

KiB = 1024
MiB = 1024 * 1024

# Limits on the request head (docs/decisions.md, Conventions), answered in the envelope: by the app when
# the server passed the request on, by `caiplatform.web.serving` when the head is too large to parse.
MAX_URI_BYTES = 16 * KiB
MAX_HEADER_BYTES = 64 * KiB  # the request line and every header line together
MAX_QUERY_PARAMETERS = 1000
URI_TOO_LONG = f"request URI too long (limit {MAX_URI_BYTES} bytes)"
HEADERS_TOO_LARGE = f"request header fields too large (limit {MAX_HEADER_BYTES} bytes in all)"
TOO_MANY_QUERY_PARAMETERS = f"too many query parameters (limit {MAX_QUERY_PARAMETERS})"


def head_refusal(scope: Mapping[str, Any]) -> tuple[int, str] | None:
    """(status, message) when the request's head breaks a limit above."""
    query = scope.get("query_string", b"")
    target = len(scope.get("raw_path") or scope.get("path", "").encode()) + (len(query) + 1 if query else 0)
    if target > MAX_URI_BYTES:
        return 414, URI_TOO_LONG
    if sum(len(name) + len(value) + 4 for name, value in scope.get("headers", [])) + target > MAX_HEADER_BYTES:
        return 431, HEADERS_TOO_LARGE
    if query.count(b"&") >= MAX_QUERY_PARAMETERS:
        return 400, TOO_MANY_QUERY_PARAMETERS
    return None


# A body refused for its size is still read (and dropped) up to this much before the answer, so a client
# still sending it reads the 413 instead of a reset connection (a workload's requests cross pasta, whose
# buffers are smaller than loopback's); a larger one is answered at once and the connection closed.
DRAIN_LIMIT = 16 * 1024 * 1024


async def _drain(chunks: Any, size: int) -> None:
    async for chunk in chunks:
        size += len(chunk)
        if size > DRAIN_LIMIT:
            return


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        if int(declared) <= DRAIN_LIMIT:
            await _drain(request.stream(), 0)
        raise PayloadTooLarge(f"request body too large (limit {limit} bytes)")
    chunks: list[bytes] = []
    size = 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            await _drain(stream, size)
            raise PayloadTooLarge(f"request body too large (limit {limit} bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(
    request: Request,
    limit: int = 8 * KiB,
    *,
    optional: bool = False,
    invalid_prefix: str = "invalid JSON body: ",
    lenient: bool = False,
) -> dict[str, Any]:
    """Decode a JSON object body. `optional`: an empty body is `{}`. `lenient`: a malformed body is `{}`."""
    return decode_object(await read_body(request, limit), optional=optional, invalid_prefix=invalid_prefix,
                         lenient=lenient)


def decode_object(
    raw: bytes, *, optional: bool = False, invalid_prefix: str = "invalid JSON body: ", lenient: bool = False
) -> dict[str, Any]:
    """`json_body` for a body already read (a route that reads it before the caller's checks)."""
    if not raw.strip():
        if optional or lenient:
            return {}
        raise BadRequest(f"{invalid_prefix}the body is empty")
    try:
        value = json_input.decode(raw)
    except json_input.JSONInputError as exc:
        if lenient:
            return {}
        raise BadRequest(f"{invalid_prefix}{exc}") from None
    if not isinstance(value, dict):
        if lenient:
            return {}
        raise BadRequest(f"{invalid_prefix}expected a JSON object")
    return value
