"""The users and sessions browser, memorize's gate, and the public embed routes over HTTP."""

from __future__ import annotations

from caiplatform.services.agent_directory import EmbedTarget
from caiplatform.testing.example_agents import PYTHON_FUNCTION
from caiplatform.testing.turn_checks import check_transcript

LONG = "anonymous-session-0123456789"


async def test_browse_users_sessions_transcripts(wired, client, admin_headers):
    wired.deploy("fn", "function", PYTHON_FUNCTION)
    made = []
    for i in range(3):
        r = await client.post("/v1/agents/fn/invoke", json={"message": f"hello {i}", "user_id": "alice"})
        made.append(r.headers["X-CAI-Session-Id"])
    await client.post("/v1/agents/fn/invoke", json={"message": "from bob", "user_id": "bob"})

    assert (await client.get("/v1/agents/fn/users")).status_code == 401
    r = await client.get("/v1/agents/fn/users", headers=admin_headers)
    assert r.status_code == 200, r.text
    users = r.json()
    assert [u["user_id"] for u in users["users"]] == ["alice", "bob"] and users["next_page_token"] == ""
    assert set(users["users"][0]) == {"user_id", "first_seen", "last_seen", "session_count"}
    r = await client.get("/v1/agents/fn/users?page_size=1", headers=admin_headers)
    assert len(r.json()["users"]) == 1 and r.json()["next_page_token"]
    r = await client.get("/v1/agents/fn/users?page_size=201", headers=admin_headers)
    assert (r.status_code, r.json()["error"]) == (400, "page_size must be between 1 and 200")

    r = await client.get("/v1/agents/fn/sessions", headers=admin_headers)
    assert (r.status_code, r.json()["error"]) == (400, "the user_id query parameter is required")
    r = await client.get("/v1/agents/fn/sessions?user_id=alice&limit=2", headers=admin_headers)
    page = r.json()
    assert [s["session_id"] for s in page["sessions"]] == made[:2]
    assert set(page["sessions"][0]) == {"session_id", "created", "last_update", "event_count", "preview"}
    assert page["sessions"][0]["preview"] == "hello 0"
    r = await client.get(f"/v1/agents/fn/sessions?user_id=alice&page_token={page['next_page_token']}",
                         headers=admin_headers)
    assert [s["session_id"] for s in r.json()["sessions"]] == made[2:]

    r = await client.get(f"/v1/agents/fn/sessions/{made[0]}", headers=admin_headers)
    assert r.status_code == 200
    check_transcript(r.json()["events"], "fn")
    assert r.json()["events"][0]["content"]["parts"] == [{"text": "hello 0"}]
    r = await client.get("/v1/agents/fn/sessions/bad$id", headers=admin_headers)
    assert (r.status_code, r.json()["error"]) == (400, "invalid session id")
    assert (await client.delete(f"/v1/agents/fn/sessions/{made[0]}", headers=admin_headers)).status_code == 204
    r = await client.delete(f"/v1/agents/fn/sessions/{made[0]}", headers=admin_headers)
    assert (r.status_code, r.json()["error"]) == (404, f"session {made[0]} not found")
    r = await client.get(f"/v1/agents/fn/sessions/{made[0]}", headers=admin_headers)
    assert r.status_code == 404
    r = await client.get("/v1/agents/nobody/users", headers=admin_headers)
    assert (r.status_code, r.json()["error"]) == (404, "unknown agent: nobody")


async def test_browsing_without_an_internal_token_is_503(wired, client, admin_headers, platform):
    wired.deploy("fn", "function", PYTHON_FUNCTION)
    platform.settings.internal_token = None
    try:
        for path in ("/v1/agents/fn/users", "/v1/agents/fn/sessions?user_id=a", "/v1/agents/fn/sessions/abc"):
            r = await client.get(path, headers=admin_headers)
            assert r.status_code == 503 and "session browsing is not configured" in r.json()["error"]
        # invoking still works without it
        assert (await client.post("/v1/agents/fn/invoke", json={"message": "hi"})).status_code == 200
    finally:
        platform.settings.internal_token = "internal-token-for-tests"


async def test_memorize_is_always_authenticated(wired, client, admin_headers):
    wired.deploy("fn", "function", PYTHON_FUNCTION)
    r = await client.post(f"/v1/agents/fn/sessions/{LONG}/memorize")
    assert r.status_code == 401
    r = await client.post(f"/v1/agents/fn/sessions/{LONG}/memorize", headers=admin_headers)
    assert (r.status_code, r.json()["error"]) == (404, f"session {LONG} not found")


def _embed(wired, origins):
    target = wired.deploy("widget", "function", PYTHON_FUNCTION)
    wired.directory.embeds["ek_public"] = EmbedTarget(
        target, {"title": "Ask us", "greeting": "Hi!", "allowed_origins": origins}, origins)
    return target


async def test_embed_config_and_invoke_with_cors(wired, client):
    _embed(wired, ["https://shop.example"])
    good = {"Origin": "https://shop.example"}
    r = await client.get("/v1/embed/ek_public/config", headers=good)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://shop.example"
    assert r.json() == {"agent": "widget", "title": "Ask us", "subtitle": "", "greeting": "Hi!", "accent_color": "",
                        "launcher_text": "", "position": "right", "streaming": True}
    r = await client.get("/v1/embed/ek_public/config", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert (await client.get("/v1/embed/nope/config", headers=good)).status_code == 404

    for path in ("/v1/embed/ek_public/config", "/v1/embed/ek_public/invoke"):
        r = await client.options(path, headers={**good, "Access-Control-Request-Method": "POST"})
        assert r.status_code == 204, r.text
        assert r.headers["access-control-allow-origin"] == "https://shop.example"
        assert "POST" in r.headers["access-control-allow-methods"]
        r = await client.options(path, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403

    r = await client.post("/v1/embed/ek_public/invoke", json={"message": "hi"}, headers=good)
    assert r.status_code == 200 and r.json()["echo"] == "hi"
    assert r.headers["access-control-allow-origin"] == "https://shop.example"
    r = await client.post("/v1/embed/ek_public/invoke", json={"message": "hi", "session_id": "short"}, headers=good)
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == "https://shop.example"
    r = await client.post("/v1/embed/ek_public/invoke", json={"message": "hi", "memorize": True}, headers=good)
    assert (r.status_code, r.json()["error"]) == (400, "memorize is not available on the embed route")
    r = await client.post("/v1/embed/ek_public/invoke?stream=true", json={"message": "hi"}, headers=good)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    r = await client.post("/v1/embed/ek_public/invoke", json={"message": "hi"}, headers={"Origin": "https://x.example"})
    assert r.status_code == 403


async def test_the_published_address_serves_the_harness_routes(wired, client, platform):
    target = wired.deploy("pub", "function", PYTHON_FUNCTION, GREETING="hi")
    host = platform.hosts.host_for("pub", target.project_short)
    platform.hosts.register(host, lambda: platform.invoke.public_upstream(target))
    on_host = {"Host": host}
    assert (await client.get("/healthz", headers=on_host)).json() == {"status": "ok"}
    debug = (await client.get("/debug/config", headers=on_host)).json()
    assert debug["agent"] == "pub" and debug["config_keys"] == ["GREETING"]
    r = await client.post("/invoke", json={"message": "hi"}, headers=on_host)
    assert r.status_code == 200 and r.json()["echo"] == "hi"
    r = await client.post("/invoke/stream", json={"message": "hi"}, headers=on_host)
    assert r.status_code == 200 and r.text.strip().splitlines()[-1].startswith('{"type": "done"')
    # outside callers are anonymous: a short chosen session id is refused; the internal routes are locked
    r = await client.post("/invoke", json={"message": "hi", "session_id": "short"}, headers=on_host)
    assert r.status_code == 400
    r = await client.get("/internal/users", headers=on_host)
    assert r.status_code == 401
    assert wired.harnesses.held == 0
