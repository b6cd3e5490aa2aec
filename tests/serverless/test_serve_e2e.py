"""A serverless service on `caiplatform serve` (a real process on a loopback port): an image our own
builder made, reached through its published address over a real socket, then deleted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from caiplatform.adapters.local.builder import LocalBuilder
from caiplatform.db import Database
from caiplatform.db.models import Project
from caiplatform.ports.builder import BuildRequest
from caiplatform.testing.engines import free_port
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.sources import FUNCTION

pytestmark = pytest.mark.e2e
TOKEN = "serverless-e2e-automation-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_a_service_on_caiplatform_serve(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    source = tmp_path / "src"
    source.mkdir()
    for name, text in FUNCTION.items():
        (source / name).write_text(text)
    port = free_port()
    env = {**os.environ, "CAI_ADMIN_EMAIL": ADMIN_EMAIL, "CAI_ADMIN_PASSWORD": ADMIN_PASSWORD,
           "CAI_AUTOMATION_TOKEN": TOKEN}
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([sys.executable, "-m", "caiplatform", "serve", "--port", str(port), "--data-dir",
                             str(data_dir), "--api", "serverless"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, Path(log.name).read_text()
                try:
                    if (await c.get("/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, Path(log.name).read_text()
                await asyncio.sleep(0.2)
            db = Database.sqlite_file(data_dir / "platform.db")
            project = db.run_sync(lambda s: s.scalar(select(Project).where(Project.slug == "default")))
            db.dispose()
            # The server's own builder stores images in the same data dir.
            image = await LocalBuilder(data_dir).build(
                BuildRequest(project.id, project.short, "tiny", "function", source))

            url = f"/v1/projects/{project.id}/services"
            created = await c.post(url, headers=AUTH, json={
                "name": "tiny", "image": image.reference, "command": [image.command[0]],
                "args": ["-m", "caiplatform.testing.tiny_app"], "publish": {"enabled": True}})
            assert created.status_code == 202, created.text
            deadline = time.monotonic() + 60
            while (svc := (await c.get(f"{url}/tiny", headers=AUTH)).json())["status"]["phase"] != "Ready":
                assert time.monotonic() < deadline, svc["status"]
                await asyncio.sleep(0.3)
            host = f"tiny-{project.short}.apps.localhost"
            assert svc["status"]["external_url"] == f"http://{host}"
            who = await c.get("/whoami", headers={"Host": host})
            assert who.status_code == 200 and who.json()["revision"] == "tiny-00001"
            assert (await c.delete(f"{url}/tiny", headers=AUTH)).status_code == 204
            assert (await c.get("/whoami", headers={"Host": host})).status_code == 404
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
