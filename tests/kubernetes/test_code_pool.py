"""The code sandbox's warm pool on a cluster (`adapters.kubernetes.codepool`), on the emulated cluster with
the code pods' kubelet and network double (`testing.kube_codepods`): warm pods, one snippet each then
deleted, refilled; the Pod and NetworkPolicy valid for the two newest Kubernetes versions (strict), and every
call allowed by the shipped ClusterRole."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from caiplatform.adapters.kubernetes.codepool import KubernetesWarmPool
from caiplatform.codesandbox import CODE, NO_WARM_SANDBOX, CodeSandboxService
from caiplatform.codesandbox.models import ExecuteRequest
from caiplatform.errors import Unavailable
from caiplatform.models.agents import SandboxToolCall
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.testing.kube_cluster import live
from caiplatform.testing.kube_codepods import OOM_MARKER, CodePods
from caiplatform.testing.kube_schemas import audit
from tests.conformance.kube_support import ROLE
from tests.kubernetes.support import until

# The pod double (`testing/kube_codepods.py`) runs each snippet as a child process, as a kubelet would.
pytestmark = pytest.mark.process

NAMESPACE = "caiplatform-sandbox"


@contextlib.asynccontextmanager
async def pool_on(cluster, **options):
    pods = CodePods(cluster.emulator)
    kubelet = asyncio.ensure_future(pods.run())
    pool = KubernetesWarmPool(cluster.settings, CODE, transport=pods, **options)
    try:
        yield pool, pods
    finally:
        await pool.close()
        kubelet.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await kubelet


def sandbox_pods(cluster) -> dict[str, dict]:
    return {name: obj.raw for ns, name, obj in live(cluster.emulator, "pods") if ns == NAMESPACE}


def workload(project_id: str) -> Principal:
    return Principal(kind=PrincipalKind.WORKLOAD, project_id=project_id, key_id="wk1")


async def test_warm_pods_run_one_snippet_each_and_the_pool_refills(cluster):
    project_id = str(uuid.uuid4())
    async with pool_on(cluster, gvisor=True) as (pool, pods):
        service = CodeSandboxService(pool, CODE)
        pool.start()
        await until(lambda: pool.describe()["warm"] == 3)
        first = sandbox_pods(cluster)
        assert len(first) == 3
        for pod in first.values():
            spec = pod["spec"]
            assert spec["runtimeClassName"] == "gvisor"
            (container,) = spec["containers"]
            limits = {"cpu": "1", "memory": "512Mi"}
            assert container["resources"] == {"limits": limits, "requests": limits}
            assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
            assert container["image"] == cluster.settings.harness_image
        (policy,) = [o.raw for ns, _, o in live(cluster.emulator, "networkpolicies", "networking.k8s.io") if ns == NAMESPACE]
        assert policy["spec"]["egress"] == [] and "Egress" in policy["spec"]["policyTypes"]

        result = await service.execute(workload(project_id), project_id, ExecuteRequest.parse({"code": "import math\nprint(math.factorial(20))"}))
        assert result.exit_code == 0 and result.stdout == "2432902008176640000\n" and result.killed is None
        used = pods.runs[-1]["pod"]
        assert used in first and pods.runs[-1]["request"]["argv"][0] == "python"  # the pod image's interpreter
        # The pod that ran it is deleted, never reused; a fresh one takes its place.
        await until(lambda: used not in sandbox_pods(cluster) and pool.describe()["warm"] == 3)
        assert len(sandbox_pods(cluster)) == 3
        shell = await service.execute(workload(project_id), project_id, ExecuteRequest.parse({"code": "echo hi >&2", "language": "shell"}))
        assert shell.stderr == "hi\n" and pods.runs[-1]["pod"] != used

        killed = await service.execute(workload(project_id), project_id, ExecuteRequest.parse({"code": f"{OOM_MARKER}\nx = 1"}))
        assert killed.killed == "memory" and "(512Mi)" in killed.message
        await until(lambda: pool.describe()["warm"] == 3)
        assert pool.describe()["served"] == 3 and pool.describe()["backend"] == "kubernetes"
        assert len({run["pod"] for run in pods.runs}) == 3
    assert sandbox_pods(cluster) == {}  # closing the pool deletes its pods
    audit(cluster.emulator, cluster.calls(), ROLE)


async def test_without_gvisor_the_pods_run_on_the_default_runtime_and_may_use_the_network(cluster):
    async with pool_on(cluster, size=1, network=True) as (pool, _):
        pool.start()
        await until(lambda: pool.describe()["warm"] == 1)
        (pod,) = sandbox_pods(cluster).values()
        assert "runtimeClassName" not in pod["spec"]
        (policy,) = [o.raw for ns, _, o in live(cluster.emulator, "networkpolicies", "networking.k8s.io") if ns == NAMESPACE]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    audit(cluster.emulator, cluster.calls(), ROLE)


async def test_no_warm_pod_within_the_wait_is_the_503(cluster):
    async with pool_on(cluster, size=1, wait_seconds=0.5) as (pool, pods):
        pods.hold_ready = True  # pods that never become ready (an image still pulling)
        with pytest.raises(Unavailable) as refused:
            await pool.acquire()
        assert refused.value.message == NO_WARM_SANDBOX
        assert pool.describe()["refused"] == 1 and pool.describe()["starting"] == 1
        pods.hold_ready = False
        sandbox, waited = await pool.acquire()
        assert waited < 5
        await pool.release(sandbox, ran=False)
    audit(cluster.emulator, cluster.calls(), ROLE)


async def test_a_starting_pod_is_awaited_by_a_watch_not_by_polling(cluster):
    """Issue 36: the pool lists the new pod once, then watches it from the list's resourceVersion until it
    is ready (no read every half second while an image pulls)."""
    async with pool_on(cluster, size=1) as (pool, pods):
        pods.hold_ready = True
        pool.start()
        await until(lambda: len(sandbox_pods(cluster)) == 1)
        (name,) = sandbox_pods(cluster)

        def calls(watching: bool) -> list:
            return [r for r in list(cluster.emulator) if r.resource is not None and r.resource.plural == "pods"
                    and ((r.params or {}).get("watch") == "true") == watching
                    and (r.name == name or (r.params or {}).get("fieldSelector") == f"metadata.name={name}")]

        await until(lambda: calls(watching=True))
        reads_while_starting = len(calls(watching=False))
        pods.hold_ready = False
        await until(lambda: pool.describe()["warm"] == 1)
        (watch, *_) = calls(watching=True)
        assert watch.params.get("resourceVersion")  # from the list's version
        assert reads_while_starting == 1  # the one list; nothing more until the watch said it was ready
    audit(cluster.emulator, cluster.calls(), ROLE)


async def test_sandboxed_tool_calls_are_a_clear_503_on_a_cluster():
    from caiplatform.codesandbox.tool_calls import ToolCallService

    async def no_image(reference):
        raise AssertionError("not looked up")

    tools = ToolCallService(None, None, no_image, unavailable="sandboxed tool calls are not available on a Kubernetes cluster yet")  # type: ignore[arg-type]
    project_id = str(uuid.uuid4())
    with pytest.raises(Unavailable, match="not available on a Kubernetes cluster yet"):
        await tools.call(workload(project_id), project_id, SandboxToolCall.parse({"module_path": "tools.py", "function": "where"}))


async def test_a_fourth_concurrent_snippet_waits_for_a_fresh_pod_and_ended_pods_are_swept(cluster):
    project_id = str(uuid.uuid4())
    async with pool_on(cluster) as (pool, pods):
        service = CodeSandboxService(pool, CODE)
        pool.start()
        await until(lambda: pool.describe()["warm"] == 3)
        answers = await asyncio.gather(*(service.execute(workload(project_id), project_id,
                                                         ExecuteRequest.parse({"code": "import time\ntime.sleep(1)"})) for _ in range(4)))
        assert all(a.exit_code == 0 for a in answers)
        waited = sorted(a.waited_ms for a in answers)
        assert waited[-1] >= 900 and waited[0] < 900, waited  # the fourth waited for a pod to come free
        assert len({run["pod"] for run in pods.runs}) == 4
    # A pod that ended but was left behind (a replica stopped mid-snippet) goes when a pool next starts.
    async with pool_on(cluster, size=1) as (first, _):
        first.start()
        await until(lambda: first.describe()["warm"] == 1)
        (leftover,) = sandbox_pods(cluster)
        [obj for ns, n, obj in live(cluster.emulator, "pods") if n == leftover][0].patch(
            {"status": {"phase": "Failed"}, "metadata": {"labels": {"caiplatform.dev/sandbox-pool": "gone-replica"}}})
        async with pool_on(cluster, size=1) as (second, _):
            second.start()
            await until(lambda: leftover not in sandbox_pods(cluster))
    audit(cluster.emulator, cluster.calls(), ROLE)


async def test_a_crashed_replicas_warm_pods_are_swept_once_its_lease_runs_out(cluster):
    """A control-plane process that dies leaves its warm pods Running (nothing deletes them, they never
    end): another pool deletes them once their owner's lease has run out, never while it is renewed."""
    pods = CodePods(cluster.emulator)
    kubelet = asyncio.ensure_future(pods.run())
    crashed = KubernetesWarmPool(cluster.settings, CODE, transport=pods, size=2, lease_seconds=1)
    try:
        crashed.start()
        await until(lambda: crashed.describe()["warm"] == 2)
        theirs = set(sandbox_pods(cluster))
        async with pool_on(cluster, size=1, lease_seconds=1) as (survivor, _):
            survivor.start()
            await until(lambda: survivor.describe()["warm"] == 1)
            ours = set(sandbox_pods(cluster)) - theirs
            await asyncio.sleep(1.5)  # past the lease's duration, which the live owner keeps renewing
            assert await survivor.sweep() == [] and theirs <= set(sandbox_pods(cluster))
            # The owner dies: its filling and its lease stop, its pods and lease stay behind.
            await crashed._stop_filling()
            crashed._leasing.cancel()
            await until(lambda: not theirs & set(sandbox_pods(cluster)), timeout=60)
            assert ours <= set(sandbox_pods(cluster))  # the survivor's own pod is untouched

            def leases() -> set[str]:
                return {name for _, name, _ in live(cluster.emulator, "leases", "coordination.k8s.io")}

            await until(lambda: crashed.lease_name(crashed.owner) not in leases(), timeout=60)  # its lease goes too
            assert survivor.lease_name(survivor.owner) in leases()
    finally:
        await crashed.http.aclose()
        await crashed.kube.close()
        kubelet.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await kubelet
    audit(cluster.emulator, cluster.calls(), ROLE)
