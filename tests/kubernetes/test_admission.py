"""Issue 36: the emulator refuses what a cluster refuses, and the adapters write what a cluster accepts.

Each of the first tests is one of the mistakes the adapters made (annotation keys with two `/`, a
`runtimeClassName` Knative's default flags refuse, a 69-character revision name and label value), refused
by `caiplatform.testing.kube_admission` as the API server or Knative's webhook refuses it. The later tests
hold the adapters' own objects to the same rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from caiplatform.adapters.kubernetes.builder import containerfile
from caiplatform.adapters.kubernetes.client import ClusterSettings, KubeClient
from caiplatform.adapters.kubernetes.memorystore import statefulset_manifest
from caiplatform.adapters.kubernetes.runtime import (
    LABELS_ANNOTATION,
    RUNTIME_CLASS_FEATURE,
    KnativeRuntime,
    knative_name,
    knative_revision,
    revision_labels,
)
from caiplatform.ports.runtime import RevisionSpec, WorkloadError, WorkloadRef
from caiplatform.testing.kube_admission import Refused, admit, merge_patch

LONGEST = "a" + "b" * 61 + "c"  # 63 characters: the longest agent name the API allows
HARNESS_CONTAINERFILE = Path(__file__).resolve().parents[2] / "backends" / "kubernetes" / "Containerfile.harness"


def ksvc(name: str, template: dict) -> dict:
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": {"name": name, "namespace": "p"},
            "spec": {"template": template}}


def template(name: str, **spec: object) -> dict:
    return {"metadata": {"name": name}, "spec": {"containers": [{"image": "x"}], **spec}}


def refused(plural: str, group: str, obj: dict, old: dict | None = None, **kw: object) -> Refused:
    with pytest.raises(Refused) as caught:
        admit(plural, group, obj, old, **kw)  # type: ignore[arg-type]
    return caught.value


# -- the double refuses each original mistake -----------------------------------------------------------


def test_an_annotation_key_with_two_slashes_is_invalid():
    body = ksvc("fn", template("fn-00001"))
    body["spec"]["template"]["metadata"]["annotations"] = {"caiplatform.dev/label-cai.dev/agent": "fn"}
    error = refused("services", "serving.knative.dev", body)
    assert error.status == 400 and "caiplatform.dev/label-cai.dev/agent" in error.message


def test_knative_refuses_runtime_class_name_unless_its_flag_is_on():
    body = ksvc("fn", template("fn-00001", runtimeClassName="gvisor"))
    error = refused("services", "serving.knative.dev", body)
    assert error.status == 400 and "must not set the field(s): spec.template.spec.runtimeClassName" in error.message
    admit("services", "serving.knative.dev", body, knative_features=frozenset({RUNTIME_CLASS_FEATURE}))


def test_a_revision_name_longer_than_63_or_without_the_service_prefix_is_refused():
    assert "no more than 63" in refused("services", "serving.knative.dev", ksvc(LONGEST, template(LONGEST + "-00001"))).message
    assert "must have prefix" in refused("services", "serving.knative.dev", ksvc("fn", template("other-00001"))).message


def test_a_label_value_longer_than_63_is_invalid():
    secret = {"kind": "Secret", "metadata": {"name": "s", "labels": {"serving.knative.dev/revision": "x" * 69}}}
    assert refused("secrets", "", secret).status == 422


def test_a_named_template_cannot_change_under_the_same_name():
    old = ksvc("fn", template("fn-00001"))
    new = merge_patch(old, {"spec": {"template": {"spec": {"containers": [{"image": "y"}]}}}})
    assert "without a name change" in refused("services", "serving.knative.dev", new, old).message


def test_names_follow_their_kind():
    assert refused("namespaces", "", {"kind": "Namespace", "metadata": {"name": "a.b"}}).status == 422
    assert refused("services", "", {"kind": "Service", "metadata": {"name": "1abc"}}).status == 422
    assert refused("jobs", "batch", {"kind": "Job", "metadata": {"name": "j" * 64}}).status == 422
    admit("secrets", "", {"kind": "Secret", "metadata": {"name": "a.b-c"}})


def test_a_pod_in_a_restricted_namespace_must_meet_the_restricted_profile():
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    restricted = {"pod-security.kubernetes.io/enforce": "restricted"}
    error = refused("pods", "", pod, namespace_labels=restricted)
    assert error.status == 403 and "seccompProfile" in error.message
    admit("pods", "", pod)  # elsewhere it is admitted
    pod["spec"]["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    pod["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False,
                                                       "capabilities": {"drop": ["ALL"]}}
    admit("pods", "", pod, namespace_labels=restricted)


# -- what the adapters write --------------------------------------------------------------------------


def runtime(**settings: object) -> KnativeRuntime:
    return KnativeRuntime(KubeClient(ClusterSettings(host="http://127.0.0.1:9", **settings)))  # type: ignore[arg-type]


def spec_for(name: str, **fields: object) -> RevisionSpec:
    ref = WorkloadRef("00000000-0000-0000-0000-000000000001", "p0000001", name, kind="agent")
    return RevisionSpec(ref, f"{name}-00001", 1, "registry.local/x:1", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["fn", LONGEST])
def test_the_runtime_writes_a_service_knative_admits(name: str):
    spec = spec_for(name, labels={"cai.dev/agent": name, "cai.dev/reason": "deploy"}, secret_env={"K": "v"})
    ref = spec.workload
    body = ksvc(knative_name(ref), runtime()._template(spec, None, f"{knative_revision(ref, spec.revision)}-env"))
    admit("services", "serving.knative.dev", body)
    revision = body["spec"]["template"]["metadata"]["name"]
    assert len(revision) <= 63 and revision.startswith(knative_name(ref) + "-")
    # The labels are recorded in one annotation, and read back whole.
    annotations = body["spec"]["template"]["metadata"]["annotations"]
    assert json.loads(annotations[LABELS_ANNOTATION])["cai.dev/agent"] == name
    assert revision_labels(body["spec"]["template"]) == {"cai.dev/agent": name, "cai.dev/reason": "deploy"}


def test_long_names_stay_distinct():
    a, b = spec_for(LONGEST).workload, spec_for(LONGEST[:-1] + "d").workload
    assert knative_name(a) != knative_name(b) and len(knative_name(a)) <= 57


async def test_a_runtime_class_the_cluster_refuses_fails_before_anything_is_written():
    with pytest.raises(WorkloadError, match=RUNTIME_CLASS_FEATURE):
        await runtime().apply(spec_for("fn", runtime_class_name="gvisor"))
    enabled = runtime(knative_features=frozenset({RUNTIME_CLASS_FEATURE}))
    spec = spec_for("fn", runtime_class_name="gvisor")
    body = ksvc("fn", enabled._template(spec, None, "fn-00001-env"))
    assert body["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"
    admit("services", "serving.knative.dev", body, knative_features=frozenset({RUNTIME_CLASS_FEATURE}))


def _final_user(containerfile_text: str) -> str:
    users = [line.split()[1] for line in containerfile_text.splitlines() if line.startswith("USER ")]
    return users[-1] if users else "root"


@pytest.mark.parametrize("framework", ["function-go", "function-nodejs", "function-ruby"])
def test_a_language_build_makes_its_directories_as_root(framework: str):
    """The harness image ends as `USER 1000` and `/app` is root's: a `RUN` that makes directories under
    `/app` must run as root (a real build failed with `mkdir: cannot create directory '/app/bin'`)."""
    user = _final_user(HARNESS_CONTAINERFILE.read_text())
    assert user == "1000"
    for line in containerfile("harness:1", framework, framework.removeprefix("function-")).splitlines():
        if line.startswith("USER "):
            user = line.split()[1]
        elif line.startswith("RUN ") and ("mkdir" in line or "chown" in line):
            assert user == "root", f"{line!r} runs as {user}"


def test_a_persistent_memory_store_can_write_its_volume():
    """A persistent volume's root is root's on most block storage: the pod's fsGroup must be the group of
    the user Valkey runs as, or it cannot write `/data`."""
    from datetime import UTC, datetime

    from caiplatform.domain.memorystore import InstanceSpec

    sts = statefulset_manifest(InstanceSpec("00000000-0000-0000-0000-000000000001", "p0000001", "cache"), "valkey:8",
                               datetime.now(UTC))
    assert sts["spec"]["volumeClaimTemplates"]  # persistent
    pod = sts["spec"]["template"]["spec"]
    uid = pod["containers"][0]["securityContext"]["runAsUser"]
    assert uid != 0 and pod["securityContext"]["fsGroup"] == uid
    admit("statefulsets", "apps", sts)


# -- several replicas on one cluster --------------------------------------------------------------------


async def test_the_same_revision_applied_for_another_reason_is_the_same_revision(tmp_path):
    """A follower replica that applies a revision (reason `replica`) before the replica that rolled it
    (reason `deploy`) must not make the roller's apply fail: labels are not part of what a revision is."""
    from caiplatform.testing.kube_cluster import emulated_cluster

    with emulated_cluster() as cluster:
        cluster_runtime = KnativeRuntime(settings=cluster.settings)
        follower = spec_for("fn", labels={"cai.dev/agent": "fn", "cai.dev/reason": "replica"})
        await cluster_runtime.apply(follower)
        roller = spec_for("fn", labels={"cai.dev/agent": "fn", "cai.dev/reason": "deploy"})
        await cluster_runtime.apply(roller)  # was: "revision fn-00001 already exists; revisions are immutable"
        assert not cluster.emulator.refusals


def test_a_cluster_runtime_and_mcp_host_are_shared_by_every_replica():
    from caiplatform.adapters.kubernetes.mcp_host import KnativeMcpHost
    from caiplatform.adapters.local.runtime import LocalProcessRuntime

    assert KnativeRuntime.shared and KnativeMcpHost.shared and not LocalProcessRuntime.shared


async def test_followers_of_a_shared_runtime_apply_nothing():
    """With several replicas on Knative, a follower round re-applied every revision (agents, services) and
    served every MCP server again (a new revision and Secret every 2 s): on a shared runtime it writes
    nothing to the runtime."""
    from types import SimpleNamespace

    from caiplatform.services.mcp_replicas import McpFollower

    class Host:
        shared = True
        served_calls = 0

        async def build(self, *_a, **_k):
            raise AssertionError("a shared host is never asked to build or serve by a follower")

    follower = McpFollower.__new__(McpFollower)
    follower.mcp = SimpleNamespace(host=Host())  # type: ignore[assignment]
    follower._unlocked_builds, follower._unlocked_now = set(), set()
    follower._serve = None  # type: ignore[assignment]  # any call would fail
    row = SimpleNamespace(building=None, owner="dead-replica", version=3, image=object(), id="x",
                          project=SimpleNamespace(id="p", slug="p"), name="m")
    await follower._follow(row, running_here=False, settled=False, held=set(), me="me")  # type: ignore[arg-type]


async def test_an_api_server_that_never_answers_does_not_hang_a_call():
    """A server that accepts the connection and never answers: the call gives up after the request timeout
    (it used to wait forever)."""
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        host = f"http://127.0.0.1:{listener.getsockname()[1]}"
        kube = KubeClient(ClusterSettings(host=host, request_timeout_seconds=0.5))
        begun = time.monotonic()
        with pytest.raises(Exception, match="(?i)timed? ?out"):
            await kube.call(kube.core.read_namespace, "anything")
        assert time.monotonic() - begun < 10
    finally:
        listener.close()


# -- waiting by watch ------------------------------------------------------------------------------------


async def test_a_wait_is_a_watch_that_sees_the_change_and_relists_when_its_version_is_gone():
    """`KubeClient.wait_for` lists once, then watches from the list's resourceVersion: it sees a change made
    after the list (by a controller, not through the API), lists again on `410 Gone`, and says so when the
    object is deleted or the time is up."""
    import asyncio

    from caiplatform.testing.kube_cluster import emulated_cluster

    with emulated_cluster() as cluster:
        kube = KubeClient(cluster.settings)
        emulator = cluster.emulator
        emulator.objects["v1/namespaces", None, "w"] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}}
        emulator.objects["v1/configmaps", "w", "c"] = {"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "c", "namespace": "w"}, "data": {"state": "0"}}

        def done(obj: dict) -> bool:
            return (obj.get("data") or {}).get("state") == "1"

        async def later(changes: dict, delay: float = 0.3) -> None:
            await asyncio.sleep(delay)
            (obj,) = [o for (res, ns, name), o in emulator.objects.items() if name == "c" and not o.deleted]
            obj.patch(changes)

        change = asyncio.ensure_future(later({"data": {"state": "1"}}))
        seen = await kube.wait_for(kube.core.list_namespaced_config_map, "w", "c", done, timeout=20)
        await change
        assert seen["data"]["state"] == "1"
        watches = [r for r in emulator if (r.params or {}).get("watch") == "true"]
        assert watches and watches[-1].params.get("resourceVersion")  # from the list's version, not "now"

        # A compacted version: the watch is told 410 and the wait lists again (and finds it done).
        (obj,) = [o for (res, ns, name), o in emulator.objects.items() if name == "c" and not o.deleted]
        obj.patch({"data": {"state": "0"}})
        emulator.oldest_watchable = 10**9
        lists_before = len([r for r in emulator if (r.params or {}).get("fieldSelector") and (r.params or {}).get("watch") != "true"])
        change = asyncio.ensure_future(later({"data": {"state": "1"}}))
        await kube.wait_for(kube.core.list_namespaced_config_map, "w", "c", done, timeout=20)
        await change
        lists_after = len([r for r in emulator if (r.params or {}).get("fieldSelector") and (r.params or {}).get("watch") != "true"])
        assert lists_after >= lists_before + 2
        emulator.oldest_watchable = 0

        obj.patch({"data": {"state": "0"}})
        with pytest.raises(TimeoutError):
            await kube.wait_for(kube.core.list_namespaced_config_map, "w", "c", done, timeout=1.5)

        async def delete_later() -> None:
            await asyncio.sleep(0.3)
            obj.delete()

        gone = asyncio.ensure_future(delete_later())
        with pytest.raises(LookupError):
            await kube.wait_for(kube.core.list_namespaced_config_map, "w", "c", done, timeout=20)
        await gone


async def test_a_write_naming_a_stale_resource_version_is_a_conflict():
    """Optimistic concurrency as the API server does it: every write gives the object a new resourceVersion,
    and a patch naming an older one is refused with 409 (it used to be merged silently)."""
    from kubernetes.client import ApiException

    from caiplatform.adapters.kubernetes.client import MERGE_PATCH
    from caiplatform.testing.kube_cluster import emulated_cluster

    with emulated_cluster() as cluster:
        kube = KubeClient(cluster.settings)
        await kube.call(kube.core.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}})
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "w"}, "data": {"a": "1"}}
        created = await kube.call(kube.core.create_namespaced_config_map, "w", body)
        first = (await kube.call(kube.core.read_namespaced_config_map, "c", "w"))["metadata"]
        assert first["resourceVersion"] and first["uid"] and first["creationTimestamp"], created
        await kube.call(kube.core.patch_namespaced_config_map, "c", "w",
                        {"metadata": {"resourceVersion": first["resourceVersion"]}, "data": {"a": "2"}},
                        _content_type=MERGE_PATCH)
        with pytest.raises(ApiException) as stale:
            await kube.call(kube.core.patch_namespaced_config_map, "c", "w",
                            {"metadata": {"resourceVersion": first["resourceVersion"]}, "data": {"a": "3"}},
                            _content_type=MERGE_PATCH)
        assert stale.value.status == 409
        assert (await kube.call(kube.core.read_namespaced_config_map, "c", "w"))["data"] == {"a": "2"}
