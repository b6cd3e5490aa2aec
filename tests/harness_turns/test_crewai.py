"""A CrewAI crew end to end, the way the platform runs one: its `requirements.txt` names crewai, the local
builder installs it into the image's own environment (pip may move pydantic and mcp back there, never in
the platform's), and the real harness process (`python -m caiplatform.harness`) serves the crew against the
scripted model.

The environment is built once and kept in the checkout's git-ignored `.caiplatform/test-cache/` (or
`CAI_TEST_CACHE_DIR`), never under the user's home (see `tests/crewai_support.py`): the first run installs
crewai (about 25 s with a warm network), later runs reuse it and take seconds; deleting the checkout
deletes it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from caiplatform.ports.builder import Image
from caiplatform.supervisor import ProcessSpec, ProcessSupervisor, free_port
from caiplatform.testing.http import healthz_probe
from caiplatform.testing.model_server import Step, model_env, tool_step
from caiplatform.testing.turn_checks import check_stream_shape, check_transcript, joined, write_agent

from ..crewai_support import REQUIREMENTS, build_in_cache

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one harness process serves the module

AGENT = "weather"
TOKEN = "internal-token-for-crewai"

CREW = {
    "requirements.txt": REQUIREMENTS,
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


@pytest.fixture(scope="session")
def crewai_image(tmp_path_factory) -> Image:
    """The crew built by the local builder into the test cache (`tests/crewai_support.py`): the first run
    installs crewai, later runs (and the other tests of crews) reuse the environment."""
    return build_in_cache(write_agent(tmp_path_factory.mktemp("crew-src"), CREW), AGENT)


@pytest.fixture(scope="session")
def harness_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("crew-home")  # CrewAI writes its own state under HOME


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harness(crewai_image, _model_server, harness_home, tmp_path_factory):
    """Base URL of the harness process serving the crew (through the supervisor, on a free port)."""
    port = free_port()
    env = {**crewai_image.env, **model_env(_model_server[1]), "PORT": str(port), "AGENT_NAME": AGENT,
           "AGENT_IMAGE": crewai_image.reference, "CAI_SESSION_STORE": "memory", "CAI_INTERNAL_TOKEN": TOKEN,
           "CAI_PROJECT_ID": str(uuid.uuid4()), "CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true",
           "HOME": str(harness_home), "PATH": os.environ.get("PATH", "")}
    spec = ProcessSpec(name=f"crewai-harness-{uuid.uuid4().hex[:8]}", argv=crewai_image.command, env=env,
                       health=healthz_probe(port), startup_timeout=90, restart=False, inherit_env=False)
    async with ProcessSupervisor(tmp_path_factory.mktemp("crew-run")) as supervisor:
        process = await supervisor.start(spec)
        yield f"http://127.0.0.1:{port}", process
        await supervisor.stop(spec.name)


@pytest.fixture
def client_for(harness):
    def make() -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=harness[0], timeout=120)

    return make


def weather_rule(request):
    if request.tools and not request.tool_results and "weather" in request.last_text():
        return tool_step("get_weather", reasoning="I should look it up.", city="Paris")
    if request.tool_results:
        return Step(content="It is sunny in Paris today.", reasoning="The tool answered.")
    return None  # echo


async def stream(client: httpx.AsyncClient, body: dict) -> tuple[httpx.Headers, list[dict]]:
    async with client.stream("POST", "/invoke/stream", json=body) as response:
        assert response.status_code == 200, await response.aread()
        return response.headers, [json.loads(line) async for line in response.aiter_lines() if line.strip()]


async def test_the_harness_runs_in_the_crews_own_environment(crewai_image, client_for):
    # crewai is installed in the image's own environment (it conflicts with the platform's) ...
    env = Path(crewai_image.command[0]).parent.parent
    version = REQUIREMENTS.strip().split("==")[1]
    assert env.parent.name == "envs" and list(env.glob(f"lib/python*/site-packages/crewai-{version}.dist-info"))
    # ... and the harness process, started from that environment, serves the crew.
    async with client_for() as client:
        config = (await client.get("/debug/config")).json()
    assert config["framework"] == "crewai"


async def test_buffered_and_streamed_turn_with_tool(model, client_for):
    model.set_script(weather_rule)
    async with client_for() as client:
        response = await client.post("/invoke", json={"message": "weather in Paris?"})
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["output"] == "It is sunny in Paris today."
        assert result["reasoning"] == "I should look it up.The tool answered."
        assert result["tool_calls"] == [{"name": "get_weather", "summary": 'called with args={"city": "Paris"}'}]
        check_transcript(result["events"], AGENT)

        headers, lines = await stream(client, {"message": "weather in Paris?"})
    check_stream_shape(lines, headers["X-CAI-Session-Id"], headers["X-CAI-User-Id"])
    assert joined(lines, "output") == result["output"]
    assert joined(lines, "thinking") == result["reasoning"]
    assert sum(1 for line in lines if line["type"] == "output") > 1  # token-sized, not one final chunk
    assert sum(1 for line in lines if line["type"] == "thinking") > 1
    types = [line["type"] for line in lines]
    assert types.index("thinking") < types.index("tool_call") < types.index("tool_result") < types.index("output")
    call = next(line for line in lines if line["type"] == "tool_call")
    assert call == {"type": "tool_call", "name": "get_weather", "args": {"city": "Paris"}}
    assert next(line for line in lines if line["type"] == "tool_result")["result"] == "sunny in Paris"


async def test_a_session_continues_across_turns(model, client_for):
    model.set_script(lambda request: None)  # echo
    async with client_for() as client:
        first = await client.post("/invoke", json={"message": "my name is Ada"})
        assert first.status_code == 200, first.text
        session_id = first.headers["X-CAI-Session-Id"]
        _, lines = await stream(client, {"message": "what is my name?", "session_id": session_id})
        assert lines[-1]["session_id"] == session_id
        prompt = model.requests[-1].last_text()
        assert "user: my name is Ada" in prompt and "what is my name?" in prompt
        transcript = await client.get(f"/internal/sessions/{session_id}", headers={"X-CAI-Internal": TOKEN})
    assert transcript.status_code == 200, transcript.text
    assert [e["author"] for e in transcript.json()["events"]] == ["user", AGENT, "user", AGENT]

