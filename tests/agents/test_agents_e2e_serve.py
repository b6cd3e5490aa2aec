"""End to end on a real `caiplatform serve`: the local builder and process runtime run the examples.

Deploy a LangGraph agent and a Python function, wait for ready, invoke, roll env and config changes into
new revisions, split traffic, read logs and history, restart the server on the same data dir, delete."""

from __future__ import annotations

import time

import httpx
import pytest

from caiplatform.testing.example_agents import WEATHER_SCRIPT
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.model_server import ScriptedModel
from caiplatform.testing.serve import ServeProcess

from ..examples_support import example_tarball, wait_ready

pytestmark = pytest.mark.e2e



def test_deploy_manage_and_delete_on_a_real_server(tmp_path):
    model = ScriptedModel()
    data_dir = tmp_path / "data"
    with model.serve() as model_url:
        env = {"MODEL_BASE_URL": model_url, "MODEL_API_KEY": "test-key", "MODEL_NAME": "scripted",
               "CAI_INTERNAL_TOKEN": "internal-e2e"}
        with ServeProcess(data_dir, env=env) as server:
            base = server.base_url
            token = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
            http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)
            for name, example, framework in (("weather", "langgraph-weather", "langgraph"), ("fn", "python-function", "function")):
                response = http.post("/v1/agents", params={"project": "default"}, data={"name": name, "framework": framework},
                                     files={"code": ("code.tar.gz", example_tarball(example), "application/gzip")})
                assert response.status_code == 202, response.text
            weather = wait_ready(http, "weather")
            assert weather["latest_revision"] == "weather-00001" and weather["image"].startswith("registry.local/cai-")
            fn = wait_ready(http, "fn")
            assert fn["kind"] == "function" and fn["runtime"] == "python"

            model.set_script(WEATHER_SCRIPT)
            answer = httpx.post(f"{base}/v1/agents/weather/invoke", json={"message": "weather in Paris?"}, timeout=120)
            assert answer.status_code == 200, answer.text
            assert answer.json()["output"] == "It is sunny in Paris today."
            assert httpx.post(f"{base}/v1/agents/fn/invoke", json={"message": "hi"}, timeout=120).json()["greeting"] == "hello"

            # Env and config changes roll new revisions; the running revisions never change.
            assert http.patch("/v1/agents/fn/env", json={"set": {"GREETING": "bonjour"}}).json()["env"] == {"GREETING": "bonjour"}
            assert wait_ready(http, "fn")["latest_revision"] == "fn-00002"
            assert httpx.post(f"{base}/v1/agents/fn/invoke", json={"message": "hi"}, timeout=120).json()["greeting"] == "bonjour"
            config = http.patch("/v1/agents/fn/config", json={"scaling": {"max_scale": 2}, "timeout_seconds": 60})
            assert config.status_code == 200 and config.json()["config"]["scaling"] == {"max_scale": 2}
            assert wait_ready(http, "fn")["latest_revision"] == "fn-00003"

            split = [{"revision_name": "fn-00001", "percent": 50}, {"revision_name": "fn-00003", "percent": 50}]
            assert http.post("/v1/agents/fn/set-traffic", json={"traffic": split}).status_code == 202
            revisions = {r["name"]: r for r in http.get("/v1/agents/fn/revisions").json()["revisions"]}
            assert [revisions[n]["traffic_percent"] for n in ("fn-00001", "fn-00002", "fn-00003")] == [50, 0, 50]
            greetings = {httpx.post(f"{base}/v1/agents/fn/invoke", json={"message": "x"}, timeout=120).json()["greeting"]
                         for _ in range(6)}
            assert greetings == {"hello", "bonjour"}

            live = http.get("/v1/agents/weather/logs")
            assert live.status_code == 200 and live.headers["content-type"].startswith("text/plain")
            with http.stream("GET", "/v1/agents/weather/logs", params={"follow": "true"}) as following:
                assert following.status_code == 200
                assert next(following.iter_lines())  # the tail arrives while the stream stays open
            deadline = time.monotonic() + 20
            while not (history := http.get("/v1/agents/weather/logs/history").json())["lines"]:
                assert time.monotonic() < deadline, history
                time.sleep(0.5)
            assert history["count"] == len(history["lines"]) and history["lines"][0]["revision"] == "weather-00001"
            spec = http.get("/v1/agents/fn/spec").json()
            assert "fn" in spec["yaml"] and "test-key" not in spec["yaml"]

        # A restart on the same data dir keeps every agent, revision and split.
        with ServeProcess(data_dir, env=env) as server:
            base = server.base_url
            token = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
            http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)
            assert {a["name"] for a in http.get("/v1/agents").json()["agents"]} == {"weather", "fn"}
            assert http.get("/v1/agents/fn").json()["ready"] is True
            assert httpx.post(f"{base}/v1/agents/fn/invoke", json={"message": "hi"}, timeout=120).status_code == 200
            for name in ("weather", "fn"):
                assert http.delete(f"/v1/agents/{name}").json() == {"agent": name, "deleted": True}
                assert http.get(f"/v1/agents/{name}").status_code == 404
            assert http.get("/v1/agents").json() == {"agents": [], "next_page_token": ""}
