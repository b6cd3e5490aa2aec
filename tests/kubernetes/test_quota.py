"""Issue 36: the emulator's ResourceQuota and LimitRange admission (`caiplatform.testing.kube_quota`) refuses
what a cluster's refuses, with the API server's messages, and keeps `status.used`; and a project over its
quota gets the platform's clear error, with the cluster's reason."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from kubernetes.client import ApiException

from caiplatform.adapters.kubernetes.client import KubeClient
from caiplatform.adapters.kubernetes.projects import QUOTA_NAME, KubernetesProjectProvisioner
from caiplatform.ports.projects import ProjectSpec
from caiplatform.testing.kube_cluster import emulated_cluster, live

QUOTA = {"pods": "2", "services": "2", "requests.cpu": "1", "requests.memory": "1Gi", "limits.cpu": "4",
         "limits.memory": "8Gi", "persistentvolumeclaims": "1"}


def pod(name: str, namespace: str, **resources: dict) -> dict:
    container = {"name": "c", "image": "x", **({"resources": resources} if resources else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [container]}}


def refusal(caught: pytest.ExceptionInfo[ApiException]) -> str:
    assert caught.value.status == 403, caught.value
    body = json.loads(caught.value.body)
    assert body["reason"] == "Forbidden"
    return str(body["message"])


def counted(obj: dict) -> bool:
    status = obj.get("status") or {}
    return set(status.get("used") or {}) == set(status.get("hard") or {}) != set()


async def test_quota_admission_refuses_as_the_api_server_and_keeps_status_used():
    with emulated_cluster() as cluster:
        kube = KubeClient(cluster.settings)
        project = ProjectSpec(str(uuid.uuid4()), "quota", "quota123", "org", dict(QUOTA))
        ns, core = project.namespace, kube.core
        provisioner = KubernetesProjectProvisioner(kube)
        await provisioner.namespace(project)
        limit_range = [o for o in await kube.items(core.list_namespaced_limit_range, ns, labels={})]
        assert not limit_range
        # The quota alone first (no LimitRange yet), counted by the quota controller.
        await kube.call(core.create_namespaced_resource_quota, ns, {
            "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": QUOTA_NAME, "namespace": ns},
            "spec": {"hard": dict(QUOTA)}})
        await kube.wait_for(core.list_namespaced_resource_quota, ns, QUOTA_NAME, counted, timeout=20)

        # A quota on cpu and memory makes every container state them (pods.go `Constraints`).
        with pytest.raises(ApiException) as caught:
            await kube.call(core.create_namespaced_pod, ns, pod("bare", ns))
        assert refusal(caught) == ('pods "bare" is forbidden: failed quota: cai-quota: must specify limits.cpu for: c; '
                                   "limits.memory for: c; requests.cpu for: c; requests.memory for: c")

        # The project's LimitRange fills them in (LimitRanger runs before quota), and the pod is stored so.
        await provisioner.quota(project)
        await kube.call(core.create_namespaced_pod, ns, pod("p1", ns))
        stored = await kube.call(core.read_namespaced_pod, "p1", ns)
        assert stored["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"},
                                                                "requests": {"cpu": "100m", "memory": "256Mi"}}
        # Charged at admission, before any controller pass.
        used = (await kube.call(core.read_namespaced_resource_quota, QUOTA_NAME, ns))["status"]["used"]
        assert {k: used[k] for k in ("pods", "requests.cpu", "limits.cpu", "requests.memory", "limits.memory")} == {
            "pods": "1", "requests.cpu": "100m", "limits.cpu": "2", "requests.memory": "256Mi", "limits.memory": "4Gi"}

        # A request defaults from its own limit (SetDefaults_Pod), not from the LimitRange.
        await kube.call(core.create_namespaced_pod, ns, pod("p2", ns, limits={"cpu": "500m", "memory": "512Mi"}))
        stored = await kube.call(core.read_namespaced_pod, "p2", ns)
        assert stored["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}

        with pytest.raises(ApiException) as caught:
            await kube.call(core.create_namespaced_pod, ns, pod("p3", ns))
        assert refusal(caught) == (
            'pods "p3" is forbidden: exceeded quota: cai-quota, requested: limits.cpu=2,limits.memory=4Gi,pods=1, '
            "used: limits.cpu=2500m,limits.memory=4608Mi,pods=2, limited: limits.cpu=4,limits.memory=8Gi,pods=2")

        # A pod that ended counts nothing (PodUsageFunc): once the quota controller recounts, p3 fits.
        (ended,) = [o for n_s, n, o in live(cluster.emulator, "pods") if n_s == ns and n == "p1"]
        ended.patch({"status": {"phase": "Succeeded"}})
        await kube.wait_for(core.list_namespaced_resource_quota, ns, QUOTA_NAME,
                            lambda q: q["status"]["used"]["pods"] == "1", timeout=20)
        await kube.call(core.create_namespaced_pod, ns, pod("p3", ns, requests={"cpu": "100m", "memory": "1Mi"},
                                                              limits={"cpu": "100m", "memory": "1Mi"}))

        # Object counts: services and claims.
        for name in ("s1", "s2"):
            await kube.call(core.create_namespaced_service, ns, {"apiVersion": "v1", "kind": "Service",
                                                                 "metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})
        with pytest.raises(ApiException) as caught:
            await kube.call(core.create_namespaced_service, ns, {"apiVersion": "v1", "kind": "Service",
                                                                 "metadata": {"name": "s3"}, "spec": {"ports": [{"port": 80}]}})
        assert refusal(caught) == ('services "s3" is forbidden: exceeded quota: cai-quota, requested: services=1, '
                                   "used: services=2, limited: services=2")
        assert (403, refusal(caught)) in cluster.emulator.refusals
        await kube.close()


async def test_what_a_controller_creates_meets_the_quota_too():
    """Knative's pods for a revision are created by its Deployment's ReplicaSet through the API: over the pods
    quota they are refused, and the revision says why (the ReplicaSet's FailedCreate)."""
    with emulated_cluster() as cluster:
        kube = KubeClient(cluster.settings)
        project = ProjectSpec(str(uuid.uuid4()), "quota", "ctrl1234", "org", {"pods": "1", "services": "30"})
        provisioner = KubernetesProjectProvisioner(kube)
        ns = project.namespace
        await provisioner.namespace(project)
        await provisioner.quota(project)
        await kube.wait_for(kube.core.list_namespaced_resource_quota, ns, QUOTA_NAME, counted, timeout=20)
        revision = {"metadata": {"name": "fn-00001", "annotations": {"autoscaling.knative.dev/min-scale": "2"}},
                    "spec": {"containers": [{"image": "x"}]}}
        await kube.call(kube.custom.create_namespaced_custom_object, "serving.knative.dev", "v1", ns, "services", {
            "apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": "fn", "namespace": ns},
            "spec": {"template": revision}})

        def failed(obj: dict) -> bool:
            return ((obj.get("status") or {}).get("conditions") or [{}])[0].get("status") == "False"

        seen = await kube.wait_for(
            lambda namespace, **kw: kube.custom.list_namespaced_custom_object("serving.knative.dev", "v1", namespace,
                                                                              "revisions", **kw),
            ns, "fn-00001", failed, timeout=20)
        condition = seen["status"]["conditions"][0]
        assert condition["reason"] == "FailedCreate"
        assert condition["message"] == ('pods "fn-00001-deployment-00001" is forbidden: exceeded quota: cai-quota, '
                                        "requested: pods=1, used: pods=1, limited: pods=1")
        # One pod admitted (`used: pods=1`), the second refused by the API server itself. The admitted pod is
        # not counted here: the revision is failed now, so the controller double scales it down, on a loaded
        # machine sometimes before this line runs.
        assert (403, condition["message"]) in cluster.emulator.refusals
        await kube.close()


async def test_a_memory_store_over_the_projects_services_quota_is_a_clear_502(tmp_path):
    """Document 3: an upstream cluster failure of a memory store's create is 502 `could not create the
    memorystore: ...`; over the project's services quota, what follows is the cluster's reason, in one line
    (not the client's dump of the HTTP exchange), and the create leaves nothing behind."""
    from caiplatform.platform import Platform
    from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD, asgi_client, login
    from tests.settings_support import settings_for

    with emulated_cluster() as cluster:
        settings = settings_for(CAI_ADMIN_EMAIL=ADMIN_EMAIL, CAI_ADMIN_PASSWORD=ADMIN_PASSWORD, CAI_RUNTIME="kubernetes",
                                CAI_KUBE_API_URL=cluster.settings.host, CAI_BUILD_CONTEXT_DIR=str(tmp_path / "build-context"))
        async with Platform.embedded(tmp_path / "data", settings) as platform, asgi_client(platform) as client:
            headers = await login(client)
            r = await client.post("/v1/projects", json={"slug": "full", "name": "Full"}, headers=headers)
            assert r.status_code == 201 and "warning" not in r.json(), r.text
            project = r.json()["project"]
            (quota,) = [o for _, _, o in live(cluster.emulator, "resourcequotas")
                        if o.raw["metadata"]["labels"].get("caiplatform.dev/project") == project["id"]]
            ns = quota.raw["metadata"]["namespace"]
            # The operator lowers the project's services quota to what it already holds: none.
            quota.patch({"spec": {"hard": {"services": "1"}}})
            kube = KubeClient(cluster.settings)
            await kube.call(kube.core.create_namespaced_service, ns, {
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": "other"}, "spec": {"ports": [{"port": 80}]}})
            await kube.wait_for(kube.core.list_namespaced_resource_quota, ns, QUOTA_NAME,
                                lambda q: q["status"]["used"].get("services") == "1" and q["status"]["hard"]["services"] == "1",
                                timeout=20)

            r = await client.post(f"/v1/projects/{project['id']}/memorystores", json={"name": "cache"}, headers=headers)
            assert r.status_code == 502, r.text
            assert r.json()["error"] == (
                'could not create the memorystore: services "ms-cache" is forbidden: exceeded quota: cai-quota, '
                "requested: services=1, used: services=1, limited: services=1")
            left = [(plural, n) for plural in ("secrets", "services", "statefulsets")
                    for n_s, n, _ in live(cluster.emulator, plural, "apps" if plural == "statefulsets" else "")
                    if n_s == ns and n.startswith("ms-cache")]
            assert left == []
            r = await client.get(f"/v1/projects/{project['id']}/memorystores/cache", headers=headers)
            assert r.status_code == 404
            await kube.close()


async def test_a_memory_store_whose_pod_or_claim_the_quota_refuses_says_why():
    """The StatefulSet controller creates a store's claim and pod through the API: refused by the project's
    quota, it records a `FailedCreate` event on the StatefulSet (kubernetes `pkg/controller/statefulset/
    stateful_pod_control.go`), and the store is `Degraded` with that message rather than `Provisioning`
    with none; once the quota lets the pod in, it becomes `Ready`."""
    from caiplatform.adapters.kubernetes.memorystore import ValkeyStatefulSetProvisioner
    from caiplatform.domain.memorystore import InstanceSpec, State

    with emulated_cluster() as cluster:
        kube = KubeClient(cluster.settings)
        provisioner = KubernetesProjectProvisioner(kube)
        stores = ValkeyStatefulSetProvisioner(settings=cluster.settings)

        async def state_of(spec: InstanceSpec, state: State):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                instance = await stores.get(spec.project_id, spec.name)
                if instance is not None and instance.state is state:
                    return instance
                await asyncio.sleep(0.02)
            raise AssertionError(f"{spec.name} did not become {state} within 20 s: {instance}")

        # The pod: a small store requests 256Mi of memory; the project may request 128Mi.
        small = ProjectSpec(str(uuid.uuid4()), "quota", "mem12345", "org", {"requests.memory": "128Mi", "services": "10"})
        await provisioner.namespace(small)
        await provisioner.quota(small)
        await kube.wait_for(kube.core.list_namespaced_resource_quota, small.namespace, QUOTA_NAME, counted, timeout=20)
        spec = InstanceSpec(small.id, small.short, "cache", persistence_enabled=False)
        await stores.create(spec, "password")
        degraded = await state_of(spec, State.DEGRADED)
        refused = next(m for _, m in cluster.emulator.refusals if m.startswith('pods "ms-cache-0"'))
        assert refused == ('pods "ms-cache-0" is forbidden: exceeded quota: cai-quota, requested: requests.memory=256Mi, '
                           "used: requests.memory=0, limited: requests.memory=128Mi")
        assert degraded.message == f"create Pod ms-cache-0 in StatefulSet ms-cache failed error: {refused}"
        view = degraded.to_json()
        assert view["state"] == "Degraded" and view["ready"] is False
        assert {c["type"]: c["message"] for c in view["conditions"]}["Ready"] == degraded.message
        # The operator raises the quota: the controller's next try creates the pod, and the store is ready.
        (quota,) = [o for n_s, _, o in live(cluster.emulator, "resourcequotas") if n_s == small.namespace]
        quota.patch({"spec": {"hard": {"requests.memory": "1Gi"}}})
        await state_of(spec, State.READY)

        # The claim: the project may hold one volume claim and already does.
        full = ProjectSpec(str(uuid.uuid4()), "quota", "pvc12345", "org", {"persistentvolumeclaims": "1", "services": "10"})
        await provisioner.namespace(full)
        await provisioner.quota(full)
        await kube.wait_for(kube.core.list_namespaced_resource_quota, full.namespace, QUOTA_NAME, counted, timeout=20)
        await kube.call(kube.core.create_namespaced_persistent_volume_claim, full.namespace, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "other"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
        spec = InstanceSpec(full.id, full.short, "kept")
        await stores.create(spec, "password")
        degraded = await state_of(spec, State.DEGRADED)
        assert degraded.message == (
            "create Claim data-ms-kept-0 for Pod ms-kept-0 in StatefulSet ms-kept failed error: "
            'persistentvolumeclaims "data-ms-kept-0" is forbidden: exceeded quota: cai-quota, '
            "requested: persistentvolumeclaims=1, used: persistentvolumeclaims=1, limited: persistentvolumeclaims=1")
        assert not [n for n_s, n, _ in live(cluster.emulator, "pods") if n_s == full.namespace]  # no pod without its claim
        await stores.close()
        await kube.close()
