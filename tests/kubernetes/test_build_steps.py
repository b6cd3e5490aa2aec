"""The Containerfile the Kubernetes builder hands kaniko, per language: the code, `requirements.txt` from
the code directory, then the language step of a function in Go, Node.js or Ruby, which is the local
builder's own code (`python -m caiplatform.build.languages`) run in the harness image."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from caiplatform.adapters.kubernetes.builder import KanikoJobBuilder, containerfile
from caiplatform.ports.builder import BuildRequest
from caiplatform.testing import sources
from caiplatform.testing.kube_cluster import emulated_cluster, live
from caiplatform.testing.kube_schemas import audit
from tests.conformance.kube_support import ROLE

HARNESS = "registry.example/harness:1"
STEP = "RUN HOME=/tmp/cai-build-cache python -m caiplatform.build.languages {framework} /app/code /app/bin"


def lines_of(text: str) -> list[str]:
    return text.splitlines()


# No toolchain is needed to write a Containerfile: `needs()` keeps the language names in the parameters
# from deselecting these tests on a machine without Go or Ruby.
@pytest.mark.needs()
@pytest.mark.parametrize("framework", ["function-go", "function-nodejs", "function-ruby"])
def test_a_function_in_another_language_gets_its_language_step(framework: str):
    lines = lines_of(containerfile(HARNESS, framework, framework.removeprefix("function-")))
    assert lines[0] == f"FROM {HARNESS}"
    assert lines[1] == "COPY --chown=1000:1000 code/ /app/code/"
    assert lines[2] == "RUN cd /app/code && if [ -f requirements.txt ]; then pip install --no-cache-dir -r requirements.txt; fi"
    step = [i for i, line in enumerate(lines) if line.startswith(STEP.format(framework=framework))]
    assert len(step) == 1, lines
    # The step runs as the image's user, on the image's copy of the code, after the code is in place.
    (i,) = step
    assert lines[i - 2] == "RUN mkdir -p /app/bin /tmp/cai-build-cache && chown 1000:1000 /app/bin /tmp/cai-build-cache"
    assert lines[i - 1] == "USER 1000" and lines[i + 1] == "USER root"
    assert lines[i].endswith("--cache-dir /tmp/cai-build-cache && rm -rf /tmp/cai-build-cache")
    assert lines[-1] == "USER 1000"
    env = next(line for line in lines if line.startswith("ENV "))
    assert f"CAI_FRAMEWORK={framework}" in env and "CAI_CODE_DIR=/app/code" in env


@pytest.mark.needs()
def test_a_go_function_finds_its_compiled_program():
    env = next(line for line in lines_of(containerfile(HARNESS, "function-go", "go")) if line.startswith("ENV "))
    assert "CAI_FUNCTION_BINARY=/app/bin/function" in env.split()
    for framework in ("function-nodejs", "function-ruby", "function", "langgraph"):
        assert "CAI_FUNCTION_BINARY" not in containerfile(HARNESS, framework, None)


@pytest.mark.parametrize("framework", ["function", "langgraph", "crewai"])
def test_python_has_no_language_step(framework: str):
    text = containerfile(HARNESS, framework, None)
    assert "caiplatform.build.languages" not in text and "USER root" not in text
    assert "pip install --no-cache-dir -r requirements.txt" in text


@pytest.mark.needs()
async def test_the_build_context_carries_the_step_of_the_functions_runtime(tmp_path: Path):
    """`framework=function` with `runtime=go`: the checks and the Containerfile are Go's, and no Go
    toolchain is needed on the control plane (the harness image has it)."""
    with emulated_cluster() as cluster:
        builder = KanikoJobBuilder(settings=cluster.settings, context_dir=tmp_path / "ctx", poll_seconds=0.02)
        try:
            source = sources.write_tree(tmp_path / "src", sources.GO_FUNCTION)
            project = str(uuid.uuid4())
            image = await builder.build(BuildRequest(project, project[:8], "fn", "function", source, runtime="go"))
        finally:
            await builder.close()
    assert image.framework == "function-go" and image.env["CAI_FUNCTION_BINARY"] == "/app/bin/function"
    (tarball,) = (tmp_path / "ctx").glob("*.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(tarball.read_bytes()))) as archive:
        dockerfile = archive.extractfile("Dockerfile").read().decode()  # type: ignore[union-attr]
        names = archive.getnames()
    assert dockerfile == containerfile(cluster.settings.harness_image, "function-go", "go")
    assert "code/main.go" in names


@pytest.mark.needs("node")
def test_the_step_the_containerfile_runs_installs_node_dependencies(tmp_path: Path):
    """What the Containerfile's RUN line runs, run here: the local builder's Node.js step."""
    code = sources.write_tree(tmp_path / "code", {
        "package.json": json.dumps({"name": "fn", "version": "1.0.0", "dependencies": {"shout": "file:./shout"}}),
        "shout/package.json": '{"name": "shout", "version": "1.0.0", "main": "index.js"}\n',
        "shout/index.js": 'module.exports = (text) => text.toUpperCase() + "!";\n',
        "index.js": 'const shout = require("shout");\nexports.handle = (event) => shout(event.message);\n',
    })
    done = subprocess.run([sys.executable, "-m", "caiplatform.build.languages", "function-nodejs", str(code),
                           str(tmp_path / "bin"), "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "npm install" in done.stdout and (code / "node_modules" / "shout").exists()


@pytest.mark.needs()
def test_a_failed_step_exits_with_the_builds_message(tmp_path: Path):
    code = sources.write_tree(tmp_path / "code", {"package.json": "[1, 2]", "index.js": "exports.handle = () => 1;\n"})
    done = subprocess.run([sys.executable, "-m", "caiplatform.build.languages", "function-nodejs", str(code),
                           str(tmp_path / "bin")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "package.json is not a JSON object" in done.stderr


async def test_push_credentials_and_a_plain_http_registry(tmp_path: Path):
    """`CAI_BUILD_PUSH_SECRET` becomes kaniko's docker config; `CAI_BUILD_INSECURE_REGISTRY` its flags for
    a registry without a certificate it can check (a kind cluster's local registry)."""
    with emulated_cluster(build_push_secret="regcred", build_insecure_registry=True) as cluster:
        builder = KanikoJobBuilder(settings=cluster.settings, context_dir=tmp_path / "ctx", poll_seconds=0.02)
        try:
            source = sources.write_tree(tmp_path / "src", sources.FUNCTION)
            project = str(uuid.uuid4())
            await builder.build(BuildRequest(project, project[:8], "fn", "function", source))
        finally:
            await builder.close()
        (job,) = [o.raw for _, _, o in live(cluster.emulator, "jobs", "batch")]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"--insecure", "--insecure-pull", "--skip-tls-verify", "--skip-tls-verify-pull"} <= set(container["args"])
    assert {"name": "push-credentials", "mountPath": "/kaniko/.docker", "readOnly": True} in container["volumeMounts"]
    assert {"name": "push-credentials", "secret": {"secretName": "regcred", "items": [
        {"key": ".dockerconfigjson", "path": "config.json"}]}} in pod["volumes"]
    audit(cluster.emulator, cluster.calls(), ROLE)  # the Job is valid for the cluster's schemas
