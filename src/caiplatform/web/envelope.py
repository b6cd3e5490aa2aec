"""The error envelope and request ids of every app the platform serves (its server, the harness, published
hosts, the secret relay, uvicorn's refusals): `{"error": <message>, "request_id": <id>}` with the same id
in `X-Request-Id` (docs/conventions.md)."""

from __future__ import annotations

import json
import random
from typing import Any

from starlette.responses import JSONResponse

MAX_REQUEST_ID = 128  # the longest `X-Request-Id` of a caller that is kept


def new_request_id() -> str:
    """`req_` and 32 hex digits. From `random` rather than `uuid4`: an id to find a request by, not a
    secret, and `os.urandom` releases the GIL for its system call, so the loop queued for it behind the
    read threads on every request. `random` is seeded from the OS at start and again after a fork."""
    return f"req_{random.getrandbits(128):032x}"


def request_id_from(incoming: str) -> str:
    """The caller's `X-Request-Id` when it is usable (1 to 128 printable characters), else a new id."""
    return incoming if 0 < len(incoming) <= MAX_REQUEST_ID and incoming.isprintable() else new_request_id()


def envelope(message: str, request_id: str, **extra: Any) -> dict[str, Any]:
    """The body of every error answer (`extra`: fields a refusal adds, such as a 207's or a 429's)."""
    return {"error": message, "request_id": request_id, **extra}


def envelope_bytes(message: str, request_id: str, **extra: Any) -> bytes:
    """`envelope` as the JSON bytes `error_response` sends, for a raw ASGI or HTTP answer."""
    return json.dumps(envelope(message, request_id, **extra), ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


def error_response(status: int, message: str, request_id: str, headers: dict[str, str] | None = None,
                   **extra: Any) -> JSONResponse:
    """The envelope as a response, its request id also in `X-Request-Id`."""
    return JSONResponse(envelope(message, request_id, **extra), status_code=status,
                        headers={**(headers or {}), "X-Request-Id": request_id})
