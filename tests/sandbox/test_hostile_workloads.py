"""Issue 26: deployed code must not own the machine. Hostile workloads on one real `caiplatform serve`.

A Python function, a Node.js function, a LangGraph agent, a serverless service's own `command` and two build
steps (a `requirements.txt` package whose build backend runs during `pip install`, a `preinstall` script run
by `npm install`) each try every escape the issue lists; each test checks one escape for every kind. With `CAI_LOCAL_SANDBOX=off` in the environment
the same tests show today's unconfined behaviour (they fail), which is how they were checked against it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest

from ..serverless.test_serve_e2e import poll
from . import probes
from .serve_support import SandboxServer

pytestmark = pytest.mark.e2e
KINDS = ("python-function", "node-function", "langgraph", "command", "build", "npm-build")


class Hostile(SandboxServer):
    """The server, its client and what each kind of workload reached."""

    def __init__(self, root: Path):
        super().__init__(root / "data")
        self.root = root
        assert self.server.proc is not None
        self.pid = self.server.proc.pid
        self.findings: dict[str, dict] = {}

    def outside(self, kind: str) -> Path:
        return self.root / f"escaped-{kind}"

    def probe_args(self, kind: str) -> tuple[str, int, str]:
        return str(self.data_dir), self.pid, str(self.outside(kind))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    h = Hostile(tmp_path_factory.mktemp("hostile"))
    try:
        h.deploy("pyprobe", probes.python_function(*h.probe_args("python-function")), framework="function")
        h.deploy("nodeprobe", probes.node_function(*h.probe_args("node-function")), framework="function",
                 runtime="nodejs")
        h.deploy("graphprobe", probes.langgraph_agent(*h.probe_args("langgraph")), framework="langgraph")
        h.deploy("buildprobe", probes.build_step(*h.probe_args("build")), framework="function")
        h.deploy("npmprobe", probes.npm_build_step(*h.probe_args("npm-build")), framework="function", runtime="nodejs")
        for name in ("pyprobe", "nodeprobe", "graphprobe"):
            agent = h.settled(name)
            assert agent["ready"], (name, agent["state"], agent.get("message"))
        answers = {
            "python-function": h.invoke("pyprobe", {"action": "probe"}),
            "node-function": h.invoke("nodeprobe", {"action": "probe"}),
        }
        for kind, answer in answers.items():
            assert answer.status_code == 200, answer.text
            h.findings[kind] = answer.json()
        graph = h.invoke("graphprobe", {"message": "look around"})
        assert graph.status_code == 200, graph.text
        h.findings["langgraph"] = json.loads(graph.json()["output"])

        for kind, name in (("build", "buildprobe"), ("npm-build", "npmprobe")):
            build = h.settled(name)
            assert build["state"] == "failed" and probes.BUILD_MARKER in build["message"], build
            h.findings[kind] = json.loads(build["message"].split(probes.BUILD_MARKER, 1)[1].splitlines()[0])

        # A serverless service whose own command runs on the function's image.
        project = next(p for p in h.http.get("/v1/projects").json()["projects"] if p["slug"] == "default")
        image = h.http.get("/v1/agents/pyprobe").json()["image"]
        script = f'id > {h.outside("command-id")}; exec "$0" -c "$1"'
        created = h.http.post(f"/v1/projects/{project['id']}/services", json={
            "name": "cmdprobe", "image": image, "publish": {"enabled": True},
            "command": ["/bin/sh", "-c", script, sys.executable, probes.command_server(*h.probe_args("command"))]})
        assert created.status_code == 202, created.text
        poll(lambda: h.http.get(f"/v1/projects/{project['id']}/services/cmdprobe").json(),
             lambda v: v["status"]["phase"] in ("Ready", "Failed"), "the service did not settle")
        answer = httpx.get(f"{h.server.base_url}/", headers={"Host": f"cmdprobe-{project['short']}.apps.localhost"},
                           timeout=60)
        assert answer.status_code == 200, answer.text
        h.findings["command"] = answer.json()
        yield h
    finally:
        h.close()


@pytest.mark.parametrize("kind", KINDS)
def test_the_server_environment_is_out_of_reach(hostile, kind):
    assert hostile.findings[kind]["server_environ"] is False


@pytest.mark.parametrize("kind", KINDS)
def test_the_platform_database_is_out_of_reach(hostile, kind):
    assert hostile.findings[kind]["database"] is False


@pytest.mark.parametrize("kind", KINDS)
def test_the_session_signing_key_is_out_of_reach(hostile, kind):
    assert hostile.findings[kind]["session_key"] is False


@pytest.mark.parametrize("kind", KINDS)
def test_openbao_init_json_is_out_of_reach(hostile, kind):
    assert (hostile.data_dir / "openbao" / "init.json").is_file()  # there is something to protect
    assert hostile.findings[kind]["openbao_init"] is False


@pytest.mark.parametrize("kind", KINDS)
def test_other_workloads_keys_are_out_of_reach(hostile, kind):
    # Only the workload's own key may be in view (its own processes' environment).
    assert len(hostile.findings[kind]["other_keys"]) <= 1, hostile.findings[kind]["other_keys"]


@pytest.mark.parametrize("kind", KINDS)
def test_other_workloads_sessions_are_out_of_reach(hostile, kind):
    own = {"python-function": "pyprobe", "node-function": "nodeprobe", "langgraph": "graphprobe"}.get(kind)
    foreign = [p for p in hostile.findings[kind]["sessions"] if own is None or f"-{own}" not in p]
    assert foreign == []


@pytest.mark.parametrize("kind", KINDS)
def test_nothing_is_written_outside_the_workload_tree(hostile, kind):
    assert not hostile.outside(kind).exists()  # nothing landed on the host
    if os.geteuid() == 0:
        # A root server's sandbox sees the directories around its tree as root's: it cannot even create the
        # file in its own view. A server that is not root runs its sandboxes in a user namespace of its own
        # uid, where bubblewrap makes those directories (in the sandbox's private tmpfs) as that uid: the
        # write succeeds there and vanishes with the sandbox, which the host check above shows.
        assert hostile.findings[kind]["wrote_outside"] is False


def test_a_service_command_does_not_run_as_root_on_the_host(hostile):
    assert not hostile.outside("command-id").exists()  # `id > <file outside>` could not write
    assert hostile.findings["command"]["uid"] != 0


@pytest.mark.parametrize("kind", KINDS)
def test_other_processes_are_invisible(hostile, kind):
    findings = hostile.findings[kind]
    assert findings["server_process"] is False
    assert findings["uid"] != 0
    assert findings["processes"] < 20, findings["processes"]  # its own few, not the machine's


@pytest.mark.parametrize("name", ["pyprobe", "nodeprobe"])
def test_a_fork_bomb_is_held_by_the_process_limit(hostile, name):
    answer = hostile.invoke(name, {"action": "forks"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["forks"] < 600  # the default limit is 512 processes; the probe tries 1500


@pytest.mark.parametrize("kind", ["python-function", "node-function"])
def test_a_memory_hog_is_stopped_and_reported_as_oomkilled(hostile, kind):
    name = f"hog-{kind.split('-')[0]}"
    files = (probes.python_function if kind == "python-function" else probes.node_function)(*hostile.probe_args(name))
    hostile.deploy(name, files, framework="function", runtime=kind.split("-")[0].replace("node", "nodejs"),
                   config=json.dumps({"resources": {"limits": {"memory": "128Mi"}}}))
    limits = hostile.http.get("/healthz").json()["sandbox"]["detail"]  # cgroup v1/v2, or rlimits
    settled = hostile.settled(name)
    assert settled["ready"], (limits, settled)  # Node.js starts under the rlimit fallback's limit too
    answer = hostile.invoke(name, {"action": "hog"})
    assert answer.status_code >= 500, answer.text  # the instance died, or its allocation failed, under the request

    def revision() -> dict:
        return hostile.http.get(f"/v1/agents/{name}/revisions").json()["revisions"][0]

    reported = poll(revision, lambda r: r["reason"] == "OOMKilled", "the OOM kill was not reported", timeout=30)
    assert "128Mi" in reported["message"]


def test_the_sandbox_is_on_and_says_so_in_healthz(hostile):
    assert hostile.http.get("/healthz").json()["sandbox"]["status"] == "on"


def test_the_server_files_in_the_data_directory_are_owner_only(hostile):
    data = hostile.data_dir
    assert data.stat().st_mode & 0o777 == 0o700
    for path in [data / "platform.db", data / "session.key", *data.glob("runtime/workloads/*.json"),
                 *data.glob("run/*.json")]:
        assert path.stat().st_mode & 0o777 == 0o600, path
    for path in [data / "runtime", data / "run", data / "sessions", data / "openbao"]:
        assert path.stat().st_mode & 0o777 == 0o700, path
