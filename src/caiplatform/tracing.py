"""OpenTelemetry traces (docs/observability.md "Traces"): off unless the operator names a collector.

The platform traces when the standard variables name an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*` as the SDK
reads them; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off) and `caiplatform serve`
calls `setup()`. Off, nothing of the SDK is imported and every hook here is one `None` test: `tracer()`
answers `None`, `span()` a shared null context.

One trace per request: the root span in the server's conventions middleware (`server_span`), the
service's spans, the engines' clients through the official instrumentations (SQLAlchemy, redis-py for
Valkey, requests for hvac/OpenBao), and the hop into the harness with a W3C
`traceparent` (`inject`). The vector engines and NATS have no official instrumentation: the services make
small spans of their own (`span`). The harness process exports its own spans (`setup_workload`) to the endpoint
the platform gives it in `CAI_OTEL_TRACES_ENDPOINT` (set after the tenant's variables: a tenant cannot
redirect them), through the sandbox's forwarded loopback port (`collector_ports`; docs/decisions.md
"Traces from the sandbox").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

# The variables the local runtime sets in every instance (docs/observability.md).
WORKLOAD_ENDPOINT = "CAI_OTEL_TRACES_ENDPOINT"
WORKLOAD_CAPTURE = "CAI_OTEL_CAPTURE_CONTENT"
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
HARNESS_SERVICE = "caiplatform-harness"
SCOPE = "caiplatform"
REQUEST_ID = "caiplatform.request_id"
# How often the harness's batch processor sends (an instance may stop soon after its last turn).
WORKLOAD_EXPORT_DELAY_MS = 1000

_tracer: Any = None  # an opentelemetry Tracer once tracing is on
_provider: Any = None
_workload_endpoint = ""
_capture = False
NULL: Any = contextlib.nullcontext()  # shared: entering it twice at once is harmless


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def traces_endpoint(env: Mapping[str, str]) -> str:
    """The OTLP/HTTP traces URL the standard variables name, or ""."""
    if _true(env.get("OTEL_SDK_DISABLED")):
        return ""
    if (env.get("OTEL_TRACES_EXPORTER") or "otlp").strip().lower() == "none":
        return ""
    explicit = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
    if explicit:
        return explicit
    base = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    return base.rstrip("/") + "/v1/traces" if base else ""


def configured(env: Mapping[str, str] | None = None) -> bool:
    return bool(traces_endpoint(os.environ if env is None else env))


def tracer() -> Any:
    """The platform's tracer, or None when tracing is off (the hot path's one test)."""
    return _tracer


def capture_content() -> bool:
    """Whether GenAI spans carry message contents and tool arguments (the operator's opt-in)."""
    return _capture


def setup(service_name: str = "caiplatform") -> bool:
    """Trace this process as the standard variables say (idempotent); False when off or not installed."""
    if _tracer is not None:
        return True
    endpoint = traces_endpoint(os.environ)
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ModuleNotFoundError as exc:
        log.warning("an OTLP endpoint is set but %s is not installed (pip install 'caiplatform[otel]'): no traces",
                    exc.name)
        return False
    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER(_ARG) ...
    provider.sampler = traces_start_at_work(provider.sampler)  # ... asked only where a trace may start
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    # Not the process-wide provider: libraries that trace on their own when one is set (FastAPI's native
    # telemetry would start a second root span per request, an agent framework its own) stay quiet; the
    # platform's spans and the instrumentations below name this provider.
    activate(provider, workload_endpoint=endpoint, capture=_true(os.environ.get(CAPTURE_CONTENT)))
    _instrument_clients(provider)
    _instrument_engines()
    return True


def traces_start_at_work(base: Any) -> Any:
    """A sampler that lets a trace start only at the platform's own work: a request it serves (SERVER), a
    message it delivers (CONSUMER), a trigger it fires (PRODUCER). An engine call outside them (a
    scheduler's poll of the database, the push worker's pulls) would otherwise be a trace of its own every
    few seconds; inside a trace every span follows `base`'s decision for the trace."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
    from opentelemetry.trace import SpanKind, get_current_span

    starts = (SpanKind.SERVER, SpanKind.CONSUMER, SpanKind.PRODUCER)

    class StartAtWork(Sampler):
        def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                          attributes: Any = None, links: Any = None, trace_state: Any = None) -> Any:
            if kind not in starts and not get_current_span(parent_context).get_span_context().is_valid:
                return SamplingResult(Decision.DROP)
            return base.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self) -> str:
            return f"StartAtWork{{{base.get_description()}}}"

    return StartAtWork()


def activate(provider: Any, *, workload_endpoint: str = "", capture: bool = False) -> None:
    """Trace with `provider` (setup's, or a test's or benchmark's own); `deactivate()` turns it off."""
    global _tracer, _provider, _workload_endpoint, _capture
    _provider = provider
    _tracer = provider.get_tracer(SCOPE)
    _workload_endpoint = workload_endpoint
    _capture = capture


def deactivate() -> None:
    global _tracer, _provider, _workload_endpoint, _capture
    _tracer = _provider = None
    _workload_endpoint, _capture = "", False


def _instrument_clients(provider: Any) -> None:
    """The official instrumentations of the engines' client libraries, those installed."""
    for module, name in (("opentelemetry.instrumentation.redis", "RedisInstrumentor"),
                         ("opentelemetry.instrumentation.requests", "RequestsInstrumentor")):
        try:
            instrumentor = getattr(__import__(module, fromlist=[name]), name)()
            instrumentor.instrument(tracer_provider=provider)
        except Exception as exc:  # noqa: BLE001 - a missing instrumentation loses its spans, nothing else
            log.debug("tracing: %s not instrumented: %s", module, exc)


def _traced_method(cls: type, name: str, describe: Callable[..., tuple[str, dict[str, Any]]]) -> None:
    """Wrap an async method of `cls` in a CLIENT span named and described by `describe(self, *args)`
    (the engines without an official instrumentation; only patched once tracing is on)."""
    original = getattr(cls, name)
    if getattr(original, "_cai_traced", False):
        return

    @functools.wraps(original)
    async def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _tracer is None:
            return await original(self, *args, **kwargs)
        span_name, attributes = describe(self, *args, **kwargs)
        with _span(span_name, attributes, "CLIENT"):
            return await original(self, *args, **kwargs)

    traced._cai_traced = True  # type: ignore[attr-defined]
    setattr(cls, name, traced)


def _nats(operation: str) -> Callable[..., tuple[str, dict[str, Any]]]:
    def describe(broker: Any, *args: Any, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        destination = str(args[1] if operation == "publish" and len(args) > 1 else (args[0] if args else ""))
        if operation in ("ack", "nak", "term"):
            destination = ""
        attributes: dict[str, Any] = {"messaging.system": "nats", "messaging.operation.name": operation,
                      "messaging.destination.name": destination}
        if operation == "publish" and len(args) > 2:
            attributes["messaging.batch.message_count"] = len(args[2])
        return f"{operation} {destination}".strip(), attributes
    return describe


def _vector(service: Any, record: Any, call: Any, *args: Any, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    operation = getattr(call, "__name__", "") or "call"
    return f"vector {operation}", {"db.system.name": type(service.engine).__name__,
                                   "db.operation.name": operation,
                                   "db.collection.name": getattr(record, "collection", None)}


def _instrument_engines() -> None:
    """Small spans where no official instrumentation exists: the vector engines' data calls (every engine
    behind `IndexService`) and the NATS broker's publish, pull and acknowledgements."""
    from caiplatform.services.vector import IndexService

    _traced_method(IndexService, "_data", _vector)
    try:
        from caiplatform.adapters.nats.broker import JetStreamBroker
    except ModuleNotFoundError:  # the nats extra is not installed
        return
    for operation in ("publish", "pull", "ack", "nak", "term"):
        _traced_method(JetStreamBroker, operation, _nats(operation))


def instrument_engine(engine: Any) -> None:
    """SQLAlchemy's spans for the platform's database engine (made before tracing could patch it)."""
    if _provider is None:
        return
    try:
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        # skip_dep_check: its declared range stops before SQLAlchemy 2.1, whose engine events it reads alike
        SQLAlchemyInstrumentor().instrument(engine=engine, tracer_provider=_provider, skip_dep_check=True)
    except Exception as exc:  # noqa: BLE001
        log.debug("tracing: the database engine is not instrumented: %s", exc)


# -- the workload's side ---------------------------------------------------------------------------


def workload_env() -> dict[str, str]:
    """What the local runtime sets in every instance, after the tenant's variables (theirs never win)."""
    return {WORKLOAD_ENDPOINT: _workload_endpoint, WORKLOAD_CAPTURE: "true" if _capture else ""}


def cluster_workload_env(cluster_endpoint: str = "") -> dict[str, str]:
    """What the Kubernetes runtime sets in a revision's pods, after the tenant's variables: the traces URL
    a pod reaches, which is the operator's to name (`cluster_endpoint`, an OTLP/HTTP base URL like
    `OTEL_EXPORTER_OTLP_ENDPOINT`: `CAI_KUBE_OTEL_ENDPOINT`), else the server's own collector unless it
    is on loopback (the server's loopback is not the pod's). Empty values while tracing is off, or when no
    endpoint a pod could reach is known (the pods then serve untraced)."""
    url = ""
    if _tracer is not None and _workload_endpoint:
        if cluster_endpoint.strip():
            url = cluster_endpoint.strip().rstrip("/") + "/v1/traces"
        elif not _on_loopback(_workload_endpoint):
            url = _workload_endpoint
    return {WORKLOAD_ENDPOINT: url, WORKLOAD_CAPTURE: "true" if url and _capture else ""}


def _on_loopback(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def collector_ports() -> tuple[int, ...]:
    """The host loopback port of the collector, forwarded into the sandbox while tracing is on."""
    if not _workload_endpoint:
        return ()
    from caiplatform.sandbox.network import loopback_ports

    return loopback_ports([_workload_endpoint])


def setup_workload(env: Mapping[str, str]) -> bool:
    """The harness process: export to the endpoint the platform set, only spans of a trace the platform
    started (a parent-based sampler that never starts one), with no variable of the tenant's choosing in
    where they go. False when off or when the workload's environment has no SDK."""
    global _tracer, _provider, _capture
    endpoint = (env.get(WORKLOAD_ENDPOINT) or "").strip()
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
    except ModuleNotFoundError as exc:
        log.warning("tracing: the platform traces but this environment lacks %s: the agent's spans are left out",
                    exc.name)
        return False
    attributes = {SERVICE_NAME: HARNESS_SERVICE, "gen_ai.agent.name": env.get("AGENT_NAME") or "",
                  "caiplatform.project": env.get("CAI_PROJECT_ID") or "",
                  "caiplatform.revision": env.get("K_REVISION") or ""}
    provider = TracerProvider(resource=Resource(attributes), sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=5),
                                                   schedule_delay_millis=WORKLOAD_EXPORT_DELAY_MS))
    _provider, _tracer = provider, provider.get_tracer(SCOPE)  # never the process-wide provider: the agent's own
    _capture = _true(env.get(WORKLOAD_CAPTURE))
    return True


def shutdown() -> None:
    """Send what is queued (the harness at exit)."""
    if _provider is not None:
        with contextlib.suppress(Exception):
            _provider.shutdown()


# -- spans ---------------------------------------------------------------------------------------


def span(name: str, attributes: Mapping[str, Any] | None = None, *, kind: str = "INTERNAL",
         root: bool = False, carrier: Mapping[str, str] | None = None) -> Any:
    """A current span for a `with` block; the shared null context when tracing is off. `root`: a trace of
    its own, whatever the context (a background task inherits the context of the request that started it).
    `carrier`: a W3C trace context that came with the work (a message's `traceparent`): the span continues
    that trace as a child and links to it (the messaging conventions' creation context); one that is
    missing or malformed is ignored."""
    if _tracer is None:
        return NULL
    return _span(name, attributes, kind, root, carrier)


@contextlib.contextmanager
def _span(name: str, attributes: Mapping[str, Any] | None, kind: str, root: bool = False,
          carrier: Mapping[str, str] | None = None) -> Iterator[Any]:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanKind

    context, links = (Context() if root else None), None
    if carrier:
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        continued = TraceContextTextMapPropagator().extract(carrier, context=Context())
        creation = get_current_span(continued).get_span_context()
        if creation.is_valid:
            context, links = continued, [Link(creation)]
    with _tracer.start_as_current_span(name, context=context, kind=SpanKind[kind], links=links,
                                       attributes=_clean(attributes)) as current:
        yield current


def start(name: str, attributes: Mapping[str, Any] | None = None, *, kind: str = "INTERNAL",
          parent: Any = None) -> Any:
    """A span the caller ends with `finish` (one that outlives a `with` block, e.g. a stream's)."""
    if _tracer is None:
        return None
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(name, context=parent, kind=SpanKind[kind], attributes=_clean(attributes))


def current(span_or_none: Any) -> Any:
    """Make a span from `start` the current one for a `with` block (it is not ended there)."""
    if span_or_none is None:
        return NULL
    from opentelemetry import trace

    return trace.use_span(span_or_none, end_on_exit=False)


def finish(current: Any, error: BaseException | str | None = None) -> None:
    if current is None:
        return
    if error is not None:
        set_error(current, error)
    current.end()


def set_error(current: Any, error: BaseException | str) -> None:
    """Mark a span (not None) failed, with the exception recorded when there is one."""
    from opentelemetry.trace import Status, StatusCode

    if isinstance(error, BaseException):
        current.record_exception(error)
        current.set_attribute("error.type", type(error).__name__)
    current.set_status(Status(StatusCode.ERROR, str(error)[:200]))


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None and v != ""}


def context_of(current: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(current)


def inject(headers: MutableMapping[str, str], current: Any = None) -> None:
    """W3C `traceparent` of `current` (or of the current span) into outgoing headers."""
    if _tracer is None:
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(headers, context=context_of(current) if current is not None else None)


def extract(raw_headers: Any) -> Any:
    """The context a request's `traceparent` names (ASGI header pairs), or None."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers
               if k.lower() in (b"traceparent", b"tracestate")}
    if not carrier:
        return None
    return TraceContextTextMapPropagator().extract(carrier)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span, for log lines; None when off or outside a span."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


# -- the server span of an ASGI request -------------------------------------------------------------


class ServerSpan:
    """The root span of one HTTP request: named `METHOD route-template` once the route is known, with the
    response's status and `X-Request-Id`. The caller enters it and calls `close` with what it learnt."""

    __slots__ = ("span", "token")

    def __init__(self, scope: Mapping[str, Any], service: str = ""):
        from opentelemetry import context

        parent = extract(scope.get("headers") or ())
        client = scope.get("client")
        self.span = start(f"{scope.get('method', 'GET')}", {
            "http.request.method": scope.get("method"), "url.path": scope.get("path"),
            "url.scheme": scope.get("scheme"), "client.address": client[0] if client else None,
            "caiplatform.service": service or None}, kind="SERVER", parent=parent)
        self.token = context.attach(context_of(self.span))

    def close(self, route: str, status: int, request_id: str, error: BaseException | None = None) -> None:
        from opentelemetry import context

        with contextlib.suppress(ValueError):  # a context detached in another task: nothing to restore
            context.detach(self.token)
        current = self.span
        current.update_name(f"{current.name} {route}")
        current.set_attribute("http.route", route)
        if status:
            current.set_attribute("http.response.status_code", status)
        if request_id:
            current.set_attribute(REQUEST_ID, request_id)
            current.set_attribute("http.response.header.x-request-id", (request_id,))
        finish(current, error if error is not None else (f"HTTP {status}" if status >= 500 else None))
