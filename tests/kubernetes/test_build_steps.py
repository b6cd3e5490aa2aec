"""The Containerfile the Kubernetes builder hands BuildKit, per language: the code, `requirements.txt` from
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

from caiplatform.adapters.kubernetes.builder import BuildKitJobBuilder, containerfile
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
        builder = BuildKitJobBuilder(settings=cluster.settings, context_dir=tmp_path / "ctx")
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
    """`CAI_BUILD_PUSH_SECRET` becomes BuildKit's docker config; `CAI_BUILD_INSECURE_REGISTRY` its registry
    settings for a registry without a certificate it can check (a kind cluster's local registry)."""
    with emulated_cluster(build_push_secret="regcred", build_insecure_registry=True) as cluster:
        builder = BuildKitJobBuilder(settings=cluster.settings, context_dir=tmp_path / "ctx")
        try:
            source = sources.write_tree(tmp_path / "src", sources.FUNCTION)
            project = str(uuid.uuid4())
            await builder.build(BuildRequest(project, project[:8], "fn", "function", source))
        finally:
            await builder.close()
        (job,) = [o.raw for _, _, o in live(cluster.emulator, "jobs", "batch")]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    script = container["command"][2]
    assert "registry.insecure=true" in script and '[registry."registry.local"]' in script and "http = true" in script
    assert {"name": "push-credentials", "mountPath": "/home/user/.docker", "readOnly": True} in container["volumeMounts"]
    assert {"name": "DOCKER_CONFIG", "value": "/home/user/.docker"} in container["env"]
    assert {"name": "push-credentials", "secret": {"secretName": "regcred", "items": [
        {"key": ".dockerconfigjson", "path": "config.json"}]}} in pod["volumes"]
    audit(cluster.emulator, cluster.calls(), ROLE)  # the Job is valid for the cluster's schemas


@pytest.mark.process
def test_the_build_jobs_script_builds_and_reports_the_pushed_digest(tmp_path: Path):
    """The Job's shell script, run with `buildctl-daemonless.sh` replaced by a stand-in that checks what it is
    asked and writes BuildKit's metadata file: it unpacks the context, asks for a pushed image named by the
    source hash, and leaves exactly the digest as the termination message."""
    from caiplatform.adapters.kubernetes.builder import pack_context
    from caiplatform.adapters.kubernetes.client import ClusterSettings, KubeClient

    source_hex = "ab" * 32
    builder = BuildKitJobBuilder(KubeClient(ClusterSettings(host="http://127.0.0.1:9")))
    job = builder._job("build-x", "registry.local/cai-p-fn", source_hex, "function", None)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("docker.io/moby/buildkit:") and container["image"].endswith("-rootless")
    workspace, bindir, root = tmp_path / "workspace", tmp_path / "bin", tmp_path / "root"
    for d in (workspace, bindir, root):
        d.mkdir()
    code = sources.write_tree(tmp_path / "code", {"handler.py": "def handle(event):\n    return event\n"})
    (workspace / f"{source_hex}.tar.gz").write_bytes(pack_context(code, "FROM harness\n"))
    digest = "sha256:" + "c" * 64
    (bindir / "buildctl-daemonless.sh").write_text(
        "#!/bin/sh\nset -e\n"
        'case "$*" in *"--local context=/tmp/context"*) ;; *) echo "no context: $*" >&2; exit 3;; esac\n'
        'case "$*" in *"name=registry.local/cai-p-fn:' + source_hex + ',push=true"*) ;; *) echo "bad output: $*" >&2; exit 4;; esac\n'
        "test -f /tmp/context/Dockerfile && test -f /tmp/context/code/handler.py\n"
        'printf \'{\\n  "containerimage.digest": "' + digest + '",\\n  "image.name": "x"\\n}\\n\' > /tmp/metadata.json\n')
    (bindir / "buildctl-daemonless.sh").chmod(0o755)
    termination = tmp_path / "termination-log"
    def rooted(text: str) -> str:  # the container's /tmp is a directory of the test's
        return text.replace("/tmp/context", f"{root}/tmp/context").replace("/tmp/metadata.json", f"{root}/tmp/metadata.json")

    script = rooted(container["command"][2].replace("/workspace/", f"{workspace}/")
                    .replace("/dev/termination-log", str(termination)))
    (root / "tmp").mkdir()
    stand_in = rooted((bindir / "buildctl-daemonless.sh").read_text())
    (bindir / "buildctl-daemonless.sh").write_text(stand_in)
    done = subprocess.run(["sh", "-ec", script], env={"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(root)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert termination.read_text().strip() == digest
