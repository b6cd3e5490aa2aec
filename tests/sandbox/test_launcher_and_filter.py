"""Issue 34: nothing a tenant chose reaches a host-side process, and every sandboxed process runs under a
syscall filter with no nested user namespace and no terminal to type into. On one real `caiplatform serve`.

A member sets `LD_PRELOAD` (a library shipped in its own tarball) and `BASH_ENV` through the env routes of an
agent and of a serverless service whose own `command` runs on that image: the library's constructor and the
script record where they ran; a host path outside every sandbox must stay empty, and no process of the
host's (uid 0, or in the host's user namespace) may hold a variable the tenant chose. The workload itself
still gets them (its library ran inside, as the unprivileged uid). Then an instance and a build step try
`unshare(CLONE_NEWUSER)`, `unshare -Ur` and `TIOCSTI` on a terminal of their own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ..serverless.test_serve_e2e import poll
from . import kernel_probes
from .serve_support import SandboxServer

pytestmark = pytest.mark.e2e
AGENT_CANARY = "tenant-chose-this-agent-value-5f1c"
SERVICE_CANARY = "tenant-chose-this-service-value-9b7e"


def _compile(source: str, directory: Path) -> bytes:
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "a C compiler (Debian's gcc) is needed to build the LD_PRELOAD probe"
    (directory / "probe.c").write_text(source)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(directory / "probe.so"), str(directory / "probe.c")],
                   check=True, capture_output=True)
    return (directory / "probe.so").read_bytes()


def _status_uid(pid: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def holders(value: str) -> list[dict]:
    """Every process of the machine whose environment holds `value`: its pid, uid (as the host sees it),
    whether it is in the host's user namespace, and its command line."""
    own_ns = os.stat("/proc/self/ns/user").st_ino
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            ns = os.stat(entry / "ns" / "user").st_ino
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if value.encode() in environ:
            found.append({"pid": entry.name, "uid": _status_uid(entry.name), "host_userns": ns == own_ns,
                          "cmdline": cmdline[:200]})
    return found


class Server(SandboxServer):
    def __init__(self, root: Path):
        super().__init__(root / "data")
        self.root = root
        self.preload_marker = root / "preload-ran-outside"
        self.bash_env_marker = root / "bash-env-ran-outside"

    def invoke(self, name: str, body: dict) -> dict:  # type: ignore[override]  # (its answer's body)
        answer = super().invoke(name, body)
        assert answer.status_code == 200, answer.text
        return answer.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("launcher"))
    try:
        library = _compile(kernel_probes.preload_source(str(s.preload_marker)), s.root)
        s.deploy("envprobe", kernel_probes.function(library, kernel_probes.bash_env_script(str(s.bash_env_marker))),
                 framework="function")
        s.deploy("kernelbuild", kernel_probes.build_step(), framework="function")
        agent = s.settled("envprobe")
        assert agent["ready"], agent
        code_dir = s.invoke("envprobe", {})["code_dir"]
        assert code_dir
        s.variables = {"LD_PRELOAD": f"{code_dir}/probe.so", "BASH_ENV": f"{code_dir}/probe.sh",
                       "CAI_CANARY": AGENT_CANARY}
        patched = s.http.patch("/v1/agents/envprobe/env", json={"set": s.variables})
        assert patched.status_code == 200, patched.text
        s.agent = poll(lambda: s.invoke("envprobe", {}), lambda v: v["env"].get("CAI_CANARY") == AGENT_CANARY,
                       "the new revision did not serve", timeout=240)
        s.agent_holders = holders(AGENT_CANARY)

        project = next(p for p in s.http.get("/v1/projects").json()["projects"] if p["slug"] == "default")
        image = s.http.get("/v1/agents/envprobe").json()["image"]
        serve = ("import http.server, json, os\n"
                 "class H(http.server.BaseHTTPRequestHandler):\n"
                 "    def do_GET(self):\n"
                 "        try:\n            pre = open('/tmp/preloaded').read()\n"
                 "        except OSError:\n            pre = ''\n"
                 "        body = json.dumps({'env': dict(os.environ), 'preloaded': pre}).encode()\n"
                 "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
                 "        self.wfile.write(body)\n"
                 "http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n")
        created = s.http.post(f"/v1/projects/{project['id']}/services", json={
            "name": "envsvc", "image": image, "publish": {"enabled": True},
            "env": {**s.variables, "CAI_CANARY": SERVICE_CANARY},
            "command": ["/bin/sh", "-c", 'exec "$0" -c "$1"', sys.executable, serve]})
        assert created.status_code == 202, created.text
        poll(lambda: s.http.get(f"/v1/projects/{project['id']}/services/envsvc").json(),
             lambda v: v["status"]["phase"] in ("Ready", "Failed"), "the service did not settle")
        answer = httpx.get(f"{s.server.base_url}/", headers={"Host": f"envsvc-{project['short']}.apps.localhost"},
                           timeout=60)
        assert answer.status_code == 200, answer.text
        s.service = answer.json()
        s.service_holders = holders(SERVICE_CANARY)
        s.kernel = s.invoke("envprobe", {"action": "kernel"})
        build = s.settled("kernelbuild")
        assert build["state"] == "failed" and kernel_probes.MARKER in build["message"], build
        s.build_kernel = json.loads(build["message"].split(kernel_probes.MARKER, 1)[1].splitlines()[0])
        yield s
    finally:
        s.close()


# -- 1. the tenant's variables reach no host-side process -----------------------------------------------------


def test_ld_preload_runs_nothing_outside_the_sandbox(server):
    assert not server.preload_marker.exists(), server.preload_marker.read_text()


def test_bash_env_runs_nothing_outside_the_sandbox(server):
    assert not server.bash_env_marker.exists(), server.bash_env_marker.read_text()


@pytest.mark.parametrize("kind", ["agent", "service"])
def test_no_host_side_process_holds_a_tenant_variable(server, kind):
    found = server.agent_holders if kind == "agent" else server.service_holders
    privileged = [p for p in found if p["uid"] == 0 or p["host_userns"]]
    assert privileged == [], privileged
    # ...and the workload itself does: the check looks at the right processes.
    assert any(p["uid"] not in (0, None) and not p["host_userns"] for p in found), found


@pytest.mark.parametrize("kind", ["agent", "service"])
def test_the_workload_still_sees_its_variables(server, kind):
    answer = server.agent if kind == "agent" else server.service
    for name, value in server.variables.items():
        if name != "CAI_CANARY":
            assert answer["env"].get(name) == value, (name, answer["env"].get(name))
    assert answer["env"]["CAI_CANARY"] == (AGENT_CANARY if kind == "agent" else SERVICE_CANARY)
    # Its own library was loaded into it, as the unprivileged uid inside the sandbox.
    assert "uid=1000 " in answer["preloaded"], answer["preloaded"]
    assert "uid=0 " not in answer["preloaded"], answer["preloaded"]


# -- 2. a syscall filter, no nested user namespace, no terminal injection -------------------------------------


@pytest.mark.parametrize("where", ["instance", "build step"])
def test_the_process_runs_under_a_seccomp_filter(server, where):
    found = server.kernel if where == "instance" else server.build_kernel
    assert found["seccomp"] == "2", found


@pytest.mark.parametrize("where", ["instance", "build step"])
def test_a_nested_user_namespace_is_refused(server, where):
    found = server.kernel if where == "instance" else server.build_kernel
    assert found["unshare_newuser"] != 0, found
    returncode, output = found["unshare_tool"]
    assert returncode != 0 and "CapEff" not in output, found


@pytest.mark.parametrize("where", ["instance", "build step"])
def test_tiocsti_pushes_nothing_into_a_terminal(server, where):
    found = server.kernel if where == "instance" else server.build_kernel
    assert found["dev_tty"] != "injected", found
    # Even on a terminal of its own, made its controlling terminal (where the kernel allows TIOCSTI).
    assert found["tiocsti_own_terminal"] != 0, found
