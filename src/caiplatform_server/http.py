"""Request decoding shared by the routes: bounded bodies, JSON with the spec's messages."""

from __future__ import annotations

import json
from typing import Any

# Starlette's Request (what fastapi re-exports): the harness imports this module, and fastapi would add a
# second to every cold start.
from starlette.requests import Request

from caiplatform.errors import BadRequest, PayloadTooLarge

KiB = 1024
MiB = 1024 * 1024


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body too large (limit {limit} bytes)")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
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
    raw = await read_body(request, limit)
    if not raw.strip():
        if optional or lenient:
            return {}
        raise BadRequest(f"{invalid_prefix}the body is empty")
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        if lenient:
            return {}
        raise BadRequest(f"{invalid_prefix}{exc}") from None
    if not isinstance(value, dict):
        if lenient:
            return {}
        raise BadRequest(f"{invalid_prefix}expected a JSON object")
    return value
