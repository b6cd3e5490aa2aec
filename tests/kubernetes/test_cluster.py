"""The Kubernetes adapters together on one emulated cluster: what the port suites cannot see (objects,
Secrets, quota status, reaping), then the ClusterRole checked against every call of the run, both ways:
no call it forbids, no grant nothing used."""

from __future__ import annotations

import asyncio
import base64
import secrets
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from caiplatform.adapters.kubernetes.builder import BuildKitJobBuilder
from caiplatform.adapters.kubernetes.codepool import KubernetesWarmPool
from caiplatform.adapters.kubernetes.mcp_host import KnativeMcpHost
from caiplatform.adapters.kubernetes.memorystore import ValkeyStatefulSetProvisioner
from caiplatform.adapters.kubernetes.projects import KubernetesProjectProvisioner
from caiplatform.adapters.kubernetes.runtime import KnativeRuntime
from caiplatform.codesandbox import CODE, CodeSandboxService
from caiplatform.codesandbox.models import ExecuteRequest
from caiplatform.domain.memorystore import InstanceSpec
from caiplatform.ports.builder import BuildError, BuildRequest
from caiplatform.ports.mcp_host import McpBuild, McpDeployment, McpServeError
from caiplatform.ports.projects import ProjectSpec
from caiplatform.ports.runtime import RevisionSpec, Scaling, TrafficTarget, WorkloadRef
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.routing import HostRouter
from caiplatform.testing import sources
from caiplatform.testing.kube_cluster import live
from caiplatform.testing.kube_codepods import CodePods
from caiplatform.testing.kube_emulator import snapshot
from caiplatform.testing.kube_schemas import Grants, audit, unused_rules, written_objects
from tests.conformance.kube_support import ROLE

#: Grants that only a repair path uses (a step re-run over what an interrupted one left behind).
REPAIR_ONLY = {
    # Waits: a watch starts only when the first list does not already show the end (timing decides which).
    ("batch", "jobs", "watch"): "a build not finished when first listed is watched (tests/kubernetes/test_admission.py)",
    ("serving.knative.dev", "revisions", "watch"): "an MCP revision not decided at the first look is watched",
    ("serving.knative.dev", "services", "watch"): "a traffic change not routed at the first list is watched "
                                                   "(tests/kubernetes/test_watches.py)",
    ("", "pods", "watch"): "a code sandbox pod not ready when first listed is watched (tests/kubernetes/test_code_pool.py)",
    ("", "services", "list"): "services are counted from the objects when the project's quota leaves them unlimited",
    ("rbac.authorization.k8s.io", "rolebindings", "patch"): "a namespace's binding left by an interrupted step is patched",
    ("", "services", "patch"): "a memory store's Service left by an interrupted create is patched, not refused",
    ("", "events", "list"): "a memory store not running when read lists its StatefulSet's events "
                            "(tests/kubernetes/test_quota.py)",
}


ECHO_TOOL = """
from caiplatform.mcp import tool

@tool
def echo(text: str) -> str:
    return text
"""


async def until(check, timeout: float = 30.0):
    for _ in range(int(timeout / 0.02)):
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def secret_data(cluster, namespace: str, name: str) -> dict[str, str]:
    (obj,) = [o for ns, n, o in live(cluster.emulator, "secrets") if ns == namespace and n == name]
    return {k: base64.b64decode(v).decode() for k, v in (obj.raw.get("data") or {}).items()}


@pytest.mark.process  # the code sandbox pod double runs its snippet as a child process
async def test_one_project_on_a_cluster(cluster, tmp_path: Path):
    settings = cluster.settings
    projects = KubernetesProjectProvisioner(settings=settings)
    runtime = KnativeRuntime(settings=settings)
    stores = ValkeyStatefulSetProvisioner(settings=settings)
    builder = BuildKitJobBuilder(settings=settings, context_dir=tmp_path / "ctx")
    project_id = str(uuid.uuid4())
    project = ProjectSpec(project_id, "team", project_id[:8], "org", {"pods": "50", "services": "30", "limits.cpu": "0"})
    ns = project.namespace

    # Projects: the quota holds exactly the table's resources with a hard (0, unlimited, is left out).
    assert (await projects.provision(project)).failed == {}
    assert (await projects.provision(project)).failed == {}  # idempotent: the second run patches
    (quota,) = [o.raw for qns, _, o in live(cluster.emulator, "resourcequotas") if qns == ns]
    assert quota["spec"]["hard"] == {"pods": "50", "services": "30"}

    # Workloads: two revisions, a split, a secret kept in a Secret, usage from the quota's status.
    ref = WorkloadRef(project_id, project.short, "agent-a")
    first = RevisionSpec(ref, "agent-a-00001", 1, "registry.local/a@sha256:" + "1" * 64, secret_env={"TOKEN": "s3cret"},
                         scaling=Scaling(min_scale=1))
    await runtime.apply(first)
    await until(lambda: _ready(runtime, ref, "agent-a-00001"))
    assert secret_data(cluster, ns, "agent-a-00001-env") == {"TOKEN": "s3cret"}
    second = RevisionSpec(ref, "agent-a-00002", 2, "registry.local/a@sha256:" + "2" * 64, scaling=Scaling(min_scale=1))
    await runtime.apply(second)
    await until(lambda: _ready(runtime, ref, "agent-a-00002"))
    await runtime.set_traffic(ref, [TrafficTarget(40, "agent-a-00001"), TrafficTarget(60, "agent-a-00002", tag="next")])
    status = await until(lambda: _split(runtime, ref))
    assert {r.name: r.traffic_percent for r in status.revisions} == {"agent-a-00001": 40, "agent-a-00002": 60}
    usage = await until(lambda: _usage(runtime, ns, pods=2))
    pods = [(o.raw["metadata"]["creationTimestamp"], n) for pns, n, o in live(cluster.emulator, "pods") if pns == ns]
    pod = max(pods)[1]  # logs come from the newest instance
    revision = pod.rpartition("-deployment-")[0]
    cluster.emulator.pod_logs[(ns, pod)] = "2026-11-25T10:00:00.000000001Z started\n2026-11-25T10:00:01Z serving\n"
    await runtime.status(ref)  # the last look, which `logs` answers from
    assert [line async for line in runtime.logs(ref, tail=1)] == ["serving"]
    assert [line async for line in runtime.logs(ref, tail=10, follow=True)] == ["started", "serving"]
    history = await runtime.log_history(ref)
    assert [(h.revision, h.pod, h.message) for h in history] == [(revision, pod, "started"), (revision, pod, "serving")]
    assert usage["services"] == 4 and usage["count/deployments.apps"] == 2  # counted: the quota has no hard for it
    assert await runtime.usage("cai-p-nothing0") == {"pods": 0, "services": 0, "count/deployments.apps": 0}
    service = WorkloadRef(project_id, project.short, "agent-a", kind="service")  # another kind, the same name
    await runtime.apply(RevisionSpec(service, "agent-a-00001", 1, "registry.local/s@sha256:" + "3" * 64))
    await until(lambda: _ready(runtime, service, "agent-a-00001"))
    assert (await runtime.spec_document(service))["metadata"]["name"] == "agent-a-svc"

    # Memory stores: the password in force changes only on restart.
    spec = InstanceSpec(project_id, project.short, "cache")
    await stores.create(spec, "first-password")
    instance = await until(lambda: _store_ready(stores, spec))
    assert (instance.host, instance.port) == (f"ms-cache.{ns}.svc.cluster.local", 6379)
    await stores.rotate_password(project_id, "cache", "second-password")
    assert secret_data(cluster, ns, "ms-cache-credential") == {"password": "first-password", "pending-password": "second-password"}
    await stores.restart(project_id, "cache")
    assert secret_data(cluster, ns, "ms-cache-credential") == {"password": "second-password"}
    await until(lambda: _store_ready(stores, spec))
    assert (await stores.health())["kubernetes"].ok

    # Builds: a failure keeps the spec's message limit.
    source = sources.write_tree(tmp_path / "src", {**sources.LANGGRAPH, "nonce": secrets.token_hex(4)})
    request = BuildRequest(project_id, project.short, "agent-a", "langgraph", source)
    image = await builder.build(request)
    assert (await builder.resolve(image.reference)) is not None
    await builder.remove(image.reference)
    cluster.controllers.build_outcome = lambda job: (False, "error: " + "x" * 5000)
    with pytest.raises(BuildError) as failed:
        await builder.build(request)
    assert failed.value.message.endswith("...(truncated)") and len(failed.value.message) == 4000 + len("...(truncated)")

    # MCP servers: a Knative Service through the runtime, secrets in its revision's Secret; every rollout
    # is a revision, and one that fails leaves the one before serving.
    mcp = KnativeMcpHost(builder, runtime, startup_timeout=30)
    tools = [{"name": "echo", "description": "", "handler": ECHO_TOOL, "schema": {}, "credential_keys": []}]
    cluster.controllers.build_outcome = lambda job: (True, "")
    mcp_image = await mcp.build(McpBuild(project_id, project.short, ns, "tools", 1, tools))
    (job,) = [o.raw for _, _, o in live(cluster.emulator, "jobs", "batch")
              if o.raw["metadata"]["annotations"]["caiplatform.dev/repository"].endswith(f"cai-{project.short}-mcp-tools")]
    deployment = McpDeployment(project_id, project.short, ns, "tools", 1, mcp_image, "", env={"CAI_PROJECT_ID": project_id},
                               secret_env={"CAI_MCP_AUTH_TOKEN": "t0ken", "CAI_PROJECT_KEY": "key-1"})
    assert await mcp.serve(deployment) == f"http://tools-mcp.{ns}.svc.cluster.local/mcp"
    mcp_ref = mcp.workload(project_id, project.short, "tools")
    container = (await runtime.spec_document(mcp_ref))["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == mcp_image.image and container["command"] == ["python", "-m", "caiplatform.mcp.server"]
    assert not [e for e in container["env"] if e["name"] in ("CAI_CODE_DIR", "CAI_FRAMEWORK")]  # not a harness image
    assert container["args"] == ["--source", "/app/mcp", "--host", "0.0.0.0", "--name", "tools", "--version", "1"]
    assert secret_data(cluster, ns, "tools-mcp-00001-env") == {"CAI_MCP_AUTH_TOKEN": "t0ken", "CAI_PROJECT_KEY": "key-1"}
    url = f"http://tools-mcp.{ns}.svc.cluster.local/mcp"
    assert await mcp.still_serving(project_id, project.short, "tools", 1) == url  # a restart leaves it be
    assert await mcp.still_serving(project_id, project.short, "tools", 2) is None
    assert await mcp.still_serving(project_id, project.short, "other", 1) is None
    failing = replace(deployment, version=2, env={**deployment.env, "TINY_FAIL_START": "1"})
    with pytest.raises(McpServeError, match="version 2 did not start: ExitCode1"):
        await mcp.serve(failing)
    status = await runtime.status(mcp_ref)
    assert status.latest_ready_revision == "tools-00001" and status.latest_created_revision == "tools-00002"
    assert await mcp.still_serving(project_id, project.short, "tools", 1) is None  # its last rollout failed
    assert {r.name: r.traffic_percent for r in status.revisions} == {"tools-00001": 100, "tools-00002": 0}
    assert await mcp.serve(replace(deployment, secret_env={**deployment.secret_env, "CAI_PROJECT_KEY": "key-2"})) \
        == f"http://tools-mcp.{ns}.svc.cluster.local/mcp"  # a rollback: the same version, a new revision
    assert secret_data(cluster, ns, "tools-mcp-00003-env")["CAI_PROJECT_KEY"] == "key-2"
    assert await mcp.still_serving(project_id, project.short, "tools", 1) == url
    hosts = HostRouter("apps.example")
    exposed = KnativeMcpHost(builder, runtime, hosts=hosts, startup_timeout=30)
    await exposed.serve(replace(deployment, expose="apps"))
    upstream = hosts.lookup(hosts.host_for("tools", project.short))
    assert upstream is not None and (await upstream()).base_url == f"http://tools-mcp.{ns}.svc.cluster.local"
    await exposed.serve(deployment)  # no longer exposed
    assert hosts.lookup(hosts.host_for("tools", project.short)) is None
    await exposed.serve(replace(deployment, expose="apps"))
    await KnativeMcpHost(builder, runtime).remove(project_id, "tools")  # another replica's host: found by label
    await exposed.remove(project_id, "tools")
    assert hosts.lookup(hosts.host_for("tools", project.short)) is None
    assert await runtime.status(mcp_ref) is None
    assert not [n for sns, n, _ in live(cluster.emulator, "secrets") if sns == ns and n.startswith("tools-mcp-")]
    await mcp.remove(project_id, "tools")  # idempotent
    assert "tar -xzf /workspace/" in job["spec"]["template"]["spec"]["containers"][0]["command"][2]

    # Reaping: deleting a workload takes its revisions' Secrets; deleting the store its objects; the
    # project's namespace takes the rest.
    await runtime.delete(ref)
    assert not [n for sns, n, _ in live(cluster.emulator, "secrets") if sns == ns and n.startswith("agent-a-0")]
    assert [n for cns, n, _ in live(cluster.emulator, "persistentvolumeclaims") if cns == ns] == ["data-ms-cache-0"]
    assert (await stores.delete(project_id, "cache")) is not None
    assert not [n for cns, n, _ in live(cluster.emulator, "persistentvolumeclaims") if cns == ns]
    assert await stores.get(project_id, "cache") is None
    assert await projects.provisioned(project) == ["namespace", "quota", "network_policy", "model_credential",
                                                    "cache_access_user"]
    await projects.deprovision(project)
    assert await projects.provisioned(project) == []
    assert not [1 for (_, ons, _), o in snapshot(cluster.emulator) if ons == ns and not o.deleted]

    # The code sandbox: a pod of the warm pool runs one snippet and is deleted (tests/kubernetes/test_code_pool.py).
    pods = CodePods(cluster.emulator)
    kubelet = asyncio.ensure_future(pods.run())
    pool = KubernetesWarmPool(settings, CODE, size=1, transport=pods)
    snippet = await CodeSandboxService(pool, CODE).execute(
        Principal(kind=PrincipalKind.WORKLOAD, project_id=project_id), project_id, ExecuteRequest.parse({"code": "print(1 + 1)"}))
    assert snippet.stdout == "2\n"
    await pool.renew_lease()  # renewed (patched), and read as live by the sweep (test_code_pool.py)
    assert not await pool.lease_ran_out(pool.owner) and await pool.sweep() == []
    await pool.close()
    kubelet.cancel()

    for adapter in (projects, runtime, stores, builder):
        await adapter.close()
    calls = cluster.calls()
    audit(cluster.emulator, calls, ROLE)
    unused = [grant for grant in unused_rules(Grants(ROLE, written_objects(cluster.emulator)), calls) if grant not in REPAIR_ONLY]
    assert unused == [], f"the ClusterRole grants what no adapter call used: {unused}"


async def _ready(runtime, ref, revision):
    status = await runtime.status(ref)
    return status is not None and any(r.name == revision and r.ready for r in status.revisions)


async def _split(runtime, ref):
    status = await runtime.status(ref)
    return status if status and sum(r.traffic_percent for r in status.revisions) == 100 and status.revisions[0].tag else None


async def _usage(runtime, namespace, pods):
    usage = await runtime.usage(namespace)
    return usage if usage.get("pods") == pods else None


async def _store_ready(stores, spec):
    instance = await stores.get(spec.project_id, spec.name)
    return instance if instance is not None and instance.ready else None


async def test_log_history_outlives_the_pods(cluster, tmp_path: Path):
    """The collector keeps what pods wrote: once the revision's pods are gone (its traffic moved on, so
    it scaled to zero) its lines still come from the history, also for a runtime started afresh on the
    same directory (which stores nothing twice); deleting the workload drops its history."""
    history = tmp_path / "history"
    runtime = KnativeRuntime(settings=cluster.settings, history_dir=history, log_poll_seconds=0.02)
    await runtime.start()
    project_id = str(uuid.uuid4())
    ref = WorkloadRef(project_id, project_id[:8], "talker")
    await runtime.apply(RevisionSpec(ref, "talker-00001", 1, "registry.local/t@sha256:" + "4" * 64,
                                     scaling=Scaling(min_scale=1)))
    (pod, ns) = await until(lambda: _a_pod(cluster, ref.namespace))
    cluster.emulator.pod_logs[(ns, pod)] = "2026-11-25T10:00:00.000000001Z started\n2026-11-25T10:00:01Z serving\n"
    await until(lambda: _history_has(runtime, ref, 2))
    cluster.emulator.pod_logs[(ns, pod)] += "2026-11-25T10:00:02Z still serving\n"
    await until(lambda: _history_has(runtime, ref, 3))

    await runtime.apply(RevisionSpec(ref, "talker-00002", 2, "registry.local/t@sha256:" + "5" * 64,
                                     scaling=Scaling(min_scale=1)))
    await until(lambda: _no_pod_of(cluster, ns, "talker-00001"))
    (second, _) = await until(lambda: _a_pod(cluster, ref.namespace))
    cluster.emulator.pod_logs[(ns, second)] = "2026-11-25T10:00:03Z second\n"
    lines = await runtime.log_history(ref)
    assert [(h.revision, h.pod, h.message) for h in lines] == [
        ("talker-00001", pod, "started"), ("talker-00001", pod, "serving"), ("talker-00001", pod, "still serving"),
        ("talker-00002", second, "second")]
    assert [h.message for h in await runtime.log_history(ref, limit=1)] == ["second"]
    assert [h.message for h in await runtime.log_history(ref, since=lines[1].ts)] == ["serving", "still serving", "second"]
    await runtime.close()

    again = KnativeRuntime(settings=cluster.settings, history_dir=history)
    assert await again.collect_logs() == 0  # the live pod's lines are stored already
    assert [h.message for h in await again.log_history(ref)] == ["started", "serving", "still serving", "second"]
    assert len((history / f"{ref.key}.jsonl").read_text().splitlines()) == 4
    # a user's erasure (docs/erasure.md) rewrites the kept history without their lines
    assert await again.erase_log_lines(ref, ["still serv", "nowhere"]) == 1
    assert [h.message for h in await again.log_history(ref)] == ["started", "serving", "second"]
    assert await again.erase_log_lines(ref, ["still serv"]) == 0
    await again.delete(ref)
    assert await again.log_history(ref) == [] and not list(history.glob("*.jsonl"))
    await again.close()
    audit(cluster.emulator, cluster.calls(), ROLE)


async def _a_pod(cluster, namespace):
    pods = [(n, ns) for ns, n, _ in live(cluster.emulator, "pods") if ns == namespace]
    return pods[0] if pods else None


async def _no_pod_of(cluster, namespace, revision):
    return not [n for ns, n, _ in live(cluster.emulator, "pods") if ns == namespace and n.startswith(revision)]


async def _history_has(runtime, ref, count):
    return len(await asyncio.to_thread(lambda: (runtime.history_dir / f"{ref.key}.jsonl").read_text().splitlines())
               if (runtime.history_dir / f"{ref.key}.jsonl").is_file() else []) == count
