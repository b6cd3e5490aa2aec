"""The kubelet and the pod network for the code sandbox's pods on the emulated cluster
(`caiplatform.testing.kube_cluster`), for `adapters.kubernetes.codepool`'s tests.

`CodePods.step()` plays the kubelet for the pods labelled `caiplatform.dev/part=code-sandbox`: a new pod
gets an address, `Running` and `Ready` (unless `hold_ready` is set), as its readiness probe would make it.
As an httpx transport it is the pod network: `GET /ready` and `POST /run` on a pod's address reach that
pod's runner, in process (`codesandbox/runner.py`'s `run_request`, one snippet per pod, in a work directory
of its own). Not emulated: the pod's limits and isolation (the real runner runs the snippet as a plain
subprocess). A snippet containing `OOM_MARKER` stands for one the kernel kills for memory: the call breaks
and the pod's container is `terminated` with reason `OOMKilled`, as cgroup v2 kills the container's group.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx

from caiplatform.codesandbox.runner import run_request
from caiplatform.testing.kube_emulator import FilteringEmulator, live

PART_LABEL = "caiplatform.dev/part"
OOM_MARKER = "# kube-test: oom"


def container_status(pod: dict[str, Any], ready: bool, state: dict[str, Any]) -> dict[str, Any]:
    """The sandbox container's status with every field the kubelet always sets (`V1ContainerStatus`
    requires `image`, `imageID` and `restartCount`: a client reading the pod as its model refuses less)."""
    image = pod["spec"]["containers"][0]["image"]
    return {"name": "sandbox", "ready": ready, "restartCount": 0, "image": image,
            "imageID": f"{image}@sha256:{'0' * 64}", "state": state}


class CodePods(httpx.AsyncBaseTransport):
    def __init__(self, emulator: FilteringEmulator):
        self.k = emulator
        self.hold_ready = False
        self.addresses: dict[str, tuple[str, str]] = {}  # pod IP -> (namespace, name)
        self.taken: set[str] = set()
        self.runs: list[dict[str, Any]] = []  # what each pod was asked to run, in order
        self._next = 1
        self._lock = threading.Lock()
        self._work = Path(tempfile.mkdtemp(prefix="cai-kube-codepods-"))

    def pods(self) -> list[tuple[str | None, str, Any]]:
        return [(ns, name, obj) for ns, name, obj in live(self.k, "pods")
                if (obj.raw["metadata"].get("labels") or {}).get(PART_LABEL) == "code-sandbox"]

    def step(self) -> None:
        if self.hold_ready:
            return
        for ns, name, pod in self.pods():
            if (pod.raw.get("status") or {}).get("podIP"):
                continue
            with self._lock:
                ip = f"10.42.{self._next // 250}.{self._next % 250 + 1}"
                self._next += 1
            self.addresses[ip] = (ns or "", name)
            pod.patch({"status": {"phase": "Running", "podIP": ip,
                                  "conditions": [{"type": "Ready", "status": "True"}],
                                  "containerStatuses": [container_status(pod.raw, True, {"running": {}})]}})

    async def run(self, period: float = 0.02) -> None:
        while True:
            self.step()
            await asyncio.sleep(period)

    def _pod(self, ip: str) -> Any:
        found = self.addresses.get(ip)
        if found is None:
            return None
        live_pods = [o for ns, n, o in self.pods() if (ns or "", n) == found]
        return live_pods[0] if live_pods else None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        ip = request.url.host
        pod = self._pod(ip)
        if pod is None:
            raise httpx.ConnectError(f"no pod at {ip}", request=request)
        if request.method == "GET" and request.url.path == "/ready":
            return httpx.Response(503 if ip in self.taken else 200, json={})
        if request.method != "POST" or request.url.path != "/run":
            return httpx.Response(404, json={"error": "not found"})
        with self._lock:
            if ip in self.taken:
                return httpx.Response(409, json={"error": "this sandbox already ran its snippet"})
            self.taken.add(ip)
        body = json.loads(await request.aread())
        self.runs.append({"pod": pod.raw["metadata"]["name"], "request": body})
        snippet = next((f for f in body.get("files") or [] if f["path"].startswith(".cai/")), None)
        if snippet and OOM_MARKER in base64.b64decode(snippet["content_base64"]).decode():
            pod.patch({"status": {"phase": "Failed", "containerStatuses": [container_status(pod.raw, False, {
                "terminated": {"exitCode": 137, "reason": "OOMKilled"}})]}})
            raise httpx.RemoteProtocolError("the pod's container was killed", request=request)
        work = self._work / ip
        work.mkdir(parents=True, exist_ok=True)
        request_body = {**body, "argv": [sys.executable if a == "python" else a for a in body["argv"]]}  # the image's
        answer = await asyncio.to_thread(run_request, work, request_body)
        pod.patch({"status": {"phase": "Succeeded", "containerStatuses": [container_status(pod.raw, False, {
            "terminated": {"exitCode": 0, "reason": "Completed"}})]}})
        return httpx.Response(200, json=answer)
