"""The in-memory builder and runtime as `Platform.in_memory()` wires them: the harness contract."""

from __future__ import annotations

import asyncio
import time
import uuid

from caiplatform.adapters.memory.builder import InMemoryBuilder
from caiplatform.adapters.memory.runtime import InMemoryRuntime
from caiplatform.platform import Platform
from caiplatform.ports.builder import BuildRequest
from caiplatform.ports.runtime import NoCapacity, RevisionSpec, WorkloadRef
from caiplatform.settings import Settings
from caiplatform.testing import sources, tiny_app


def workload() -> WorkloadRef:
    project = str(uuid.uuid4())
    return WorkloadRef(project_id=project, project_short=project[:8], name="echo")


async def wait_state(runtime, ref, state: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        status = await runtime.status(ref)
        if status and status.revisions and status.revisions[0].state == state:
            return status
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.02)


async def test_platform_wires_memory_builder_and_runtime(tmp_path):
    settings = Settings(CAI_SCALE_TO_ZERO_SECONDS=7, LOG_RETENTION="48h")
    async with Platform.in_memory(settings) as platform:
        assert isinstance(platform.builder, InMemoryBuilder) and isinstance(platform.runtime, InMemoryRuntime)
        assert platform.runtime.idle_seconds == 7 and platform.runtime.log_retention.total_seconds() == 48 * 3600
        ref = workload()
        image = await platform.builder.build(BuildRequest(
            ref.project_id, ref.project_short, ref.name, "function", sources.write_tree(tmp_path / "src", sources.FUNCTION)))
        seen = {}

        def factory(built, env):
            seen.update(image=built, env=dict(env))
            return tiny_app.create_app(env)

        platform.runtime.app_factory = factory
        await platform.runtime.apply(RevisionSpec(
            ref, "echo-00001", 1, image.reference, env={"AGENT_NAME": "echo"}, secret_env={"MODEL_API_KEY": "k"}))
        await wait_state(platform.runtime, ref, "ready")
        assert seen["image"].digest == image.digest
        env = seen["env"]
        assert env["CAI_FRAMEWORK"] == "function" and env["CAI_CODE_DIR"] == image.location
        assert env["AGENT_NAME"] == "echo" and env["MODEL_API_KEY"] == "k"
        assert env["K_REVISION"] == "echo-00001" and env["PORT"] == "8080"
        endpoint = await platform.runtime.acquire(ref, timeout=5)
        async with endpoint.client() as client:
            assert (await client.get("/whoami")).json()["revision"] == "echo-00001"
        await endpoint.release()


async def test_default_factory_without_a_built_image_is_not_ready():
    runtime = InMemoryRuntime(idle_seconds=1)
    ref = workload()
    try:
        await runtime.apply(RevisionSpec(ref, "echo-00001", 1, "docker.io/library/nginx:latest"))
        status = await wait_state(runtime, ref, "not_ready")
        assert status.revisions[0].reason == "ImagePullBackOff"
        assert "not built by this platform's builder" in status.revisions[0].message
        try:
            await runtime.acquire(ref, timeout=1)
        except NoCapacity as exc:
            assert "no ready revision" in exc.message
        else:
            raise AssertionError("acquire should fail")
    finally:
        await runtime.close()


async def test_app_that_raises_while_built_is_not_ready_with_its_error():
    def factory(image, env):
        raise RuntimeError("entry module failed to import")

    runtime = InMemoryRuntime(app_factory=factory, idle_seconds=1)
    ref = workload()
    try:
        await runtime.apply(RevisionSpec(ref, "echo-00001", 1, "registry.local/x@sha256:" + "1" * 64))
        status = await wait_state(runtime, ref, "not_ready")
        assert status.revisions[0].reason == "ContainerFailed"
        assert "entry module failed to import" in status.revisions[0].message
        history = await runtime.log_history(ref)
        assert any("entry module failed to import" in line.message for line in history)
    finally:
        await runtime.close()


async def test_spec_document_carries_command_resources_and_traffic_tags():
    from caiplatform.ports.runtime import Resources, TrafficTarget

    runtime = InMemoryRuntime(app_factory=lambda image, env: tiny_app.create_app(env), idle_seconds=1)
    ref = workload()
    try:
        await runtime.apply(RevisionSpec(
            ref, "echo-00001", 1, "docker.io/example/app:1", command=["serve"], args=["--fast"],
            resources=Resources(requests={"cpu": "100m"}, limits={"memory": "256Mi"}),
            runtime_class_name="gvisor", service_account_name="runner", labels={"who": "me"},
        ), [TrafficTarget(100, "echo-00001", tag="blue")])
        doc = await runtime.spec_document(ref)
        assert doc is not None
        template = doc["spec"]["template"]
        (container,) = template["spec"]["containers"]
        assert container["command"] == ["serve"] and container["args"] == ["--fast"]
        assert container["resources"] == {"requests": {"cpu": "100m"}, "limits": {"memory": "256Mi"}}
        assert template["spec"]["runtimeClassName"] == "gvisor" and template["spec"]["serviceAccountName"] == "runner"
        assert template["metadata"]["labels"] == {"who": "me"}
        assert doc["spec"]["traffic"] == [{"percent": 100, "latestRevision": False, "revisionName": "echo-00001", "tag": "blue"}]
        assert doc["status"]["traffic"][0]["url"].startswith("http://blue-echo.")
    finally:
        await runtime.close()
