"""ADK runner end to end against the scripted model, with the session service on our store."""

from __future__ import annotations

import uuid

import pytest

from caiplatform.adapters.memory.sessions import InMemorySessionStore
from caiplatform.testing.example_agents import ADK_WEATHER
from caiplatform.testing.model_server import Step, tool_step
from caiplatform.testing.turn_checks import (
    check_buffered_equals_stream,
    check_stream_shape,
    check_transcript,
    write_agent,
)
from caiplatform.turns import Conversation, load_runner

pytestmark = pytest.mark.needs("agents")  # deselected with one summary line without the extra

AGENT = ADK_WEATHER

SCRIPT = [
    tool_step("get_weather", reasoning="I should look it up.", city="Paris"),
    Step(content="It is sunny in Paris today.", reasoning="The tool answered."),
]


def _runner(tmp_path, store=None):
    return load_runner("adk", write_agent(tmp_path / f"adk-{uuid.uuid4().hex[:6]}", AGENT), agent="weather",
                       sessions=store or InMemorySessionStore())


async def test_buffered_and_streamed_turn_with_tool_and_reasoning(model, tmp_path):
    store = InMemorySessionStore()
    runner = _runner(tmp_path, store)
    model.set_script(SCRIPT)
    result = await runner.run("weather in Paris?", "s-1", "u-1", [])
    assert result.output == "It is sunny in Paris today."
    assert result.reasoning == "I should look it up.The tool answered."
    assert result.tool_calls == [{"name": "get_weather", "summary": 'called with args={"city": "Paris"}'}]
    check_transcript(result.events, "weather")
    stored = await store.get("weather", "s-1")
    assert [e["id"] for e in stored.events] == [e["id"] for e in result.events]
    parts = [p for e in stored.events for p in e["content"]["parts"]]
    assert any(p.get("thought") and p.get("text") == "I should look it up." for p in parts)
    assert any(p.get("function_call", {}).get("args") == {"city": "Paris"} for p in parts)
    assert any(p.get("function_response", {}).get("response") == {"result": "sunny in Paris"} for p in parts)

    model.set_script(SCRIPT)
    lines = [line async for line in runner.stream("weather in Paris?", "s-2", "u-2", [])]
    check_stream_shape(lines, "s-2", "u-2")
    check_buffered_equals_stream(result, lines)
    assert sum(1 for line in lines if line["type"] == "output") > 1
    assert {"type": "tool_result", "name": "get_weather", "result": "sunny in Paris"} in lines


async def test_session_continues_across_turns_and_instances(model, tmp_path):
    store = InMemorySessionStore()
    conv = Conversation(_runner(tmp_path, store), store)
    first = await conv.invoke("my name is Ada", "sess-a", "user-a")
    assert first.output == "you said: my name is Ada"
    lines = [line async for line in conv.stream("and again", "sess-a", "user-a")]
    assert lines[-1]["type"] == "done"
    fresh = Conversation(_runner(tmp_path, store), store)
    await fresh.invoke("third", "sess-a", "user-a")
    seen = [m for m in model.requests[-1].messages if m["role"] in ("user", "assistant")]
    texts = [m["content"] if isinstance(m["content"], str) else "".join(p.get("text", "") for p in m["content"])
             for m in seen]
    assert texts == ["my name is Ada", "you said: my name is Ada", "and again", "you said: and again", "third"]
    stored = await store.get("weather", "sess-a")
    assert [e["author"] for e in stored.events] == ["user", "weather"] * 3
    assert (await store.list_users("weather")).items[0].session_count == 1


@pytest.fixture(params=["sqlite", "redis"])
async def durable_store(request, tmp_path):
    if request.param == "sqlite":
        from caiplatform.adapters.sqlite.sessions import SQLiteSessionStore

        store = SQLiteSessionStore.in_data_dir(tmp_path)
        yield store
        await store.aclose()
    else:
        from caiplatform.adapters.redis.sessions import RedisSessionStore

        store = RedisSessionStore(request.getfixturevalue("redis_url"), prefix=f"test-adk-{uuid.uuid4().hex}")
        try:
            yield store
        finally:
            await store.purge()
            await store.aclose()


async def test_adk_events_round_trip_through_durable_stores(model, tmp_path, durable_store):
    model.set_script(SCRIPT)
    conv = Conversation(_runner(tmp_path, durable_store), durable_store)
    first = await conv.invoke("weather in Paris?", "sess-d", "user-d")
    assert first.output == "It is sunny in Paris today."
    again = Conversation(_runner(tmp_path, durable_store), durable_store)
    second = await again.invoke("thanks", "sess-d", "user-d")
    assert second.output == "you said: thanks"
    roles = [m["role"] for m in model.requests[-1].messages if m["role"] != "system"]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    summary = (await durable_store.list_sessions("weather", "user-d")).items[0]
    assert summary.preview == "weather in Paris?" and summary.event_count == len(
        (await durable_store.get("weather", "sess-d")).events)


# A tool that keeps a file of the user's as an ADK artifact (as ADK's code executors keep a snippet's output).
KEEPER = {
    "agent.py": '''
        from google.adk.agents import LlmAgent
        from google.adk.tools import ToolContext
        from google.genai import types
        from caiplatform.turns.models import adk_model

        async def keep(text: str, tool_context: ToolContext) -> str:
            """Keep a note."""
            await tool_context.save_artifact("note.txt", types.Part(text=text))
            await tool_context.save_artifact("user:profile.txt", types.Part(text=text))
            return "kept: " + ", ".join(await tool_context.list_artifacts())

        root_agent = LlmAgent(name="keeper", model=adk_model(), instruction="Keep notes.", tools=[keep])
    ''',
}


async def test_a_turns_artifacts_do_not_outlive_the_turn(model, tmp_path):
    """ADK's artifact service lives in the instance's memory: a user's files kept there would outlive the
    erasure of their sessions (docs/erasure.md), so they live for the turn that made them."""
    runner = load_runner("adk", write_agent(tmp_path / "keeper", KEEPER), agent="keeper",
                         sessions=InMemorySessionStore())
    model.set_script([tool_step("keep", text="the user's secret"), Step(content="Kept.")])
    result = await runner.run("keep this", "s-1", "u-1", [])
    assert result.output == "Kept."
    kept = [e for e in result.events for p in e["content"]["parts"] if "function_response" in p]
    assert "note.txt" in str(kept) and "user:profile.txt" in str(kept), kept  # there during the turn
    artifacts = runner.runner.artifact_service
    assert await artifacts.list_artifact_keys(app_name=runner.runner.app_name, user_id="u-1", session_id="s-1") == []
    assert not getattr(artifacts, "artifacts", {}), "nothing of the user's is left in the instance's memory"
