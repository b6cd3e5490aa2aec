"""What the sandbox's end-to-end tests share: one `caiplatform serve` with an automation token, deploying
workloads from files, and the Python function whose `requirements.txt` runs a probe as a build step."""

from __future__ import annotations

from pathlib import Path

import httpx

from caiplatform.testing.serve import ServeProcess

from ..agents.agents_support import tarball
from ..serverless.test_serve_e2e import poll

TOKEN = "sandbox-e2e-automation-token"


class SandboxServer:
    """A server on `data_dir`, its client (as the automation token) and deploys into the default project."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.server = ServeProcess(self.data_dir, env={"CAI_AUTOMATION_TOKEN": TOKEN}).start()
        self.http = httpx.Client(base_url=self.server.base_url, headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=120)

    def deploy(self, name: str, files: dict[str, str], **fields: str) -> None:
        response = self.http.post("/v1/agents", params={"project": "default"}, data={"name": name, **fields},
                                  files={"code": ("code.tar.gz", tarball(files), "application/gzip")})
        assert response.status_code == 202, response.text

    def settled(self, name: str, timeout: float = 240) -> dict:
        return poll(lambda: self.http.get(f"/v1/agents/{name}").json(),
                    lambda v: v.get("state") not in ("building", "deploying"), f"{name} did not settle", timeout=timeout)

    def invoke(self, name: str, body: dict) -> httpx.Response:
        return self.http.post(f"/v1/agents/{name}/invoke", json=body)

    def close(self) -> None:
        self.http.close()
        self.server.stop()


def build_step_package(package: str, backend: str) -> dict[str, str]:
    """A Python function whose requirements.txt installs the local package `package`, built by the in-tree
    backend `backend`: that code runs inside `pip install` (the environment's build step)."""
    return {
        "main.py": "def handle(event, context):\n    return {}\n",
        "requirements.txt": f"./{package}\n",
        f"{package}/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
                                     f'[project]\nname = "{package}"\nversion = "1"\n',
        f"{package}/backend.py": backend,
    }
