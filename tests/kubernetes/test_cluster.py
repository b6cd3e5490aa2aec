"""The Kubernetes adapters together on one emulated cluster: what the port suites cannot see (objects,
Secrets, quota status, reaping), then the ClusterRole checked against every call of the run, both ways:
no call it forbids, no grant nothing used."""

from __future__ import annotations

import asyncio
import base64
import secrets
import uuid
from pathlib import Path

import pytest

from caiplatform.adapters.kubernetes.builder import KanikoJobBuilder
from caiplatform.adapters.kubernetes.codepool import KubernetesWarmPool
from caiplatform.adapters.kubernetes.memorystore import ValkeyStatefulSetProvisioner
from caiplatform.adapters.kubernetes.projects import KubernetesProjectProvisioner
from caiplatform.adapters.kubernetes.runtime import KnativeRuntime
from caiplatform.codesandbox import CODE, CodeSandboxService
from caiplatform.domain.memorystore import InstanceSpec
from caiplatform.ports.builder import BuildError, BuildRequest
from caiplatform.ports.projects import ProjectSpec
from caiplatform.ports.runtime import RevisionSpec, Scaling, TrafficTarget, WorkloadRef
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.testing import sources
from caiplatform.testing.kube_cluster import emulated_cluster, live
from caiplatform.testing.kube_codepods import CodePods
from caiplatform.testing.kube_emulator import snapshot
from caiplatform.testing.kube_schemas import audit, cluster_role, unused_rules
from tests.conformance.kube_support import ROLE

#: Grants that only a repair path uses (a step re-run over what an interrupted one left behind).
REPAIR_ONLY = {
    ("", "services", "patch"): "a memory store's Service left by an interrupted create is patched, not refused",
}


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


@pytest.fixture
def cluster():
    with emulated_cluster() as emulated:
        yield emulated


async def test_one_project_on_a_cluster(cluster, tmp_path: Path):
    settings = cluster.settings
    projects = KubernetesProjectProvisioner(settings=settings)
    runtime = KnativeRuntime(settings=settings, poll_seconds=0.02)
    stores = ValkeyStatefulSetProvisioner(settings=settings)
    builder = KanikoJobBuilder(settings=settings, context_dir=tmp_path / "ctx", poll_seconds=0.02)
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
    pool = KubernetesWarmPool(settings, CODE, size=1, transport=pods, poll_seconds=0.02)
    snippet = await CodeSandboxService(pool, CODE).execute(
        Principal(kind=PrincipalKind.WORKLOAD, project_id=project_id), project_id, {"code": "print(1 + 1)"})
    assert snippet["stdout"] == "2\n"
    await pool.close()
    kubelet.cancel()

    for adapter in (projects, runtime, stores, builder):
        await adapter.close()
    calls = cluster.calls()
    audit(cluster.emulator, calls, ROLE)
    unused = [grant for grant in unused_rules(cluster_role(ROLE), calls) if grant not in REPAIR_ONLY]
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
