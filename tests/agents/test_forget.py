"""Forget a user everywhere (issue 37) on the in-memory platform with the real harness: two users with
sessions and memorized content, one forgotten; the receipt counts what was seeded, the other user is
untouched, the forgotten one starts afresh and recalls nothing; who may ask; the audit entry."""

from __future__ import annotations

import asyncio
import json
import time

from .test_agents_examples import _deploy, model_server, settings  # noqa: F401 - the same fixtures

REAL_HARNESS = True  # tests/agents/conftest.py: instances are the harness, not the tiny test app

ALICE, BOB = "alice-7", "bob-9"
A1, A2 = "alice-session-000000000000001", "alice-session-000000000000002"
B1 = "bob-session-00000000000000001"
W1 = "alice-widget-session-0000000001"
ALICE_SAYS = "my secret favourite colour is teal"
BOB_SAYS = "my favourite sport is rowing on rivers"


async def _say(client, user: str, session: str, message: str) -> dict:
    r = await client.post("/v1/agents/weather/invoke", json={"message": message, "session_id": session, "user_id": user})
    assert r.status_code == 200, r.text
    return r.json()


async def _seed(client, world) -> None:
    await _deploy(client, world.member, "weather", "langgraph-weather", "langgraph")
    await _say(client, ALICE, A1, ALICE_SAYS)
    await _say(client, ALICE, A1, "and I live in Lyon")
    await _say(client, ALICE, A2, "alice again here")
    await _say(client, BOB, B1, BOB_SAYS)
    for session in (A1, B1):
        r = await client.post(f"/v1/agents/weather/sessions/{session}/memorize", headers=world.admin)
        assert r.status_code == 200, r.text
    # a conversation through the embed widget's public route is one of the agent's sessions too
    shop = {"Origin": "https://shop.example"}
    embed = (await client.put("/v1/agents/weather/embed", headers=world.member,
                              json={"enabled": True, "allowed_origins": ["https://shop.example"]})).json()
    r = await client.post(f"/v1/embed/{embed['embed_key']}/invoke", headers=shop,
                          json={"message": "hello from the widget", "session_id": W1, "user_id": ALICE})
    assert r.status_code == 200, r.text


async def _until_done(client, headers, project_id: str, erasure_id: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = await client.get(f"/v1/projects/{project_id}/erasures/{erasure_id}", headers=headers)
        assert r.status_code == 200, r.text
        if r.json()["state"] == "done":
            return r.json()
        assert time.monotonic() < deadline, r.json()
        await asyncio.sleep(0.05)


async def test_forget_one_user_leaves_the_other(client, world, platform, model_server):  # noqa: F811
    model, _ = model_server
    model.set_script(None)
    await _seed(client, world)
    pid = world.project_id

    r = await client.post(f"/v1/projects/{pid}/forget", headers=world.admin, json={"user_id": ALICE})
    assert r.status_code == 202, r.text
    accepted = r.json()
    assert accepted["state"] in ("pending", "running", "done") and accepted["erasure_id"]
    done = await _until_done(client, world.admin, pid, accepted["erasure_id"])

    by_store = {(x["agent"], x["store"]): x["removed"] for x in done["receipts"]}
    assert by_store[("weather", "sessions")] == {"sessions": 3, "events": 8}  # 4 turns: user + answer each
    assert by_store[("weather", "memory")] == {"memories": 2}  # A1's two exchanges
    assert set(by_store) == {("weather", "sessions"), ("weather", "memory"), ("weather", "log_history")}
    assert (done["steps_done"], done["steps_total"]) == (3, 3)
    assert done["user_id"] == ALICE and done["requested_by"] == "boss@example.com" and done["finished_at"]
    assert "code_sandbox" in done["notes"]

    # the browser no longer lists her; bob is untouched
    users = (await client.get("/v1/agents/weather/users", headers=world.member)).json()["users"]
    assert [u["user_id"] for u in users] == [BOB]
    for session in (A1, A2, W1):
        assert (await client.get(f"/v1/agents/weather/sessions/{session}", headers=world.member)).status_code == 404
    bob = (await client.get(f"/v1/agents/weather/sessions/{B1}", headers=world.member)).json()
    assert bob["event_count"] == 2

    # she starts with no history and recalls nothing of hers; bob's memory is still recalled
    model.requests.clear()
    await _say(client, ALICE, A1, "what is my favourite colour?")
    seen = json.dumps(model.requests[-1].messages)
    assert "teal" not in seen and "Lyon" not in seen
    assert BOB_SAYS in seen  # shared memory: bob's memorized session is still there

    # the audit log holds the receipt and none of what was erased
    entries = (await client.get(f"/v1/projects/{pid}/audit", headers=world.admin)).json()["entries"]
    forgot = [e for e in entries if e["action"] == "user.forget"]
    assert len(forgot) == 1 and forgot[0]["target"] == ALICE and forgot[0]["actor"] == "boss@example.com"
    detail = json.loads(forgot[0]["detail"])
    assert detail["totals"] == {"sessions": 3, "events": 8, "memories": 2, "lines": detail["totals"]["lines"]}
    assert "teal" not in forgot[0]["detail"] and "Lyon" not in forgot[0]["detail"]

    # asking again is harmless: a new erasure that finds nothing left (the session begun since aside)
    again = (await client.post(f"/v1/projects/{pid}/forget", headers=world.admin,
                               json={"user_id": ALICE, "agents": ["weather"]})).json()
    again = await _until_done(client, world.admin, pid, again["erasure_id"])
    removed = {x["store"]: x["removed"] for x in again["receipts"]}
    assert removed["memory"] == {"memories": 0} and removed["sessions"] == {"sessions": 1, "events": 2}


async def test_who_may_forget(client, world, platform, model_server):  # noqa: F811
    await _deploy(client, world.member, "weather", "langgraph-weather", "langgraph")
    pid = world.project_id
    body = {"user_id": ALICE}
    # a member without the project admin role: 403 for the whole project; an outsider: 404
    r = await client.post(f"/v1/projects/{pid}/forget", headers=world.member, json=body)
    assert r.status_code == 403, r.text
    assert (await client.post(f"/v1/projects/{pid}/forget", headers=world.outsider, json=body)).status_code == 404
    assert (await client.post(f"/v1/projects/{pid}/forget", json=body)).status_code == 401
    # the agent's owner may erase in their own agent; another member's agent looks missing
    r = await client.post(f"/v1/projects/{pid}/forget", headers=world.member, json={**body, "agents": ["weather"]})
    assert r.status_code == 202, r.text
    erasure_id = r.json()["erasure_id"]
    r = await client.post(f"/v1/projects/{pid}/forget", headers=world.member2, json={**body, "agents": ["weather"]})
    assert r.status_code == 404, r.text
    r = await client.post(f"/v1/projects/{pid}/forget", headers=world.admin, json={**body, "agents": ["nobody"]})
    assert (r.status_code, r.json()["error"]) == (404, "unknown agent: nobody")
    # reading a receipt: project admins; a member 403, an outsider 404, an unknown id 404
    assert (await client.get(f"/v1/projects/{pid}/erasures/{erasure_id}", headers=world.member)).status_code == 403
    assert (await client.get(f"/v1/projects/{pid}/erasures/{erasure_id}", headers=world.outsider)).status_code == 404
    assert (await client.get(f"/v1/projects/{pid}/erasures/nope", headers=world.admin)).status_code == 404
    other = world.other_project_id
    assert (await client.get(f"/v1/projects/{other}/erasures/{erasure_id}", headers=world.admin)).status_code == 404
    # the request's rules
    for bad in ({}, {"user_id": ""}, {"user_id": "no spaces allowed"}, {"user_id": ALICE, "agents": []},
                {"user_id": ALICE, "agents": ["Bad_Name"]}, {"user_id": ALICE, "extra": 1}):
        r = await client.post(f"/v1/projects/{pid}/forget", headers=world.admin, json=bad)
        assert r.status_code == 400, (bad, r.text)


async def test_sessions_left_by_a_deleted_agent_are_erased_too(client, world, platform, model_server):  # noqa: F811
    """Deleting an agent leaves its sessions (document 1): erasing every agent reaches them as well."""
    model, _ = model_server
    model.set_script(None)
    await _deploy(client, world.member, "weather", "langgraph-weather", "langgraph")
    await _say(client, ALICE, A1, ALICE_SAYS)
    await _say(client, BOB, B1, BOB_SAYS)
    assert (await client.delete("/v1/agents/weather", headers=world.member)).status_code == 200

    r = await client.post(f"/v1/projects/{world.project_id}/forget", headers=world.admin, json={"user_id": ALICE})
    assert r.status_code == 202 and r.json()["agents"] == []
    done = await _until_done(client, world.admin, world.project_id, r.json()["erasure_id"])
    assert done["agents"] == ["weather"]
    assert {x["store"]: x["removed"] for x in done["receipts"]} == {
        "log_history": {}, "memory": {}, "sessions": {"sessions": 1, "events": 2}}

    # deployed again under the same name, the agent has bob's session and none of hers
    await _deploy(client, world.member, "weather", "langgraph-weather", "langgraph")
    users = (await client.get("/v1/agents/weather/users", headers=world.member)).json()["users"]
    assert [u["user_id"] for u in users] == [BOB]
