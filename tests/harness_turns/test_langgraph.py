"""LangGraph runner end to end against the scripted model."""

from __future__ import annotations

import uuid

import pytest

from caiplatform.adapters.memory.sessions import InMemorySessionStore
from caiplatform.testing.example_agents import LANGGRAPH_WEATHER
from caiplatform.testing.model_server import Step, tool_step
from caiplatform.testing.turn_checks import (
    check_buffered_equals_stream,
    check_stream_shape,
    check_transcript,
    write_agent,
)
from caiplatform.turns import Conversation, TurnError, load_runner

pytestmark = pytest.mark.needs("agents")  # deselected with one summary line without the extra

GRAPH = LANGGRAPH_WEATHER

SCRIPT = [
    tool_step("get_weather", reasoning="I should look it up.", city="Paris"),
    Step(content="It is sunny in Paris today.", reasoning="The tool answered."),
]


@pytest.fixture
def runner(model, tmp_path):
    return load_runner("langgraph", write_agent(tmp_path / f"lg-{uuid.uuid4().hex[:6]}", GRAPH), agent="weather")


async def test_buffered_turn_with_tool_and_reasoning(model, runner):
    model.set_script(SCRIPT)
    result = await runner.run("weather in Paris?", "s-1", "u-1", [])
    assert result.output == "It is sunny in Paris today."
    assert result.reasoning == "I should look it up.The tool answered."
    assert result.tool_calls == [{"name": "get_weather", "summary": 'called with args={"city": "Paris"}'}]
    check_transcript(result.events, "weather")
    parts = [p for e in result.events for p in e["content"]["parts"]]
    assert {"text": "I should look it up.", "thought": True} in parts
    assert any(p.get("function_call", {}).get("args") == {"city": "Paris"} for p in parts)
    assert any(p.get("function_response", {}).get("response") == {"result": "sunny in Paris"} for p in parts)


async def test_streamed_turn_matches_buffered(model, runner, tmp_path):
    model.set_script(SCRIPT)
    lines = [line async for line in runner.stream("weather in Paris?", "s-2", "u-2", [])]
    check_stream_shape(lines, "s-2", "u-2")
    types = [line["type"] for line in lines]
    assert types.index("tool_call") < types.index("tool_result") < types.index("output")
    assert sum(1 for t in types if t == "output") > 1  # token-sized deltas
    assert {"type": "tool_call", "name": "get_weather", "args": {"city": "Paris"}} in lines
    assert {"type": "tool_result", "name": "get_weather", "result": "sunny in Paris"} in lines
    other = load_runner("langgraph", write_agent(tmp_path / "again", GRAPH), agent="weather")
    model.set_script(SCRIPT)
    check_buffered_equals_stream(await other.run("weather in Paris?", "s-3", "u-3", []), lines)


async def test_session_continues_through_the_checkpointer_and_from_the_transcript(model, runner, tmp_path):
    store = InMemorySessionStore()
    conv = Conversation(runner, store)
    first = await conv.invoke("my name is Ada", "sess-a", "user-a")
    assert first.output == "you said: my name is Ada"
    lines = [line async for line in conv.stream("and again", "sess-a", "user-a")]
    assert lines[-1]["type"] == "done"
    # the model saw the whole conversation on the second turn
    seen = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"]
    assert seen == ["my name is Ada", "and again"]
    stored = await store.get("weather", "sess-a")
    assert [e["author"] for e in stored.events] == ["user", "weather", "user", "weather"]
    # a fresh instance (empty checkpointer) continues from the stored transcript
    fresh = Conversation(load_runner("langgraph", write_agent(tmp_path / "fresh", GRAPH), agent="weather"), store)
    await fresh.invoke("third", "sess-a", "user-a")
    seen = [m["content"] for m in model.requests[-1].messages if m["role"] in ("user", "assistant")]
    assert seen == ["my name is Ada", "you said: my name is Ada", "and again", "you said: and again", "third"]


async def test_model_failure_is_an_error_line(model, tmp_path, monkeypatch):
    monkeypatch.setenv("MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    files = {**GRAPH, "graph.py": GRAPH["graph.py"].replace("chat_model()", "chat_model(max_retries=0, timeout=2)")}
    broken = load_runner("langgraph", write_agent(tmp_path / "broken", files), agent="weather")
    lines = [line async for line in broken.stream("hi", "s", "u", [])]
    assert lines[-1]["type"] == "error" and lines[-1]["message"]
    with pytest.raises(TurnError):
        await broken.run("hi", "s2", "u", [])
