"""What the cluster tests share: `sink`, a Python function (deployed as the agent `sink-fn`: a service may
not share an agent's name) run as a serverless service on every replica.

It reports each call (`begin` when it starts, `done` when it answers) with the random name of the instance
that ran it, to a collector of the test's on loopback: the workload sandbox rightly shows it no file of the
test's, while loopback stays reachable. Each instance also appends its name to a file in its home, which lies in
the data dir of the replica whose process runs it (`Cluster.replica_of` looks there): inside, a workload sees its
home at /home/app, no path of the data directory.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import httpx

from caiplatform.testing.serve import ServeProcess

if TYPE_CHECKING:
    from .conftest import Cluster

SINK = {
    "main.py": (
        "import json, os, time, urllib.request, uuid\n\n"
        "INSTANCE = uuid.uuid4().hex\n"
        "if 'SINK_URL' in os.environ:\n"
        "    with open(os.path.join(os.environ['HOME'], 'sink-instances'), 'a') as fh:\n"
        "        fh.write(INSTANCE + '\\n')\n\n\n"
        "def _log(event, phase):\n"
        "    if 'SINK_URL' not in os.environ:  # invoked as the function itself, not as the service\n"
        "        return\n"
        "    line = json.dumps({'id': event.get('id'), 'phase': phase, 'instance': INSTANCE})\n"
        "    urllib.request.urlopen(urllib.request.Request(os.environ['SINK_URL'], data=line.encode(), method='POST'), timeout=5).read()\n\n\n"
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
    """Collects the sink's reports: one JSON line per POST to `url`."""

    def __init__(self) -> None:
        lines: list[str] = []
        self._lines = lines
        self._lock = threading.Lock()
        lock = self._lock

        class Collect(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the handler's protocol
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                with lock:
                    lines.append(body)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Collect)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def calls(self, ident: str | None = None, phase: str | None = None) -> list[dict[str, str]]:
        with self._lock:
            lines = list(self._lines)
        return [c for c in map(json.loads, lines)
                if (ident is None or c["id"] == ident) and (phase is None or c["phase"] == phase)]


def deploy(replica: ServeProcess, cluster: Cluster, code: bytes) -> None:
    answer = httpx.post(f"{replica.base_url}/v1/agents", params={"project": "default"}, headers=cluster.automation,
                        data={"name": "sink-fn", "framework": "function"},
                        files={"code": ("code.tar.gz", code, "application/gzip")}, timeout=60)
    assert answer.status_code == 202, answer.text


def agent(cluster: Cluster) -> dict[str, Any]:
    return dict(cluster.lb.get("/v1/agents/sink-fn", headers=cluster.automation).json())


def settled(cluster: Cluster) -> dict[str, Any]:
    view = poll(lambda: agent(cluster), lambda v: v.get("state") not in ("building", "deploying"),
                "the build did not finish", timeout=90)
    assert view["ready"], view
    return view


def pulling(cluster: Cluster, stream: str, consumer: str) -> int:
    """How many pull requests wait on a JetStream consumer now: one per replica whose push worker delivers
    its subscription (each keeps one open, renewed as it expires; the server drops expired ones first)."""
    import nats

    async def read() -> int:
        connection = await nats.connect(f"nats://127.0.0.1:{cluster.nats.port}", connect_timeout=5,
                                        allow_reconnect=False)
        try:
            return (await connection.jetstream().consumer_info(stream, consumer)).num_waiting or 0
        except nats.errors.Error:
            return 0
        finally:
            await connection.close()

    return asyncio.run(read())


def wait_until_every_worker_delivers(cluster: Cluster, work: dict[str, Any], topic: str, subscription: str) -> None:
    """Every replica's push worker has read the push subscription (each replica reads them again
    periodically; the one it was created through at once)."""
    stream = f"cai-{work['short']}-{topic}"
    poll(lambda: pulling(cluster, stream, subscription), lambda n: n >= len(cluster.replicas),
         f"not every replica's push worker delivers {topic}/{subscription}", timeout=20)


def wait_until_every_replica_serves(cluster: Cluster, work: dict[str, Any], service: str) -> None:
    """Every replica's runtime has the service with its traffic (its follower applied it and routed its
    hostnames, which push delivery resolves on the replica that pulled the message)."""

    def serving(replica: ServeProcess) -> bool:
        record = replica.data_dir / "runtime" / "workloads" / f"{work['short']}-service-{service}.json"
        try:
            return bool(json.loads(record.read_text()).get("traffic"))
        except (OSError, ValueError):
            return False

    poll(lambda: [r.base_url for r in cluster.replicas if not serving(r)], lambda missing: not missing,
         f"replicas that do not serve {service} yet", timeout=30)


def ensure_sink_service(cluster: Cluster, work: dict[str, Any]) -> None:
    """The function built on every replica (each can then run its image) and the `sink` service."""
    if "image" not in work:
        for replica in cluster.replicas:
            deploy(replica, cluster, work["code"])
            work["image"] = settled(cluster)["image"]
    pid, services = work["pid"], f"/v1/projects/{work['pid']}/services"
    if cluster.lb.get(f"{services}/sink", headers=cluster.automation).status_code == 404:
        created = cluster.lb.post(services, headers=cluster.automation, json={
            "name": "sink", "image": work["image"], "env": {"SINK_URL": work["sink"].url},
            "scaling": {"min_scale": 1}})
        assert created.status_code == 202, created.text
    assert pid
