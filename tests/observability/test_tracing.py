"""caiplatform.tracing in process: off by default and free then; on, the server's root span carries the
request id and continues a caller's `traceparent`, the harness joins the platform's trace, and the GenAI
spans of a LangChain run carry the conventions' attributes (contents only on the operator's opt-in)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from caiplatform import tracing
from caiplatform.harness.app import create_harness_app
from caiplatform.testing.example_agents import PYTHON_FUNCTION
from caiplatform.testing.turn_checks import write_agent

pytestmark = pytest.mark.unit

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"


@pytest.fixture
def spans():
    """Tracing on, into memory, for one test."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.activate(provider, workload_endpoint="http://127.0.0.1:4318/v1/traces")
    yield exporter
    tracing.deactivate()
    provider.shutdown()


@pytest.mark.parametrize(("env", "endpoint"), [
    ({}, ""),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://d"}, "http://c:4318/x"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, ""),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, ""),
])
def test_the_standard_variables_name_the_endpoint(env, endpoint):
    assert tracing.traces_endpoint(env) == endpoint
    assert tracing.configured(env) is bool(endpoint)


def test_off_by_default_every_hook_is_a_no_op():
    assert tracing.tracer() is None
    assert tracing.span("x", {"a": 1}) is tracing.NULL
    assert tracing.start("x") is None
    assert tracing.current(None) is tracing.NULL
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {} and tracing.current_ids() is None
    # what a workload is given while off: the variables, empty (a tenant's own never survive)
    assert tracing.workload_env() == {tracing.WORKLOAD_ENDPOINT: "", tracing.WORKLOAD_CAPTURE: ""}
    assert tracing.collector_ports() == ()
    assert tracing.setup_workload({}) is False


def test_the_collector_port_is_forwarded_only_while_tracing(spans):
    assert tracing.collector_ports() == (4318,)
    assert tracing.workload_env()[tracing.WORKLOAD_ENDPOINT] == "http://127.0.0.1:4318/v1/traces"


async def test_the_root_span_carries_the_request_id_and_continues_the_callers_trace(spans, client):
    r = await client.get("/healthz", headers={"traceparent": TRACEPARENT})
    (root,) = [s for s in spans.get_finished_spans() if s.name == "GET /healthz"]
    assert root.attributes["caiplatform.request_id"] == r.headers["X-Request-Id"]
    assert root.attributes["http.route"] == "/healthz"
    assert root.attributes["http.response.status_code"] == r.status_code
    assert f"{root.context.trace_id:032x}" == PARENT_TRACE and f"{root.parent.span_id:016x}" == PARENT_SPAN

    r = await client.get("/v1/agents/nobody/sessions/x")  # a template, never the raw path
    names = [s.name for s in spans.get_finished_spans()]
    assert "GET /v1/agents/{name}/sessions/{session_id}" in names
    root = next(s for s in spans.get_finished_spans() if s.name.endswith("/sessions/{session_id}"))
    assert root.parent is None and root.attributes["caiplatform.request_id"] == r.headers["X-Request-Id"]


async def test_the_harness_joins_the_platforms_trace(spans, tmp_path):
    code = write_agent(tmp_path / "fn", PYTHON_FUNCTION)
    app = create_harness_app({"CAI_FRAMEWORK": "function", "CAI_CODE_DIR": str(code), "AGENT_NAME": "fn",
                              "CAI_SESSION_STORE": "memory", "CAI_PROJECT_ID": str(uuid.uuid4())})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://harness") as harness:
        r = await harness.post("/invoke", json={"message": "hi"}, headers={"traceparent": TRACEPARENT})
        assert r.status_code == 200, r.text
    await app.harness.aclose()  # type: ignore[attr-defined]
    finished = {s.name: s for s in spans.get_finished_spans()}
    server, turn = finished["POST /invoke"], finished["turn function"]
    assert f"{server.context.trace_id:032x}" == PARENT_TRACE and f"{server.parent.span_id:016x}" == PARENT_SPAN
    assert turn.parent.span_id == server.context.span_id
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent" and turn.attributes["gen_ai.agent.name"] == "fn"
    assert server.attributes["caiplatform.request_id"] == r.headers["X-Request-Id"]


def test_inject_writes_a_w3c_traceparent(spans):
    with tracing.span("outer") as outer:
        headers: dict[str, str] = {}
        tracing.inject(headers)
        ids = tracing.current_ids()
    context = outer.get_span_context()
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", f"{context.trace_id:032x}", f"{context.span_id:016x}")
    assert int(flags, 16) & 1  # sampled
    assert ids == (f"{context.trace_id:032x}", f"{context.span_id:016x}")


@pytest.mark.needs("agents")
@pytest.mark.parametrize("capture", [False, True])
def test_model_and_tool_spans_in_the_genai_conventions(spans, capture):
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, LLMResult

    from caiplatform.turns import telemetry

    tracing._capture = capture
    with tracing.span("turn"):
        (handler,) = telemetry.langchain_callbacks()
    model_run, tool_run = uuid.uuid4(), uuid.uuid4()
    handler.on_chat_model_start({}, [[HumanMessage("weather in Paris?")]], run_id=model_run,
                                metadata={"ls_model_name": "scripted", "ls_provider": "openai"})
    answer = AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}],
                       usage_metadata={"input_tokens": 12, "output_tokens": 3, "total_tokens": 15},
                       response_metadata={"finish_reason": "tool_calls", "model_name": "scripted-1"})
    handler.on_llm_end(LLMResult(generations=[[ChatGeneration(message=answer)]]), run_id=model_run)
    handler.on_tool_start({"name": "get_weather", "description": "Weather of a city."}, "{'city': 'Paris'}",
                          run_id=tool_run, inputs={"city": "Paris"}, tool_call_id="call_1")
    handler.on_tool_end("sunny in Paris", run_id=tool_run)

    finished = {s.name: s for s in spans.get_finished_spans()}
    turn, chat, tool = finished["turn"], finished["chat scripted"], finished["execute_tool get_weather"]
    assert chat.parent.span_id == turn.context.span_id and tool.parent.span_id == turn.context.span_id
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "scripted"
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.response.model"] == "scripted-1"
    assert (chat.attributes["gen_ai.usage.input_tokens"], chat.attributes["gen_ai.usage.output_tokens"]) == (12, 3)
    assert chat.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "get_weather"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    contents = ("gen_ai.input.messages", "gen_ai.output.messages")
    if capture:
        assert "weather in Paris?" in chat.attributes["gen_ai.input.messages"]
        assert "get_weather" in chat.attributes["gen_ai.output.messages"]
        assert "Paris" in tool.attributes["gen_ai.tool.call.arguments"]
        assert tool.attributes["gen_ai.tool.call.result"] == '"sunny in Paris"'
    else:
        assert not any(key in chat.attributes for key in contents)
        assert "gen_ai.tool.call.arguments" not in tool.attributes
        assert "gen_ai.tool.call.result" not in tool.attributes


async def test_engines_without_an_official_instrumentation_get_client_spans(spans):
    class Engine:
        async def upsert(self, collection: str) -> str:
            return collection

    class Service:
        engine = Engine()

        async def _data(self, record, call):
            return await call

    class Record:
        collection = "p1-docs"

    tracing._traced_method(Service, "_data", tracing._vector)
    tracing._traced_method(Service, "_data", tracing._vector)  # once only
    service = Service()
    assert await service._data(Record(), service.engine.upsert("p1-docs")) == "p1-docs"
    (span,) = spans.get_finished_spans()
    assert span.name == "vector upsert" and span.kind.name == "CLIENT"
    assert dict(span.attributes) == {"db.system.name": "Engine", "db.operation.name": "upsert",
                                     "db.collection.name": "p1-docs"}
    name, attributes = tracing._nats("publish")(object(), "CAI_P1", "cai.p1.topic.orders", [1, 2])
    assert name == "publish cai.p1.topic.orders" and attributes["messaging.batch.message_count"] == 2
    assert tracing._nats("ack")(object(), ["token"])[0] == "ack"


def test_the_harness_exports_only_traces_the_platform_started(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # a tenant's: never used
    env = {tracing.WORKLOAD_ENDPOINT: "http://127.0.0.1:4318/v1/traces", "AGENT_NAME": "weather"}
    try:
        assert tracing.setup_workload(env) is True
        provider = tracing._provider
        assert provider.resource.attributes["service.name"] == tracing.HARNESS_SERVICE
        assert provider.resource.attributes["gen_ai.agent.name"] == "weather"
        processor = provider._active_span_processor._span_processors[0]  # the SDK's internals, as of 1.2x-1.4x
        exporter = (getattr(getattr(processor, "_batch_processor", None), "_exporter", None)
                    or getattr(processor, "span_exporter", None))
        assert exporter._endpoint == "http://127.0.0.1:4318/v1/traces"
        with tracing.span("no parent") as root:
            assert not root.is_recording()  # the harness never starts a trace of its own
        parent = tracing.extract([(b"traceparent", TRACEPARENT.encode())])
        child = tracing.start("child", parent=parent)
        assert child.is_recording() and f"{child.get_span_context().trace_id:032x}" == PARENT_TRACE
        tracing.finish(child)
    finally:
        provider = tracing._provider
        tracing.deactivate()
        if provider is not None:
            provider.shutdown()


def test_a_workload_without_the_sdk_serves_untraced(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    assert tracing.setup_workload({tracing.WORKLOAD_ENDPOINT: "http://127.0.0.1:4318/v1/traces"}) is False
    assert tracing.tracer() is None


async def test_the_host_proxy_hands_its_own_span_to_the_workload(spans):
    from caiplatform_server.proxy import proxy

    seen: dict[str, str] = {}

    async def workload(scope, receive, send):
        seen.update({k.decode(): v.decode() for k, v in scope["headers"]})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    class Upstream:
        base_url, transport, timeout_seconds = "http://workload", httpx.ASGITransport(app=workload), 5

        async def release(self):
            pass

    class Router:
        def lookup(self, host):
            async def factory():
                return Upstream()
            return factory

        def guard_for(self, host):
            return None

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "raw_path": b"/", "query_string": b"",
             "headers": [(b"host", b"weather.apps.example"), (b"traceparent", TRACEPARENT.encode())]}
    with tracing.span("root") as root:
        await proxy(Router(), httpx.AsyncClient(), scope, receive, send, "req_1")
    assert sent[0]["status"] == 200
    _, trace_id, parent_id, _ = seen["traceparent"].split("-")
    context = root.get_span_context()
    assert (trace_id, parent_id) == (f"{context.trace_id:032x}", f"{context.span_id:016x}")


def test_a_trace_starts_only_at_the_platforms_own_work():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    tracer = TracerProvider(sampler=tracing.traces_start_at_work(ALWAYS_ON)).get_tracer("t")
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span("SELECT", kind=SpanKind.CLIENT) as alone:
        assert not alone.is_recording()  # a scheduler's poll of the database: no trace of its own
    with tracer.start_as_current_span("GET /healthz", kind=SpanKind.SERVER) as request:
        assert request.is_recording()
        with tracer.start_as_current_span("SELECT", kind=SpanKind.CLIENT) as inside:
            assert inside.is_recording()
    for kind in (SpanKind.CONSUMER, SpanKind.PRODUCER):
        with tracer.start_as_current_span("work", kind=kind) as work:
            assert work.is_recording()
