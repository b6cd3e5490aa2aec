"""`caiplatform serve` on the embedded defaults with deployed agents, for the benchmarks that need one.

The echo LangGraph agent answers with the message it got (one node, no model), so the time measured is
the platform's and the harness's, never a model's.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx
from benchsupport import descendants

from caiplatform.services import invoke_ids
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.serve import ServeProcess

INTERNAL_TOKEN = "bench-internal-token"
# The rate limiter stays on (its cost is part of every request); its budget is just out of reach.
UNLIMITED = {"RATELIMIT_RPS": "1000000000", "RATELIMIT_BURST": "1000000000", "CAI_INTERNAL_TOKEN": INTERNAL_TOKEN}

ECHO_GRAPH = """\
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph


def echo(state):
    return {"messages": [AIMessage(content=state["messages"][-1].content)]}


builder = StateGraph(MessagesState)
builder.add_node("echo", echo)
builder.add_edge(START, "echo")
builder.add_edge("echo", END)
graph = builder.compile()
"""

ECHO_FUNCTION = "def handle(event, context):\n    return {'echo': event}\n"


def tarball(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Served:
    def __init__(self, server: ServeProcess, token: str):
        self.server = server
        self.base_url = server.base_url
        self.port = server.port
        self.auth = {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=server.base_url, headers=self.auth, timeout=300)

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def deploy(self, name: str, framework: str = "langgraph", files: dict[str, str] | None = None) -> None:
        files = files or ({"graph.py": ECHO_GRAPH} if framework == "langgraph" else {"main.py": ECHO_FUNCTION})
        response = self.http.post("/v1/agents", params={"project": "default"}, data={"name": name, "framework": framework},
                                  files={"code": ("code.tar.gz", tarball(files), "application/gzip")})
        assert response.status_code == 202, response.text

    def wait_ready(self, name: str, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            body = self.http.get(f"/v1/agents/{name}").json()
            if body.get("state") == "ready":
                return body
            if body.get("state") not in ("building", "deploying") or time.monotonic() > deadline:
                raise SystemExit(f"agent {name} did not become ready: {body}")
            time.sleep(0.25)

    def harness_endpoints(self) -> dict[str, HarnessEndpoint]:
        """How to reach each running harness instance directly, by agent name: what the platform holds for it
        (`harness_instances`)."""
        return {instance.agent: instance.endpoint() for instance in harness_instances(self.pid)}


# -- the instances, seen from the outside -----------------------------------------------------------------
#
# An instance runs in the platform's sandbox (docs/sandbox.md): its own network namespace, reached only
# through a Unix socket in a directory bound into its sandbox (`/run/cai/harness.sock` inside), with a
# per-instance secret on every request. A harness listens on that socket itself (`CAI_HARNESS_SOCKET`); a
# revision with its own `command` (a serverless service) listens on `$PORT` in its namespace behind the
# platform's relay, which listens on the socket (`relay.py <socket> <port> -- <command>`) and has the
# instance's variables. The benchmark runs as root beside the server it started, so it
# finds both as any root process could: the bind from bubblewrap's command line (an ancestor of the
# instance, `--bind <host dir> /run/cai`) and the variables of the instance's own process, the harness or
# the relay (loaded inside the sandbox, `/proc/<pid>/environ`). Nothing in the platform is there for the benchmark.

RELAY = "caiplatform/sandbox/relay.py"
BIND_OPTIONS = frozenset({"--bind", "--ro-bind", "--dev-bind", "--bind-try", "--ro-bind-try", "--dev-bind-try"})


def _argv(pid: int) -> list[str]:
    return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]


def _environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.split("=", 1) for item in items if "=" in item)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _binds(argv: list[str]) -> dict[str, str]:
    """bubblewrap's binds: the path inside -> the host path. A read-only overlay (a place whose mount names no
    host path: `--ro-bind <host> /../oldroot<layer> ... --overlay-src <layer> --ro-overlay <dest>`) counts as
    a bind of its top layer's host directory."""
    binds: dict[str, str] = {}
    sources: list[str] = []
    args = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    for i, arg in enumerate(args[:-1]):
        if arg in BIND_OPTIONS and i + 2 < len(args):
            binds[args[i + 2]] = args[i + 1]
        elif arg == "--overlay-src":
            sources.append(args[i + 1])
        elif arg == "--ro-overlay" and sources:
            top = sources[-1]
            binds[args[i + 1]] = binds.get(f"/../oldroot{top}", top)
            sources = []
    return binds


@dataclass(frozen=True)
class HarnessEndpoint:
    """One harness instance as the platform reaches it: its Unix socket (the host's side) and its secrets."""

    socket: str
    token: str  # CAI_HARNESS_TOKEN, presented in X-CAI-Harness-Token
    internal: str | None  # the workload's own CAI_INTERNAL_TOKEN, which the platform presents in X-CAI-Internal

    @property
    def credentials(self) -> dict[str, str]:
        return {"X-CAI-Harness-Token": self.token, **({"X-CAI-Internal": self.internal} if self.internal else {})}

    def turn(self, message: str, session_id: str, user_id: str) -> tuple[bytes, dict[str, str]]:
        """The body and headers of a turn as the platform sends them (`InvokeService`: the resolved ids in
        the body and in `X-CAI-Session-Id` / `X-CAI-User-Id`, the instance's secrets)."""
        body = json.dumps({"message": message, "session_id": session_id, "user_id": user_id}).encode()
        return body, {"Content-Type": "application/json", "X-CAI-Session-Id": session_id, "X-CAI-User-Id": user_id,
                      **self.credentials}

    def fresh_turn(self, message: str) -> tuple[bytes, dict[str, str]]:
        """A turn on a new session, with the ids the platform mints for an anonymous caller."""
        ids = invoke_ids.resolve(None, None, authenticated=False)
        return self.turn(message, ids.session_id, ids.user_id)

    def client(self, timeout: float = 60) -> httpx.AsyncClient:
        """An httpx client to this instance (URLs `http://harness/...`: the socket gives the way)."""
        return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=self.socket), timeout=timeout)


@dataclass(frozen=True)
class HarnessInstance:
    pid: int
    argv: list[str]
    env: dict[str, str]
    binds: dict[str, str]  # its sandbox's binds (inside -> host); empty when it runs unsandboxed

    @property
    def agent(self) -> str:
        return self.env["AGENT_NAME"]

    @property
    def socket_inside(self) -> str | None:
        """The socket as the instance sees it: the harness's own, else the relay's (its first argument)."""
        if self.env.get("CAI_HARNESS_SOCKET"):
            return self.env["CAI_HARNESS_SOCKET"]
        at = next((i for i, arg in enumerate(self.argv) if arg.endswith(RELAY)), None)
        return self.argv[at + 1] if at is not None and at + 1 < len(self.argv) else None

    def host_path(self, inside: str) -> str:
        """Where a path the instance sees is on the host (through the deepest bind that holds it)."""
        path = PurePosixPath(inside)
        for target in sorted(self.binds, key=lambda t: len(PurePosixPath(t).parts), reverse=True):
            if path == PurePosixPath(target) or PurePosixPath(target) in path.parents:
                return str(PurePosixPath(self.binds[target]) / path.relative_to(target))
        return inside

    def host_env(self) -> dict[str, str]:
        """The instance's variables with the paths in them (whole values or `:` lists) as the host sees them."""
        def mapped(value: str) -> str:
            parts = value.split(":")
            if value.startswith("/") and all(p.startswith("/") for p in parts if p):
                return ":".join(self.host_path(p) if p else p for p in parts)
            return value
        return {name: mapped(value) for name, value in self.env.items()}

    def endpoint(self) -> HarnessEndpoint:
        socket = self.socket_inside
        if not socket or "CAI_HARNESS_TOKEN" not in self.env:
            raise SystemExit(f"the instance {self.env.get('K_REVISION', '?')} (pid {self.pid}) has no socket or no "
                             "secret in its environment")
        return HarnessEndpoint(self.host_path(socket), self.env["CAI_HARNESS_TOKEN"], self.env.get("CAI_INTERNAL_TOKEN"))


def harness_instances(server_pid: int) -> list[HarnessInstance]:
    """The harness processes under the server (the instance itself, not the sandbox around it: bubblewrap's
    argv names the harness too, but its environment is the launcher's), each with its sandbox's binds."""
    return _instances(server_pid, lambda argv, env: "caiplatform.harness" in argv and "AGENT_NAME" in env)


def service_endpoints(server_pid: int) -> dict[str, HarnessEndpoint]:
    """How to reach each running instance of a revision with its own `command` (a serverless service)
    directly, by service name (`K_SERVICE`): its relay's socket and the instance's secret."""
    found = _instances(server_pid, lambda argv, env: any(a.endswith(RELAY) for a in argv) and "K_SERVICE" in env)
    return {instance.env["K_SERVICE"]: instance.endpoint() for instance in found}


def _instances(server_pid: int, wanted: Callable[[list[str], dict[str, str]], bool]) -> list[HarnessInstance]:
    found: list[HarnessInstance] = []
    for pid in descendants(server_pid):
        try:
            argv = _argv(pid)
            if not argv or Path(argv[0]).name == "bwrap":
                continue
            env = _environ(pid)
            if not wanted(argv, env):
                continue
            binds: dict[str, str] = {}
            ancestor = _parent(pid)
            while ancestor > 1 and ancestor != server_pid:
                outer = _argv(ancestor)
                if outer and Path(outer[0]).name == "bwrap":
                    binds = _binds(outer)
                    break
                ancestor = _parent(ancestor)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        found.append(HarnessInstance(pid, argv, env, binds))
    return found


@contextmanager
def served(data_dir: Path, **env: str) -> Iterator[Served]:
    with ServeProcess(data_dir, env={**UNLIMITED, **env}) as server:
        token = httpx.post(f"{server.base_url}/v1/auth/login",
                           json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
        yield Served(server, token)
