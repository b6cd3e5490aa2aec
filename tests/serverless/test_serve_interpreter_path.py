"""A service with its own `command` on `caiplatform serve` started through an interpreter path that is not
normalized (`cd app && ../.venv/bin/python -m caiplatform serve`: Python keeps the `..` in
`sys.executable`).

Such a revision runs behind the platform's relay, started with the server's interpreter inside the sandbox,
where only the interpreter's environment is mounted: a path through a directory that is not there
(`<cwd>/..`) cannot be resolved, and every such instance exited with 127 (`exec: .../python: not found`)."""

from __future__ import annotations

import os
import sys

import httpx
import pytest

from caiplatform.testing.serve import ServeProcess

from .test_serve_e2e import function_image

pytestmark = pytest.mark.e2e
TOKEN = "serverless-interpreter-path-token"


def test_a_service_command_runs_when_the_server_was_started_through_a_relative_interpreter_path(tmp_path):
    elsewhere = tmp_path / "app"  # a working directory the sandbox does not show
    elsewhere.mkdir()
    python = os.path.relpath(os.path.abspath(sys.executable), elsewhere)  # ../../.venv/bin/python
    assert python.startswith("../") and os.path.samefile(elsewhere / python, sys.executable)
    server = ServeProcess(tmp_path / "data", env={"CAI_AUTOMATION_TOKEN": TOKEN}, python=python, cwd=elsewhere).start()
    http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    try:
        image = function_image(http)
        project = next(p for p in http.get("/v1/projects").json()["projects"] if p["slug"] == "default")
        url = f"/v1/projects/{project['id']}/services"
        # Its own command: the image's Python environment, where the sandbox shows it (docs/sandbox.md).
        created = http.post(url, json={"name": "tiny", "image": image, "publish": {"enabled": True},
                                       "command": ["/app/venv/bin/python"], "args": ["-m", "caiplatform.testing.tiny_app"],
                                       "env": {"GREETING": "hello"}})
        assert created.status_code == 202, created.text
        host = f"tiny-{project['short']}.apps.localhost"
        answer = httpx.get(f"{server.base_url}/whoami", headers={"Host": host}, timeout=60)
        assert answer.status_code == 200, (answer.text, http.get(f"{url}/tiny").json()["status"])
        assert answer.json()["greeting"] == "hello"
    finally:
        http.close()
        server.stop()
