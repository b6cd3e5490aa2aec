"""One error hierarchy for the library and the client: an HTTP answer becomes the platform's own error.

A 404 over HTTP raises `caiplatform.NotFound`, as the same call on an in-process platform does, with the
answer's `request_id`, its headers and any extra fields of the envelope. A connection that fails or
times out raises `APIConnectionError` or `APITimeoutError`, both `Unavailable` (retryable).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from caiplatform import errors
from caiplatform.errors import PlatformError, Unavailable

BY_STATUS: dict[int, type[PlatformError]] = {
    cls.status: cls
    for cls in (errors.BadRequest, errors.Unauthenticated, errors.Forbidden, errors.NotFound,
                errors.MethodNotAllowed, errors.Conflict, errors.Gone, errors.PayloadTooLarge,
                errors.FailedDependency, errors.InternalError, errors.NotSupported, errors.BadGateway,
                errors.Unavailable)
}


class APIStatusError(PlatformError):
    """An error status with no class of its own (a 418, a 504, a 431): `status_code` tells which."""


class APIConnectionError(Unavailable):
    """The platform could not be reached (refused, reset, DNS): nothing was answered."""


class APITimeoutError(APIConnectionError):
    """The platform did not answer within the call's timeout."""


def error_from_response(response: httpx.Response) -> PlatformError:
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, httpx.ResponseNotRead):
        body = None
    envelope = body if isinstance(body, dict) else {}
    message = envelope["error"] if isinstance(envelope.get("error"), str) else response.text[:500]
    extra = {k: v for k, v in envelope.items() if k not in ("error", "request_id")}
    headers = dict(response.headers)
    error: PlatformError
    if response.status_code == 429:
        retry_after = response.headers.get("retry-after")
        error = errors.RateLimited(message or "rate limited",
                                   retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None)
        error.body = extra
    else:
        cls = BY_STATUS.get(response.status_code, APIStatusError)
        error = cls(message or response.reason_phrase, headers=headers, body=extra)
    error.request_id = envelope.get("request_id") or response.headers.get("x-request-id")
    error.answered_status = response.status_code
    return error
