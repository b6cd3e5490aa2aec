"""The harness app in-process: every framework answers buffered and streamed, sessions continue,
transcripts read back in the spec's shape, the internal surface refuses outside callers."""

from __future__ import annotations

import asyncio
import json

import pytest

from caiplatform.testing.example_agents import (
    ADK_WEATHER,
    ECHO_FUNCTION_ERRORS,
    ECHO_FUNCTIONS,
    LANGGRAPH_WEATHER,
    PYTHON_FUNCTION,
    WEATHER_SCRIPT,
)
from caiplatform.testing.polling import eventually
from caiplatform.testing.turn_checks import check_stream_shape, check_transcript

LONG_SESSION = "session-0123456789abcdefghij"
TOKEN = "internal-secret-for-tests"
INTERNAL = {"X-CAI-Internal": TOKEN}


def ndjson(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("framework,files", [("adk", ADK_WEATHER), ("langgraph", LANGGRAPH_WEATHER)])
async def test_agent_answers_buffered_and_streamed_with_a_tool(model, harness_env, harness_client, framework, files):
    env = harness_env(framework, files, CAI_INTERNAL_TOKEN=TOKEN)
    client = harness_client(env)
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    model.set_script(WEATHER_SCRIPT)
    r = await client.post("/invoke", json={"message": "weather in Paris?"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output"] == "It is sunny in Paris today."
    assert body["reasoning"] == "I should look it up.The tool answered."
    assert body["tool_calls"] == [{"name": "get_weather", "summary": 'called with args={"city": "Paris"}'}]
    assert set(body) == {"session_id", "user_id", "output", "reasoning", "tool_calls", "events"}
    assert r.headers["X-CAI-Session-Id"] == body["session_id"] and r.headers["X-CAI-User-Id"] == body["user_id"]

    model.set_script(WEATHER_SCRIPT)
    r = await client.post("/invoke/stream", json={"message": "weather in Paris?", "session_id": LONG_SESSION})
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = ndjson(r.text)
    user_id = r.headers["X-CAI-User-Id"]
    check_stream_shape(lines, LONG_SESSION, user_id)
    assert "".join(line["text"] for line in lines if line["type"] == "output") == body["output"]
    assert {"type": "tool_result", "name": "get_weather", "result": "sunny in Paris"} in lines

    # the transcript reads back through the internal surface
    r = await client.get(f"/internal/sessions/{LONG_SESSION}", headers=INTERNAL)
    assert r.status_code == 200, r.text
    check_transcript(r.json()["events"], env["AGENT_NAME"])
    parts = [p for e in r.json()["events"] for p in e["content"]["parts"]]
    assert any(p.get("thought") is True for p in parts)
    assert any("function_call" in p for p in parts) and any("function_response" in p for p in parts)


async def test_session_continues_across_turns(model, harness_env, harness_client):
    client = harness_client(harness_env("langgraph", LANGGRAPH_WEATHER))
    first = (await client.post("/invoke", json={"message": "my name is Ada"})).json()
    second = await client.post("/invoke", json={"message": "and again", "session_id": first["session_id"]})
    assert second.json()["user_id"] == first["user_id"]
    seen = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"]
    assert seen == ["my name is Ada", "and again"]


@pytest.mark.parametrize("framework", list(ECHO_FUNCTIONS))
async def test_function_gets_the_body_as_event_in_every_language(harness_env, harness_client, framework):
    client = harness_client(harness_env(framework, ECHO_FUNCTIONS[framework]))
    assert (await client.get("/healthz")).status_code == 200
    r = await client.post("/invoke", json={"message": "hi", "n": 1})
    assert r.status_code == 200, r.text
    assert r.json() == {"echo": "hi", "keys": ["message", "n"], "agent": client.harness.agent}
    r = await client.post("/invoke/stream", json={"message": "hi"})
    lines = ndjson(r.text)
    assert lines[-1]["type"] == "done"
    assert json.loads("".join(line["text"] for line in lines if line["type"] == "output"))["echo"] == "hi"
    error = ECHO_FUNCTION_ERRORS[framework]
    r = await client.post("/invoke", json={"fail": True})
    assert r.status_code == 500 and r.json()["error"] == error
    r = await client.post("/invoke/stream", json={"fail": True})
    assert ndjson(r.text)[-1] == {"type": "error", "message": error}


@pytest.mark.parametrize("framework", ["function-nodejs", "function-go", "function-ruby"])
async def test_concurrent_calls_run_concurrently_in_one_process(harness_env, harness_client, framework):
    """Two calls that each wait for the other finish only if the child runs them at the same time."""
    files = {
        "function-nodejs": {"index.js": """
            const waiting = [];
            exports.handle = async (event) => {
              if (!event.first) {
                if (!waiting.length) return "not yet";
                waiting.shift()();
                return "second";
              }
              await new Promise((resolve) => waiting.push(resolve));
              return "first";
            };
        """},
        "function-go": {"main.go": """
            package main

            var partner = make(chan struct{})

            func Handle(event map[string]any) (string, error) {
                if event["first"] == true {
                    <-partner
                    return "first", nil
                }
                select {
                case partner <- struct{}{}:
                    return "second", nil
                default:
                    return "not yet", nil
                }
            }
        """},
        "function-ruby": {"main.rb": """
            PARTNER = Queue.new
            def handle(event, context)
              if event["first"]
                PARTNER.pop
                "first"
              elsif PARTNER.num_waiting.zero?
                "not yet"
              else
                PARTNER << :go
                "second"
              end
            end
        """},
    }[framework]
    client = harness_client(harness_env(framework, files))
    assert (await client.get("/healthz")).status_code == 200
    first = asyncio.create_task(client.post("/invoke", json={"first": True}))

    async def second_releases_first() -> bool:
        # "not yet" until the first call waits inside the function; a child that ran one call at a time
        # would never get there, and this would time out.
        second = await client.post("/invoke", json={"first": False})
        assert second.status_code == 200 and second.text in ('"second"', '"not yet"'), second.text
        return second.text == '"second"'

    await asyncio.wait_for(eventually(second_releases_first, "the second call to find the first one waiting",
                                      timeout=20), 30)
    assert (await asyncio.wait_for(first, 20)).text == '"first"'


@pytest.mark.parametrize("framework,files,fragment", [
    ("function-go", {"main.go": "package main\n\nfunc Handle(a, b, c int) int { return a }\n"}, "Handle must look like"),
    ("function-go", {"main.go": "package main\n\nfunc Handle(event any) any { return undefined }\n"}, "undefined"),
    ("function-ruby", {"main.rb": "def handle(event, context\n"}, "SyntaxError"),
    ("function-ruby", {"main.rb": "def other(event, context) = 1\n"}, "must define `handle(event, context)`"),
])
async def test_function_that_cannot_load_fails_health_with_the_reason(harness_env, harness_client, framework, files,
                                                                      fragment):
    client = harness_client(harness_env(framework, files))
    r = await client.get("/healthz")
    assert r.status_code == 503 and fragment in r.json()["error"], r.text


async def test_function_event_body_cap_is_8_mib(harness_env, harness_client):
    client = harness_client(harness_env("function", PYTHON_FUNCTION))
    big = json.dumps({"message": "x" * (8 * 1024 * 1024)})
    r = await client.post("/invoke", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"] == f"request body too large (limit {8 * 1024 * 1024} bytes)"
    ok = json.dumps({"message": "x" * (2 * 1024 * 1024)})
    assert (await client.post("/invoke", content=ok)).status_code == 200


async def test_node_function_that_does_not_export_handle_fails_health(harness_env, harness_client):
    client = harness_client(harness_env("function-nodejs", {"index.js": "exports.other = 1;\n"}))
    r = await client.get("/healthz")
    assert r.status_code == 503 and "must export a function `handle" in r.json()["error"]


@pytest.mark.parametrize("framework,tool", [("function-go", "Go"), ("function-ruby", "Ruby"), ("function-nodejs", "Node.js")])
async def test_functions_without_their_toolchain_say_so(harness_env, harness_client, framework, tool):
    client = harness_client(harness_env(framework, ECHO_FUNCTIONS[framework], PATH="/nonexistent"))
    r = await client.get("/healthz")
    assert r.status_code == 503
    assert f"needs the {tool} toolchain" in r.json()["error"]


async def test_agent_rules_on_the_harness(harness_env, harness_client):
    client = harness_client(harness_env("langgraph", LANGGRAPH_WEATHER))
    r = await client.post("/invoke", json={"message": "  "})
    assert (r.status_code, r.json()["error"]) == (400, "message is required")
    assert r.json()["request_id"] == r.headers["X-Request-Id"]
    # an outside caller of the public address is anonymous: short chosen session ids are refused
    public = {"X-Forwarded-Host": "a-b.apps.localhost"}
    r = await client.post("/invoke", json={"message": "hi", "session_id": "short"}, headers=public)
    assert r.status_code == 400 and r.json()["error"].startswith("session_id must be at least 24 characters")
    r = await client.post("/invoke", json={"message": "hi", "user_id": "bad user"})
    assert r.status_code == 400 and "must match" in r.json()["error"]


async def test_internal_surface_needs_the_internal_token(harness_env, harness_client):
    open_client = harness_client(harness_env("function", PYTHON_FUNCTION))
    r = await open_client.get("/internal/users", headers=INTERNAL)
    assert r.status_code == 503 and "not configured" in r.json()["error"]

    env = harness_env("function", PYTHON_FUNCTION, CAI_INTERNAL_TOKEN=TOKEN)
    client = harness_client(env)
    for headers in ({}, {"X-CAI-Internal": "wrong"}):
        for path in ("/internal/users", "/internal/sessions/x", "/users", "/sessions?user_id=a", "/sessions/x",
                     "/memory", "/internal/anything"):
            assert (await client.get(path, headers=headers)).status_code == 401, path
        assert (await client.post("/sessions/x/memorize", headers=headers)).status_code == 401
    for path in ("/sessions/x", "/memorize", "/recall"):
        assert (await open_client.post(path, headers=INTERNAL)).status_code == 503, path
    assert (await open_client.get("/users")).status_code == 503
    assert (await client.post("/sessions/x", headers=INTERNAL)).status_code == 405
    sessions = []
    for i in range(3):
        r = await client.post("/invoke", json={"message": f"m{i}", "user_id": "alice"})
        sessions.append(r.headers["X-CAI-Session-Id"])
    users = (await client.get("/internal/users", headers=INTERNAL)).json()
    assert [u["user_id"] for u in users["users"]] == ["alice"] and users["users"][0]["session_count"] == 3
    r = await client.get("/internal/sessions", params={"user_id": "alice", "page_size": 2}, headers=INTERNAL)
    page = r.json()
    assert [s["session_id"] for s in page["sessions"]] == sessions[:2] and page["next_page_token"]
    r = await client.get("/internal/sessions", params={"user_id": "alice", "page_token": page["next_page_token"]},
                         headers=INTERNAL)
    assert [s["session_id"] for s in r.json()["sessions"]] == sessions[2:]
    r = await client.get("/internal/sessions", headers=INTERNAL)
    assert (r.status_code, r.json()["error"]) == (400, "the user_id query parameter is required")
    assert (await client.delete(f"/internal/sessions/{sessions[0]}", headers=INTERNAL)).status_code == 204
    r = await client.delete(f"/internal/sessions/{sessions[0]}", headers=INTERNAL)
    assert (r.status_code, r.json()["error"]) == (404, f"session {sessions[0]} not found")


async def test_debug_config_is_narrow(harness_env, harness_client):
    env = harness_env("function", PYTHON_FUNCTION, CAI_INTERNAL_TOKEN=TOKEN, GREETING="hello", STRIPE_API_KEY="sk")
    body = (await harness_client(env).get("/debug/config")).json()
    assert body["agent"] == env["AGENT_NAME"] and body["framework"] == "function"
    assert body["model"] == env["MODEL_NAME"] and body["model_key_present"] is True
    assert body["config_keys"] == ["GREETING"]
    assert TOKEN not in json.dumps(body) and "sk" not in body["config_keys"]
    # Secrets arrive as plain variables; the names the control plane lists in CAI_SECRET_NAMES stay out.
    # The local runtime's process settings are the platform's, not the agent's.
    env = harness_env("function", PYTHON_FUNCTION, GREETING="hello", PLAIN_LOOKING="v", CAI_SECRET_NAMES="PLAIN_LOOKING",
                      PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    assert (await harness_client(env).get("/debug/config")).json()["config_keys"] == ["GREETING"]


async def test_two_agents_in_one_process_use_their_own_model_settings(model, harness_env, harness_client):
    good = harness_client(harness_env("langgraph", LANGGRAPH_WEATHER))
    broken_env = harness_env("langgraph", LANGGRAPH_WEATHER, MODEL_BASE_URL="http://127.0.0.1:9/v1")
    broken = harness_client(broken_env)
    assert (await good.post("/invoke", json={"message": "hi"})).json()["output"] == "you said: hi"
    r = await broken.post("/invoke", json={"message": "hi"})
    assert r.status_code == 500
    assert (await good.post("/invoke", json={"message": "again"})).json()["output"] == "you said: again"


@pytest.mark.parametrize("framework,files", [("adk", ADK_WEATHER), ("langgraph", LANGGRAPH_WEATHER)])
async def test_recalled_memories_reach_the_model_but_not_the_transcript(model, harness_env, harness_client,
                                                                         framework, files):
    client = harness_client(harness_env(framework, files, CAI_INTERNAL_TOKEN=TOKEN))
    r = await client.post("/invoke", headers=INTERNAL,
                          json={"message": "what colour?", "memories": ["User: I like teal"], "session_id": LONG_SESSION})
    assert r.status_code == 200, r.text
    seen = [m for m in model.requests[-1].messages if m["role"] == "user"][-1]["content"]
    seen = seen if isinstance(seen, str) else "".join(p.get("text", "") for p in seen)
    assert "User: I like teal" in seen and seen.endswith("what colour?")
    transcript = (await client.get(f"/internal/sessions/{LONG_SESSION}", headers=INTERNAL)).json()
    assert transcript["events"][0]["content"]["parts"][0]["text"] == "what colour?"
    assert r.json()["events"][0]["content"]["parts"][0]["text"] == "what colour?"
    # an outside caller of the published address cannot inject memories
    r = await client.post("/invoke", headers={"X-Forwarded-Host": "x.apps.localhost"},
                          json={"message": "hi", "memories": ["injected"]})
    seen = [m for m in model.requests[-1].messages if m["role"] == "user"][-1]["content"]
    assert "injected" not in json.dumps(seen)


async def test_redis_session_store_from_the_environment(redis_url, harness_env, harness_client):
    import redis.asyncio as aioredis

    env = harness_env("function", PYTHON_FUNCTION, CAI_INTERNAL_TOKEN=TOKEN, CAI_SESSION_STORE=redis_url)
    client = harness_client(env)
    r = await client.post("/invoke", json={"message": "kept in redis", "user_id": "u1"})
    session_id = r.headers["X-CAI-Session-Id"]
    other = harness_client(env)  # another instance of the same agent sees the session
    transcript = (await other.get(f"/internal/sessions/{session_id}", headers=INTERNAL)).json()
    assert transcript["events"][0]["content"]["parts"] == [{"text": "kept in redis"}]
    redis = aioredis.from_url(redis_url)
    try:
        keys = [k async for k in redis.scan_iter(match=f"cai:sessions:{env['CAI_PROJECT_ID']}:*")]
        assert keys
        await redis.delete(*keys)
    finally:
        await redis.aclose()
