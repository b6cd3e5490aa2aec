"""A service's whole life on the embedded platform with the local process runtime: an image our own
builder made, run as a supervised process, reached through its internal and published addresses, a
PATCH into a new revision, a traffic split, logs, spec, metrics, a restart of the platform, delete."""

from __future__ import annotations

import time

import anyio
import httpx

from caiplatform.platform import Platform
from caiplatform.ports.builder import BuildRequest
from caiplatform.principal import Principal
from caiplatform.testing.http import asgi_client
from caiplatform.testing.sources import FUNCTION

AUTOMATION = {"Authorization": "Bearer automation-token-for-tests"}


async def wait_phase(c: httpx.AsyncClient, url: str, phase: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = (await c.get(url, headers=AUTOMATION)).json()
        if body["status"]["phase"] == phase or time.monotonic() > deadline:
            assert body["status"]["phase"] == phase, body["status"]
            return body
        await anyio.sleep(0.2)


async def _function_image(platform: Platform, project, tmp_path):
    """The example function, built for the project by the platform's own builder."""
    source = tmp_path / "src"
    source.mkdir(exist_ok=True)
    for name, text in FUNCTION.items():
        (source / name).write_text(text)
    return await platform.builder.build(BuildRequest(project.id, project.short, "fn", "function", source))


async def test_service_lifecycle_on_the_local_runtime(tmp_path, settings, clock):
    platform = Platform.embedded(tmp_path / "data", settings, clock=clock)
    await platform.start()
    try:
        project = await platform.serverless.project(Principal.automation(), _default_project(platform))
        image = await _function_image(platform, project, tmp_path)
        python = image.command[0]
        base = f"/v1/projects/{project.id}/services"
        async with asgi_client(platform, ["serverless"]) as c:
            r = await c.post(base, headers=AUTOMATION, json={
                "name": "tiny", "image": image.reference, "command": [python],
                "args": ["-m", "caiplatform.testing.tiny_app"], "env": {"GREETING": "one"},
                "publish": {"enabled": True}})
            assert r.status_code == 202, r.text
            svc = await wait_phase(c, f"{base}/tiny", "Ready")
            assert svc["status"]["latest_ready_revision"] == "tiny-00001"

            internal = svc["status"]["internal_url"]
            async with httpx.AsyncClient(transport=platform.serverless.internal_transport(), timeout=30) as inside:
                who = (await inside.get(f"{internal}/whoami")).json()
                assert who == {**who, "revision": "tiny-00001", "greeting": "one"}
                timeout_env = (await inside.get(f"{internal}/env/PLATFORM_REQUEST_TIMEOUT_SECONDS")).json()
                assert timeout_env["value"] == "300"
            host = f"tiny-{project.short}.{platform.settings.apps_domain}"
            published = await c.get("/say?text=hello-from-outside", headers={"Host": host})
            assert published.status_code == 200 and published.json() == {"said": "hello-from-outside"}

            patched = await c.patch(f"{base}/tiny", headers=AUTOMATION, json={"env": {"GREETING": "two"}})
            assert patched.status_code == 200 and patched.json()["status"]["latest_created_revision"] == "tiny-00002"
            await wait_phase(c, f"{base}/tiny", "Ready")
            assert (await c.get("/whoami", headers={"Host": host})).json()["greeting"] == "two"

            split = await c.post(f"{base}/tiny:set-traffic", headers=AUTOMATION, json={"traffic": [
                {"revision_name": "tiny-00001", "percent": 50, "tag": "blue"},
                {"revision_name": "tiny-00002", "percent": 50, "tag": "green"}]})
            assert split.status_code == 202, split.text
            seen = {(await c.get("/whoami", headers={"Host": host})).json()["greeting"] for _ in range(40)}
            assert seen == {"one", "two"}

            logs = await c.get(f"{base}/tiny/logs", headers=AUTOMATION, params={"tail": 100})
            assert logs.status_code == 200
            spec = (await c.get(f"{base}/tiny/spec", headers=AUTOMATION)).json()
            assert "caiplatform.testing.tiny_app" in spec["yaml"]
            metrics = (await c.get(f"{base}/tiny/metrics", headers=AUTOMATION)).json()
            assert metrics["instances"]["current"] >= 1 and len(metrics["revisions"]) == 2

            # A schedule trigger fired by the platform's own scheduler task (the clock moves, time passes).
            trigger = await c.post(f"/v1/projects/{project.id}/triggers", headers=AUTOMATION, json={
                "name": "cron", "target": {"service": "tiny", "path": "/say?text=fired-by-cron"},
                "source": {"type": "schedule", "schedule": {"cron": "* * * * *"}}})
            assert trigger.status_code == 202, trigger.text
            await platform.serverless.triggers.wait_idle()
            clock.advance(minutes=1)
            deadline = time.monotonic() + 20
            while True:
                runs = (await c.get(f"/v1/projects/{project.id}/triggers/cron", headers=AUTOMATION)).json()["runs"]
                if (runs and runs[0]["status"] != "running") or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.2)
            assert len(runs) == 1 and runs[0]["status"] == "succeeded" and runs[0]["http_status"] == 200, runs
    finally:
        await platform.aclose()

    # A restart of the platform on the same data dir keeps the service and serves it again.
    platform = Platform.embedded(tmp_path / "data", settings)
    await platform.start()
    try:
        async with asgi_client(platform, ["serverless"]) as c:
            svc = await wait_phase(c, f"{base}/tiny", "Ready")
            assert svc["env"] == {"GREETING": "two"} and svc["status"]["generation"] == 3
            assert (await c.get("/whoami", headers={"Host": host})).status_code == 200
            assert (await c.delete(f"{base}/tiny", headers=AUTOMATION)).status_code == 204
            assert (await c.get("/whoami", headers={"Host": host})).status_code == 404
            assert (await c.get(f"{base}/tiny", headers=AUTOMATION)).status_code == 404
    finally:
        await platform.aclose()


async def test_deleting_a_project_stops_its_service_processes_and_removes_its_buckets(tmp_path, settings, clock):
    from caiplatform.ports.runtime import WorkloadRef
    from caiplatform.testing.users import delete_project, new_project

    platform = Platform.embedded(tmp_path / "data", settings, clock=clock)
    await platform.start()
    try:
        project = await new_project(platform, "doomed")
        image = await _function_image(platform, project, tmp_path)
        base = f"/v1/projects/{project.id}"
        async with asgi_client(platform, ["serverless"]) as c:
            r = await c.post(f"{base}/services", headers=AUTOMATION, json={
                "name": "tiny", "image": image.reference, "command": [image.command[0]],
                "args": ["-m", "caiplatform.testing.tiny_app"], "scaling": {"min_scale": 1}})
            assert r.status_code == 202, r.text
            await wait_phase(c, f"{base}/services/tiny", "Ready")
            r = await c.post(f"{base}/triggers", headers=AUTOMATION, json={
                "name": "uploads", "target": {"service": "tiny", "path": "/say"},
                "source": {"type": "objectstore", "objectstore": {"bucket": "inbox"}}})
            assert r.status_code == 202, r.text
            await platform.serverless.triggers.wait_idle()
        bucket = platform.serverless.triggers.bucket_dir(project.short, "inbox")
        (bucket / "object.json").write_text("{}")
        ref = WorkloadRef(project.id, project.short, "tiny", kind="service")
        processes = [p for p in platform.supervisor().processes if p.name.startswith(f"workload-{ref.key}-")]
        assert processes and all(p.pid for p in processes)

        await delete_project(platform, project.id)

        assert await platform.runtime.status(ref) is None
        assert not [p for p in platform.supervisor().processes if p.name.startswith(f"workload-{ref.key}-")]
        for process in processes:
            assert process.state == "stopped"
        assert not bucket.parent.exists()  # the project's buckets, objects and all
        assert (await platform.runtime.usage(project.namespace))["pods"] == 0
        assert await platform.serverless.purge_project(project.id) == 0
    finally:
        await platform.aclose()


def _default_project(platform: Platform) -> str:
    from sqlalchemy import select

    from caiplatform.db.models import Project

    return platform.db.run_sync(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
