"""Issue 34: what one project's build shares with another's, and what a build sees of the server.

On one real `caiplatform serve`: the same tarball deployed in two projects is two images (the project is
part of the image key), and nothing project B sees says that project A built it first; within a project
the image is still reused.
"""

from __future__ import annotations

import httpx
import pytest

from caiplatform.testing.serve import ServeProcess

from ..agents.agents_support import tarball
from ..serverless.test_serve_e2e import poll

pytestmark = pytest.mark.e2e
TOKEN = "build-isolation-automation-token"
FUNCTION = {"main.py": "def handle(event, context):\n    return {'echo': event}\n", "notes.txt": "same source\n"}


class Server:
    def __init__(self, root):
        self.data_dir = root / "data"
        self.server = ServeProcess(self.data_dir, env={"CAI_AUTOMATION_TOKEN": TOKEN}).start()
        self.http = httpx.Client(base_url=self.server.base_url, headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=120)

    def deploy(self, project: str, name: str, files: dict[str, str], **fields: str) -> None:
        response = self.http.post("/v1/agents", params={"project": project}, data={"name": name, **fields},
                                  files={"code": ("code.tar.gz", tarball(files), "application/gzip")})
        assert response.status_code == 202, response.text

    def settled(self, project: str, name: str) -> dict:
        return poll(lambda: self.http.get(f"/v1/agents/{name}", params={"project": project}).json(),
                    lambda v: v.get("state") not in ("building", "deploying"), f"{name} did not settle", timeout=240)

    def close(self) -> None:
        self.http.close()
        self.server.stop()


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("builds"))
    try:
        created = server.http.post("/v1/projects", json={"slug": "other", "name": "Other"})
        assert created.status_code in (200, 201), created.text
        yield server
    finally:
        server.close()


def test_the_same_source_in_two_projects_is_two_images(serve):
    serve.deploy("default", "same", FUNCTION, framework="function")
    first = serve.settled("default", "same")
    assert first["ready"], first
    serve.deploy("other", "same", FUNCTION, framework="function")
    second = serve.settled("other", "same")
    assert second["ready"], second
    digest_a, digest_b = first["image"].rpartition("@")[2], second["image"].rpartition("@")[2]
    assert digest_a.startswith("sha256:") and digest_b.startswith("sha256:")
    assert digest_a != digest_b, (first["image"], second["image"])
    images = serve.data_dir / "images"
    assert (images / digest_a.removeprefix("sha256:")).is_dir() and (images / digest_b.removeprefix("sha256:")).is_dir()
    seen_by_b = [second, serve.http.get("/v1/agents/same/revisions", params={"project": "other"}).text,
                 serve.http.get("/v1/agents/same/logs/history", params={"project": "other"}).text]
    assert not any("reus" in str(part).lower() or "same source" in str(part).lower() for part in seen_by_b), seen_by_b
    # within one project the image is still reused: a second workload of the same source gets the same digest
    serve.deploy("default", "again", FUNCTION, framework="function")
    again = serve.settled("default", "again")
    assert again["ready"] and again["image"].rpartition("@")[2] == digest_a, again
