"""Model and tool spans of a turn in the GenAI conventions, for both Python agent frameworks, against the
scripted model: a chat span per model call with the token counts, an execute_tool span per tool call, all
children of the turn's span (caiplatform.turns.telemetry)."""

from __future__ import annotations

import uuid

import pytest

from caiplatform import tracing
from caiplatform.adapters.memory.sessions import InMemorySessionStore
from caiplatform.testing.example_agents import WEATHER_SCRIPT
from caiplatform.testing.turn_checks import write_agent
from caiplatform.turns import load_runner

pytestmark = pytest.mark.needs("agents")

LANGGRAPH_WEATHER = {
    "graph.py": """
        from langgraph.prebuilt import create_react_agent

        from caiplatform.turns.models import chat_model


        def get_weather(city: str) -> str:
            \"\"\"Weather of a city.\"\"\"
            return f"sunny in {city}"


        graph = create_react_agent(chat_model(), [get_weather])
    """,
}


@pytest.fixture
def spans():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.activate(provider)
    yield exporter
    tracing.deactivate()
    provider.shutdown()


@pytest.mark.parametrize("framework", ["langgraph", "adk"])
async def test_model_and_tool_calls_are_spans_of_the_turn(model, tmp_path, spans, framework):
    from caiplatform.testing.example_agents import ADK_WEATHER

    files = ADK_WEATHER if framework == "adk" else LANGGRAPH_WEATHER
    runner = load_runner(framework, write_agent(tmp_path / f"{framework}-{uuid.uuid4().hex[:6]}", files),
                         agent="weather", sessions=InMemorySessionStore())
    model.set_script(WEATHER_SCRIPT)
    with tracing.span("turn"):
        lines = [line async for line in runner.stream("weather in Paris?", "s-1", "u-1", [])]
    assert lines[-1]["type"] == "done", lines
    finished = spans.get_finished_spans()
    (turn,) = [s for s in finished if s.name == "turn"]
    chats = [s for s in finished if s.attributes.get("gen_ai.operation.name") == "chat"]
    tools = [s for s in finished if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert len(chats) == 2 and len(tools) == 1, [s.name for s in finished]
    for span in (*chats, *tools):
        assert span.context.trace_id == turn.context.trace_id
    assert all(c.parent.span_id == turn.context.span_id for c in chats)
    for chat in chats:
        assert "scripted" in chat.attributes["gen_ai.request.model"]
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0 and chat.attributes["gen_ai.usage.output_tokens"] > 0
        assert "gen_ai.input.messages" not in chat.attributes
    (tool,) = tools
    assert tool.name == "execute_tool get_weather" and tool.attributes["gen_ai.tool.name"] == "get_weather"
    assert tool.attributes.get("gen_ai.tool.call.id")
    await runner.aclose()
