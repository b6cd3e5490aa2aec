"""A serverless service on `caiplatform serve` (a real process on a loopback port), end to end.

A Python function deployed through the agents API gives the image (`registry.local/cai-...@sha256:...`);
a service runs that image. It is called through its published host on the server's port and through its
private address (which only the platform resolves on one machine, so a pub/sub trigger delivers to it),
rolled into a second revision, split between the two, read (logs, spec, metrics) and deleted."""

from __future__ import annotations

import time

import httpx
import pytest

from caiplatform.testing.serve import ServeProcess

from ..agents.test_agents_e2e_serve import example_tarball

pytestmark = pytest.mark.e2e
TOKEN = "serverless-e2e-automation-token"


def poll(read, done, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not done(value := read()):
        assert time.monotonic() < deadline, f"{what}: {value}"
        time.sleep(0.2)
    return value


def function_image(http: httpx.Client, name: str = "fn") -> str:
    """The image of a Python function, built by the server's own builder through the agents API."""
    deployed = http.post("/v1/agents", params={"project": "default"}, data={"name": name, "framework": "function"},
                         files={"code": ("code.tar.gz", example_tarball("python-function"), "application/gzip")})
    assert deployed.status_code == 202, deployed.text
    agent = poll(lambda: http.get(f"/v1/agents/{name}").json(), lambda v: v.get("state") not in ("building", "deploying"),
                 "the function did not settle", timeout=240)
    assert agent["ready"], agent
    return agent["image"]


def test_a_function_image_as_a_service_on_caiplatform_serve(tmp_path):
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir, env={"CAI_AUTOMATION_TOKEN": TOKEN}).start()
    base = server.base_url
    http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    try:
        def health() -> int:
            assert server.proc is not None and server.proc.poll() is None, server.log_tail()
            try:
                return http.get("/healthz").status_code
            except httpx.HTTPError:
                return 0

        poll(health, lambda s: s == 200, "serve did not answer")
        image = function_image(http)
        assert image.startswith("registry.local/cai-") and "-fn@sha256:" in image
        project = next(p for p in http.get("/v1/projects").json()["projects"] if p["slug"] == "default")
        pid, short = project["id"], project["short"]
        url = f"/v1/projects/{pid}/services"

        created = http.post(url, json={"name": "greeter", "image": image, "publish": {"enabled": True},
                                       "env": {"GREETING": "hello", "API_TOKEN": "s3cr3t-value"}})
        assert created.status_code == 202, created.text
        svc = poll(lambda: http.get(f"{url}/greeter").json(), lambda v: v["status"]["phase"] == "Ready",
                   "the service did not become ready")
        host = f"greeter-{short}.apps.localhost"
        assert svc["status"]["external_url"] == f"http://{host}"
        assert svc["status"]["internal_url"] == f"http://greeter.cai-p-{short}.svc.cluster.local"

        def call(message: str) -> dict:
            answer = httpx.post(f"{base}/invoke", json={"message": message}, headers={"Host": host}, timeout=60)
            assert answer.status_code == 200, answer.text
            return answer.json()

        assert call("hi") == {"greeting": "hello", "echo": "hi", "keys": ["message"]}

        # The private address: a pub/sub trigger's push subscription delivers to it through the platform.
        assert http.post(f"/v1/projects/{pid}/topics", json={"name": "greetings"}).status_code == 201
        trigger = http.post(f"/v1/projects/{pid}/triggers", json={
            "name": "on-greeting", "target": {"service": "greeter", "path": "/invoke"},
            "source": {"type": "pubsub", "pubsub": {"topic": "greetings"}}})
        assert trigger.status_code == 202, trigger.text
        assert trigger.json()["delivery_url"] == f"http://greeter.cai-p-{short}.svc.cluster.local/invoke"
        poll(lambda: http.get(f"/v1/projects/{pid}/triggers/on-greeting").json(), lambda v: v["state"] == "ready",
             "the trigger did not become ready", timeout=30)
        published = http.post(f"/v1/projects/{pid}/topics/greetings:publish",
                              json={"messages": [{"text": '{"message": "by push"}'}]})
        assert published.status_code == 200, published.text
        runs = poll(lambda: http.get(f"/v1/projects/{pid}/triggers/on-greeting").json()["runs"], bool,
                    "the message did not reach the service", timeout=30)
        assert runs[0]["status"] == "succeeded" and runs[0]["http_status"] == 200, runs

        # A new revision, then half of the traffic on each.
        patched = http.patch(f"{url}/greeter", json={"env": {"GREETING": "bonjour", "API_TOKEN": "s3cr3t-value"}})
        assert patched.status_code == 200 and patched.json()["status"]["latest_created_revision"] == "greeter-00002"
        poll(lambda: http.get(f"{url}/greeter").json(), lambda v: v["status"]["latest_ready_revision"] == "greeter-00002",
             "the second revision did not become ready")
        assert call("again")["greeting"] == "bonjour"
        split = [{"revision_name": "greeter-00001", "percent": 50}, {"revision_name": "greeter-00002", "percent": 50}]
        assert http.post(f"{url}/greeter:set-traffic", json={"traffic": split}).status_code == 202
        assert {call("x")["greeting"] for _ in range(12)} == {"hello", "bonjour"}
        revisions = http.get(f"{url}/greeter/revisions").json()["revisions"]
        assert [(r["name"], r["traffic_percent"]) for r in revisions] == [("greeter-00002", 50), ("greeter-00001", 50)]

        logs = http.get(f"{url}/greeter/logs", params={"tail": 50})
        assert logs.status_code == 200 and logs.headers["content-type"].startswith("text/plain") and logs.text
        spec = http.get(f"{url}/greeter/spec").json()
        assert spec["service"] == "greeter" and "***REDACTED***" in spec["yaml"] and "s3cr3t-value" not in spec["yaml"]
        metrics = http.get(f"{url}/greeter/metrics").json()
        assert metrics["service"] == "greeter" and metrics["instances"]["current"] >= 1
        assert metrics["instances"]["desired"] == metrics["instances"]["current"]
        assert {r["name"] for r in metrics["revisions"]} == {"greeter-00001", "greeter-00002"}

        assert http.delete(f"/v1/projects/{pid}/triggers/on-greeting").status_code == 204
        assert http.delete(f"{url}/greeter").status_code == 204
        assert httpx.post(f"{base}/invoke", json={}, headers={"Host": host}, timeout=10).status_code == 404
        assert http.get(f"{url}/greeter").status_code == 404
    finally:
        http.close()
        server.stop()
