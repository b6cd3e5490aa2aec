"""`caiplatform serve` on the embedded defaults with deployed agents, for the benchmarks that need one.

The echo LangGraph agent answers with the message it got (one node, no model), so the time measured is
the platform's and the harness's, never a model's.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from benchsupport import descendants

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

    def harness_ports(self) -> dict[str, int]:
        """The loopback port of each running harness instance, by agent name (from the instances' own
        environment, which is how the platform told them where to listen)."""
        ports: dict[str, int] = {}
        for pid in descendants(self.pid):
            try:
                env = dict(item.split("=", 1) for item in
                           Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0") if "=" in item)
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"caiplatform.harness" in argv and "PORT" in env and "AGENT_NAME" in env:
                ports[env["AGENT_NAME"]] = int(env["PORT"])
        return ports


@contextmanager
def served(data_dir: Path, **env: str) -> Iterator[Served]:
    with ServeProcess(data_dir, env={**UNLIMITED, **env}) as server:
        token = httpx.post(f"{server.base_url}/v1/auth/login",
                           json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
        yield Served(server, token)
