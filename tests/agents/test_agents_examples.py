"""The examples in `examples/` deployed on the in-memory platform with the real harness, invoked through
the control plane, against the scripted model server."""

from __future__ import annotations

import pytest

from caiplatform.testing.example_agents import WEATHER_SCRIPT
from caiplatform.testing.model_server import ScriptedModel

from ..examples_support import example_tarball
from .agents_support import wait_settled

REAL_HARNESS = True  # tests/agents/conftest.py: instances are the harness, not the tiny test app


@pytest.fixture(scope="module")
def model_server():
    model = ScriptedModel()
    with model.serve() as base_url:
        yield model, base_url


@pytest.fixture
def settings(settings, model_server):
    return settings.model_copy(update={"model_base_url": model_server[1], "model_api_key": "test-key", "model_name": "scripted"})


async def _deploy(client, headers, name, example, framework, **fields):
    response = await client.post(
        "/v1/agents", params={"project": "default"}, headers=headers,
        data={"name": name, "framework": framework, **fields},
        files={"code": ("code.tar.gz", example_tarball(example), "application/gzip")},
    )
    assert response.status_code == 202, response.text
    view = await wait_settled(client, headers, name, timeout=60)
    assert view["ready"], view
    return view


async def test_langgraph_example_answers_through_the_platform(client, world, model_server):
    model, _ = model_server
    model.set_script(WEATHER_SCRIPT)
    await _deploy(client, world.member, "weather", "langgraph-weather", "langgraph")
    response = await client.post("/v1/agents/weather/invoke", json={"message": "weather in Paris?"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["output"] == "It is sunny in Paris today." and body["tool_calls"][0]["name"] == "get_weather"


async def test_function_example_keeps_answering_across_revisions(client, world):
    """(In memory every instance shares this process's os.environ, so the env change itself is checked
    end to end on the local runtime, tests/agents/test_agents_e2e_serve.py.)"""
    await _deploy(client, world.member, "fn", "python-function", "function")
    first = await client.post("/v1/agents/fn/invoke", json={"message": "hi"})
    assert first.status_code == 200, first.text
    assert "hello" in first.text
    await client.patch("/v1/agents/fn/env", headers=world.member, json={"set": {"GREETING": "bonjour"}})
    assert (await wait_settled(client, world.member, "fn"))["latest_revision"] == "fn-00002"
    second = await client.post("/v1/agents/fn/invoke", json={"message": "again"})
    assert second.status_code == 200 and second.json()["echo"] == "again", second.text
    revisions = (await client.get("/v1/agents/fn/revisions", headers=world.member)).json()["revisions"]
    assert [(r["name"], r["traffic_percent"]) for r in revisions] == [("fn-00002", 100), ("fn-00001", 0)]


async def test_adk_example_answers_through_the_platform(client, world, model_server):
    model, _ = model_server
    model.set_script(WEATHER_SCRIPT)
    await _deploy(client, world.member, "adk-weather", "adk-weather", "adk")
    response = await client.post("/v1/agents/adk-weather/invoke", json={"message": "weather in Paris?"})
    assert response.status_code == 200, response.text
    assert response.json()["output"] == "It is sunny in Paris today."


@pytest.mark.parametrize("example,runtime", [("node-function", "nodejs"), ("go-function", "go"), ("ruby-function", "ruby")])
async def test_function_examples_in_other_languages_answer_through_the_platform(client, world, example, runtime):
    view = await _deploy(client, world.member, "greeter", example, "function", runtime=runtime)
    assert (view["kind"], view["framework"], view["runtime"]) == ("function", f"function-{runtime}", runtime)
    session = "session-for-the-greeter-example"
    response = await client.post("/v1/agents/greeter/invoke", json={"message": "hi", "session_id": session},
                                 headers=world.member)
    assert response.status_code == 200, response.text
    assert response.json() == {"greeting": "hello", "echo": "hi", "keys": ["message", "session_id"], "session_id": session}
