"""Local MCP host: content-addressed image directories and one supervised process per server.

A build writes the tool set into `<data-dir>/mcp-images/<digest-hex>/` (`tools/<name>.py` plus a
manifest) and loads it once in a separate interpreter, so an import error or a signature the schema
inference cannot read fails the build instead of the rollout. The same tool set has the same digest, so
its directory is reused and never rewritten.

Serving starts `python -m caiplatform.mcp.server` under the platform's `ProcessSupervisor` with only the
deployment's variables (`inherit_env=False`: the platform's own secrets never reach tool code), inside the
platform's sandbox (`caiplatform.sandbox`), which shows it its tool tree and nothing else of the data
directory; the build's load check runs there too. Like an instance it has a network namespace of its own
(it reaches the platform API, the model endpoint, its project's memory stores and public addresses, no
engine and no other port of this machine) and listens on a Unix socket in a directory bound into its
sandbox alone (`/run/cai/mcp.sock` inside, `caiplatform.sandbox.sockets`): its address is that socket
(`caiplatform.routing.unix_url`), which the platform's `/mcp/<short>/<name>/mcp` route and an `expose: apps`
host (`<name>-<project-short>.<apps_domain>`) proxy to; nothing listens on a port. The previous process of
that server is stopped only once the new one answers `/healthz`, so a failed rollout leaves the old version
serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

import caiplatform
from caiplatform.mcp.source import HELPER_HINT, check_tool_source, image_digest, write_source_tree
from caiplatform.ports.mcp_host import (
    McpBuild,
    McpBuildError,
    McpDeployment,
    McpHost,
    McpImage,
    McpServeError,
)
from caiplatform.routing import UNIX_ORIGIN, HostRouter, Upstream, unix_url, upstream_at
from caiplatform.sandbox import (
    Confinement,
    Sandbox,
    SandboxUnavailable,
    paths,
    sandbox_env,
    shared_sandbox,
    workload_limits,
)
from caiplatform.sandbox.network import given_ports
from caiplatform.sandbox.sockets import SocketDirs
from caiplatform.supervisor import ProcessSpec, ProcessStartError, ProcessSupervisor

IMAGES_DIR = "mcp-images"
BUILD_CHECK_TIMEOUT_SECONDS = 120.0
# The variables of the platform's own interpreter a tool process needs to start at all.
PASSTHROUGH_ENV = ("LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR")
SOCKET_NAME = "mcp.sock"


@dataclass
class _Serving:
    process: str  # supervisor name
    socket: Path  # where it listens (host path; its directory is bound into its sandbox alone)
    version: int
    digest: str
    host: str | None  # apps host when exposed
    started: float = field(default_factory=time.monotonic)


def _package_root() -> str:
    """The directory the platform imports `caiplatform` from, so the tool process runs the same code."""
    return str(Path(caiplatform.__file__).resolve().parents[1])


class LocalMcpHost(McpHost):
    #: its servers listen on Unix sockets of this replica, which change with every version and replica: the
    #: `url` clients get is the platform's route to the server instead (`services/mcp.platform_route`)
    routes_through_platform = True

    def __init__(
        self,
        data_dir: Path,
        *,
        supervisor: ProcessSupervisor | Callable[[], ProcessSupervisor],
        registry_host: str = "registry.local",
        hosts: HostRouter | None = None,
        python: str | None = None,
        startup_timeout: float = 60.0,
        sandbox: Sandbox | None = None,
        model_env: Mapping[str, str | None] | None = None,
    ):
        self.images_dir = Path(data_dir) / IMAGES_DIR
        self.sandbox = sandbox or shared_sandbox()
        # A factory is resolved on first use, so a platform starts its supervisor only when a server runs.
        self._supervisor = supervisor
        self.registry_host = registry_host
        self.hosts = hosts
        self.python = python or paths.python()  # run inside the sandbox: its normalized path
        self.startup_timeout = startup_timeout
        self.builds = 0  # images actually built (not reused); tests check that rollbacks build nothing
        self._serving: dict[tuple[str, str], _Serving] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._build_lock = asyncio.Lock()
        self._sockets = SocketDirs()
        # The model endpoint, as agents get it (`MODEL_BASE_URL`, `EMBED_BASE_URL`): its port is forwarded
        # into a server's network like the platform API's.
        self.model_env = {name: url for name, url in (model_env or {}).items() if url}
        # Awaited with a project's id before a server of it starts (its memory stores become reachable first).
        self.before_run: Callable[[str], Awaitable[None]] | None = None

    @property
    def supervisor(self) -> ProcessSupervisor:
        if not isinstance(self._supervisor, ProcessSupervisor):
            self._supervisor = self._supervisor()
        return self._supervisor

    # -- images ---------------------------------------------------------------------------------

    def image_dir(self, digest: str) -> Path:
        return self.images_dir / digest.removeprefix("sha256:")

    def _base_env(self) -> dict[str, str]:
        env = {name: os.environ[name] for name in PASSTHROUGH_ENV if name in os.environ}
        if self.sandbox.enabled:
            env = sandbox_env(env)
        env.update(
            {
                "PATH": os.defpath,
                "PYTHONPATH": _package_root(),
                "PYTHONDONTWRITEBYTECODE": "1",  # the image directory is immutable
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    async def build(self, build: McpBuild) -> McpImage:
        for tool in build.tools:
            problem = check_tool_source(tool["name"], tool["handler"])
            if problem:
                raise McpBuildError(problem)
        digest = image_digest(build.tools, project=build.project_id)
        image = McpImage(f"{self.registry_host}/cai-{build.project_short}-mcp-{build.server}@{digest}", digest)
        target = self.image_dir(digest)
        async with self._build_lock:
            if (target / "mcp.json").exists():
                return image  # the same tool set: reuse the image
            self.images_dir.mkdir(parents=True, exist_ok=True)
            staging = self.images_dir / f".build-{secrets.token_hex(6)}"
            try:
                write_source_tree(staging, build.tools, project=build.project_id)
                self.sandbox.share(staging)  # the tool process reads it in its sandbox
                await self._check_loads(staging)
                os.replace(staging, target)  # atomic: a directory under its digest is always complete
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
            self.builds += 1
        return image

    def _confinement(self, tree: Path, label: str) -> Confinement:
        return Confinement(read_only=(tree,), places=((tree, paths.CODE),), limits=workload_limits({}), label=label)

    async def _check_loads(self, tree: Path) -> None:
        argv = [self.python, "-m", "caiplatform.mcp.server", "--source", str(tree), "--check"]
        try:
            await asyncio.to_thread(self.sandbox.check)
            launch = await asyncio.to_thread(self.sandbox.wrap, argv, self._confinement(tree, "mcp-build"), cwd=tree,
                                             env=self._base_env())
        except SandboxUnavailable as exc:
            raise McpBuildError(f"the tools were not loaded: {exc}") from None
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *launch.argv, pass_fds=launch.pass_fds,
                    cwd=str(tree), env=launch.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )
            finally:
                launch.started()
            try:
                _, stderr = await asyncio.wait_for(proc.communicate(), BUILD_CHECK_TIMEOUT_SECONDS)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise McpBuildError(f"loading the tools took longer than {BUILD_CHECK_TIMEOUT_SECONDS:g} s") from None
        finally:
            await asyncio.to_thread(launch.close)
        if proc.returncode != 0:
            lines = stderr.decode("utf-8", "replace").strip().splitlines()
            reason = lines[-1] if lines else f"exit code {proc.returncode}"
            if reason.startswith("ModuleNotFoundError"):
                reason += f" ({HELPER_HINT})"
            raise McpBuildError("the tools do not load: " + reason)

    # -- serving --------------------------------------------------------------------------------

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def serve(self, deployment: McpDeployment) -> str:
        key = (deployment.project_id, deployment.server)
        tree = self.image_dir(deployment.image.digest)
        if not (tree / "mcp.json").exists():
            raise McpServeError(f"image {deployment.image.digest} is not in {self.images_dir}; publish again to rebuild it")
        async with self._lock(key):
            name = f"mcp-{deployment.project_short}-{deployment.server}-v{deployment.version}-{secrets.token_hex(3)}"
            env = {**self._base_env(), **self.model_env, **deployment.env, **deployment.secret_env}
            sockets = self._sockets.new()
            await asyncio.to_thread(self.sandbox.hand_over, [sockets])
            socket = sockets / SOCKET_NAME
            if self.before_run is not None:
                await self.before_run(deployment.project_id)
            spec = ProcessSpec(
                name=name,
                argv=[
                    self.python, "-m", "caiplatform.mcp.server", "--source", str(tree),
                    "--socket", f"{self.sandbox.socket_dir_inside(sockets)}/{SOCKET_NAME}",
                    "--name", deployment.server, "--version", str(deployment.version),
                ],
                env=env,
                cwd=tree,
                health=lambda: self._healthy(socket),
                startup_timeout=self.startup_timeout,
                inherit_env=False,
                sandbox=self.sandbox,
                # A network of its own, as an instance's: the platform reaches it by its socket alone.
                confinement=dataclasses.replace(self._confinement(tree, name), forward=given_ports(env),
                                                socket_dir=sockets, project=deployment.project_id),
                # One log per server across its versions (process names change with every rollout).
                log_path=self.supervisor.logs_dir / f"mcp-{deployment.project_short}-{deployment.server}.log",
            )
            try:
                await self.supervisor.start(spec)
            except ProcessStartError as exc:
                self._sockets.remove(sockets)
                raise McpServeError(f"version {deployment.version} did not start: {exc}") from exc
            previous = self._serving.get(key)
            host = None
            if deployment.expose == "apps" and self.hosts is not None:
                host = self.hosts.host_for(deployment.server, deployment.project_short)
                self.hosts.register(host, self._upstream(key))
            self._serving[key] = _Serving(name, socket, deployment.version, deployment.image.digest, host)
            if previous is not None:
                if previous.host and previous.host != host and self.hosts is not None:
                    self.hosts.unregister(previous.host)
                await self._stop(previous)
            return unix_url(str(socket), "/mcp")

    async def _stop(self, serving: _Serving) -> None:
        try:
            await self.supervisor.stop(serving.process)
        finally:
            self._sockets.remove(serving.socket.parent)

    def _upstream(self, key: tuple[str, str]):  # type: ignore[no-untyped-def]
        async def upstream() -> Upstream:
            serving = self._serving.get(key)
            if serving is None:
                raise McpServeError("the mcp server is not serving")
            return upstream_at(unix_url(str(serving.socket)))

        return upstream

    @staticmethod
    async def _healthy(socket: Path) -> bool:
        try:
            # Plain HTTP over the socket: no TLS context to build (loading the CA bundle took ~80 ms of the
            # event loop per probe, every 100 ms while an instance starts).
            transport = httpx.AsyncHTTPTransport(uds=str(socket), verify=False)
            async with httpx.AsyncClient(transport=transport, timeout=2.0, trust_env=False) as client:
                return (await client.get(f"{UNIX_ORIGIN}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    def serving(self, project_id: str, server: str) -> _Serving | None:
        return self._serving.get((project_id, server))

    def served(self, older_than: float = 0.0) -> list[tuple[str, str]]:
        """(project id, server) of every server this host runs a process of, started at least
        `older_than` seconds ago."""
        now = time.monotonic()
        return [key for key, serving in self._serving.items() if now - serving.started >= older_than]

    async def remove(self, project_id: str, server: str) -> None:
        key = (project_id, server)
        async with self._lock(key):
            serving = self._serving.pop(key, None)
            if serving is None:
                return
            if serving.host and self.hosts is not None:
                self.hosts.unregister(serving.host)
            with contextlib.suppress(Exception):
                await self._stop(serving)
        self._locks.pop(key, None)

    async def close(self) -> None:
        """Stop every server process (the platform's supervisor would too; this keeps the map honest)."""
        for project_id, server in list(self._serving):
            await self.remove(project_id, server)
        self._sockets.close()
