"""How `caiplatform serve` runs the app under uvicorn: h11 with documented limits on the request head, and
an answer in the error envelope when a request breaks them (docs/decisions.md, Conventions).

uvicorn's own answer to a request h11 cannot parse is a plain-text 400 and an immediate close; a client
still sending its oversized head then sees the connection reset instead of any answer. Here the status
follows h11's hint (431 for a head over the limit, 414 when the request line alone is), the body is the
`{error, request_id}` envelope, and the connection drains what the client still sends for a moment
before it closes (a "lingering close"), so the answer is read. h11 enforces its size only on a head
that arrives in pieces; the app checks the same limits on every head it is given (`http.head_refusal`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from caiplatform.web.envelope import envelope_bytes, new_request_id
from caiplatform.web.http import HEADERS_TOO_LARGE, MAX_HEADER_BYTES, URI_TOO_LONG

LINGER_SECONDS = 2.0


class _RecordingConnection(h11.Connection):
    """h11's connection, keeping the protocol error it raised (uvicorn's loop swallows it)."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


class EnvelopeH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering a broken or oversized request head in the envelope."""

    _refused = False
    _linger: asyncio.TimerHandle | None = None

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.conn = _RecordingConnection(h11.SERVER, config.h11_max_incomplete_event_size or MAX_HEADER_BYTES)

    def data_received(self, data: bytes) -> None:
        if not self._refused:  # once answered, the rest of the request is dropped until the close
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        exc = self.conn.last_error if isinstance(self.conn, _RecordingConnection) else None
        status, message = 400, "invalid HTTP request"
        if exc is not None and exc.error_status_hint == 431:
            pending, _ = self.conn.trailing_data
            # a request line that alone fills the buffer is an overlong URI
            status, message = (414, URI_TOO_LONG) if b"\n" not in pending else (431, HEADERS_TOO_LARGE)
        request_id = new_request_id()
        body = envelope_bytes(message, request_id)
        reason = {400: b"Bad Request", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}[status]
        head = b"".join([
            b"HTTP/1.1 %d %s\r\n" % (status, reason),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"x-request-id: %s\r\n" % request_id.encode(),
            b"connection: close\r\n\r\n",
        ])
        self.logger.warning("refused a request from %s: %s", self.client, message)
        self._refused = True
        self.transport.write(head + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)


def uvicorn_config(app: Any, *, host: str, port: int, log_level: str, **options: Any) -> uvicorn.Config:
    """A uvicorn configuration with h11 and the limits above (the platform, the harness, MCP servers).

    No `server: uvicorn` header: which server answers is nobody's business, and it is one header less to
    validate and send on every response. No forwarded headers believed unless the caller names the proxies
    (`forwarded_allow_ips`): uvicorn's default believes `X-Forwarded-For` from 127.0.0.1 (or its own
    `FORWARDED_ALLOW_IPS` variable), and on one machine every workload connects from loopback."""
    options.setdefault("server_header", False)
    allowed = [ip.strip() for ip in str(options.pop("forwarded_allow_ips", "") or "").split(",") if ip.strip()]
    options["proxy_headers"] = bool(allowed)
    options["forwarded_allow_ips"] = allowed or ["255.255.255.255"]  # never a client: no env fallback either
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", http=EnvelopeH11Protocol,
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES, **options)


def server(app: Any, *, host: str, port: int, log_level: str, **options: Any) -> uvicorn.Server:
    return uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level=log_level, **options))


def run(app: Any, *, host: str, port: int, log_level: str, **options: Any) -> None:
    server(app, host=host, port=port, log_level=log_level, **options).run()
