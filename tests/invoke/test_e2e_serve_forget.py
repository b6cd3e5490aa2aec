"""Forget a user everywhere (issue 37) end to end on a real `caiplatform serve`, with the scripted model, a
LangGraph agent and a function that logs what it is told: two users with sessions, memorized content and
log lines; one is forgotten while the server is killed (`kill -9`) in the middle of the erasure; after a
restart it converges; the receipt counts what was seeded, the other user is untouched, the audit entry
holds the receipt and none of the erased text; a member without the project admin role is refused."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.model_server import ScriptedModel
from caiplatform.testing.serve import ServeProcess

from ..agents.agents_support import tarball
from ..examples_support import example_tarball, wait_ready

pytestmark = pytest.mark.e2e

ALICE, BOB = "alice-7", "bob-9"
A1, B1 = "alice-session-000000000000001", "bob-session-00000000000000001"
ALICE_SAYS, ALICE_AGAIN = "my secret favourite colour is teal", "and I live in the city of Lyon"
BOB_SAYS = "my favourite sport is rowing on rivers"
MEMBER_EMAIL, MEMBER_PASSWORD = "member@forget.example.com", "member-password-123"

ECHO = """
def handle(event, context):
    print(f"echo for {context.user_id}: {event['message']}", flush=True)
    return {"echo": event["message"]}
"""


def _client(base: str, email: str, password: str) -> httpx.Client:
    token = httpx.post(f"{base}/v1/auth/login", json={"email": email, "password": password}).json()["token"]
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)


def _say(http: httpx.Client, agent: str, user: str, session: str, message: str) -> dict:
    r = http.post(f"/v1/agents/{agent}/invoke", json={"message": message, "session_id": session, "user_id": user})
    assert r.status_code == 200, r.text
    return r.json()


def _history(admin: httpx.Client, agent: str) -> list[str]:
    return [line["message"] for line in admin.get(f"/v1/agents/{agent}/logs/history").json()["lines"]]


def _until(check, timeout: float = 120, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)
    return value


def _seed(base: str) -> tuple[httpx.Client, str]:
    admin = _client(base, ADMIN_EMAIL, ADMIN_PASSWORD)
    anonymous = httpx.Client(base_url=base, timeout=120)
    project_id = next(p["id"] for p in admin.get("/v1/projects").json()["projects"] if p["slug"] == "default")
    r = admin.post("/v1/agents", params={"project": "default"}, data={"name": "weather", "framework": "langgraph"},
                   files={"code": ("code.tar.gz", example_tarball("langgraph-weather"), "application/gzip")})
    assert r.status_code == 202, r.text
    r = admin.post("/v1/agents", params={"project": "default"}, data={"name": "echo", "framework": "function"},
                   files={"code": ("code.tar.gz", tarball({"main.py": ECHO}), "application/gzip")})
    assert r.status_code == 202, r.text
    wait_ready(admin, "weather")
    wait_ready(admin, "echo")

    _say(anonymous, "weather", ALICE, A1, ALICE_SAYS)
    _say(anonymous, "weather", ALICE, A1, ALICE_AGAIN)
    _say(anonymous, "weather", BOB, B1, BOB_SAYS)
    for session in (A1, B1):
        assert admin.post(f"/v1/agents/weather/sessions/{session}/memorize").status_code == 200
    _say(anonymous, "echo", ALICE, A1, ALICE_SAYS)
    _say(anonymous, "echo", BOB, B1, BOB_SAYS)
    _until(lambda: any(ALICE_SAYS in m for m in _history(admin, "echo")) and any(BOB_SAYS in m for m in _history(admin, "echo")))

    # a member of the project without the admin role
    r = admin.post("/v1/users", json={"email": MEMBER_EMAIL, "password": "temporary-password-1"})
    assert r.status_code == 201, r.text
    r = admin.post(f"/v1/projects/{project_id}/members", json={"email": MEMBER_EMAIL})
    assert r.status_code in (200, 201), r.text
    member = _client(base, MEMBER_EMAIL, "temporary-password-1")
    r = member.post("/v1/auth/change-password", json={"current_password": "temporary-password-1",
                                                       "new_password": MEMBER_PASSWORD})
    assert r.status_code == 200, r.text
    member = _client(base, MEMBER_EMAIL, MEMBER_PASSWORD)
    r = member.post(f"/v1/projects/{project_id}/forget", json={"user_id": ALICE})
    assert r.status_code == 403, r.text
    return admin, project_id


def test_forget_survives_kill_9_and_erases_one_user_everywhere(tmp_path):
    model = ScriptedModel()
    data = tmp_path / "data"
    with model.serve() as model_url:
        env = {"MODEL_BASE_URL": model_url, "MODEL_API_KEY": "test-key", "MODEL_NAME": "scripted",
               "CAI_INTERNAL_TOKEN": "internal-e2e"}
        # A pause between steps, so that the kill lands with some steps done and others not.
        first = ServeProcess(data, env={**env, "CAI_ERASURE_STEP_PAUSE_SECONDS": "4"})
        with first:
            admin, project_id = _seed(first.base_url)
            r = admin.post(f"/v1/projects/{project_id}/forget", json={"user_id": ALICE})
            assert r.status_code == 202, r.text
            erasure_id = r.json()["erasure_id"]
            assert r.json()["state"] in ("pending", "running")
            url = f"/v1/projects/{project_id}/erasures/{erasure_id}"
            # the same request while it runs is the same erasure
            assert admin.post(f"/v1/projects/{project_id}/forget", json={"user_id": ALICE}).json()["erasure_id"] == erasure_id
            partial = _until(lambda: (body := admin.get(url).json())["steps_done"] >= 1 and body)
            assert partial["state"] == "running" and partial["steps_done"] < partial["steps_total"] == 6
            assert first.proc is not None
            os.killpg(first.proc.pid, signal.SIGKILL)  # the server and everything it started
            first.proc.wait(10)

        with ServeProcess(data, env=env, port=first.port) as again:
            admin = _client(again.base_url, ADMIN_EMAIL, ADMIN_PASSWORD)
            done = _until(lambda: (body := admin.get(url).json())["state"] == "done" and body)
            _check_erased(admin, project_id, done, partial)
            _check_fresh_start(admin, model)
            _check_deleted_agent(admin, project_id)


def _check_erased(admin: httpx.Client, project_id: str, done: dict, partial: dict) -> None:
    receipts = done["receipts"]
    assert [(r["agent"], r["store"]) for r in receipts] == [
        ("echo", "log_history"), ("echo", "memory"), ("echo", "sessions"),
        ("weather", "log_history"), ("weather", "memory"), ("weather", "sessions")]  # each step once
    assert receipts[: partial["steps_done"]] == partial["receipts"]  # what ran before the kill was kept
    removed = {(r["agent"], r["store"]): r["removed"] for r in receipts}
    assert removed[("weather", "sessions")] == {"sessions": 1, "events": 4}
    assert removed[("weather", "memory")] == {"memories": 2}
    assert removed[("echo", "sessions")] == {"sessions": 1, "events": 2}
    assert removed[("echo", "memory")] == {"memories": 0}
    assert removed[("echo", "log_history")]["lines"] >= 1
    assert done["requested_by"] == ADMIN_EMAIL and done["finished_at"] >= done["started_at"]

    # browse routes no longer list her; bob is untouched everywhere
    for agent in ("weather", "echo"):
        users = admin.get(f"/v1/agents/{agent}/users").json()["users"]
        assert [u["user_id"] for u in users] == [BOB]
        assert admin.get(f"/v1/agents/{agent}/sessions/{A1}").status_code == 404
        assert admin.get(f"/v1/agents/{agent}/sessions/{B1}").json()["event_count"] == 2  # one turn
    history = _history(admin, "echo")
    assert not any(ALICE_SAYS in m or ALICE in m for m in history)
    assert any(BOB_SAYS in m for m in history)

    # the audit log holds the receipt, and nothing of what was erased
    entries = admin.get(f"/v1/projects/{project_id}/audit").json()["entries"]
    forgot = [e for e in entries if e["action"] == "user.forget"]
    assert len(forgot) == 1 and forgot[0]["target"] == ALICE
    detail = json.loads(forgot[0]["detail"])
    assert detail["erasure_id"] == done["erasure_id"] and len(detail["receipts"]) == 6
    assert detail["totals"]["sessions"] == 2 and detail["totals"]["memories"] == 2
    text = json.dumps(entries)
    assert "teal" not in text and "Lyon" not in text



def _check_fresh_start(admin: httpx.Client, model: ScriptedModel) -> None:
    """She starts afresh and recalls nothing of hers; bob's memorized session is still recalled."""
    model.requests.clear()
    r = admin.post("/v1/agents/weather/invoke", json={"message": "what is my favourite colour?", "session_id": A1,
                                                     "user_id": ALICE})
    assert r.status_code == 200, r.text
    transcript = admin.get(f"/v1/agents/weather/sessions/{A1}").json()
    assert transcript["event_count"] == 2
    seen = json.dumps(model.requests[-1].messages)
    assert "teal" not in seen and "Lyon" not in seen
    assert BOB_SAYS in seen


def _check_deleted_agent(admin: httpx.Client, project_id: str) -> None:
    """Deleting an agent leaves its sessions (document 1); erasing every agent still reaches them."""
    _say(admin, "echo", ALICE, A1, "one more thing from alice")
    assert admin.delete("/v1/agents/echo").status_code == 200
    r = admin.post(f"/v1/projects/{project_id}/forget", json={"user_id": ALICE})
    assert r.status_code == 202, r.text
    url = f"/v1/projects/{project_id}/erasures/{r.json()['erasure_id']}"
    done = _until(lambda: (body := admin.get(url).json())["state"] == "done" and body)
    removed = {(x["agent"], x["store"]): x["removed"] for x in done["receipts"]}
    assert removed[("echo", "sessions")] == {"sessions": 1, "events": 2}
    assert removed[("weather", "sessions")] == {"sessions": 1, "events": 2}  # the fresh start above
