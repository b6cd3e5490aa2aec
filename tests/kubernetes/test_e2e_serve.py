"""End to end: `caiplatform serve` with `CAI_RUNTIME=kubernetes` deploys an agent, lists its revisions,
splits traffic, reads the quota, creates a memory store and an MCP server (a Knative Service of its own,
built by a BuildKit Job) and deletes the project, over HTTP; afterwards the cluster holds nothing of the
project. It runs against the API emulator (and its controller double), and, opt-in, against the real
cluster of `CAI_TEST_KUBECONFIG` (skipped otherwise, saying why; docs/kubernetes.md): the test's own
checks read the cluster through its API either way."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from kubernetes.client import ApiException

from caiplatform.adapters.kubernetes.client import ClusterSettings, KubeClient
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.kube_cluster import EmulatedCluster, emulated_cluster
from caiplatform.testing.kube_emulator import snapshot
from caiplatform.testing.kube_schemas import audit
from caiplatform.testing.serve import ServeProcess
from tests.conformance.kube_support import (
    OPT_IN,
    ROLE,
    cluster_serve_env,
    real_cluster,
    real_cluster_settings,
)

from ..examples_support import example_tarball

pytestmark = pytest.mark.e2e


ECHO_TOOL = """
from caiplatform.mcp import tool

@tool
def echo(text: str) -> str:
    \"\"\"Say it back.\"\"\"
    return text
"""


@dataclass
class Target:
    """Where the scenario runs: how the test reads that cluster, and what the server is given."""

    settings: ClusterSettings
    env: dict[str, str]
    unset: tuple[str, ...] = ()
    emulated: EmulatedCluster | None = None
    patience: float = 60.0  # the longest wait for one step (a real cluster pulls images and builds)


@contextlib.contextmanager
def target(kind: str, tmp_path: Any) -> Iterator[Target]:
    if kind == "cluster":
        if not real_cluster():
            pytest.skip(OPT_IN)
        yield Target(real_cluster_settings(os.environ), cluster_serve_env(os.environ), unset=("CAI_KUBE_API_URL",),
                     patience=900.0)
        return
    with emulated_cluster() as cluster:
        yield Target(cluster.settings, {"CAI_RUNTIME": "kubernetes", "CAI_KUBE_API_URL": str(cluster.settings.host),
                                        "CAI_BUILD_CONTEXT_DIR": str(tmp_path / "build-context")}, emulated=cluster)
    audit(cluster.emulator, cluster.calls(), ROLE)  # once the emulator's loop has stopped


def read(method: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """One API read as JSON (None for 404), bounded as the adapters bound theirs."""
    try:
        response = method(*args, _preload_content=False, _request_timeout=(30, 30), **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(json.loads(response.data))


def settled(admin: httpx.Client, project: str, name: str, revision: str, patience: float) -> dict:
    deadline = time.monotonic() + patience
    while True:
        view = admin.get(f"/v1/agents/{name}", params={"project": project}).json()
        if view.get("state") not in ("building", "deploying") and view.get("latest_revision") == revision:
            assert view["ready"], view
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.2)


def split(admin: httpx.Client, q: dict) -> dict:
    return {r["name"]: r["traffic_percent"] for r in admin.get("/v1/agents/fn/revisions", params=q).json()["revisions"]}


@pytest.mark.parametrize("kind", ["emulated", "cluster"])
def test_a_project_on_the_kubernetes_runtime_over_http(tmp_path, kind):
    with target(kind, tmp_path) as on:
        kube = KubeClient(on.settings)
        with ServeProcess(tmp_path / "data", env=on.env, unset=on.unset) as server:
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
            settled(admin, "on-cluster", "fn", "fn-00001", on.patience)
            r = admin.patch("/v1/agents/fn/env", params=q, json={"set": {"GREETING": "bonjour"}})
            assert r.status_code == 200, r.text
            settled(admin, "on-cluster", "fn", "fn-00002", on.patience)

            revisions = admin.get("/v1/agents/fn/revisions", params=q).json()["revisions"]
            assert [r["name"] for r in revisions] == ["fn-00002", "fn-00001"] and all(r["ready"] for r in revisions)
            r = admin.post("/v1/agents/fn/set-traffic", params=q, json={"traffic": [
                {"revision_name": "fn-00001", "percent": 25}, {"revision_name": "fn-00002", "percent": 75}]})
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + on.patience
            while split(admin, q) != {"fn-00001": 25, "fn-00002": 75}:
                assert time.monotonic() < deadline
                time.sleep(0.2)

            quota = admin.get(f"/v1/projects/{project['id']}/quota").json()
            assert quota["note"] == "live from enforcement; read-only"
            by_resource = {e["resource"]: e for e in quota["quotas"]}
            assert int(by_resource["pods"]["used"]) >= 0
            if on.emulated is not None:  # two per revision (document 3)
                assert by_resource["services"]["used"] == "4"
            else:  # and a real Knative adds one of its own per route
                assert int(by_resource["services"]["used"]) >= 4
            namespace = quota["namespace"]

            r = admin.post(f"/v1/projects/{project['id']}/memorystores", json={"name": "cache"})
            assert r.status_code == 201, r.text
            deadline = time.monotonic() + on.patience
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
            deadline = time.monotonic() + on.patience
            while (server := admin.get(f"{servers}/tools").json()["mcp_server"])["status"] != "ready":
                assert server["status"] in ("building", "deploying", "pending") and time.monotonic() < deadline, server
                time.sleep(0.2)
            service = read(kube.custom.get_namespaced_custom_object, "serving.knative.dev", "v1", namespace, "services",
                           "tools-mcp")
            assert service is not None and server["version"] == 1
            assert server["url"] == service["status"]["url"].rstrip("/") + "/mcp"
            if on.emulated is not None:
                assert server["url"] == f"http://tools-mcp.{namespace}.svc.cluster.local/mcp"
            container = service["spec"]["template"]["spec"]["containers"][0]
            assert container["image"] == server["image"] and container["command"][-1] == "caiplatform.mcp.server"
            assert not [e for e in container["env"] if e["name"] == "CAI_MCP_AUTH_TOKEN" and "value" in e]
            jobs = (read(kube.batch.list_namespaced_job, on.settings.build_namespace) or {}).get("items") or []
            assert any((j["metadata"].get("annotations") or {}).get("caiplatform.dev/repository", "").endswith("-mcp-tools")
                       for j in jobs)

            assert admin.delete("/v1/agents/fn", params=q).status_code in (200, 202, 204)
            r = admin.delete(f"/v1/projects/{project['id']}")
            assert r.status_code in (200, 202, 204), r.text
            deadline = time.monotonic() + on.patience
            while read(kube.core.read_namespace, namespace) is not None:
                assert time.monotonic() < deadline, "the project's namespace is still there"
                time.sleep(0.2)
            if on.emulated is not None:
                assert not [1 for (_, ns, _), o in snapshot(on.emulated.emulator) if ns == namespace and not o.deleted]
        kube.api.close()
