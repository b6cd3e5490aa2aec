"""The serverless API's service routes over HTTP (in-process ASGI) on the in-memory platform."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import yaml

from caiplatform.models.secrets import SecretWrite
from caiplatform.services.service_quota import services_hard
from caiplatform.testing.http import asgi_client
from caiplatform.testing.users import bearer

IMAGE = "registry.local/cai-test-hello@sha256:" + "a" * 64


@pytest.fixture
async def http(platform, users):
    async with asgi_client(platform, ["serverless", "core"]) as c:
        yield c, users.project_id, bearer(platform, users.member), bearer(platform, users.admin), \
            bearer(platform, users.stranger)


def base(pid: str) -> str:
    return f"/v1/projects/{pid}/services"


async def create(c, pid, headers, **body):
    body.setdefault("image", IMAGE)
    r = await c.post(base(pid), headers=headers, json=body)
    assert r.status_code == 202, r.text
    return r.json()


async def test_create_applies_every_default_and_reports_status(http):
    c, pid, member, _, _ = http
    svc = await create(c, pid, member, name="hello")
    assert svc["name"] == "hello" and svc["image"] == IMAGE
    assert svc["command"] == [] and svc["args"] == [] and svc["env"] == {} and svc["env_from"] == []
    assert svc["ports"] == [{"name": "http1", "container_port": 8080}]
    assert svc["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    assert svc["scaling"] == {"min_scale": 0, "max_scale": 10, "container_concurrency": 80}
    assert svc["publish"] == {"enabled": False, "host": ""}
    assert svc["traffic"] == [{"revision_name": "", "latest_revision": True, "percent": 100, "tag": ""}]
    assert svc["runtime_class_name"] == "" and svc["service_account_name"] == "" and svc["timeout_seconds"] == 300
    assert svc["project"].startswith("projects/") and svc["project"].endswith("/services/hello")
    assert svc["created_at"].endswith("Z")
    status = svc["status"]
    assert status["phase"] in ("Pending", "Ready")
    assert status["internal_url"].startswith("http://hello.cai-p-") and status["published"] is False
    assert status["url"] == status["internal_url"] and "external_url" not in status
    assert status["latest_created_revision"] == "hello-00001"
    assert status["generation"] == 1
    assert [c["type"] for c in status["conditions"]] == [
        "Ready", "ServiceReady", "VisibilityEnforced", "RuntimeClassApplied", "TrafficAccepted", "Exposed"]
    for cond in status["conditions"]:
        assert set(cond) == {"type", "status", "reason", "message", "last_transition_time"}

    got = (await c.get(f"{base(pid)}/hello", headers=member)).json()
    assert got["status"]["phase"] == "Ready" and got["status"]["latest_ready_revision"] == "hello-00001"
    assert got["status"]["observed_generation"] == got["status"]["generation"] == 1
    assert got["status"]["traffic"] == [{"revision_name": "hello-00001", "percent": 100, "tag": "", "url": ""}] or \
        got["status"]["traffic"][0]["percent"] == 100


async def test_the_timeout_is_mirrored_into_the_environment(http, received, platform):
    c, pid, member, _, _ = http
    await create(c, pid, member, name="timed", timeout_seconds=42, env={"GREETING": "hi"})
    ref = platform.serverless.ref(await platform.serverless.project(platform_admin(), pid), "timed")
    endpoint = await platform.runtime.acquire(ref, timeout=5)
    async with endpoint.client() as client:
        echoed = (await client.post("/x")).json()
    await endpoint.release()
    assert echoed["env"]["PLATFORM_REQUEST_TIMEOUT_SECONDS"] == "42" and echoed["env"]["GREETING"] == "hi"


def platform_admin():
    from caiplatform.principal import Principal

    return Principal.automation()


async def test_create_validation_messages(http):
    c, pid, member, _, _ = http
    url = base(pid)
    cases = [
        ({"name": "Bad_Name", "image": IMAGE}, "name must be 1 to 52 characters"),
        ({"name": "a" * 53, "image": IMAGE}, "name must be 1 to 52 characters"),
        ({"name": "ok"}, "image is required - "),
        ({"name": "ok", "image": ""}, "image is required - "),
        ({"name": "ok", "image": IMAGE, "timeout_seconds": 0}, "timeout_seconds must be between 1 and 3600"),
        ({"name": "ok", "image": IMAGE, "timeout_seconds": 3601}, "timeout_seconds must be between 1 and 3600"),
        ({"name": "ok", "image": IMAGE, "ports": [{}, {}]}, "ports accepts at most one entry"),
        ({"name": "ok", "image": IMAGE, "ports": [{"name": "grpc"}]}, "ports[0].name must be http1 or h2c"),
        ({"name": "ok", "image": IMAGE, "ports": [{"container_port": 70000}]}, "between 1 and 65535"),
        ({"name": "ok", "image": IMAGE, "scaling": {"min_scale": -1}}, "scaling.min_scale must not be negative"),
        ({"name": "ok", "image": IMAGE, "scaling": {"max_scale": -1}}, "scaling.max_scale must not be negative"),
        ({"name": "ok", "image": IMAGE, "scaling": {"container_concurrency": -1}},
         "scaling.container_concurrency must not be negative"),
        ({"name": "ok", "image": IMAGE, "scaling": {"min_scale": 5, "max_scale": 2}},
         "scaling.min_scale (5) must not be greater than scaling.max_scale (2)"),
        ({"name": "ok", "image": IMAGE, "traffic": [{"latest_revision": True, "percent": 90}]},
         "traffic percentages must sum to 100 (got 90)"),
        ({"name": "ok", "image": IMAGE, "traffic": [{"latest_revision": True, "percent": 101}]},
         "traffic[0].percent must be between 0 and 100"),
        ({"name": "ok", "image": IMAGE, "traffic": [{"percent": 100}]},
         "traffic[0] needs either revision_name or latest_revision: true"),
        ({"name": "ok", "image": IMAGE, "traffic": [{"revision_name": "ok-00001", "latest_revision": True,
                                                     "percent": 100}]}, "sets both revision_name and latest_revision"),
        ({"name": "ok", "image": IMAGE, "traffic": [{"latest_revision": True, "percent": 50},
                                                    {"latest_revision": True, "percent": 50}]}, "duplicate target"),
        ({"name": "ok", "image": IMAGE, "traffic": [{"latest_revision": True, "percent": 50, "tag": "a"},
                                                    {"revision_name": "ok-00001", "percent": 50, "tag": "a"}]},
         "duplicate tag"),
        ({"name": "ok", "image": IMAGE, "traffic": [{"revision_name": "ok-00007", "percent": 100}]},
         "traffic[0].revision_name 'ok-00007' does not exist"),
    ]
    for body, message in cases:
        r = await c.post(url, headers=member, json=body)
        assert r.status_code == 400, (body, r.text)
        assert message in r.json()["error"], (body, r.json())
    bad = await c.post(url, headers={**member, "content-type": "application/json"}, content=b"{nope")
    assert bad.status_code == 400 and bad.json()["error"].startswith("invalid JSON body: ")
    huge = await c.post(url, headers=member, json={"name": "big", "image": IMAGE, "env": {"X": "y" * 300_000}})
    assert huge.status_code == 413
    # Nothing of the refused bodies was created.
    assert (await c.get(url, headers=member)).json() == {"services": []}


async def test_name_exists_and_max_scale_zero_round_trips(http):
    c, pid, member, _, _ = http
    svc = await create(c, pid, member, name="dup", scaling={"max_scale": 0, "min_scale": 3})
    assert svc["scaling"] == {"min_scale": 3, "max_scale": 0, "container_concurrency": 80}
    r = await c.post(base(pid), headers=member, json={"name": "dup", "image": IMAGE})
    assert r.status_code == 409 and r.json()["error"] == "a service with that name already exists in this project"


async def test_list_pages_and_omits_the_token_on_the_last_page(http):
    c, pid, member, _, _ = http
    for name in ("a1", "a2", "a3"):
        await create(c, pid, member, name=name)
    first = (await c.get(base(pid), headers=member, params={"page_size": 2})).json()
    assert [s["name"] for s in first["services"]] == ["a1", "a2"] and first["next_page_token"]
    second = (await c.get(base(pid), headers=member,
                          params={"page_size": 2, "page_token": first["next_page_token"]})).json()
    assert [s["name"] for s in second["services"]] == ["a3"] and "next_page_token" not in second
    assert (await c.get(base(pid), headers=member, params={"page_size": 201})).status_code == 400
    assert (await c.get(base(pid), headers=member, params={"page_size": 0})).status_code == 400
    foreign = await c.get(f"/v1/projects/{pid}/triggers", headers=member,
                          params={"page_token": first["next_page_token"]})
    assert foreign.status_code == 400
    assert foreign.json()["error"] == "page_token is invalid or was issued for a different list; start from the first page"


async def test_patch_is_sparse_makes_revisions_and_detects_concurrent_changes(http):
    c, pid, member, _, _ = http
    await create(c, pid, member, name="web", env={"A": "1"}, scaling={"min_scale": 1, "max_scale": 5,
                                                                       "container_concurrency": 10})
    url = f"{base(pid)}/web"
    r = await c.patch(url, headers=member, json={"env": {"A": "2"}})
    assert r.status_code == 200, r.text
    svc = r.json()
    assert svc["env"] == {"A": "2"} and svc["scaling"]["max_scale"] == 5  # omitted fields are kept
    assert svc["status"]["latest_created_revision"] == "web-00002" and svc["status"]["generation"] == 2
    # A scaling block replaces the whole block; omitted sub-fields revert to 0, 10, 80.
    svc = (await c.patch(url, headers=member, json={"scaling": {"max_scale": 3}})).json()
    assert svc["scaling"] == {"min_scale": 0, "max_scale": 3, "container_concurrency": 80}
    # Explicit zeros are set.
    svc = (await c.patch(url, headers=member, json={"scaling": {"container_concurrency": 0, "max_scale": 0}})).json()
    assert svc["scaling"] == {"min_scale": 0, "max_scale": 0, "container_concurrency": 0}
    assert svc["status"]["latest_created_revision"] == "web-00004"
    # A stale generation is refused and changes nothing.
    stale = await c.patch(url, headers=member, json={"env": {"A": "3"}, "generation": 1})
    assert stale.status_code == 409
    assert stale.json()["error"] == "the service was modified concurrently - re-read it and retry"
    fresh = (await c.get(url, headers=member)).json()
    assert fresh["env"] == {"A": "2"} and fresh["status"]["generation"] == 4
    ok = await c.patch(url, headers=member, json={"env": {"A": "3"}, "generation": 4})
    assert ok.status_code == 200 and ok.json()["status"]["generation"] == 5
    # Validation as on create.
    bad = await c.patch(url, headers=member, json={"timeout_seconds": 0})
    assert bad.status_code == 400 and "timeout_seconds" in bad.json()["error"]
    assert (await c.patch(url, headers=member, json={"name": "other"})).status_code == 400
    assert (await c.patch(f"{base(pid)}/missing", headers=member, json={})).status_code == 404

    revisions = (await c.get(f"{url}/revisions", headers=member)).json()
    assert [r["name"] for r in revisions["revisions"]] == ["web-00005", "web-00004", "web-00003", "web-00002",
                                                           "web-00001"]
    assert [r["generation"] for r in revisions["revisions"]] == [5, 4, 3, 2, 1]
    newest = revisions["revisions"][0]
    assert set(newest) == {"name", "generation", "image", "ready", "reason", "message", "replicas", "created_at",
                           "traffic_percent", "tag", "url"}
    assert newest["ready"] in ("True", "False", "Unknown")
    assert "next_page_token" not in revisions


async def test_set_traffic_splits_and_checks_every_rule(http):
    c, pid, member, _, _ = http
    await create(c, pid, member, name="split")
    url = f"{base(pid)}/split"
    await c.patch(url, headers=member, json={"env": {"V": "2"}})
    r = await c.post(f"{url}:set-traffic", headers=member, json={"traffic": [
        {"revision_name": "split-00001", "percent": 30, "tag": "old"},
        {"latest_revision": True, "percent": 70}]})
    assert r.status_code == 202, r.text
    svc = r.json()
    assert svc["traffic"] == [{"revision_name": "split-00001", "latest_revision": False, "percent": 30, "tag": "old"},
                              {"revision_name": "", "latest_revision": True, "percent": 70, "tag": ""}]
    live = {t["revision_name"]: t for t in svc["status"]["traffic"]}
    assert live["split-00001"]["percent"] == 30 and live["split-00001"]["tag"] == "old"
    assert live["split-00002"]["percent"] == 70
    revisions = {r["name"]: r for r in (await c.get(f"{url}/revisions", headers=member)).json()["revisions"]}
    assert revisions["split-00001"]["traffic_percent"] == 30 and revisions["split-00002"]["traffic_percent"] == 70

    empty = await c.post(f"{url}:set-traffic", headers=member, json={"traffic": []})
    assert empty.status_code == 400
    assert empty.json()["error"].startswith("traffic is required - send the complete split")
    missing = await c.post(f"{url}:set-traffic", headers=member, json={})
    assert missing.status_code == 400 and missing.json()["error"].startswith("traffic is required - ")
    nope = await c.post(f"{url}:set-traffic", headers=member,
                        json={"traffic": [{"revision_name": "split-00009", "percent": 100}]})
    assert nope.status_code == 400 and "does not exist" in nope.json()["error"]
    sum_off = await c.post(f"{url}:set-traffic", headers=member,
                           json={"traffic": [{"revision_name": "split-00001", "percent": 10}]})
    assert sum_off.status_code == 400 and "sum to 100" in sum_off.json()["error"]

    verb = await c.post(f"{url}:rollback", headers=member, json={})
    assert verb.status_code == 404
    assert verb.json()["error"] == "unknown method ':rollback' - the supported one is ':set-traffic'"
    assert (await c.post(f"{base(pid)}/nobody:set-traffic", headers=member,
                         json={"traffic": [{"latest_revision": True, "percent": 100}]})).status_code == 404


async def test_delete_needs_project_admin_and_releases_the_hostname(http, platform, users):
    c, pid, member, admin, _ = http
    svc = await create(c, pid, member, name="pub", publish={"enabled": True, "host": "ignored.example.com"})
    assert svc["publish"] == {"enabled": True, "host": "ignored.example.com"}
    host = f"pub-{users.project_short}.apps.localhost"
    got = (await c.get(f"{base(pid)}/pub", headers=member)).json()
    assert got["status"]["published"] is True and got["status"]["url"] == f"https://{host}"
    assert got["status"]["external_url"] == f"http://{host}"
    # The published address reaches the service through host routing.
    through = await c.post("/hello?x=1", headers={"Host": host}, content=b"hi")
    assert through.status_code == 200 and through.json()["path"] == "/hello" and through.json()["body"] == "hi"

    denied = await c.delete(f"{base(pid)}/pub", headers=member)
    assert denied.status_code == 403
    assert (await c.get(f"{base(pid)}/pub", headers=member)).status_code == 200
    gone = await c.delete(f"{base(pid)}/pub", headers=admin)
    assert gone.status_code == 204 and gone.content == b""
    assert (await c.get(f"{base(pid)}/pub", headers=member)).status_code == 404
    assert platform.hosts.lookup(host) is None
    assert (await c.post("/hello", headers={"Host": host})).status_code == 404
    assert (await c.delete(f"{base(pid)}/pub", headers=admin)).status_code == 404


async def test_the_404_rule_and_authentication(http):
    c, pid, member, _, stranger = http
    await create(c, pid, member, name="mine")
    assert (await c.get(f"{base(pid)}/mine")).status_code == 401
    for path in (base(pid), f"{base(pid)}/mine", f"{base(pid)}/mine/revisions", f"{base(pid)}/mine/spec"):
        assert (await c.get(path, headers=stranger)).status_code == 404
    assert (await c.get(base("not-a-uuid"), headers=member)).status_code == 404
    assert (await c.get(base(str(uuid.uuid4())), headers=member)).status_code == 404
    assert (await c.delete(f"{base(pid)}/mine", headers=stranger)).status_code == 404


async def test_logs_spec_and_metrics(http, platform, users):
    c, pid, member, _, _ = http
    await create(c, pid, member, name="obs", env={"API_KEY": "very-secret", "DB_PASSWORD": "pw", "PLAIN": "shown"},
                 env_from=[{"secret_name": "creds", "optional": True}])
    url = f"{base(pid)}/obs"
    await c.post("/ping", headers={"Host": f"obs-{users.project_short}.apps.localhost"})
    ref = platform.serverless.ref(await platform.serverless.project(platform_admin(), pid), "obs")
    endpoint = await platform.runtime.acquire(ref, timeout=5)
    async with endpoint.client() as client:
        await client.post("/work")
    await endpoint.release()

    logs = await c.get(f"{url}/logs", headers=member, params={"tail": 50})
    assert logs.status_code == 200 and logs.headers["content-type"].startswith("text/plain")
    assert "handled POST /work" in logs.text
    for tail in ("0", "10001", "x"):
        bad = await c.get(f"{url}/logs", headers=member, params={"tail": tail})
        assert bad.status_code == 400 and bad.json()["error"] == "tail must be an integer between 1 and 10000"

    spec = (await c.get(f"{url}/spec", headers=member)).json()
    assert set(spec) == {"service", "yaml", "note"} and spec["service"] == "obs"
    assert "very-secret" not in spec["yaml"] and "pw" not in yaml.safe_load(spec["yaml"])["spec"]["template"][
        "spec"]["containers"][0]["env"][1]["value"]
    document = yaml.safe_load(spec["yaml"])
    env = {e["name"]: e["value"] for e in document["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env == {"API_KEY": "***REDACTED***", "DB_PASSWORD": "***REDACTED***", "PLAIN": "shown",
                   "PLATFORM_REQUEST_TIMEOUT_SECONDS": "300"}
    assert document["kind"] == "Service" and document["metadata"]["name"] == "obs"

    metrics = (await c.get(f"{url}/metrics", headers=member)).json()
    assert set(metrics) == {"service", "instances", "revisions", "phase", "readiness", "scaling", "note"}
    assert metrics["instances"]["current"] == metrics["instances"]["desired"] >= 1
    (rev,) = metrics["revisions"]
    assert rev == {"name": "obs-00001", "generation": 1, "replicas": rev["replicas"], "ready": True,
                   "traffic_percent": 100, "latest_ready": True, "latest_created": True}
    assert set(metrics["readiness"]) == {"ready", "reason", "message", "last_transition_time"}
    assert metrics["scaling"] == {"min_scale": 0, "max_scale": 10, "container_concurrency": 80}


async def test_logs_of_a_service_without_instances(http, platform):
    c, pid, member, _, _ = http
    await create(c, pid, member, name="cold")
    project = await platform.serverless.project(platform_admin(), pid)
    runtime = platform.runtime
    original = runtime.logs
    runtime.logs = lambda ref, **kw: None  # scaled to zero: no instance runs
    try:
        r = await c.get(f"{base(pid)}/cold/logs", headers=member)
    finally:
        runtime.logs = original
    assert r.status_code == 200 and "no running pods" in r.text and "send a request" in r.text.lower()
    assert project.short


async def test_a_log_stream_that_fails_ends_with_the_reason(http, platform):
    c, pid, member, _, _ = http
    await create(c, pid, member, name="flaky")
    runtime = platform.runtime

    async def broken(ref, **kw):
        yield "first line"
        raise ConnectionError("instance went away")

    original = runtime.logs
    runtime.logs = broken
    try:
        r = await c.get(f"{base(pid)}/flaky/logs", headers=member, params={"follow": "true"})
    finally:
        runtime.logs = original
    assert r.text == "first line\n[log stream ended: instance went away]\n"


async def test_an_image_the_local_runtime_cannot_run_is_accepted_but_not_ready(platform, users):
    from caiplatform.adapters.memory.runtime import default_app_factory

    platform.runtime.app_factory = default_app_factory
    async with asgi_client(platform, ["serverless"]) as c:
        member = bearer(platform, users.member)
        # A command override does not turn a foreign image into a host process.
        r = await c.post(base(users.project_id), headers=member, json={
            "name": "nginx", "image": "nginx:1.27", "command": ["python3", "-m", "http.server"]})
        assert r.status_code == 202, r.text
        svc = (await c.get(f"{base(users.project_id)}/nginx", headers=member)).json()
        assert svc["status"]["phase"] == "NotReady"
        ready = svc["status"]["conditions"][0]
        assert ready["status"] == "False" and ready["reason"] == "ImagePullBackOff"
        assert "nginx:1.27" in ready["message"] and "Kubernetes" in ready["message"]
        (rev,) = (await c.get(f"{base(users.project_id)}/nginx/revisions", headers=member)).json()["revisions"]
        assert rev["ready"] == "False" and rev["reason"] == "ImagePullBackOff"


async def test_healthz(platform):
    async with asgi_client(platform, ["serverless"]) as c:
        r = await c.get("/healthz")
    assert r.status_code == 200
    body = r.json()
    # No cluster: the document's `kubernetes` and `crd` slots say so instead of a bare "ok".
    assert body == {"status": "ok", "service": "serverless", "database": "ok", "sessions": "ok",
                    "kubernetes": "not configured", "crd": "not configured", "runtime": "memory",
                    "kubernetes_detail": "no cluster is configured; services run on the memory runtime",
                    "crd_detail": "no cluster is configured; service records live in the platform database"}


async def test_project_routes_answer_503_without_a_database(http, platform):
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    c, pid, member, _, _ = http
    automation = {"Authorization": "Bearer automation-token-for-tests"}  # resolved without the database
    working = platform.db._sessions
    # Nothing listens on port 1: every unit of work fails to connect.
    platform.db._sessions = sessionmaker(create_engine("postgresql+psycopg://127.0.0.1:1/none",
                                                       connect_args={"connect_timeout": 1}))
    try:
        for call in (c.get(base(pid), headers=automation),
                     c.post(base(pid), headers=automation, json={"name": "x", "image": IMAGE}),
                     c.get(f"/v1/projects/{pid}/triggers", headers=automation)):
            r = await call
            assert r.status_code == 503, r.text
            assert r.json()["error"] == ("the platform database is not configured, so project access cannot be "
                                         "resolved")
    finally:
        platform.db._sessions = working
    assert (await c.get(base(pid), headers=member)).status_code == 200


async def test_a_revision_that_cannot_start_is_accepted_and_reported(http):
    c, pid, member, _, _ = http
    r = await c.post(base(pid), headers=member, json={
        "name": "cfg", "image": IMAGE, "env_from": [{"config_map_name": "settings"}]})
    assert r.status_code == 202, r.text
    svc = r.json()
    assert svc["status"]["phase"] == "NotReady"
    assert svc["status"]["conditions"][1]["reason"] == "CreateContainerConfigError"
    split = await c.post(f"{base(pid)}/cfg:set-traffic", headers=member,
                         json={"traffic": [{"latest_revision": True, "percent": 100, "tag": "main"}]})
    assert split.status_code == 202, split.text
    fixed = await c.patch(f"{base(pid)}/cfg", headers=member, json={"env_from": [
        {"config_map_name": "settings", "optional": True}, {"secret_name": "absent", "optional": True}]})
    assert fixed.status_code == 200 and fixed.json()["status"]["latest_created_revision"] == "cfg-00002"
    assert (await c.get(f"{base(pid)}/cfg", headers=member)).json()["status"]["phase"] == "Ready"
    bad = await c.post(base(pid), headers=member, json={"name": "x", "image": IMAGE, "env_from": [{}]})
    assert bad.status_code == 400 and "exactly one of secret_name or config_map_name" in bad.json()["error"]


async def test_env_from_secrets_reach_the_revision_and_never_the_spec(http, platform, users, received):
    c, pid, member, _, _ = http
    await platform.secrets.put(users.member, pid, SecretWrite(name="db-password", value="hunter2-hunter2"))
    await platform.secrets.put(users.member, pid, SecretWrite(name="bundle", value='{"TOKEN_A": "ta", "PLAIN_B": "pb"}'))
    await create(c, pid, member, name="withsecrets",
                 env_from=[{"secret_name": "db-password"}, {"secret_name": "bundle"}])
    host = f"withsecrets-{users.project_short}.apps.localhost"
    await c.patch(f"{base(pid)}/withsecrets", headers=member, json={"publish": {"enabled": True}})
    echoed = (await c.post("/env", headers={"Host": host})).json()["env"]
    assert echoed["DB_PASSWORD"] == "hunter2-hunter2" and echoed["TOKEN_A"] == "ta" and echoed["PLAIN_B"] == "pb"
    spec = (await c.get(f"{base(pid)}/withsecrets/spec", headers=member)).json()["yaml"]
    assert "hunter2" not in spec and "db-password" in spec
    missing = await create(c, pid, member, name="nosecret", env_from=[{"secret_name": "absent"}])
    assert missing["status"]["conditions"][1]["reason"] == "CreateContainerConfigError"
    assert "absent" in missing["status"]["conditions"][1]["message"]


async def test_start_hands_a_forgetful_runtime_every_accepted_revision_and_the_split(http, platform):
    c, pid, member, _, _ = http
    await create(c, pid, member, name="keep")
    url = f"{base(pid)}/keep"
    await c.patch(url, headers=member, json={"env": {"V": "2"}})
    split = {"traffic": [{"revision_name": "keep-00001", "percent": 40}, {"revision_name": "keep-00002", "percent": 60}]}
    assert (await c.post(f"{url}:set-traffic", headers=member, json=split)).status_code == 202
    project = await platform.serverless.project(platform_admin(), pid)
    await platform.runtime.delete(platform.serverless.ref(project, "keep"))  # a runtime that lost its state
    assert (await c.get(url, headers=member)).json()["status"]["phase"] == "Pending"
    await platform.serverless.start()
    svc = (await c.get(url, headers=member)).json()
    assert svc["status"]["latest_created_revision"] == "keep-00002"
    assert sorted((t["revision_name"], t["percent"]) for t in svc["status"]["traffic"]) == [
        ("keep-00001", 40), ("keep-00002", 60)]


async def test_revisions_count_against_the_project_services_quota(http, platform, monkeypatch):
    """Two services per revision (document 3); a change that does not fit is refused whole, as the
    cluster's quota admission would refuse it."""
    from caiplatform.db.models import Project

    c, pid, member, _, _ = http
    platform.service_quota.enforced = True  # CAI_ENFORCE_SERVICE_QUOTA

    def set_quota(services):
        def run(session):
            project = session.get(Project, pid)
            project.settings = {**(project.settings or {}), "quota": {"services": services}}
        return platform.db.run(run)

    await set_quota("4")
    await create(c, pid, member, name="one")
    assert (await c.patch(f"{base(pid)}/one", headers=member, json={"env": {"A": "1"}})).status_code == 200
    # 4 / 4 used: neither a new service nor a new revision fits, and nothing of them stays.
    refused = await c.post(base(pid), headers=member, json={"name": "two", "image": IMAGE})
    assert refused.status_code == 400
    assert refused.json()["error"].startswith("rejected by the cluster: this project is at its service limit (4 / 4): ")
    assert (await c.get(f"{base(pid)}/two", headers=member)).status_code == 404
    patched = await c.patch(f"{base(pid)}/one", headers=member, json={"env": {"A": "2"}})
    assert patched.status_code == 400 and "(4 / 4)" in patched.json()["error"]
    one = (await c.get(f"{base(pid)}/one", headers=member)).json()
    assert one["env"] == {"A": "1"} and one["status"]["generation"] == 2
    assert [r["name"] for r in (await c.get(f"{base(pid)}/one/revisions", headers=member)).json()["revisions"]] == \
        ["one-00002", "one-00001"]
    # A traffic-only change makes no revision, so it needs no place.
    split = [{"revision_name": "one-00001", "percent": 50}, {"revision_name": "one-00002", "percent": 50}]
    assert (await c.post(f"{base(pid)}/one:set-traffic", headers=member, json={"traffic": split})).status_code == 202
    # One check, shared with the agents area (one lock per project across both).
    assert platform.agents.quota is platform.serverless.quota
    # Two creates racing for the last two places: exactly one gets them, even when the runtime takes
    # its time to apply (the check and the apply run under the project's lock).
    await set_quota("6")
    apply = platform.runtime.apply

    async def slow_apply(*args, **kwargs):
        await asyncio.sleep(0.05)
        return await apply(*args, **kwargs)

    monkeypatch.setattr(platform.runtime, "apply", slow_apply)
    racing = await asyncio.gather(*(c.post(base(pid), headers=member, json={"name": n, "image": IMAGE})
                                    for n in ("two", "three")))
    assert sorted(r.status_code for r in racing) == [202, 400]
    # A project record without the quota field gets the fallback of 60 (document 2, Limits), as the
    # quota view shows; a quota without a services entry is unlimited.
    assert services_hard({}) == 60 and services_hard({"quota": {"pods": "5"}}) == 0
    assert services_hard({"quota": {"services": 2}}) == 2
    # Off by default on one machine (every revision ever rolled would count): the same create passes.
    platform.service_quota.enforced = False
    assert (await c.post(base(pid), headers=member, json={"name": "four", "image": IMAGE})).status_code == 202
