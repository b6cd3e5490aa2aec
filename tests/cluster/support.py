"""What the cluster tests share: `sink`, a Python function run as a serverless service on every replica.

It appends a line per call to a file (`begin` when it starts, `done` when it answers) with its `HOME`,
which lies in the data dir of the replica whose process runs it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from caiplatform.testing.serve import ServeProcess

if TYPE_CHECKING:
    from .conftest import Cluster

SINK = {
    "main.py": (
        "import json, os, time\n\n\n"
        "def _log(event, phase):\n"
        "    if 'SINK_LOG' not in os.environ:  # invoked as the function itself, not as the service\n"
        "        return\n"
        "    with open(os.environ['SINK_LOG'], 'a') as fh:\n"
        "        fh.write(json.dumps({'id': event.get('id'), 'phase': phase, 'home': os.environ.get('HOME', '')}) + '\\n')\n\n\n"
        "def handle(event, context):\n"
        "    _log(event, 'begin')\n"
        "    time.sleep(float(event.get('sleep', 0)))\n"
        "    if event.get('fail'):\n"
        "        raise RuntimeError('refused on purpose')\n"
        "    _log(event, 'done')\n"
        "    return {'ok': True}\n"
    ),
}


def poll(read: Callable[[], Any], done: Callable[[Any], bool], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not done(value := read()):
        assert time.monotonic() < deadline, f"{what}: {value}"
        time.sleep(0.2)
    return value


class Sink:
    def __init__(self, path: Path):
        self.path = path

    def calls(self, ident: str | None = None, phase: str | None = None) -> list[dict[str, str]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return [c for c in map(json.loads, lines)
                if (ident is None or c["id"] == ident) and (phase is None or c["phase"] == phase)]


def deploy(replica: ServeProcess, cluster: Cluster, code: bytes) -> None:
    answer = httpx.post(f"{replica.base_url}/v1/agents", params={"project": "default"}, headers=cluster.automation,
                        data={"name": "sink", "framework": "function"},
                        files={"code": ("code.tar.gz", code, "application/gzip")}, timeout=60)
    assert answer.status_code == 202, answer.text


def agent(cluster: Cluster) -> dict[str, Any]:
    return dict(cluster.lb.get("/v1/agents/sink", headers=cluster.automation).json())


def settled(cluster: Cluster) -> dict[str, Any]:
    view = poll(lambda: agent(cluster), lambda v: v.get("state") not in ("building", "deploying"),
                "the build did not finish", timeout=90)
    assert view["ready"], view
    return view


def ensure_sink_service(cluster: Cluster, work: dict[str, Any]) -> None:
    """The function built on every replica (each can then run its image) and the `sink` service."""
    if "image" not in work:
        for replica in cluster.replicas:
            deploy(replica, cluster, work["code"])
            work["image"] = settled(cluster)["image"]
    pid, services = work["pid"], f"/v1/projects/{work['pid']}/services"
    if cluster.lb.get(f"{services}/sink", headers=cluster.automation).status_code == 404:
        created = cluster.lb.post(services, headers=cluster.automation, json={
            "name": "sink", "image": work["image"], "env": {"SINK_LOG": str(work["sink"].path)},
            "scaling": {"min_scale": 1}})
        assert created.status_code == 202, created.text
    assert pid
