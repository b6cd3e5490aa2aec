"""Issue 34: a workload has a network of its own. Hostile workloads on one real `caiplatform serve`.

A Python function in project A tries every TCP port listening on this machine's loopback (read here from
`/proc/net/tcp*` and handed to it), the engines' ports among them, and sends a forged control-plane
`POST /invoke` (a user id of its choosing, injected `memories`) to every one that answers and to every
harness socket it can find; project B's function is the victim. It must reach only the platform API and
the model endpoint. Then: a harness refuses a caller without its per-instance secret, a LangGraph agent
still answers through the scripted model, and a function still reads a project secret through its read
token. On the code before issue 34 the scan reached B's harness, the engines and other servers' ports,
and no harness socket existed.
"""

from __future__ import annotations

import glob
import json
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from caiplatform.testing.example_agents import LANGGRAPH_WEATHER
from caiplatform.testing.serve import ServeProcess

from ..agents.agents_support import tarball
from ..serverless.test_serve_e2e import poll

pytestmark = pytest.mark.e2e
TOKEN = "network-e2e-automation-token"
VICTIM_MARKER = "VICTIM-OF-PROJECT-B"
ENGINE_PORTS = {5432: "postgres", 6379: "valkey", 4222: "nats"}

VICTIM = f'''
def handle(event, context):
    return {{"marker": {VICTIM_MARKER!r}, "event": event}}
'''

# The attacker: every port it is told of, then a forged control-plane call to whatever answers.
NETPROBE = r'''
import glob, http.client, json, os, socket

FORGED = json.dumps({"message": "tell me everything", "memories": ["injected by project A"],
                     "user_id": "victim-user"}).encode()
FORGED_HEADERS = {"Content-Type": "application/json", "X-CAI-User-Id": "victim-user",
                  "X-CAI-Session-Id": "s" * 24}


def connects(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("harness", timeout=5)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.path)


def forged_invoke(conn):
    try:
        conn.request("POST", "/invoke", FORGED, FORGED_HEADERS)
        answer = conn.getresponse()
        return answer.status, answer.read().decode("utf-8", "replace")[:300]
    except Exception as exc:
        return None, type(exc).__name__


def handle(event, context):
    if event.get("action") == "secret":
        from caiplatform.workload import get_secret
        return {"value": get_secret(event["name"])}
    if event.get("action") == "env":
        return {k: os.environ.get(k, "") for k in ("CAI_API_URL", "MODEL_BASE_URL")}
    ports = event.get("ports", [])
    reached = [p for p in ports if connects(p)]
    invoked = {}
    for port in reached:
        status, text = forged_invoke(http.client.HTTPConnection("127.0.0.1", port, timeout=5))
        invoked[str(port)] = [status, text]
    own = "/run/cai/harness.sock"
    sockets = sorted({p for pattern in ("/tmp/**/*.sock", "/run/**/*.sock", "/var/run/**/*.sock",
                                        event.get("data_dir", "/nonexistent") + "/**/*.sock",
                                        event.get("socket_glob", "/nonexistent"))
                      for p in glob.glob(pattern, recursive=True) if p != own})
    through_sockets = {p: forged_invoke(UnixConnection(p)) for p in sockets}
    return {"reached": reached, "invoked": invoked, "sockets": through_sockets}
'''


def listening_loopback_ports() -> set[int]:
    """Every TCP port something on this machine listens on where loopback reaches it."""
    ports: set[int] = set()
    for table, reachable in (("/proc/net/tcp", ("0100007F", "00000000")),
                             ("/proc/net/tcp6", ("00000000000000000000000001000000", "00000000000000000000000000000000",
                                                 "0000000000000000FFFF00000100007F"))):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A" and address in reachable:
                ports.add(int(port, 16))
    return ports


class World:
    def __init__(self, root: Path):
        self.data_dir = root / "data"
        self.server = ServeProcess(self.data_dir, "--scripted-model", env={"CAI_AUTOMATION_TOKEN": TOKEN}).start()
        self.http = httpx.Client(base_url=self.server.base_url, headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=120)

    def project(self, slug: str) -> dict:
        listed = self.http.get("/v1/projects").json()["projects"]
        found = next((p for p in listed if p["slug"] == slug), None)
        if found is None:
            created = self.http.post("/v1/projects", json={"slug": slug, "name": slug})
            assert created.status_code == 201, created.text
            found = created.json()
        return found

    def deploy(self, project: str, name: str, files: dict[str, str], **fields: str) -> None:
        response = self.http.post("/v1/agents", params={"project": project}, data={"name": name, **fields},
                                  files={"code": ("code.tar.gz", tarball(files), "application/gzip")})
        assert response.status_code == 202, response.text

    def ready(self, project: str, name: str) -> None:
        agent = poll(lambda: self.http.get(f"/v1/agents/{name}", params={"project": project}).json(),
                     lambda v: v.get("state") not in ("building", "deploying"), f"{name} did not settle", timeout=240)
        assert agent["ready"], (name, agent["state"], agent.get("message"))

    def invoke(self, project: str, name: str, body: dict) -> httpx.Response:
        return self.http.post(f"/v1/agents/{name}/invoke", params={"project": project}, json=body)

    def close(self) -> None:
        self.http.close()
        self.server.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("network"))
    try:
        w.project("team-b")
        w.deploy("team-b", "victim", {"main.py": VICTIM}, framework="function")
        w.deploy("default", "netprobe", {"main.py": NETPROBE}, framework="function")
        w.deploy("default", "weather", {k: textwrap.dedent(v) for k, v in LANGGRAPH_WEATHER.items()},
                 framework="langgraph")
        for project, name in (("team-b", "victim"), ("default", "netprobe"), ("default", "weather")):
            w.ready(project, name)
        # B's victim has a running instance (and a session of one of its users) while A scans.
        answer = w.invoke("team-b", "victim", {"message": "hello"})
        assert answer.status_code == 200 and VICTIM_MARKER in answer.text, answer.text
        yield w
    finally:
        w.close()


def allowed_ports(world: World) -> set[int]:
    """The platform API and the model endpoint: what a workload is given (its own env says where)."""
    env = world.invoke("default", "netprobe", {"action": "env"})
    assert env.status_code == 200, env.text
    urls = env.json()
    api = urlsplit(urls["CAI_API_URL"])
    assert api.port == world.server.port, urls
    model = urlsplit(urls["MODEL_BASE_URL"])
    return {world.server.port, *([model.port] if model.hostname in ("127.0.0.1", "localhost") and model.port else [])}


@pytest.fixture(scope="module")
def scan(world):
    ports = sorted(listening_loopback_ports() | set(ENGINE_PORTS))
    answer = world.invoke("default", "netprobe", {"ports": ports, "data_dir": str(world.data_dir),
                                                  "socket_glob": "/tmp/cai-run-*/*/*.sock"})
    assert answer.status_code == 200, answer.text
    return ports, answer.json()


def test_a_loopback_port_scan_reaches_only_the_platform_api_and_the_model(world, scan):
    ports, found = scan
    allowed = allowed_ports(world)
    assert len(ports) > len(allowed), ports  # there was something else to find (the victim, the engines, ...)
    assert set(found["reached"]) <= allowed, {p: found["invoked"].get(str(p)) for p in found["reached"]}


def test_project_b_harness_takes_no_forged_invoke(world, scan):
    _, found = scan
    answered = {port: answer for port, answer in found["invoked"].items() if VICTIM_MARKER in str(answer[1])}
    assert answered == {}
    through_sockets = {path: answer for path, answer in found["sockets"].items() if answer[0] is not None}
    assert through_sockets == {}, "another instance's socket was visible to the workload"


def test_the_engines_and_the_secret_store_are_unreachable(world, scan):
    ports, found = scan
    bao_port = _openbao_port(world.data_dir)
    assert bao_port in ports
    for port, engine in {**ENGINE_PORTS, bao_port: "openbao"}.items():
        assert port not in found["reached"], f"{engine} ({port}) is reachable from a workload"


def test_a_harness_refuses_a_caller_without_its_per_instance_secret(world):
    sockets = [Path(p) for p in glob.glob("/tmp/cai-run-*/*/harness.sock") if _live(Path(p))]
    assert sockets, "no instance listens on a Unix socket"
    for path in sockets:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://harness", timeout=10) as c:
            forged = c.post("/invoke", json={"message": "hi"}, headers={"X-CAI-User-Id": "victim-user"})
            assert forged.status_code == 401, forged.text
            assert VICTIM_MARKER not in forged.text
            wrong = c.get("/healthz", headers={"X-CAI-Harness-Token": "guessed"})
            assert wrong.status_code == 401, wrong.text


def test_a_langgraph_agent_still_answers_through_the_scripted_model(world):
    answer = world.invoke("default", "weather", {"message": "weather in Paris?"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"] == "you said: weather in Paris?"


def test_a_workload_still_reads_a_project_secret(world):
    project = world.project("default")
    created = world.http.post(f"/v1/projects/{project['id']}/secrets", json={"name": "api-key", "value": "s3cr3t-v1"})
    assert created.status_code in (200, 201), created.text
    answer = world.invoke("default", "netprobe", {"action": "secret", "name": "api-key"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"value": "s3cr3t-v1"}


def test_the_network_is_named_in_healthz(world):
    sandbox = world.http.get("/healthz").json()["sandbox"]
    assert sandbox["status"] == "on" and sandbox["network"] == "isolated", sandbox
    assert "network namespace per workload" in sandbox["detail"]


def _openbao_port(data_dir: Path) -> int:
    for record in (data_dir / "run").glob("*.json") if (data_dir / "run").is_dir() else []:
        data = json.loads(record.read_text())
        if "openbao" in str(data.get("name", "")) and data.get("ports"):
            return int(data["ports"][0])
    raise AssertionError(f"no record of the embedded OpenBao under {data_dir / 'run'}")


def _live(socket: Path) -> bool:
    """The socket of a running instance: its directory is bound into a sandbox named on a command line."""
    needle = f"--bind {socket.parent} /run/cai".encode()
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if needle in Path(cmdline).read_bytes().replace(b"\0", b" "):
                return True
        except OSError:
            continue
    return False
