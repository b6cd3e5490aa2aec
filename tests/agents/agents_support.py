"""Helpers of the agents tests: tarballs, deploy, wait for a settled state."""

from __future__ import annotations

import asyncio
import io
import tarfile
import time

AUTOMATION = {"Authorization": "Bearer automation-token-for-tests"}

GRAPH = {
    "graph.py": "from langgraph.graph import MessagesState, StateGraph\n\ngraph = StateGraph(MessagesState).compile()\n",
}
FUNCTION = {"main.py": "def handle(event, context):\n    return {'echo': event}\n"}


def tarball(files: dict[str, str | bytes], *, extra: list[tarfile.TarInfo] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for info in extra or []:
            archive.addfile(info)
    return buffer.getvalue()



async def deploy(client, headers, name: str, files=None, *, project: str | None = "default", **fields):
    if files is None:
        fields.setdefault("framework", "langgraph")
    data = {"name": name, **fields}
    params = {"project": project} if project else {}
    return await client.post("/v1/agents", params=params, headers=headers, data=data,
                             files={"code": ("code.tar.gz", tarball(files or GRAPH), "application/gzip")})


async def wait_settled(client, headers, name: str, *, project: str | None = None, timeout: float = 20.0) -> dict:
    """Poll the agent view until it leaves building/deploying."""
    deadline = time.monotonic() + timeout
    params = {"project": project} if project else {}
    while True:
        body = (await client.get(f"/v1/agents/{name}", headers=headers, params=params)).json()
        if body.get("state") not in ("building", "deploying") or time.monotonic() > deadline:
            return body
        await asyncio.sleep(0.05)
