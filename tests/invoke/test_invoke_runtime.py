"""Invoke through the platform's own in-memory runtime and builder (the deploy path's shape): an ADK agent
with a tool, concurrency limits, and slots released when a stream is abandoned."""

from __future__ import annotations

import asyncio
import json
import uuid

from caiplatform.ports.builder import BuildRequest
from caiplatform.ports.runtime import RevisionSpec, Scaling, WorkloadRef
from caiplatform.services.agent_directory import InvokeTarget
from caiplatform.testing.example_agents import ADK_WEATHER, PYTHON_FUNCTION, WEATHER_SCRIPT
from caiplatform.testing.invoke import StaticDirectory
from caiplatform.testing.turn_checks import check_stream_shape, check_transcript, write_agent
from caiplatform.turns.browse import workload_internal_token


async def _deploy(platform, tmp_path, model_vars, name, framework, files, *, scaling=None) -> InvokeTarget:
    project_id, short = str(uuid.uuid4()), "rt001"
    kind = "function" if framework == "function" else "agent"
    ref = WorkloadRef(project_id, short, name, kind)
    image = await platform.builder.build(BuildRequest(project_id, short, name, framework,
                                                      write_agent(tmp_path / name, files)))
    env = {"AGENT_NAME": name, "AGENT_IMAGE": image.reference, "CAI_SESSION_STORE": "memory",
           "CAI_PROJECT_ID": project_id, **model_vars}
    spec = RevisionSpec(ref, f"{name}-00001", 1, image.reference, env=env,
                        secret_env={"CAI_INTERNAL_TOKEN": workload_internal_token(platform.settings.internal_token,
                                                                                  ref.key)},
                        scaling=scaling or Scaling())
    await platform.runtime.apply(spec)
    target = InvokeTarget(name, str(uuid.uuid4()), project_id, short, kind, framework, ref)
    directory = platform.invoke.directory or StaticDirectory()
    directory.add(target)
    platform.invoke.attach(directory=directory)
    return target


async def test_adk_agent_with_a_tool_through_the_runtime(model, model_vars, platform, client, admin_headers, tmp_path):
    await _deploy(platform, tmp_path, model_vars, "weather", "adk", ADK_WEATHER)
    model.set_script(WEATHER_SCRIPT)
    r = await client.post("/v1/agents/weather/invoke", json={"message": "weather in Paris?"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output"] == "It is sunny in Paris today."
    assert body["reasoning"] == "I should look it up.The tool answered."
    assert body["tool_calls"] == [{"name": "get_weather", "summary": 'called with args={"city": "Paris"}'}]

    model.set_script(WEATHER_SCRIPT)
    r = await client.post("/v1/agents/weather/invoke/stream", json={"message": "weather in Paris?"})
    lines = [json.loads(x) for x in r.text.splitlines()]
    check_stream_shape(lines, r.headers["X-CAI-Session-Id"], r.headers["X-CAI-User-Id"])
    assert {"type": "tool_call", "name": "get_weather", "args": {"city": "Paris"}} in lines
    assert "".join(x["text"] for x in lines if x["type"] == "output") == body["output"]
    # the session continues
    r = await client.post("/v1/agents/weather/invoke", json={"message": "and now?", "session_id": body["session_id"]})
    assert r.status_code == 200 and r.json()["user_id"] == body["user_id"]

    r = await client.get(f"/v1/agents/weather/sessions/{body['session_id']}", headers=admin_headers)
    assert r.status_code == 200
    events = r.json()["events"]
    check_transcript(events, "weather")
    assert [e["content"]["parts"][0].get("text") for e in events if e["author"] == "user"
            and "text" in e["content"]["parts"][0]] == ["weather in Paris?", "and now?"]
    users = (await client.get("/v1/agents/weather/users", headers=admin_headers)).json()["users"]
    assert {u["user_id"]: u["session_count"] for u in users}[body["user_id"]] == 1 and len(users) == 2


async def test_concurrent_invokes_share_a_warm_instance(model_vars, platform, client, tmp_path):
    target = await _deploy(platform, tmp_path, model_vars, "fn", "function", PYTHON_FUNCTION,
                           scaling=Scaling(min_scale=0, max_scale=1, container_concurrency=4))
    replies = await asyncio.gather(*[client.post("/v1/agents/fn/invoke", json={"message": f"m{i}"}) for i in range(8)])
    assert [r.json()["echo"] for r in replies] == [f"m{i}" for i in range(8)]
    metrics = await platform.runtime.metrics(target.workload)
    assert metrics is not None and metrics.instances == 1


async def test_an_abandoned_stream_frees_its_runtime_slot(model_vars, platform, tmp_path):
    await _deploy(platform, tmp_path, model_vars, "fn", "function", PYTHON_FUNCTION,
                  scaling=Scaling(min_scale=0, max_scale=1, container_concurrency=1))
    from caiplatform.principal import Principal

    anonymous = Principal.anonymous("127.0.0.1")
    turn = await platform.invoke.stream(anonymous, "fn", None, b'{"message": "hi"}')
    await turn.aclose()  # what the route does when the client goes away
    # the only slot is free again: the next invoke gets it at once
    reply = await asyncio.wait_for(platform.invoke.invoke(anonymous, "fn", None, b'{"message": "again"}'), 10)
    assert json.loads(reply.content)["echo"] == "again"


async def test_the_library_reads_a_turn_typed(model, model_vars, platform, tmp_path):
    """The invoke service's answers as models: `Reply.response()` and `TurnStream.events()` (issue 19)."""
    from caiplatform.models.invoke import InvokeRequest, OutputDelta, ToolCallEvent, TurnDone
    from caiplatform.principal import Principal

    await _deploy(platform, tmp_path, model_vars, "weather", "adk", ADK_WEATHER)
    anonymous = Principal.anonymous("127.0.0.1")
    model.set_script(WEATHER_SCRIPT)
    answer = (await platform.invoke.invoke(anonymous, "weather", None, InvokeRequest(message="weather in Paris?"))).response()
    assert answer.output == "It is sunny in Paris today."
    assert [(c.name, c.summary) for c in answer.tool_calls] == [("get_weather", 'called with args={"city": "Paris"}')]

    model.set_script(WEATHER_SCRIPT)
    turn = await platform.invoke.stream(anonymous, "weather", None, InvokeRequest(message="weather in Paris?"))
    events = [event async for event in turn.events()]
    assert "".join(e.text for e in events if isinstance(e, OutputDelta)) == answer.output
    assert any(isinstance(e, ToolCallEvent) and e.args == {"city": "Paris"} for e in events)
    assert isinstance(events[-1], TurnDone) and events[-1].session_id == turn.headers["X-CAI-Session-Id"]
