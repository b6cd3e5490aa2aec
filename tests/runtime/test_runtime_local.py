"""What only the local process runtime promises: restarts keep revisions, crashed runs are reaped,
log history survives and expires, workloads see only the variables they are given."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import caiplatform
from caiplatform.adapters.local.builder import LocalBuilder
from caiplatform.adapters.local.runtime import LocalProcessRuntime
from caiplatform.platform import Platform
from caiplatform.ports.builder import Image
from caiplatform.ports.runtime import RevisionSpec, Scaling, TrafficTarget, WorkloadRef
from caiplatform.settings import Settings
from caiplatform.supervisor import ProcessSupervisor
from caiplatform.supervisor.process import _alive

PACKAGE_ROOT = str(Path(caiplatform.__file__).resolve().parent.parent)
IMAGE = "registry.local/cai-test-tiny@sha256:" + "a" * 64


async def tiny_images(reference: str) -> Image | None:
    if reference != IMAGE:
        return None
    return Image(reference=IMAGE, digest=IMAGE.rpartition("@")[2], framework="tiny",
                 command=[sys.executable, "-m", "caiplatform.testing.tiny_app"],
                 env={"PYTHONPATH": PACKAGE_ROOT, "TINY": "1"})


def workload() -> WorkloadRef:
    project = str(uuid.uuid4())
    return WorkloadRef(project_id=project, project_short=project[:8], name=f"w{uuid.uuid4().hex[:6]}")


def revision(ref: WorkloadRef, generation: int, **kw) -> RevisionSpec:
    return RevisionSpec(ref, f"{ref.name}-{generation:05d}", generation, IMAGE, **kw)


async def until(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (result := await predicate()):
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)
    return result


async def ready(runtime, ref, name):
    async def check():
        status = await runtime.status(ref)
        return status if status and any(r.name == name and r.ready for r in status.revisions) else None

    return await until(check)


async def call(runtime, ref, path: str) -> dict:
    endpoint = await runtime.acquire(ref, timeout=30)
    try:
        async with endpoint.client(timeout=30) as client:
            return (await client.get(path)).json()
    finally:
        await endpoint.release()


async def test_restart_serves_the_same_revisions_and_split(tmp_path):
    ref = workload()
    first = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await first.start()
    try:
        await first.apply(revision(ref, 1, env={"GREETING": "one"}, secret_env={"API_KEY": "k1"}))
        await ready(first, ref, f"{ref.name}-00001")
        await first.apply(revision(ref, 2, env={"GREETING": "two"}))
        await ready(first, ref, f"{ref.name}-00002")
        await first.set_traffic(ref, [TrafficTarget(100, f"{ref.name}-00001")])
        await call(first, ref, "/say?text=before-restart")
    finally:
        await first.close()
    stored = tmp_path / "runtime" / "workloads" / f"{ref.key}.json"
    assert stored.stat().st_mode & 0o777 == 0o600  # secret values are inside

    second = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await second.start()
    try:
        status = await second.status(ref)
        assert status is not None
        assert [r.name for r in status.revisions] == [f"{ref.name}-00002", f"{ref.name}-00001"]
        assert all(r.ready for r in status.revisions)

        async def rewarmed() -> bool:  # the routed revision had an instance at the stop; the other gets none
            replicas = {r.name: r.replicas for r in (await second.status(ref)).revisions}
            return replicas == {f"{ref.name}-00001": 1, f"{ref.name}-00002": 0}

        await until(rewarmed)
        body = await call(second, ref, "/whoami")
        assert body["greeting"] == "one"  # the pin survived
        assert (await call(second, ref, "/env/API_KEY"))["value"] == "k1"
        history = await second.log_history(ref)
        assert any("before-restart" in line.message for line in history)
    finally:
        await second.close()


async def test_min_scale_instances_come_back_after_restart(tmp_path):
    ref = workload()
    first = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await first.start()
    try:
        await first.apply(revision(ref, 1, scaling=Scaling(min_scale=1)))
        await ready(first, ref, f"{ref.name}-00001")
    finally:
        await first.close()
    second = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await second.start()
    try:
        async def warm():
            status = await second.status(ref)
            return status is not None and status.revisions[0].replicas == 1

        await until(warm)
    finally:
        await second.close()


async def test_only_what_ran_at_the_stop_comes_back_warm_and_only_once(tmp_path):
    """A revision nobody called before the stop stays cold; one that ran comes back warm after a clean
    stop, and a start after that run's crash (no clean stop) restores nothing."""
    called, idle = workload(), workload()
    first = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await first.start()
    try:
        for ref in (called, idle):
            await first.apply(revision(ref, 1))
            await ready(first, ref, f"{ref.name}-00001")

        async def idle_is_cold() -> bool:
            return (await first.status(idle)).revisions[0].replicas == 0

        first.idle_seconds = 0  # the instance the readiness proof started stops at the next pass
        await until(idle_is_cold)
        first.idle_seconds = 30
        await call(first, called, "/whoami")
    finally:
        await first.close()

    async def replicas(runtime: LocalProcessRuntime, ref) -> int:
        return (await runtime.status(ref)).revisions[0].replicas

    second = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await second.start()
    try:
        async def called_is_warm() -> bool:
            return await replicas(second, called) == 1

        await until(called_is_warm)
        assert await replicas(second, idle) == 0
    finally:
        # A crash: the instances die with the run, and nothing records them.
        second._closed = True
        for task in list(second._tasks) + ([second._housekeeper] if second._housekeeper else []):
            task.cancel()
        await second.supervisor.stop_all()
    third = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await third.start()
    try:
        assert not any(task.get_name().startswith("rewarm-") for task in third._tasks)
        assert await replicas(third, called) == 0
    finally:
        await third.close()


async def test_processes_of_a_crashed_run_are_reaped(tmp_path):
    ref = workload()
    crashed = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await crashed.start()
    await crashed.apply(revision(ref, 1, scaling=Scaling(min_scale=1)))
    await ready(crashed, ref, f"{ref.name}-00001")
    body = await call(crashed, ref, "/whoami")
    # The run "crashes": nothing is stopped, its supervisor's records stay behind.
    crashed._closed = True
    if crashed._housekeeper is not None:
        crashed._housekeeper.cancel()
    records = [r for r in ProcessSupervisor(tmp_path / "runtime" / "run").records()]
    # The recorded pid is the instance's on this machine (its sandbox's; the workload sees its own namespace).
    (pid,) = [r["pid"] for r in records if r["name"].startswith("workload-")]
    # A record names its owner; pretend that owner is gone (a real crash takes the whole process).
    for record in records:
        path = Path(record.pop("_path"))
        path.write_text(json.dumps({**record, "owner_pid": 2**22 + 12345}))
    restarted = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await restarted.start()
    try:
        await until(lambda: asyncio.sleep(0, result=not _alive(pid)), timeout=10)
        assert (await call(restarted, ref, "/whoami"))["instance"] != body["instance"]
    finally:
        await restarted.close()
        for task in list(crashed._tasks):
            task.cancel()


async def test_history_expires_after_the_retention(tmp_path):
    ref = workload()
    runtime = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30, log_retention="1h")
    await runtime.start()
    try:
        await runtime.apply(revision(ref, 1))
        await ready(runtime, ref, f"{ref.name}-00001")
        await call(runtime, ref, "/say?text=fresh")
        assert any("fresh" in line.message for line in await runtime.log_history(ref))
        history = tmp_path / "runtime" / "history" / f"{ref.key}.jsonl"
        old = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
        with history.open("a") as fh:
            fh.write(json.dumps({"ts": old, "revision": "x", "pod": "p", "stream": "stdout", "message": "stale"}) + "\n")
        lines = await runtime.log_history(ref)
        assert not any(line.message == "stale" for line in lines)
        runtime._compact()
        assert "stale" not in history.read_text()
        assert "fresh" in history.read_text()
    finally:
        await runtime.close()


async def test_workload_sees_only_what_it_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("CAI_ADMIN_PASSWORD", "platform-secret-value")
    ref = workload()
    runtime = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=30)
    await runtime.start()
    try:
        await runtime.apply(revision(ref, 1))
        await ready(runtime, ref, f"{ref.name}-00001")
        assert (await call(runtime, ref, "/env/CAI_ADMIN_PASSWORD"))["value"] is None
        home = (await call(runtime, ref, "/env/HOME"))["value"]
        # Its own home: at a fixed path in the sandbox (sandbox/paths.py), else its directory in the data dir.
        assert home == "/home/app" if runtime.sandbox.enabled else home.endswith(ref.key)
        assert (await call(runtime, ref, "/env/K_REVISION"))["value"] == f"{ref.name}-00001"
    finally:
        await runtime.close()


async def test_a_command_without_a_built_image_runs_with_tcp_health(tmp_path):
    ref = workload()
    runtime = LocalProcessRuntime(tmp_path, idle_seconds=30)  # no image resolver at all
    await runtime.start()
    try:
        spec = RevisionSpec(ref, f"{ref.name}-00001", 1, "docker.io/example/app:1",
                            command=[sys.executable, "-m", "caiplatform.testing.tiny_app"],
                            env={"PYTHONPATH": PACKAGE_ROOT})
        await runtime.apply(spec)
        await ready(runtime, ref, spec.revision)
        assert (await call(runtime, ref, "/whoami"))["revision"] == spec.revision
        other = workload()
        await runtime.apply(RevisionSpec(other, f"{other.name}-00001", 1, "docker.io/example/app:1"))

        async def refused():
            status = await runtime.status(other)
            return status if status and status.revisions[0].state == "not_ready" else None

        status = await until(refused)
        assert status.revisions[0].reason == "ImagePullBackOff"
    finally:
        await runtime.close()


async def test_embedded_platform_wires_local_builder_and_runtime(tmp_path):
    settings = Settings(CAI_SCALE_TO_ZERO_SECONDS=12)
    platform = Platform.embedded(tmp_path / "data", settings)
    try:
        assert isinstance(platform.builder, LocalBuilder) and isinstance(platform.runtime, LocalProcessRuntime)
        assert platform.runtime.supervisor is platform.supervisor()
        assert platform.runtime.idle_seconds == 12
        assert platform.builder.root == tmp_path / "data" / "images"
        await platform.runtime.start()
        ref = workload()
        await platform.runtime.apply(RevisionSpec(
            ref, f"{ref.name}-00001", 1, "docker.io/example/app:1",
            command=[sys.executable, "-m", "caiplatform.testing.tiny_app"], env={"PYTHONPATH": PACKAGE_ROOT}))
        await ready(platform.runtime, ref, f"{ref.name}-00001")
        assert any(p.name.startswith("workload-") for p in platform.supervisor().processes)
    finally:
        await platform.aclose()  # stops the runtime's instances, then the supervisor
    assert not any(p.name.startswith("workload-") for p in platform.supervisor().processes)


async def test_a_stopped_instance_leaves_its_lines_in_history_and_no_log_file(tmp_path):
    ref = workload()
    runtime = LocalProcessRuntime(tmp_path, images=tiny_images, idle_seconds=0.5)
    await runtime.start()
    try:
        await runtime.apply(revision(ref, 1))
        await ready(runtime, ref, f"{ref.name}-00001")
        await call(runtime, ref, "/say?text=last-words")

        async def stopped():
            status = await runtime.status(ref)
            return status is not None and status.revisions[0].replicas == 0

        await until(stopped)

        async def no_log_file():  # replicas drop when the stop begins; the file goes when it ends
            return not list((tmp_path / "runtime" / "logs" / ref.key).glob("*.log"))

        await until(no_log_file, timeout=10)
        messages = [line.message for line in await runtime.log_history(ref)]
        assert "last-words" in messages and "tiny_app starting" in " ".join(messages)
        assert any(" is ready (started in " in m for m in messages)  # each cold start is measured
    finally:
        await runtime.close()
