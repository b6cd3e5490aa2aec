"""Traces end to end: `caiplatform serve` with OTEL_EXPORTER_OTLP_ENDPOINT on a receiver of the test's own
sends one connected trace for a streamed invoke of a LangGraph agent that calls a tool through the scripted
model: route → service → harness → turn → model → tool, the GenAI attributes, one trace id on the server's
and the harness's spans, the response's X-Request-Id on the root span; with `--log-format json` the server's
and the agent's log lines carry the same request and trace ids. A tenant's variables do not move the
harness's spans elsewhere."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from caiplatform.testing.example_agents import WEATHER_SCRIPT
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.model_server import ScriptedModel
from caiplatform.testing.otlp import OTLPReceiver, ReceivedSpan
from caiplatform.testing.serve import ServeProcess

from ..examples_support import example_tarball, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.needs("agents")]

SERVICE = "caiplatform-under-test"
SERVER_KIND, CLIENT_KIND = 2, 3  # OTLP's SpanKind numbers


def _trace_of(spans: list[ReceivedSpan], request_id: str) -> list[ReceivedSpan]:
    roots = [s for s in spans if s.attributes.get("caiplatform.request_id") == request_id and s.service == SERVICE]
    if not roots:
        return []
    return [s for s in spans if s.trace_id == roots[0].trace_id]


def _complete(trace: list[ReceivedSpan]) -> bool:
    names = {s.name for s in trace}
    return ("execute_tool get_weather" in names and "turn langgraph" in names
            and sum(1 for s in trace if s.attributes.get("gen_ai.operation.name") == "chat") >= 2)


def _has(text: str, ids: dict[str, str]) -> bool:
    """A JSON log line carrying these ids (and a span id with them)."""
    try:
        line = json.loads(text)
    except ValueError:
        return False
    return isinstance(line, dict) and all(line.get(k) == v for k, v in ids.items()) and bool(line.get("span_id"))


def _stream(base: str) -> str:
    with httpx.stream("POST", f"{base}/v1/agents/weather/invoke/stream", json={"message": "weather in Paris?"},
                      timeout=120) as s:
        assert s.status_code == 200
        lines = [json.loads(line) for line in s.iter_lines() if line.strip()]
        request_id = s.headers["X-Request-Id"]
    assert lines[-1]["type"] == "done", lines
    return request_id


def test_a_streamed_invoke_is_one_trace_from_route_to_tool(tmp_path):
    receiver, model = OTLPReceiver(), ScriptedModel()
    with receiver.serve() as collector, model.serve() as model_url:
        env = {"MODEL_BASE_URL": model_url, "MODEL_API_KEY": "test-key", "MODEL_NAME": "scripted",
               "CAI_INTERNAL_TOKEN": "internal-e2e", "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
               "OTEL_SERVICE_NAME": SERVICE, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        with ServeProcess(tmp_path / "data", "--log-format", "json", "--log-level", "info", env=env,
                          unset=("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER")) as server:
            token = httpx.post(f"{server.base_url}/v1/auth/login",
                               json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
            admin = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
            r = admin.post("/v1/agents", params={"project": "default"}, data={"name": "weather", "framework": "langgraph"},
                           files={"code": ("code.tar.gz", example_tarball("langgraph-weather"), "application/gzip")})
            assert r.status_code == 202, r.text
            wait_ready(admin, "weather")

            model.set_script(WEATHER_SCRIPT)
            request_id = _stream(server.base_url)
            spans = receiver.wait_for(lambda got: _complete(_trace_of(got, request_id)))
            trace = _trace_of(spans, request_id)
            assert _complete(trace), sorted({(s.service, s.name) for s in spans})

            by_id = {s.span_id: s for s in trace}
            root = next(s for s in trace if not s.parent_id)
            assert root.service == SERVICE and root.kind == SERVER_KIND
            assert root.name == "POST /v1/agents/{name}/invoke/stream"
            assert root.attributes["http.route"] == "/v1/agents/{name}/invoke/stream"
            assert root.attributes["http.response.status_code"] == 200
            assert root.attributes["caiplatform.request_id"] == request_id
            assert all(s.parent_id in by_id for s in trace if s is not root), "one connected trace"

            def parent(span: ReceivedSpan) -> ReceivedSpan:
                return by_id[span.parent_id]

            service = next(s for s in trace if s.name == "invoke_agent weather")
            assert (service.service, service.kind, parent(service)) == (SERVICE, CLIENT_KIND, root)
            assert service.attributes["gen_ai.operation.name"] == "invoke_agent"
            assert service.attributes["gen_ai.agent.name"] == "weather"
            harness = next(s for s in trace if s.name == "POST /invoke/stream")
            assert (harness.service, harness.kind, parent(harness)) == ("caiplatform-harness", SERVER_KIND, service)
            turn = next(s for s in trace if s.name == "turn langgraph")
            assert (turn.service, parent(turn)) == ("caiplatform-harness", harness)
            assert turn.attributes["gen_ai.agent.name"] == "weather"

            chats = [s for s in trace if s.attributes.get("gen_ai.operation.name") == "chat"]
            assert len(chats) == 2 and all(parent(c) is turn and c.kind == CLIENT_KIND for c in chats)
            for chat in chats:
                assert chat.name == "chat scripted" and chat.attributes["gen_ai.request.model"] == "scripted"
                assert chat.attributes["gen_ai.usage.input_tokens"] > 0
                assert chat.attributes["gen_ai.usage.output_tokens"] > 0
                assert "gen_ai.input.messages" not in chat.attributes  # contents only on the operator's opt-in
            tool = next(s for s in trace if s.name == "execute_tool get_weather")
            assert parent(tool) is turn
            assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
            assert tool.attributes["gen_ai.tool.name"] == "get_weather"
            assert tool.attributes.get("gen_ai.tool.call.id")
            assert "gen_ai.tool.call.arguments" not in tool.attributes
            assert {s.trace_id for s in trace if s.service == "caiplatform-harness"} == {root.trace_id}

            # JSON log lines carry the request's ids: the server's own and the agent's that the platform keeps.
            ids = {"request_id": request_id, "trace_id": root.trace_id}
            assert any(_has(line, ids) for line in server.log_path.read_text().splitlines()), server.log_tail()
            deadline = time.monotonic() + 30
            while True:
                history = admin.get("/v1/agents/weather/logs/history", params={"limit": 1000}).json()["lines"]
                if any(_has(line["message"], ids) for line in history):
                    break
                assert time.monotonic() < deadline, [line["message"] for line in history][-20:]
                time.sleep(0.5)

            # The tenant's own variables name another collector: the platform's spans still come here.
            r = admin.patch("/v1/agents/weather/env", json={"set": {
                "CAI_OTEL_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}})
            assert r.status_code == 200, r.text
            assert wait_ready(admin, "weather")["latest_revision"] == "weather-00002"
            model.set_script(WEATHER_SCRIPT)
            request_id = _stream(server.base_url)
            trace = _trace_of(receiver.wait_for(lambda got: _complete(_trace_of(got, request_id))), request_id)
            assert _complete(trace)
