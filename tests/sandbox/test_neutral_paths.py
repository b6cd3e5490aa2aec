"""Issue 34, "neutral paths inside": a workload sees its code, environment and state at fixed paths, and no
path of the server's data directory, on one real `caiplatform serve`.

A Python function, a LangGraph agent (with its session database), a Node.js function, a Go function and the
build step of a Python environment (`pip install` running an in-tree build backend) each look for the data
directory in their variables, working directory, command line, mount table, memory maps and the files of their
own tree (`path_probes.py`). A function that raises must not name it either, in its answer or in the log
lines its project reads.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from ..serverless.test_serve_e2e import poll
from . import path_probes
from .serve_support import SandboxServer

pytestmark = pytest.mark.e2e
RUNNING = ("python-function", "langgraph", "node-function", "go-function")
KINDS = (*RUNNING, "build")
PLACES = ("environment", "working directory", "command line", "mount table", "memory maps")
# What a workload (or the environment's install step) writes: bind mounts of its own directories, whose entry in
# /proc/self/mountinfo still shows their source (docs/sandbox.md, what the boundary does not cover yet). By
# their last component: a build's message shows a path as `.../<last>` (`caiplatform.redaction`).
WORKLOAD_WRITES = {"app", "state"}  # /home/app, /var/lib/cai/state (its session database)
WRITABLE = {**dict.fromkeys(RUNNING, WORKLOAD_WRITES), "build": {"venv", "pip"}}  # /app/venv, /var/cache/cai/pip


class Probed(SandboxServer):
    def __init__(self, root: Path):
        # A distinctive name, so a path shown relative to its file system is still recognised.
        super().__init__(root / f"cai-data-{secrets.token_hex(4)}")
        self.markers = [str(self.data_dir), self.data_dir.name]
        self.findings: dict[str, dict] = {}


    def named(self, text: str) -> bool:
        return any(marker in text for marker in self.markers)


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    p = Probed(tmp_path_factory.mktemp("neutral"))
    try:
        p.deploy("pypaths", path_probes.python_function(p.markers), framework="function")
        p.deploy("graphpaths", path_probes.langgraph_agent(p.markers), framework="langgraph")
        p.deploy("nodepaths", path_probes.node_function(p.markers), framework="function", runtime="nodejs")
        p.deploy("gopaths", path_probes.go_function(p.markers), framework="function", runtime="go")
        p.deploy("buildpaths", path_probes.build_step(p.markers), framework="function")
        for name in ("pypaths", "graphpaths", "nodepaths", "gopaths"):
            agent = p.settled(name, timeout=300)
            assert agent["ready"], (name, agent["state"], agent.get("message"))
        for kind, name in (("python-function", "pypaths"), ("node-function", "nodepaths"), ("go-function", "gopaths")):
            answer = p.invoke(name, {"action": "probe"})
            assert answer.status_code == 200, answer.text
            p.findings[kind] = answer.json()
        graph = p.invoke("graphpaths", {"message": "where am I"})
        assert graph.status_code == 200, graph.text
        p.findings["langgraph"] = json.loads(graph.json()["output"])
        build = p.settled("buildpaths")
        assert build["state"] == "failed" and path_probes.BUILD_MARKER in build["message"], build
        p.findings["build"] = json.loads(build["message"].split(path_probes.BUILD_MARKER, 1)[1].splitlines()[0])
        yield p
    finally:
        p.close()


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("kind", KINDS)
def test_no_data_directory_path_inside(probed, kind, place):
    assert place not in probed.findings[kind]["leaks"], probed.findings[kind]["leaks"][place]


@pytest.mark.parametrize("kind", KINDS)
def test_the_mount_table_names_no_data_directory_path_of_its_code_or_environment(probed, kind):
    # /proc/self/mountinfo: code, compiled program and Python environment are read-only overlays that name
    # no host path; only the directories it writes are bind mounts of their host directory.
    mounts = probed.findings[kind]["mounts"]
    assert {m.rsplit("/", 1)[-1] for m in mounts} <= WRITABLE[kind], mounts


@pytest.mark.xfail(strict=True, reason="a writable directory is a bind mount: mountinfo shows its source path "
                                       "(docs/sandbox.md, what the boundary does not cover yet)")
@pytest.mark.parametrize("kind", KINDS)
def test_the_mount_table_names_no_data_directory_path_at_all(probed, kind):
    assert probed.findings[kind]["mounts"] == []


@pytest.mark.parametrize("kind", ("python-function", "langgraph", "build"))
def test_no_data_directory_path_in_its_own_files(probed, kind):
    # Its code, its Python environment (pyvenv.cfg, scripts), its home and its session database's directory.
    assert "files" not in probed.findings[kind]["leaks"], probed.findings[kind]["leaks"]["files"]
    assert "interpreter" not in probed.findings[kind]["leaks"], probed.findings[kind]["leaks"]["interpreter"]


def test_a_python_workload_sees_its_code_environment_and_state_at_fixed_paths(probed):
    function, graph = probed.findings["python-function"], probed.findings["langgraph"]
    assert function["code_dir"] == function["cwd"] == "/app/code"
    assert function["prefix"] == "/app/venv" and function["executable"] == "/app/venv/bin/python"
    assert function["home"] == "/home/app"
    assert graph["session_store"].endswith(":////var/lib/cai/state/sessions.sqlite3"), graph["session_store"]


def test_a_go_function_runs_from_a_fixed_path(probed):
    assert probed.findings["go-function"]["executable"] == "/app/bin/function"
    assert probed.findings["node-function"]["cwd"] == probed.findings["go-function"]["cwd"] == "/app/code"


def test_a_failing_function_names_no_data_directory_path(probed):
    answer = probed.invoke("pypaths", {"action": "fail"})
    assert answer.status_code >= 400 and "failed on purpose" in answer.text, answer.text
    assert not probed.named(answer.text), answer.text
    history = poll(lambda: probed.http.get("/v1/agents/pypaths/logs/history").json(),
                   lambda v: any("failed on purpose" in line["message"] for line in v["lines"]),
                   "the traceback did not reach the log history")
    lines = [line["message"] for line in history["lines"]]
    assert not any(probed.named(line) for line in lines), [line for line in lines if probed.named(line)]
