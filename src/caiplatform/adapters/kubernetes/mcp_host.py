"""Hosted MCP servers on a cluster: every server a Knative Service, through the workload runtime port.

A build checks the tools as every host does (`caiplatform.mcp.source`), writes the tool tree
(`write_source_tree`: `tools/<name>.py` plus `mcp.json`) and has the Kubernetes builder turn it into an
image: a BuildKit Job on the harness image with the tree under `/app/mcp`, whose build loads every tool
once (`caiplatform.mcp.server --check`), so a tool that does not import fails the build, not the rollout,
as the local host's load check does. The image is named by the digest the registry gave it (what
Knative pulls); the same tool set reuses the Job that built it, so it keeps its digest.

Serving applies a revision of the `mcp` workload `<server>` (Knative Service `<server>-mcp` in the
project's namespace, `runtime.KnativeRuntime`) running `python -m caiplatform.mcp.server` on the
revision's port, the plain variables inline and the server's token and project key in the revision's
Secret. Every rollout is a new revision (`<server>-00001` upward: each rollout carries a newly minted
project key, and revisions are immutable); the version it serves is a label of the revision. Traffic
follows the latest ready revision, so what served before keeps serving until the new revision is ready,
and a revision that fails leaves it serving (`McpServeError` with Knative's reason). The URL is the
Knative Service's address in the cluster plus `/mcp`; `expose: apps` servers are also registered with the
platform's host router, which forwards to that address.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from caiplatform.adapters.kubernetes.builder import BuildKitJobBuilder
from caiplatform.adapters.kubernetes.client import PROJECT_LABEL
from caiplatform.adapters.kubernetes.runtime import NAMESPACE_PREFIX, KnativeRuntime, revision_labels
from caiplatform.build.digest import source_digest
from caiplatform.mcp.source import check_tool_source, write_source_tree
from caiplatform.ports.builder import BuildError
from caiplatform.ports.mcp_host import (
    McpBuild,
    McpBuildError,
    McpDeployment,
    McpHost,
    McpImage,
    McpServeError,
)
from caiplatform.ports.runtime import RevisionSpec, WorkloadError, WorkloadRef
from caiplatform.routing import HostRouter, Upstream, UpstreamFactory

MCP_DIR = "/app/mcp"
MCP_FRAMEWORK = "mcp"
SERVER_COMMAND = ["python", "-m", "caiplatform.mcp.server"]
VERSION_LABEL = "mcp-version"
REQUEST_TIMEOUT_SECONDS = 300  # document 2, Limits: MCP request timeout


def mcp_containerfile(harness_image: str) -> str:
    """The tool tree on the harness image (which carries `caiplatform.mcp`), loaded once at build time."""
    return "\n".join([
        f"FROM {harness_image}",
        f"COPY --chown=1000:1000 code/ {MCP_DIR}/",
        "USER 1000",
        f"RUN PYTHONDONTWRITEBYTECODE=1 python -m caiplatform.mcp.server --source {MCP_DIR} --check",
        f"ENV CAI_FRAMEWORK={MCP_FRAMEWORK} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1",
        "",
    ])


class KnativeMcpHost(McpHost):
    shared = True  # the Knative Service serves every replica; a replica's death takes nothing down
    """`builder`: the Kubernetes builder (`BuildKitJobBuilder`); `runtime`: the Kubernetes workload runtime.
    Either may be a zero-argument factory, resolved on first use (the platform builds them lazily)."""

    def __init__(self, builder: BuildKitJobBuilder | Callable[[], BuildKitJobBuilder],
                 runtime: KnativeRuntime | Callable[[], KnativeRuntime], *,
                 hosts: HostRouter | None = None, startup_timeout: float = 300.0,
                 **_: object):
        self._builder = builder
        self._runtime = runtime
        self.hosts = hosts
        self.startup_timeout = startup_timeout
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    @property
    def builder(self) -> BuildKitJobBuilder:
        if not isinstance(self._builder, BuildKitJobBuilder):
            self._builder = self._builder()
        return self._builder

    @property
    def runtime(self) -> KnativeRuntime:
        if not isinstance(self._runtime, KnativeRuntime):
            self._runtime = self._runtime()
        return self._runtime

    @staticmethod
    def workload(project_id: str, project_short: str, server: str) -> WorkloadRef:
        return WorkloadRef(project_id, project_short, server, kind="mcp")

    # -- images ---------------------------------------------------------------------------------

    async def build(self, build: McpBuild) -> McpImage:
        for tool in build.tools:
            problem = check_tool_source(tool["name"], tool["handler"])
            if problem:
                raise McpBuildError(problem)
        builder = self.builder
        repository = f"{builder.registry_host}/cai-{build.project_short}-mcp-{build.server}"
        with tempfile.TemporaryDirectory(prefix="cai-mcp-build-") as tmp:
            tree = Path(tmp) / "tree"
            await asyncio.to_thread(lambda: write_source_tree(tree, build.tools, project=build.project_id))
            digest = await asyncio.to_thread(lambda: source_digest(tree, MCP_FRAMEWORK, project=build.project_id))
            try:
                image = await builder.build_context(repository, digest, tree,
                                                    mcp_containerfile(builder.kube.settings.harness_image), MCP_FRAMEWORK)
            except BuildError as exc:
                raise McpBuildError(f"the tools do not load or the image did not build: {exc.message}") from None
        return McpImage(image.reference, image.digest)

    # -- serving --------------------------------------------------------------------------------

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def serve(self, deployment: McpDeployment) -> str:
        ref = self.workload(deployment.project_id, deployment.project_short, deployment.server)
        runtime = self.runtime
        async with self._lock((deployment.project_id, deployment.server)):
            for attempt in range(3):
                current = await runtime.status(ref)
                generation = max((r.generation for r in current.revisions), default=0) + 1 if current else 1
                revision = f"{deployment.server}-{generation:05d}"
                spec = RevisionSpec(
                    ref, revision, generation, deployment.image.image, env=dict(deployment.env),
                    secret_env=dict(deployment.secret_env), command=list(SERVER_COMMAND),
                    args=["--source", MCP_DIR, "--host", "0.0.0.0", "--name", deployment.server,
                          "--version", str(deployment.version)],
                    timeout_seconds=REQUEST_TIMEOUT_SECONDS, labels={VERSION_LABEL: str(deployment.version)})
                try:
                    await runtime.apply(spec)
                    break
                except WorkloadError as exc:
                    # Another replica rolled the server meanwhile and took this revision name: take the next.
                    if "already exists" in exc.message and attempt < 2:
                        continue
                    raise McpServeError(f"version {deployment.version} was refused by the cluster: {exc.message}") from exc
            url = await self._ready(ref, revision, deployment.version)
            if deployment.expose == "apps" and self.hosts is not None:
                self.hosts.register(self.hosts.host_for(deployment.server, deployment.project_short), self._upstream(ref))
            elif self.hosts is not None:
                self.hosts.unregister(self.hosts.host_for(deployment.server, deployment.project_short))
            return url.rstrip("/") + "/mcp"

    async def still_serving(self, project_id: str, project_short: str, server: str, version: int) -> str | None:
        """The server's URL when its newest revision serves `version` and is ready (the Knative Service
        keeps running, with its key, while the platform restarts)."""
        ref = self.workload(project_id, project_short, server)
        status = await self.runtime.status(ref)
        service = await self.runtime.spec_document(ref) if status is not None else None
        if status is None or service is None or not status.ready or not status.url:
            return None
        if status.latest_ready_revision != status.latest_created_revision:
            return None
        if revision_labels(service["spec"]["template"]).get(VERSION_LABEL) != str(version):
            return None
        return status.url.rstrip("/") + "/mcp"

    async def _ready(self, ref: WorkloadRef, revision: str, version: int) -> str:
        """The Service's address once `revision` is ready; `McpServeError` when it failed or took too long
        (the revision that served before keeps the traffic either way)."""
        deadline = time.monotonic() + self.startup_timeout
        while True:
            status = await self.runtime.status(ref)
            found = next((r for r in status.revisions if r.name == revision), None) if status else None
            if status is not None and found is not None and found.ready and status.url:
                return status.url
            if found is not None and found.state == "not_ready":
                reason = ": ".join(part for part in (found.reason, found.message) if part) or "not ready"
                raise McpServeError(f"version {version} did not start: {reason}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise McpServeError(f"version {version} did not become ready within {self.startup_timeout:g} s")
            await self.runtime.settled(ref, revision, min(remaining, 30.0))

    def _upstream(self, ref: WorkloadRef) -> UpstreamFactory:
        async def upstream() -> Upstream:
            endpoint = await self.runtime.acquire(ref, timeout=60.0)
            return Upstream(endpoint.base_url, release=endpoint.release, timeout_seconds=REQUEST_TIMEOUT_SECONDS,
                            transport=endpoint.transport)

        return upstream

    async def remove(self, project_id: str, server: str) -> None:
        """The server's Knative Service in the project's namespace (found by the namespace's project label,
        so any replica can remove what another one served), with its revisions' Secrets."""
        runtime = self.runtime
        async with self._lock((project_id, server)):
            namespaces = await runtime.kube.items(runtime.kube.core.list_namespace, labels={PROJECT_LABEL: project_id})
            for namespace in namespaces:
                name = namespace["metadata"]["name"]
                if not name.startswith(NAMESPACE_PREFIX):
                    continue
                ref = self.workload(project_id, name.removeprefix(NAMESPACE_PREFIX), server)
                if self.hosts is not None:
                    self.hosts.unregister(self.hosts.host_for(server, ref.project_short))
                await runtime.delete(ref)
        self._locks.pop((project_id, server), None)
