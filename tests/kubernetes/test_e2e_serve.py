"""End to end: `caiplatform serve` with `CAI_RUNTIME=kubernetes` against the API emulator (and its
controller double) deploys an agent, lists its revisions, splits traffic, reads the quota, creates a
memory store and an MCP server (a Knative Service of its own, built by a BuildKit Job) and deletes the
project, over HTTP; afterwards the emulator holds nothing of the project."""

from __future__ import annotations

import time

import httpx
import pytest

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.kube_cluster import emulated_cluster
from caiplatform.testing.kube_emulator import live, snapshot
from caiplatform.testing.kube_schemas import audit
from caiplatform.testing.serve import ServeProcess
from tests.conformance.kube_support import ROLE

from ..examples_support import example_tarball

pytestmark = pytest.mark.e2e


ECHO_TOOL = """
from caiplatform.mcp import tool

@tool
def echo(text: str) -> str:
    \"\"\"Say it back.\"\"\"
    return text
"""


def settled(admin: httpx.Client, project: str, name: str, revision: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        view = admin.get(f"/v1/agents/{name}", params={"project": project}).json()
        if view.get("state") not in ("building", "deploying") and view.get("latest_revision") == revision:
            assert view["ready"], view
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.2)


def split(admin: httpx.Client, q: dict) -> dict:
    return {r["name"]: r["traffic_percent"] for r in admin.get("/v1/agents/fn/revisions", params=q).json()["revisions"]}


def test_a_project_on_the_kubernetes_runtime_over_http(tmp_path):
    with emulated_cluster() as cluster:
        env = {"CAI_RUNTIME": "kubernetes", "CAI_KUBE_API_URL": cluster.settings.host,
               "CAI_BUILD_CONTEXT_DIR": str(tmp_path / "build-context")}
        with ServeProcess(tmp_path / "data", env=env) as server:
            token = httpx.post(f"{server.base_url}/v1/auth/login",
                               json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
            admin = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

            r = admin.post("/v1/projects", json={"slug": "on-cluster", "name": "On a cluster"})
            assert r.status_code == 201 and "warning" not in r.json(), r.text
            project = r.json()["project"]
            q = {"project": "on-cluster"}

            upload = {"code": ("code.tar.gz", example_tarball("python-function"), "application/gzip")}
            r = admin.post("/v1/agents", params=q, data={"name": "fn", "framework": "function"}, files=upload)
            assert r.status_code == 202, r.text
            settled(admin, "on-cluster", "fn", "fn-00001")
            r = admin.patch("/v1/agents/fn/env", params=q, json={"set": {"GREETING": "bonjour"}})
            assert r.status_code == 200, r.text
            settled(admin, "on-cluster", "fn", "fn-00002")

            revisions = admin.get("/v1/agents/fn/revisions", params=q).json()["revisions"]
            assert [r["name"] for r in revisions] == ["fn-00002", "fn-00001"] and all(r["ready"] for r in revisions)
            r = admin.post("/v1/agents/fn/set-traffic", params=q, json={"traffic": [
                {"revision_name": "fn-00001", "percent": 25}, {"revision_name": "fn-00002", "percent": 75}]})
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + 30
            while split(admin, q) != {"fn-00001": 25, "fn-00002": 75}:
                assert time.monotonic() < deadline
                time.sleep(0.2)

            quota = admin.get(f"/v1/projects/{project['id']}/quota").json()
            assert quota["note"] == "live from enforcement; read-only"
            by_resource = {e["resource"]: e for e in quota["quotas"]}
            assert int(by_resource["pods"]["used"]) >= 0 and by_resource["services"]["used"] == "4"
            namespace = quota["namespace"]

            r = admin.post(f"/v1/projects/{project['id']}/memorystores", json={"name": "cache"})
            assert r.status_code == 201, r.text
            deadline = time.monotonic() + 30
            while not admin.get(f"/v1/projects/{project['id']}/memorystores/cache").json().get("ready"):
                assert time.monotonic() < deadline
                time.sleep(0.2)
            store = admin.get(f"/v1/projects/{project['id']}/memorystores/cache").json()
            assert store["connection"]["host"].startswith(f"ms-cache.{namespace}") and store["connection"]["port"] == 6379

            servers = f"/v1/projects/{project['id']}/mcpservers"
            r = admin.post(servers, json={"name": "tools"})
            assert r.status_code == 201, r.text
            r = admin.put(f"{servers}/tools/tools/echo", json={"handler": ECHO_TOOL})
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + 60
            while (server := admin.get(f"{servers}/tools").json()["mcp_server"])["status"] != "ready":
                assert server["status"] in ("building", "deploying", "pending") and time.monotonic() < deadline, server
                time.sleep(0.2)
            assert server["url"] == f"http://tools-mcp.{namespace}.svc.cluster.local/mcp" and server["version"] == 1
            (service,) = [o.raw for ns, n, o in live(cluster.emulator, "services", "serving.knative.dev")
                          if ns == namespace and n == "tools-mcp"]
            container = service["spec"]["template"]["spec"]["containers"][0]
            assert container["image"] == server["image"] and container["command"][-1] == "caiplatform.mcp.server"
            assert not [e for e in container["env"] if e["name"] == "CAI_MCP_AUTH_TOKEN" and "value" in e]
            jobs = [o.raw for _, _, o in live(cluster.emulator, "jobs", "batch")]
            assert any(j["metadata"]["annotations"]["caiplatform.dev/repository"].endswith("-mcp-tools") for j in jobs)

            assert admin.delete("/v1/agents/fn", params=q).status_code in (200, 202, 204)
            r = admin.delete(f"/v1/projects/{project['id']}")
            assert r.status_code in (200, 202, 204), r.text
            deadline = time.monotonic() + 30
            while [1 for (_, ns, _), o in snapshot(cluster.emulator) if ns == namespace and not o.deleted]:
                assert time.monotonic() < deadline, "the project's namespace still holds objects"
                time.sleep(0.2)
    audit(cluster.emulator, cluster.calls(), ROLE)  # once the emulator's loop has stopped
