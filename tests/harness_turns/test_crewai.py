"""CrewAI runner end to end against the scripted model.

CrewAI pins pydantic<2.13 and mcp<2, which conflict with the platform's own environment, so these
tests run only where crewai is importable (an agent build environment, or a venv made with
`python -m venv --system-site-packages v && v/bin/pip install crewai`).
"""

from __future__ import annotations

import uuid

import pytest

from caiplatform.adapters.memory.sessions import InMemorySessionStore
from caiplatform.testing.model_server import Step, tool_step
from caiplatform.testing.turn_checks import (
    check_buffered_equals_stream,
    check_stream_shape,
    check_transcript,
    write_agent,
)
from caiplatform.turns import Conversation, load_runner

pytest.importorskip("crewai", reason="crewai conflicts with the platform env (pydantic<2.13, mcp<2); see module doc")

CREW = {
    "crew.py": '''
        from crewai import Agent, Crew, Task
        from crewai.tools import tool
        from caiplatform.turns.models import crewai_llm

        @tool("get_weather")
        def get_weather(city: str) -> str:
            """Weather of a city."""
            return f"sunny in {city}"

        def crew():
            agent = Agent(role="weather reporter", goal="answer weather questions", backstory="knows weather",
                          llm=crewai_llm(stream=True), tools=[get_weather])
            task = Task(description="{message}\\nConversation so far:\\n{history}", expected_output="an answer",
                        agent=agent)
            return Crew(agents=[agent], tasks=[task])
    ''',
}


def weather_rule(request):
    if request.tools and not request.tool_results and "weather" in request.last_text():
        return tool_step("get_weather", reasoning="I should look it up.", city="Paris")
    if request.tool_results:
        return Step(content="It is sunny in Paris today.", reasoning="The tool answered.")
    return None  # echo


@pytest.fixture
def runner(model, tmp_path, monkeypatch):
    monkeypatch.setenv("CREWAI_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    return load_runner("crewai", write_agent(tmp_path / f"crew-{uuid.uuid4().hex[:6]}", CREW), agent="weather")


async def test_buffered_and_streamed_turn_with_tool(model, runner):
    model.set_script(weather_rule)
    result = await runner.run("weather in Paris?", "s-1", "u-1", [])
    assert result.output == "It is sunny in Paris today."
    assert result.reasoning == "I should look it up.The tool answered."
    assert result.tool_calls == [{"name": "get_weather", "summary": 'called with args={"city": "Paris"}'}]
    check_transcript(result.events, "weather")
    lines = [line async for line in runner.stream("weather in Paris?", "s-2", "u-2", [])]
    check_stream_shape(lines, "s-2", "u-2")
    check_buffered_equals_stream(result, lines)
    assert sum(1 for line in lines if line["type"] == "output") > 1
    types = [line["type"] for line in lines]
    assert types.index("thinking") < types.index("tool_call") < types.index("tool_result") < types.index("output")


async def test_history_reaches_the_crew(model, runner):
    store = InMemorySessionStore()
    conv = Conversation(runner, store)
    await conv.invoke("my name is Ada", "sess-a", "user-a")
    await conv.invoke("what is my name?", "sess-a", "user-a")
    prompt = model.requests[-1].last_text()
    assert "user: my name is Ada" in prompt and "what is my name?" in prompt
    stored = await store.get("weather", "sess-a")
    assert [e["author"] for e in stored.events] == ["user", "weather", "user", "weather"]
