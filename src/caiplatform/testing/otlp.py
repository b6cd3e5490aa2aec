"""An OTLP/HTTP traces receiver on a loopback port, for tests: what a collector would get, decoded with
`opentelemetry-proto` (the `otel` extra).

`with OTLPReceiver().serve() as endpoint:` gives the base URL for `OTEL_EXPORTER_OTLP_ENDPOINT`; the
spans that arrived are in `receiver.spans` (`ReceivedSpan`: service name, ids in hex, attributes as
Python values), `wait_for(predicate)` waits for a set of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one `ExportTraceServiceRequest` (protobuf)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service=str(resource.get("service.name", "")), name=span.name, trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(), parent_id=span.parent_span_id.hex(), kind=span.kind,
                    attributes={a.key: _value(a.value) for a in span.attributes}, status_code=span.status.code))
    return spans


class OTLPReceiver:
    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep  # False: a sink that only counts (a benchmark's collector)
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()

    @contextmanager
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.rstrip("/") == "/v1/traces":
                    spans = decode(body) if receiver.keep else []
                    with receiver._lock:
                        receiver.spans.extend(spans)
                        receiver.requests += 1
                    self.send_response(200)
                else:
                    self.send_response(404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((host, port), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://{host}:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.2)
