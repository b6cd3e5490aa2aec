"""Issue 36: what the Kubernetes adapters await is watched, not read again and again: a traffic change's
settling and a request waiting for a ready revision (the Knative runtime), a replaced build Job's
deletion (the builder). Each test holds the awaited change back (the controller double's `paused`, a
finalizer), sees the wait turn into a watch, counts the plain reads made meanwhile, then lets it happen.
The technique is `test_code_pool.py::test_a_starting_pod_is_awaited_by_a_watch_not_by_polling`'s."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import secrets
import uuid
from pathlib import Path

import pytest

from caiplatform.adapters.kubernetes.builder import BuildKitJobBuilder
from caiplatform.adapters.kubernetes.mcp_host import KnativeMcpHost
from caiplatform.adapters.kubernetes.runtime import KnativeRuntime
from caiplatform.ports.builder import BuildError, BuildRequest
from caiplatform.ports.runtime import RevisionSpec, TrafficTarget, WorkloadRef
from caiplatform.testing import sources
from caiplatform.testing.kube_cluster import live
from caiplatform.testing.kube_schemas import audit
from tests.conformance.kube_support import ROLE
from tests.kubernetes.support import until

KNATIVE = "serving.knative.dev"


def requests_for(cluster, plural: str, group: str, name: str, *, watching: bool, since: int = 0) -> list:
    """The emulator's requests about the object `name` (read by name, or listed or watched by its name or
    by a label naming it), watches or plain reads, from its `since`-th request on."""
    found = []
    for r in list(cluster.emulator)[since:]:
        resource = r.resource
        if resource is None or resource.plural != plural or (resource.group or "") != group:
            continue
        if str(getattr(r.method, "value", r.method)).upper() != "GET":
            continue
        params = r.params or {}
        about = (r.name == name or params.get("fieldSelector") == f"metadata.name={name}"
                 or f"={name}" in params.get("labelSelector", ""))
        if about and (params.get("watch") == "true") == watching:
            found.append(r)
    return found


def image(n: int) -> str:
    return f"registry.local/fn@sha256:{str(n) * 64}"


async def cancelled(task: asyncio.Future) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def test_a_traffic_change_settles_on_a_watch_not_by_polling(cluster):
    runtime = KnativeRuntime(settings=cluster.settings, settle_seconds=30)
    project_id = str(uuid.uuid4())
    ref = WorkloadRef(project_id, project_id[:8], "fn")

    def ready(name: str) -> bool:
        return any(o.raw["status"]["conditions"][0]["status"] == "True"
                   for _, n, o in live(cluster.emulator, "revisions", KNATIVE) if n == name)

    # Knative makes the revision of the template it sees: each is awaited before the next is applied.
    await runtime.apply(RevisionSpec(ref, "fn-00001", 1, image(1)))
    await until(lambda: ready("fn-00001"))
    await runtime.apply(RevisionSpec(ref, "fn-00002", 2, image(2)))
    await until(lambda: ready("fn-00002"))
    cluster.controllers.paused.add("fn")  # Knative has not routed the new split yet
    since = len(list(cluster.emulator))
    change = asyncio.ensure_future(runtime.set_traffic(ref, [TrafficTarget(50, "fn-00001"), TrafficTarget(50, "fn-00002")]))
    try:
        await until(lambda: requests_for(cluster, "services", KNATIVE, "fn", watching=True, since=since))
        reads_while_settling = len(requests_for(cluster, "services", KNATIVE, "fn", watching=False, since=since))
        cluster.controllers.paused.discard("fn")
        await asyncio.wait_for(change, 20)
    finally:
        await cancelled(change)
    (watch, *_) = requests_for(cluster, "services", KNATIVE, "fn", watching=True, since=since)
    assert watch.params.get("resourceVersion")  # from the list's version
    # The existence check and the wait's one list; nothing more until the watch saw the route.
    assert reads_while_settling == 2
    status = await runtime.status(ref)
    assert status is not None and {r.name: r.traffic_percent for r in status.revisions} == {"fn-00001": 50, "fn-00002": 50}
    await runtime.close()
    audit(cluster.emulator, cluster.calls(), ROLE)


async def test_a_request_waits_for_a_ready_revision_on_a_watch_not_by_polling(cluster):
    runtime = KnativeRuntime(settings=cluster.settings)
    project_id = str(uuid.uuid4())
    ref = WorkloadRef(project_id, project_id[:8], "fn")
    cluster.controllers.paused.add("fn-00001")  # its pods are still starting
    await runtime.apply(RevisionSpec(ref, "fn-00001", 1, image(1)))

    since = len(list(cluster.emulator))

    def reads() -> int:
        return (len(requests_for(cluster, "services", KNATIVE, "fn", watching=False, since=since))
                + len(requests_for(cluster, "revisions", KNATIVE, "fn", watching=False, since=since))
                + len(requests_for(cluster, "revisions", KNATIVE, "fn-00001", watching=False, since=since)))

    def watches() -> list:
        return (requests_for(cluster, "services", KNATIVE, "fn", watching=True, since=since)
                + requests_for(cluster, "revisions", KNATIVE, "fn-00001", watching=True, since=since))

    acquired = asyncio.ensure_future(runtime.acquire(ref, timeout=30))
    try:
        await until(lambda: watches())
        reads_while_starting = reads()
        cluster.controllers.paused.discard("fn-00001")
        endpoint = await asyncio.wait_for(acquired, 20)
    finally:
        await cancelled(acquired)
    assert endpoint.revision == "fn-00001" and endpoint.base_url.startswith("http://fn.")
    # One look at the Service and its revisions, then the revision's list for its watch: no read again.
    assert reads_while_starting <= 3, reads_while_starting
    # A workload with no revision at all is not waited for.
    with pytest.raises(LookupError):
        await runtime.acquire(WorkloadRef(project_id, project_id[:8], "none"), timeout=5)
    await runtime.close()
    audit(cluster.emulator, cluster.calls(), ROLE)


async def test_a_replaced_build_jobs_deletion_is_awaited_by_a_watch(cluster, tmp_path: Path):
    builder = BuildKitJobBuilder(settings=cluster.settings, context_dir=tmp_path / "ctx")
    source = sources.write_tree(tmp_path / "src", {**sources.LANGGRAPH, "nonce": secrets.token_hex(4)})
    project_id = str(uuid.uuid4())
    request = BuildRequest(project_id, project_id[:8], "agent", "langgraph", source)
    cluster.controllers.build_outcome = lambda job: (False, "error: no")
    with pytest.raises(BuildError):
        await builder.build(request)
    (name, job), = [(n, o) for _, n, o in live(cluster.emulator, "jobs", "batch")]
    # A finalizer holds the failed Job after its delete (as the API server keeps an object until its
    # finalizers are removed): the builder must wait for it to go before it creates the Job again.
    job.patch({"metadata": {"finalizers": ["test.caiplatform.dev/hold"]}})
    cluster.controllers.build_outcome = lambda job: (True, "")
    since = len(list(cluster.emulator))  # the first build's requests (its own watch among them) do not count
    rebuilt = asyncio.ensure_future(builder.build(request))
    try:
        await until(lambda: requests_for(cluster, "jobs", "batch", name, watching=True, since=since)
                    and (job.raw["metadata"].get("deletionTimestamp")))
        reads_while_deleting = len(requests_for(cluster, "jobs", "batch", name, watching=False, since=since))
        job.patch({"metadata": {"finalizers": None}})
        job.delete()  # the finalizer's owner is done: the API server removes the object
        built = await asyncio.wait_for(rebuilt, 20)
    finally:
        await cancelled(rebuilt)
    assert built.digest.startswith("sha256:") and not built.reused
    # The read of the existing Job and the list the watch starts from: no read every second.
    assert reads_while_deleting == 2, reads_while_deleting
    await builder.close()
    audit(cluster.emulator, cluster.calls(), ROLE)


async def test_a_deleted_workloads_revisions_going_is_awaited_by_a_watch(cluster):
    runtime = KnativeRuntime(settings=cluster.settings, settle_seconds=30)
    project_id = str(uuid.uuid4())
    ref = WorkloadRef(project_id, project_id[:8], "fn")
    await runtime.apply(RevisionSpec(ref, "fn-00001", 1, image(1)))

    def revisions() -> list:
        return [o for _, n, o in live(cluster.emulator, "revisions", KNATIVE) if n == "fn-00001"]

    await until(revisions)  # the controller double makes it
    (revision,) = revisions()
    # A finalizer holds the revision after the garbage collector's delete: the runtime's delete waits for it
    # to go (so that usage read right after no longer counts it).
    revision.patch({"metadata": {"finalizers": ["test.caiplatform.dev/hold"]}})
    since = len(list(cluster.emulator))
    deleting = asyncio.ensure_future(runtime.delete(ref))
    try:
        await until(lambda: requests_for(cluster, "revisions", KNATIVE, "fn-00001", watching=True, since=since)
                    and revision.raw["metadata"].get("deletionTimestamp"))
        await asyncio.sleep(0.5)  # long enough for a poll every 0.1 s to show: what is counted is what it read
        reads_while_going = len(requests_for(cluster, "revisions", KNATIVE, "fn-00001", watching=False, since=since))
        assert not deleting.done()
        revision.patch({"metadata": {"finalizers": None}})  # its owner is done: the collector removes it
        await asyncio.wait_for(deleting, 20)
    finally:
        await cancelled(deleting)
    # The list of the workload's revisions and the list the watch starts from: no read every 0.1 s.
    assert reads_while_going <= 2, reads_while_going
    await runtime.close()
    audit(cluster.emulator, cluster.calls(), ROLE)


def test_the_mcp_host_takes_no_polling_interval():
    """It waits for a revision through the runtime's watch (`KnativeRuntime.settled`): no interval to set."""
    assert "poll_seconds" not in inspect.signature(KnativeMcpHost.__init__).parameters
