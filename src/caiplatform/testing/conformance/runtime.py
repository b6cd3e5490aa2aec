"""Conformance suite for `WorkloadRuntime` adapters.

Use it from a test module that defines a `kit` fixture (a started `RuntimeKit`: the adapter, built with
`images=kit.resolve` and a short idle period, and a way to make images of the tiny test app,
`caiplatform.testing.tiny_app`) and a `backend` fixture (its registry name), then import the tests:

    from caiplatform.testing.conformance.runtime import *  # noqa: F403

The suite does not depend on the harness: every image runs the tiny app. Each test uses its own random
project, so tests may share one adapter.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property

import httpx
import pytest

from caiplatform.ports.builder import Image
from caiplatform.ports.runtime import (
    NoCapacity,
    RevisionSpec,
    Scaling,
    TrafficTarget,
    WorkloadError,
    WorkloadRef,
    WorkloadRuntime,
    WorkloadStatus,
)
from caiplatform.testing.conformance.memorystore import apply_notimpl

__all__ = [
    "test_apply_becomes_ready_with_one_revision",
    "test_request_reaches_instance_with_env_secrets_and_port",
    "test_new_revision_takes_latest_traffic",
    "test_traffic_split_by_percent",
    "test_tagged_target_reaches_its_revision",
    "test_failing_start_leaves_revision_not_ready",
    "test_unhealthy_instance_is_not_ready",
    "test_failed_new_revision_keeps_traffic_on_ready_one",
    "test_idle_instance_scales_to_zero_and_cold_starts",
    "test_min_scale_keeps_instances_warm",
    "test_concurrency_and_max_scale_bound_slots",
    "test_max_scale_adds_instances_under_load",
    "test_burst_on_a_cold_revision_starts_one_instance_per_concurrency",
    "test_logs_live_and_history",
    "test_logs_follow_sees_new_lines",
    "test_erase_log_lines_removes_only_matching_history",
    "test_logs_none_when_scaled_to_zero",
    "test_spec_document_is_knative_shaped",
    "test_metrics_count_instances",
    "test_usage_counts_pods_services_deployments",
    "test_delete_forgets_everything",
    "test_unknown_workload",
    "test_revisions_are_immutable",
    "apply_notimpl",
]

IDLE_SECONDS = 0.6


@dataclass
class RuntimeKit:
    """An adapter under test plus a factory of tiny-app images it can run."""

    runtime: WorkloadRuntime
    image_for: Callable[[str, dict[str, str]], Image]  # (reference, image env) -> Image the adapter runs
    images: dict[str, Image] = field(default_factory=dict)
    idle_seconds: float = IDLE_SECONDS

    @cached_property
    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=30.0)

    async def resolve(self, reference: str) -> Image | None:
        return self.images.get(reference)

    def image(self, **env: str) -> str:
        digest = "sha256:" + secrets.token_hex(32)
        reference = f"registry.local/cai-test-tiny@{digest}"
        self.images[reference] = self.image_for(reference, {"TINY": "1", **env})
        return reference


def ref(name: str | None = None) -> WorkloadRef:
    project = str(uuid.uuid4())
    return WorkloadRef(project_id=project, project_short=project[:8], name=name or f"w-{secrets.token_hex(3)}")


def spec(kit: RuntimeKit, workload: WorkloadRef, generation: int = 1, *, image: str | None = None, **kw) -> RevisionSpec:
    return RevisionSpec(
        workload=workload,
        revision=f"{workload.name}-{generation:05d}",
        generation=generation,
        image=image or kit.image(),
        **kw,
    )


async def wait_for(kit: RuntimeKit, workload: WorkloadRef, check: Callable[[WorkloadStatus], bool],
                   timeout: float = 30.0, what: str = "condition") -> WorkloadStatus:
    deadline = time.monotonic() + timeout
    while True:
        status = await kit.runtime.status(workload)
        if status is not None and check(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached after {timeout} s: {status}")
        await asyncio.sleep(0.05)


def revision_state(name: str, state: str) -> Callable[[WorkloadStatus], bool]:
    return lambda s: any(r.name == name and r.state == state for r in s.revisions)


async def ready(kit: RuntimeKit, s: RevisionSpec, traffic: list[TrafficTarget] | None = None) -> WorkloadStatus:
    await kit.runtime.apply(s, traffic)
    return await wait_for(kit, s.workload, revision_state(s.revision, "ready"), what=f"{s.revision} ready")


async def get(kit: RuntimeKit, workload: WorkloadRef, path: str, *, tag: str | None = None, timeout: float = 30.0) -> dict:
    endpoint = await kit.runtime.acquire(workload, timeout=timeout, tag=tag)
    try:
        if endpoint.transport is None:  # a network address: one pooled client, as a proxy keeps
            response = await kit.http.get(endpoint.base_url + path)
        else:
            async with endpoint.client(timeout=30.0) as client:
                response = await client.get(path)
        response.raise_for_status()
        return response.json() | {"_revision": endpoint.revision}
    finally:
        await endpoint.release()


async def replicas(kit: RuntimeKit, workload: WorkloadRef, revision: str) -> int:
    status = await kit.runtime.status(workload)
    assert status is not None
    return next(r.replicas for r in status.revisions if r.name == revision)


# ---------------------------------------------------------------------------------------------------


async def test_apply_becomes_ready_with_one_revision(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w)
    await kit.runtime.apply(s)
    early = await kit.runtime.status(w)
    assert early is not None and early.revisions[0].name == s.revision
    assert early.revisions[0].state in ("unknown", "ready")
    status = await wait_for(kit, w, lambda st: st.ready, what="ready")
    assert status.latest_created_revision == status.latest_ready_revision == s.revision
    (revision,) = status.revisions
    assert revision.ready and revision.generation == 1 and revision.image == s.image
    assert revision.traffic_percent == 100 and revision.reason == "" and revision.message == ""
    assert revision.created_at.tzinfo is not None
    assert [(t.percent, t.revision_name, t.latest_revision) for t in status.traffic] == [(100, s.revision, True)]
    assert status.url


async def test_request_reaches_instance_with_env_secrets_and_port(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, env={"GREETING": "hello"}, secret_env={"API_TOKEN": "s3cret"})
    await ready(kit, s)
    body = await get(kit, w, "/whoami")
    assert body["revision"] == s.revision and body["greeting"] == "hello" and body["_revision"] == s.revision
    assert (await get(kit, w, "/env/API_TOKEN"))["value"] == "s3cret"
    assert (await get(kit, w, "/env/TINY"))["value"] == "1"  # the image's own variables
    assert (await get(kit, w, "/env/PORT"))["value"]


async def test_new_revision_takes_latest_traffic(kit: RuntimeKit):
    w = ref()
    first = spec(kit, w, env={"GREETING": "one"})
    await ready(kit, first)
    second = spec(kit, w, 2, env={"GREETING": "two"})
    status = await ready(kit, second)
    assert [r.name for r in status.revisions] == [second.revision, first.revision]  # newest first
    status = await wait_for(kit, w, lambda st: st.latest_ready_revision == second.revision)
    assert {r.name: r.traffic_percent for r in status.revisions} == {second.revision: 100, first.revision: 0}
    assert (await get(kit, w, "/whoami"))["greeting"] == "two"


@pytest.mark.notimpl(["kubernetes-cluster"], reason="Knative splits traffic at random by weight; the exact per-request counts are the in-process runtimes'")
async def test_traffic_split_by_percent(kit: RuntimeKit):
    w = ref()
    first, second = spec(kit, w), spec(kit, w, 2)
    await ready(kit, first)
    await ready(kit, second)
    await kit.runtime.set_traffic(w, [TrafficTarget(30, first.revision), TrafficTarget(70, second.revision)])
    status = await kit.runtime.status(w)
    assert status is not None
    assert {r.name: r.traffic_percent for r in status.revisions} == {first.revision: 30, second.revision: 70}
    seen = Counter([(await get(kit, w, "/whoami"))["revision"] for _ in range(20)])
    assert seen == {first.revision: 6, second.revision: 14}


async def test_tagged_target_reaches_its_revision(kit: RuntimeKit):
    w = ref()
    first, second = spec(kit, w), spec(kit, w, 2)
    await ready(kit, first)
    await ready(kit, second)
    await kit.runtime.set_traffic(w, [TrafficTarget(100, latest_revision=True), TrafficTarget(0, first.revision, tag="old")])
    assert (await get(kit, w, "/whoami", tag="old"))["revision"] == first.revision
    assert (await get(kit, w, "/whoami"))["revision"] == second.revision
    status = await kit.runtime.status(w)
    assert status is not None
    tagged = next(r for r in status.revisions if r.name == first.revision)
    assert tagged.tag == "old" and tagged.url
    with pytest.raises(LookupError):
        await kit.runtime.acquire(w, timeout=1, tag="missing")


async def test_failing_start_leaves_revision_not_ready(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, image=kit.image(TINY_FAIL_START="1"))
    await kit.runtime.apply(s)
    status = await wait_for(kit, w, revision_state(s.revision, "not_ready"), what="not ready")
    assert not status.ready and status.reason and status.message
    assert status.revisions[0].reason and status.revisions[0].message
    with pytest.raises(NoCapacity):
        await kit.runtime.acquire(w, timeout=5)


@pytest.mark.notimpl(["kubernetes-cluster"], reason="Knative reports a failing readiness probe as its own condition after the progress deadline")
@pytest.mark.notimpl(["kubernetes"], reason="Knative reports a failing readiness probe as its own condition after the progress deadline, not as HealthCheckFailed")
async def test_unhealthy_instance_is_not_ready(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, image=kit.image(TINY_UNHEALTHY="1"))
    kit.runtime.readiness_timeout = 1.5  # type: ignore[attr-defined]
    await kit.runtime.apply(s)
    status = await wait_for(kit, w, revision_state(s.revision, "not_ready"), what="not ready")
    assert status.revisions[0].reason == "HealthCheckFailed" and "503" in status.revisions[0].message


async def test_failed_new_revision_keeps_traffic_on_ready_one(kit: RuntimeKit):
    w = ref()
    good = spec(kit, w)
    await ready(kit, good)
    bad = spec(kit, w, 2, image=kit.image(TINY_FAIL_START="1"))
    await kit.runtime.apply(bad)
    status = await wait_for(kit, w, revision_state(bad.revision, "not_ready"))
    assert status.latest_created_revision == bad.revision and status.latest_ready_revision == good.revision
    assert not status.ready
    assert (await get(kit, w, "/whoami"))["revision"] == good.revision


@pytest.mark.notimpl(["kubernetes-cluster"], reason="Knative scales to zero after its own stable window and grace period, far beyond the suite's idle period")
@pytest.mark.notimpl(["kubernetes"], reason="Knative's autoscaler owns scale to zero, concurrency and burst scaling; the API emulator has none")
async def test_idle_instance_scales_to_zero_and_cold_starts(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w)
    await ready(kit, s)
    before = (await get(kit, w, "/whoami"))["instance"]
    status = await wait_for(kit, w, lambda st: st.revisions[0].replicas == 0, timeout=kit.idle_seconds + 15,
                            what="scaled to zero")
    assert status.revisions[0].ready  # a revision that scaled to zero stays ready
    after = (await get(kit, w, "/whoami"))["instance"]
    assert after != before
    assert await replicas(kit, w, s.revision) == 1


async def test_min_scale_keeps_instances_warm(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, scaling=Scaling(min_scale=2, max_scale=3))
    await ready(kit, s)
    await wait_for(kit, w, lambda st: st.revisions[0].replicas == 2, what="two warm instances")
    await asyncio.sleep(kit.idle_seconds * 1.5 + 0.3)
    assert await replicas(kit, w, s.revision) == 2


@pytest.mark.notimpl(["kubernetes-cluster"], reason="Knative's queue-proxy queues requests beyond containerConcurrency instead of refusing a slot")
@pytest.mark.notimpl(["kubernetes"], reason="Knative's autoscaler owns scale to zero, concurrency and burst scaling; the API emulator has none")
async def test_concurrency_and_max_scale_bound_slots(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, scaling=Scaling(max_scale=1, container_concurrency=1))
    await ready(kit, s)
    held = await kit.runtime.acquire(w, timeout=10)
    started = time.monotonic()
    with pytest.raises(NoCapacity):
        await kit.runtime.acquire(w, timeout=0.5)
    assert time.monotonic() - started >= 0.45  # it waited for a slot before giving up
    waiter = asyncio.ensure_future(kit.runtime.acquire(w, timeout=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()  # queued behind the held slot
    await held.release()
    second = await asyncio.wait_for(waiter, 10)
    await second.release()
    await second.release()  # releasing twice is harmless
    assert await replicas(kit, w, s.revision) == 1


@pytest.mark.notimpl(["kubernetes"], reason="Knative's autoscaler owns scale to zero, concurrency and burst scaling; the API emulator has none")
async def test_max_scale_adds_instances_under_load(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, scaling=Scaling(max_scale=2, container_concurrency=1))
    await ready(kit, s)
    bodies = await asyncio.gather(*(get(kit, w, "/sleep?seconds=0.5") for _ in range(4)))
    assert len({b["instance"] for b in bodies}) == 2
    assert await replicas(kit, w, s.revision) == 2


@pytest.mark.notimpl(["kubernetes"], reason="log lines come from running containers; the API emulator runs none (keeping the lines of pods "
                        "that are gone is tested on it in tests/kubernetes/test_cluster.py)")
async def test_logs_live_and_history(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w)
    await ready(kit, s)
    marker = f"marker-{secrets.token_hex(4)}"
    await get(kit, w, f"/say?text={marker}")
    stream = kit.runtime.logs(w, tail=100)
    assert stream is not None
    deadline = time.monotonic() + 10
    lines: list[str] = []
    while not any(marker in line for line in lines):
        assert time.monotonic() < deadline, lines
        stream = kit.runtime.logs(w, tail=100)
        assert stream is not None
        lines = [line async for line in stream]
        await asyncio.sleep(0.1)
    history = await kit.runtime.log_history(w)
    ours = [line for line in history if marker in line.message]
    assert ours and ours[0].revision == s.revision and ours[0].pod and ours[0].stream in ("stdout", "stderr")
    assert all(a.ts <= b.ts for a, b in zip(history, history[1:], strict=False))
    assert len(await kit.runtime.log_history(w, limit=1)) == 1
    assert await kit.runtime.log_history(w, since=datetime.now(UTC) + timedelta(hours=1)) == []


@pytest.mark.notimpl(["kubernetes"], reason="log lines come from running containers; the API emulator runs none (erasing kept lines "
                        "is tested on it in tests/kubernetes/test_cluster.py)")
async def test_erase_log_lines_removes_only_matching_history(kit: RuntimeKit):
    w = ref()
    await ready(kit, spec(kit, w))
    secret, other = f"erase-{secrets.token_hex(4)}", f"keep-{secrets.token_hex(4)}"
    for text in (secret, other, f"again-{secret}"):
        await get(kit, w, f"/say?text={text}")
    deadline = time.monotonic() + 10
    while sum(secret in line.message for line in await kit.runtime.log_history(w)) < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert await kit.runtime.erase_log_lines(w, [secret, ""]) == 2
    history = await kit.runtime.log_history(w)
    assert not any(secret in line.message for line in history)
    assert any(other in line.message for line in history)
    assert await kit.runtime.erase_log_lines(w, [secret]) == 0  # idempotent
    assert await kit.runtime.erase_log_lines(ref(), [other]) == 0  # an unknown workload has nothing


@pytest.mark.notimpl(["kubernetes"], reason="log lines come from running containers; the API emulator runs none (keeping the lines of pods "
                        "that are gone is tested on it in tests/kubernetes/test_cluster.py)")
async def test_logs_follow_sees_new_lines(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, scaling=Scaling(min_scale=1))
    await ready(kit, s)
    stream = kit.runtime.logs(w, tail=0, follow=True)
    assert stream is not None
    marker = f"follow-{secrets.token_hex(4)}"

    async def first_match() -> str:
        async for line in stream:
            if marker in line:
                return line
        return ""

    reader = asyncio.ensure_future(first_match())
    await asyncio.sleep(0.2)
    await get(kit, w, f"/say?text={marker}")
    assert marker in await asyncio.wait_for(reader, 10)
    await stream.aclose()  # type: ignore[attr-defined]


@pytest.mark.notimpl(["kubernetes-cluster"], reason="Knative scales to zero after its own stable window and grace period, far beyond the suite's idle period")
@pytest.mark.notimpl(["kubernetes"], reason="log lines come from running containers; the API emulator runs none (keeping the lines of pods "
                        "that are gone is tested on it in tests/kubernetes/test_cluster.py)")
async def test_logs_none_when_scaled_to_zero(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w)
    await ready(kit, s)
    await wait_for(kit, w, lambda st: st.revisions[0].replicas == 0, timeout=kit.idle_seconds + 15)
    assert kit.runtime.logs(w) is None
    assert await kit.runtime.log_history(w)  # what it wrote is kept


async def test_spec_document_is_knative_shaped(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, env={"GREETING": "hi"}, secret_env={"API_KEY": "never-shown"},
             scaling=Scaling(min_scale=0, max_scale=4, container_concurrency=7), timeout_seconds=42)
    await ready(kit, s)
    doc = await kit.runtime.spec_document(w)
    assert doc is not None
    assert doc["apiVersion"] == "serving.knative.dev/v1" and doc["kind"] == "Service"
    assert doc["metadata"]["name"] == w.name and doc["metadata"]["namespace"] == w.namespace
    template = doc["spec"]["template"]
    assert template["metadata"]["name"] == s.revision
    assert template["metadata"]["annotations"]["autoscaling.knative.dev/max-scale"] == "4"
    assert template["spec"]["containerConcurrency"] == 7 and template["spec"]["timeoutSeconds"] == 42
    (container,) = template["spec"]["containers"]
    assert container["image"] == s.image
    assert {"name": "GREETING", "value": "hi"} in container["env"]
    assert "never-shown" not in repr(doc)
    assert any(e["name"] == "API_KEY" for e in container["env"])
    assert doc["spec"]["traffic"] == [{"percent": 100, "latestRevision": True}]
    assert doc["status"]["latestReadyRevisionName"] == s.revision
    assert await kit.runtime.spec_document(ref()) is None


async def test_metrics_count_instances(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, scaling=Scaling(min_scale=1, container_concurrency=5))
    await ready(kit, s)
    await wait_for(kit, w, lambda st: st.revisions[0].replicas == 1)
    metrics = await kit.runtime.metrics(w)
    assert metrics is not None
    assert metrics.instances == 1 and metrics.target_concurrency == 5
    assert [r.name for r in metrics.revisions] == [s.revision]
    assert await kit.runtime.metrics(ref()) is None


async def test_usage_counts_pods_services_deployments(kit: RuntimeKit):
    project = str(uuid.uuid4())
    a = WorkloadRef(project, project[:8], f"a-{secrets.token_hex(2)}")
    b = WorkloadRef(project, project[:8], f"b-{secrets.token_hex(2)}", kind="service")
    await ready(kit, spec(kit, a, scaling=Scaling(min_scale=1)))
    await ready(kit, spec(kit, a, 2, scaling=Scaling(min_scale=1)))
    await ready(kit, spec(kit, b, scaling=Scaling(min_scale=1)))
    await wait_for(kit, a, lambda st: st.revisions[0].replicas == 1 and st.revisions[1].replicas == 0,
                   timeout=kit.idle_seconds + 15)
    await wait_for(kit, b, lambda st: st.revisions[0].replicas == 1)
    usage = await kit.runtime.usage(a.namespace)
    assert usage == {"pods": 2, "services": 6, "count/deployments.apps": 3}
    assert await kit.runtime.usage("cai-p-nothing0") == {"pods": 0, "services": 0, "count/deployments.apps": 0}


async def test_delete_forgets_everything(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, scaling=Scaling(min_scale=1))
    await ready(kit, s)
    await get(kit, w, "/say?text=bye")
    await kit.runtime.delete(w)
    assert await kit.runtime.status(w) is None
    assert await kit.runtime.log_history(w) == []
    assert kit.runtime.logs(w) is None
    assert await kit.runtime.usage(w.namespace) == {"pods": 0, "services": 0, "count/deployments.apps": 0}
    with pytest.raises(LookupError):
        await kit.runtime.acquire(w, timeout=1)
    await kit.runtime.delete(w)  # idempotent


async def test_unknown_workload(kit: RuntimeKit):
    w = ref()
    assert await kit.runtime.status(w) is None
    with pytest.raises(LookupError):
        await kit.runtime.acquire(w, timeout=1)
    assert kit.runtime.logs(w) is None
    assert await kit.runtime.log_history(w) == []


async def test_revisions_are_immutable(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w)
    await ready(kit, s)
    await kit.runtime.apply(s)  # the same revision again changes nothing
    status = await kit.runtime.status(w)
    assert status is not None and len(status.revisions) == 1
    with pytest.raises(WorkloadError):
        await kit.runtime.apply(RevisionSpec(**{**s.__dict__, "env": {"OTHER": "1"}}))


@pytest.mark.notimpl(["kubernetes-cluster"], reason="Knative scales to zero after its own stable window and grace period, far beyond the suite's idle period")
@pytest.mark.notimpl(["kubernetes"], reason="Knative's autoscaler owns scale to zero, concurrency and burst scaling; the API emulator has none")
async def test_burst_on_a_cold_revision_starts_one_instance_per_concurrency(kit: RuntimeKit):
    w = ref()
    s = spec(kit, w, scaling=Scaling(max_scale=5, container_concurrency=10))
    await ready(kit, s)
    await wait_for(kit, w, lambda st: st.revisions[0].replicas == 0, timeout=kit.idle_seconds + 15,
                   what="scaled to zero")
    bodies = await asyncio.gather(*(get(kit, w, "/sleep?seconds=0.3") for _ in range(8)))
    assert len({b["instance"] for b in bodies}) == 1  # eight requests fit one instance's ten slots
    assert await replicas(kit, w, s.revision) == 1
