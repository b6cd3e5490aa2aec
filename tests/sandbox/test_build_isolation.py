"""Issue 34: what one project's build shares with another's, and what a build sees of the server.

On one real `caiplatform serve`: the same tarball deployed in two projects is two images (the project is
part of the image key), and nothing project B sees says that project A built it first; within a project
the image is still reused. The server's environment holds canary variables (`GOOGLE_API_KEY`,
`GOOGLE_APPLICATION_CREDENTIALS`, `NPM_CONFIG__AUTHTOKEN`, `GOCANARY`, `PIP_CANARY`, ...) that a build step (a
Python package's build backend run by `pip install -r requirements.txt`, an npm `preinstall`) must not see,
and a variable the operator names in `CAI_BUILD_PASS_ENV` that it must see.
"""

from __future__ import annotations

import json

import httpx
import pytest

from caiplatform.testing.serve import ServeProcess

from ..agents.agents_support import tarball
from ..serverless.test_serve_e2e import poll

pytestmark = pytest.mark.e2e
TOKEN = "build-isolation-automation-token"
MARKER = "BUILD-ENV-REPORT:"
CANARIES = {
    "GOOGLE_API_KEY": "canary-google-api-key",
    "GOOGLE_APPLICATION_CREDENTIALS": "/canary/google-credentials.json",
    "NPM_CONFIG__AUTHTOKEN": "canary-npm-auth-token",
    "npm_config__authToken": "canary-npm-auth-token-lower",
    "GOCANARY": "canary-go",
    "GOFLAGS": "-canary-goflags",
    "PIP_CANARY": "canary-pip",
    "BUNDLE_GEMS__EXAMPLE__COM": "canary-user:canary-bundle-password",
    "CGO_CANARY": "canary-cgo",
    "GEM_CANARY": "canary-gem",
}
PASSED = {"CAI_TEST_NAMED_FOR_BUILDS": "named-by-the-operator", "NO_PROXY": "proxy-exempt.invalid"}
PYTHON_BUILD = {
    "main.py": "def handle(event, context):\n    return {}\n",
    "requirements.txt": "./envpkg\n",
    "envpkg/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
                             '[project]\nname = "envpkg"\nversion = "1"\n',
    "envpkg/backend.py": "import json, os, sys\n"
                         f"print({MARKER!r} + json.dumps(dict(os.environ)), file=sys.stderr, flush=True)\n"
                         "raise SystemExit(1)\n",
}
NPM_BUILD = {
    "index.js": "exports.handle = async () => ({});\n",
    "report.js": f"console.error({MARKER!r} + JSON.stringify(process.env)); process.exit(1);\n",
    "package.json": json.dumps({"name": "envprobe", "version": "1.0.0", "scripts": {"preinstall": "node report.js"},
                                "dependencies": {"dep": "file:./dep"}}),
    "dep/package.json": json.dumps({"name": "dep", "version": "1.0.0"}),
}
FUNCTION = {"main.py": "def handle(event, context):\n    return {'echo': event}\n", "notes.txt": "same source\n"}


class Server:
    def __init__(self, root):
        self.data_dir = root / "data"
        env = {"CAI_AUTOMATION_TOKEN": TOKEN, **CANARIES, **PASSED, "CAI_BUILD_PASS_ENV": "CAI_TEST_NAMED_FOR_BUILDS"}
        self.server = ServeProcess(self.data_dir, env=env).start()
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


@pytest.mark.parametrize(("name", "files", "fields"), [
    ("pybuildenv", PYTHON_BUILD, {"framework": "function"}),
    ("npmbuildenv", NPM_BUILD, {"framework": "function", "runtime": "nodejs"}),
])
def test_a_build_step_sees_no_server_variable_but_the_named_ones(serve, name, files, fields):
    serve.deploy("default", name, files, **fields)
    build = serve.settled("default", name)
    assert build["state"] == "failed" and MARKER in build["message"], build
    seen = json.loads(build["message"].split(MARKER, 1)[1].splitlines()[0])
    leaked = {k: v for k, v in seen.items() if any(c in v for c in CANARIES.values()) or k in CANARIES}
    assert not leaked, leaked
    for key, value in PASSED.items():
        assert seen.get(key) == value, (key, sorted(seen))
