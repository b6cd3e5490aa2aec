"""One typed error hierarchy for the whole platform.

Services raise these; the HTTP layer turns each into the `{error, request_id}` envelope with the
class's status. Library users catch them by class (or by `code`) exactly as the HTTP API reports them.
"""

from __future__ import annotations

from typing import Any, ClassVar


class PlatformError(Exception):
    """Base of every error the platform reports to a caller."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, body: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        # Extra fields that some errors carry beside `error` (for example apply's per-binding list).
        self.body = body or {}
        # Set when the error came back over HTTP (the remote client): the answer's `request_id`.
        self.request_id: str | None = None
        self.answered_status: int | None = None

    @property
    def status_code(self) -> int:
        """The HTTP status: the one a server answered (over HTTP), else this class's."""
        return self.answered_status or self.status

    def __str__(self) -> str:
        return self.message


class BadRequest(PlatformError):
    status = 400
    code = "bad_request"


class Unauthenticated(PlatformError):
    status = 401
    code = "unauthenticated"


class Forbidden(PlatformError):
    status = 403
    code = "forbidden"


class NotFound(PlatformError):
    status = 404
    code = "not_found"


class MethodNotAllowed(PlatformError):
    status = 405
    code = "method_not_allowed"


class Conflict(PlatformError):
    status = 409
    code = "conflict"


class Gone(PlatformError):
    status = 410
    code = "gone"


class PayloadTooLarge(PlatformError):
    status = 413
    code = "payload_too_large"


class FailedDependency(PlatformError):
    status = 424
    code = "failed_dependency"


class RateLimited(PlatformError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str = "rate limit exceeded; slow down and retry", *, retry_after: float | None = None):
        headers = {"Retry-After": str(max(1, int(retry_after + 0.999)))} if retry_after is not None else None
        super().__init__(message, headers=headers)
        self.retry_after = retry_after


class InternalError(PlatformError):
    status = 500
    code = "internal"


class NotSupported(PlatformError):
    status = 501
    code = "not_implemented"


class BadGateway(PlatformError):
    status = 502
    code = "bad_gateway"


class Unavailable(PlatformError):
    status = 503
    code = "unavailable"


class MissingDriver(PlatformError):
    """A backend was asked for whose Python driver is not installed."""

    status = 503
    code = "missing_driver"
