"""`POST /v1/agents/{name}/invoke` and `/invoke/stream` over HTTP: rules 1 to 7, ids, caps, streaming."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import ClientDisconnect

from caiplatform.services.invoke_ids import derive_user_id
from caiplatform.testing.example_agents import LANGGRAPH_WEATHER, PYTHON_FUNCTION, WEATHER_SCRIPT
from caiplatform.testing.turn_checks import check_stream_shape

LONG = "anonymous-session-0123456789"


def ndjson(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_buffered_and_streamed_invoke_with_minted_and_derived_ids(model, wired, client):
    wired.deploy("weather", "langgraph", LANGGRAPH_WEATHER)
    model.set_script(WEATHER_SCRIPT)
    r = await client.post("/v1/agents/weather/invoke", json={"message": "weather in Paris?"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output"] == "It is sunny in Paris today."
    assert body["tool_calls"] == [{"name": "get_weather", "summary": 'called with args={"city": "Paris"}'}]
    assert body["user_id"] == derive_user_id(body["session_id"])
    assert r.headers["X-CAI-Session-Id"] == body["session_id"]

    model.set_script(WEATHER_SCRIPT)
    r = await client.post("/v1/agents/weather/invoke/stream", json={"message": "weather in Paris?"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    session_id, user_id = r.headers["X-CAI-Session-Id"], r.headers["X-CAI-User-Id"]
    assert user_id == derive_user_id(session_id)
    lines = ndjson(r.text)
    check_stream_shape(lines, session_id, user_id)
    assert "".join(x["text"] for x in lines if x["type"] == "output") == body["output"]
    assert wired.harnesses.held == 0


async def test_session_continues_and_the_chosen_ids_are_kept(model, wired, client, admin_headers):
    wired.deploy("echo", "langgraph", LANGGRAPH_WEATHER)
    first = (await client.post("/v1/agents/echo/invoke", json={"message": "one", "session_id": LONG})).json()
    assert first["session_id"] == LONG and first["user_id"] == derive_user_id(LONG)
    await client.post("/v1/agents/echo/invoke", json={"message": "two", "session_id": LONG})
    assert [m["content"] for m in model.requests[-1].messages if m["role"] == "user"] == ["one", "two"]
    # authenticated callers may pick short ids and their own user id
    r = await client.post("/v1/agents/echo/invoke", headers=admin_headers,
                          json={"message": "hi", "session_id": "s1", "user_id": "alice@example.com"})
    assert (r.json()["session_id"], r.json()["user_id"]) == ("s1", "alice@example.com")


async def test_invoke_rules(wired, client, admin_headers, platform):
    wired.deploy("echo", "langgraph", LANGGRAPH_WEATHER)
    cases = [
        ({"message": ""}, 400, "message is required"),
        ({}, 400, "message is required"),
        ({"message": "hi", "session_id": "short"}, 400, "session_id must be at least 24 characters"),
        ({"message": "hi", "user_id": "no spaces"}, 400, "invalid user_id: must match ^[A-Za-z0-9_.:@-]{1,128}$"),
        ({"message": "hi", "memorize": True}, 401, "memorize requires authentication"),
    ]
    for path in ("/v1/agents/echo/invoke", "/v1/agents/echo/invoke/stream"):
        for body, status, message in cases:
            r = await client.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            assert r.json()["error"].startswith(message), r.json()
            assert r.json()["request_id"] == r.headers["X-Request-Id"]
    r = await client.post("/v1/agents/nobody/invoke", json={"message": "hi"})
    assert (r.status_code, r.json()["error"]) == (404, "unknown agent: nobody")
    r = await client.post("/v1/agents/nobody/invoke", json={"message": " "})
    assert (r.status_code, r.json()["error"]) == (400, "message is required")
    r = await client.post("/v1/agents/echo/invoke", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"].startswith("invalid JSON body")
    big = json.dumps({"message": "x" * (1024 * 1024)})
    r = await client.post("/v1/agents/echo/invoke", content=big)
    assert (r.status_code, r.json()["error"]) == (413, "request body too large (limit 1048576 bytes)")
    # rule 5
    platform.settings.invoke_auth_required = True
    try:
        r = await client.post("/v1/agents/echo/invoke", json={"message": "hi"})
        assert r.status_code == 401
        assert (await client.post("/v1/agents/echo/invoke", json={"message": "hi"}, headers=admin_headers)).status_code == 200
    finally:
        platform.settings.invoke_auth_required = False


async def test_ambiguous_name_needs_the_project(wired, client):
    wired.deploy("twin", "function", PYTHON_FUNCTION, project_short="aaaa1")
    wired.deploy("twin", "function", PYTHON_FUNCTION, project_short="bbbb2")
    r = await client.post("/v1/agents/twin/invoke", json={"message": "hi"})
    assert r.status_code == 409 and "?project=" in r.json()["error"]
    r = await client.post("/v1/agents/twin/invoke?project=bbbb2", json={"message": "hi"})
    assert r.status_code == 200 and r.json()["echo"] == "hi"


async def test_function_invoke_answers_the_return_value(wired, client):
    wired.deploy("fn", "function", PYTHON_FUNCTION)
    r = await client.post("/v1/agents/fn/invoke", json={"message": "hi", "n": 2})
    assert r.status_code == 200
    assert r.json() == {"echo": "hi", "keys": ["message", "n"], "agent": "fn"}
    assert r.headers["X-CAI-Session-Id"]
    r = await client.post("/v1/agents/fn/invoke", json={"n": 3})  # an event needs no message
    assert r.status_code == 200 and r.json()["keys"] == ["n"]
    wired.deploy("listfn", "function", {"main.py": "def handle(event, context):\n    return {'got': event}\n"})
    r = await client.post("/v1/agents/listfn/invoke", json=[1, 2])  # any JSON value is an event
    assert r.status_code == 200 and r.json() == {"got": [1, 2]}
    r = await client.post("/v1/agents/fn/invoke", json={"fail": True})
    assert (r.status_code, r.json()["error"]) == (502, "invoke agent fn: ValueError: asked to fail")
    event = json.dumps({"message": "x" * (2 * 1024 * 1024)})
    assert (await client.post("/v1/agents/fn/invoke", content=event)).status_code == 200
    r = await client.post("/v1/agents/fn/invoke", content=json.dumps({"message": "x" * (8 * 1024 * 1024)}))
    assert r.status_code == 413


async def test_upstream_failures_are_502(wired, client, platform):
    wired.deploy("broken", "function", PYTHON_FUNCTION)
    r = await client.post("/v1/agents/broken/invoke", json={"message": "hi", "fail": True})
    assert (r.status_code, r.json()["error"]) == (502, "invoke agent broken: ValueError: asked to fail")
    r = await client.post("/v1/agents/broken/invoke/stream", json={"message": "hi", "fail": True})
    assert r.status_code == 200 and ndjson(r.text)[-1] == {"type": "error", "message": "ValueError: asked to fail"}
    # not serving at all
    from caiplatform.testing.invoke import target_for

    wired.directory.add(target_for("ghost"))
    r = await client.post("/v1/agents/ghost/invoke", json={"message": "hi"})
    assert r.status_code == 502 and r.json()["error"].startswith("invoke agent ghost: ")
    assert wired.harnesses.held == 0


async def test_the_timeout_covers_the_cold_start(wired, client, platform):
    wired.deploy("slow", "function", PYTHON_FUNCTION)
    wired.harnesses.cold_start_seconds = 0.5
    platform.settings.invoke_timeout_seconds = 0.2
    try:
        r = await client.post("/v1/agents/slow/invoke", json={"message": "hi"})
        assert r.status_code == 502 and r.json()["error"].startswith("invoke agent slow: timed out after 0.2s")
    finally:
        platform.settings.invoke_timeout_seconds = 60


async def test_oversized_upstream_answer_is_502(wired, client, monkeypatch):
    from caiplatform.services import invoke

    wired.deploy("fn", "function", PYTHON_FUNCTION)
    monkeypatch.setattr(invoke, "UPSTREAM_LIMIT", 20)
    r = await client.post("/v1/agents/fn/invoke", json={"message": "a long enough answer"})
    assert r.status_code == 502 and "larger than 20 bytes" in r.json()["error"]
    assert wired.harnesses.held == 0


async def test_a_client_leaving_mid_stream_frees_the_slot(wired, client, platform):
    """The route releases the runtime slot however the stream ends."""
    from caiplatform_server.apis.core_invoke import TurnStreamResponse

    wired.deploy("fn", "function", PYTHON_FUNCTION)
    turn = await platform.invoke.stream(platform_principal(), "fn", None, b'{"message": "hi"}')
    assert wired.harnesses.held == 1
    response = TurnStreamResponse(turn)
    sent: list[dict] = []

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        raise OSError("the client went away")

    with pytest.raises(ClientDisconnect):
        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    assert wired.harnesses.held == 0


async def test_a_client_that_disconnects_while_the_turn_runs_ends_the_stream_and_frees_the_slot(wired, platform):
    """ASGI 2.3 (uvicorn): the server says `http.disconnect` and keeps accepting sends; the stream stops
    waiting for the turn at once, ends without an error and frees the slot."""
    from caiplatform_server.apis.core_invoke import TurnStreamResponse

    wired.deploy("fn", "function", PYTHON_FUNCTION)
    turn = await platform.invoke.stream(platform_principal(), "fn", None, b'{"message": "hi"}')
    never = asyncio.Event()

    async def lines():
        yield b'{"type": "start"}\n'
        await never.wait()  # the turn would go on past the client's departure
        yield b"unreachable\n"

    turn.lines = lines()
    left = asyncio.Event()

    async def receive():
        await left.wait()
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message):
        sent.append(message)
        if message.get("body"):
            left.set()  # the client reads the first line and goes away

    await asyncio.wait_for(TurnStreamResponse(turn)({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send), 5)
    assert [m.get("body") for m in sent[1:]] == [b'{"type": "start"}\n']
    assert wired.harnesses.held == 0


def platform_principal():
    from caiplatform.principal import Principal

    return Principal.anonymous("127.0.0.1")


async def test_unwired_service_is_503(settings):
    from caiplatform.errors import Unavailable
    from caiplatform.services.invoke import InvokeService

    with pytest.raises(Unavailable, match="agent invocation is not configured on this platform"):
        await InvokeService(settings).invoke(platform_principal(), "x", None, b'{"message": "hi"}')
