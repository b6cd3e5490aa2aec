"""End to end on a real `caiplatform serve` with the scripted model: an ADK agent with a tool answers
buffered and streamed, the session continues, the browser reads the transcript, memorize then recall from
a new session, and the invoke rules answer over the wire."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from caiplatform.testing.example_agents import WEATHER_SCRIPT
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.model_server import ScriptedModel
from caiplatform.testing.serve import ServeProcess
from caiplatform.testing.turn_checks import check_stream_shape, check_transcript

from ..examples_support import example_tarball, wait_ready

pytestmark = pytest.mark.e2e



def test_adk_agent_on_a_real_server(tmp_path):
    model = ScriptedModel()
    with model.serve() as model_url:
        env = {"MODEL_BASE_URL": model_url, "MODEL_API_KEY": "test-key", "MODEL_NAME": "scripted",
               "CAI_INTERNAL_TOKEN": "internal-e2e"}
        with ServeProcess(tmp_path / "data", env=env) as server:
            _talk_to_the_agent(server.base_url, model)


def _talk_to_the_agent(base: str, model: ScriptedModel) -> None:
    token = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
    admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)
    anonymous = httpx.Client(base_url=base, timeout=120)
    r = admin.post("/v1/agents", params={"project": "default"}, data={"name": "weather", "framework": "adk"},
                   files={"code": ("code.tar.gz", example_tarball("adk-weather"), "application/gzip")})
    assert r.status_code == 202, r.text
    wait_ready(admin, "weather")

    model.set_script(WEATHER_SCRIPT)
    r = anonymous.post("/v1/agents/weather/invoke", json={"message": "weather in Paris?"})
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["output"] == "It is sunny in Paris today."
    assert first["reasoning"] == "I should look it up.The tool answered."
    assert first["tool_calls"] == [{"name": "get_weather", "summary": 'called with args={"city": "Paris"}'}]

    model.set_script(WEATHER_SCRIPT)
    with anonymous.stream("POST", "/v1/agents/weather/invoke/stream", json={"message": "weather in Paris?"}) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("application/x-ndjson")
        session_id, user_id = s.headers["X-CAI-Session-Id"], s.headers["X-CAI-User-Id"]
        lines = [json.loads(line) for line in s.iter_lines() if line.strip()]
    check_stream_shape(lines, session_id, user_id)
    assert sum(1 for line in lines if line["type"] == "output") > 1  # token-sized deltas
    assert "".join(line["text"] for line in lines if line["type"] == "output") == first["output"]

    # the session continues; the browser reads it back in the spec's shape
    r = anonymous.post("/v1/agents/weather/invoke", json={"message": "my favourite city is Lyon",
                                                          "session_id": first["session_id"]})
    assert r.status_code == 200 and r.json()["user_id"] == first["user_id"]
    transcript = admin.get(f"/v1/agents/weather/sessions/{first['session_id']}").json()
    check_transcript(transcript["events"], "weather")
    user_texts = [p["text"] for e in transcript["events"] if e["author"] == "user"
                  for p in e["content"]["parts"] if "text" in p]
    assert user_texts == ["weather in Paris?", "my favourite city is Lyon"]
    users = admin.get("/v1/agents/weather/users").json()["users"]
    assert {u["user_id"] for u in users} == {first["user_id"], user_id}
    sessions = admin.get("/v1/agents/weather/sessions", params={"user_id": first["user_id"]}).json()["sessions"]
    assert [s["session_id"] for s in sessions] == [first["session_id"]]

    # memorize, then a new caller's session recalls it
    assert anonymous.post(f"/v1/agents/weather/sessions/{first['session_id']}/memorize").status_code == 401
    r = admin.post(f"/v1/agents/weather/sessions/{first['session_id']}/memorize")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    r = anonymous.post("/v1/agents/weather/invoke", json={"message": "which city is my favourite city?"})
    assert r.status_code == 200
    seen = json.dumps(model.requests[-1].messages)
    assert "my favourite city is Lyon" in seen

    # the rules over the wire
    r = anonymous.post("/v1/agents/weather/invoke", json={"message": "hi", "session_id": "short"})
    assert r.status_code == 400 and r.json()["request_id"] == r.headers["X-Request-Id"]
    assert anonymous.post("/v1/agents/weather/invoke", json={"message": ""}).status_code == 400
    assert anonymous.post("/v1/agents/weather/invoke", json={"message": "hi", "memorize": True}).status_code == 401
    r = anonymous.post("/v1/agents/nobody/invoke", json={"message": "hi"})
    assert (r.status_code, r.json()["error"]) == (404, "unknown agent: nobody")
    r = admin.delete(f"/v1/agents/weather/sessions/{session_id}")
    assert r.status_code == 204
    assert admin.delete(f"/v1/agents/weather/sessions/{session_id}").status_code == 404

    # the public embed routes, gated by the key and the Origin allowlist
    shop = {"Origin": "https://shop.example"}
    embed = admin.put("/v1/agents/weather/embed", json={"enabled": True, "allowed_origins": ["https://shop.example"],
                                                        "title": "Weather"}).json()
    r = anonymous.get(f"/v1/embed/{embed['embed_key']}/config", headers=shop)
    assert r.status_code == 200 and r.json()["title"] == "Weather" and r.json()["agent"] == "weather"
    assert r.headers["access-control-allow-origin"] == "https://shop.example"
    assert anonymous.options(f"/v1/embed/{embed['embed_key']}/invoke", headers=shop).status_code == 204
    r = anonymous.post(f"/v1/embed/{embed['embed_key']}/invoke", json={"message": "hello"}, headers=shop)
    assert r.status_code == 200 and r.json()["output"]
    assert anonymous.get(f"/v1/embed/{embed['embed_key']}/config",
                         headers={"Origin": "https://evil.example"}).status_code == 403

    # the published address serves the harness routes; its session routes refuse outside callers
    admin.patch("/v1/agents/weather/env", json={"set": {"CAI_EXPOSE_EXTERNAL": "none",
                                                         "CAI_EXPOSE_RATE_LIMIT": "100/second"}})
    deadline = time.monotonic() + 240
    while not (view := admin.get("/v1/agents/weather").json()).get("external_url"):
        assert time.monotonic() < deadline, view
        time.sleep(0.5)
    host = {"Host": view["public_url"].split("://", 1)[1]}
    assert anonymous.get("/healthz", headers=host).json() == {"status": "ok"}
    assert anonymous.get("/debug/config", headers=host).json()["framework"] == "adk"
    r = anonymous.post("/invoke", json={"message": "hi from outside"}, headers=host)
    assert r.status_code == 200 and r.json()["output"]
    assert anonymous.get("/users", headers=host).status_code == 401

