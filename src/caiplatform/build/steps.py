"""Running one build step (pip, go, bundle, ...) with its output in the build log.

A step of the local builder runs the user's code (a `setup.py`, npm's install scripts, a gem's extension,
a Go `init`), so it runs in the sandbox (`StepJail`): it sees the system, the platform's interpreter, the
paths it reads and writes the paths it builds, with the variables a package manager needs and none of the
server's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from caiplatform.ports.builder import BuildError, BuildLog
from caiplatform.sandbox import Confinement, Launch, Limits, Sandbox, SandboxUnavailable, sandbox_env
from caiplatform.sandbox.paths import Place

STEP_TIMEOUT_SECONDS = 900.0
# The server's variables a build step gets, by name (no prefixes: `GO*` passed `GOOGLE_API_KEY`, `NPM_CONFIG_*`
# passed `NPM_CONFIG__AUTHTOKEN`): the locale and `PATH`, proxies, CA files, and where packages come from.
# A step runs the tenant's code (a `setup.py`, an npm script), so nothing that only authenticates passes; an
# operator names more with `CAI_BUILD_PASS_ENV=NAME,NAME` (docs/sandbox.md). What the platform sets for a
# step itself (`set_env` of `run_step`: Go's caches, Bundler's paths, `PIP_NO_INPUT`) is added on top.
PASSED_VARIABLES = frozenset({
    "PATH", "LANG", "LC_ALL", "TZ",
    # proxies, in both spellings the tools read
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    # CA files
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS",
    "NPM_CONFIG_CAFILE", "npm_config_cafile",
    # package indexes and module proxies
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_FIND_LINKS",
    "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX",
    "NPM_CONFIG_REGISTRY", "npm_config_registry",
    "GOPROXY", "GONOPROXY", "GOSUMDB", "GONOSUMDB", "GOPRIVATE", "GOINSECURE",
})
PASS_ENV_SETTING = "CAI_BUILD_PASS_ENV"


def passed_names(env: Mapping[str, str]) -> frozenset[str]:
    """The named allowlist plus what the operator adds with `CAI_BUILD_PASS_ENV` (comma or space separated)."""
    extra = env.get(PASS_ENV_SETTING, "").replace(",", " ").split()
    return PASSED_VARIABLES | {name for name in extra if name != PASS_ENV_SETTING}


def build_environment(env: Mapping[str, str], set_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a sandboxed step gets: the server's variables the allowlist names, then the platform's own."""
    names = passed_names(env)
    return {**{k: v for k, v in env.items() if k in names}, **(set_env or {})}


BUILD_LIMITS = Limits(memory_bytes=4 * 2**30, cpu_millis=2000, pids=1024)


@dataclass(frozen=True)
class StepJail:
    """The sandbox of a builder's steps, with the paths they read and write."""

    sandbox: Sandbox
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    # Where the step sees those paths (`sandbox/paths.py`): the code it builds at /app/code, the environment
    # at /app/venv, ... so that what it writes and prints names no path of the data directory.
    places: tuple[Place, ...] = ()

    def with_paths(self, *, read_only: tuple[Path, ...] = (), writable: tuple[Path, ...] = (),
                   places: tuple[Place, ...] = ()) -> StepJail:
        return replace(self, read_only=self.read_only + read_only, writable=self.writable + writable,
                       places=self.places + places)

    def environment(self, env: Mapping[str, str], set_env: Mapping[str, str] | None = None) -> dict[str, str]:
        return sandbox_env(build_environment(env, set_env))

    def launch(self, argv: list[str], cwd: Path | None, what: str, env: Mapping[str, str] | None = None) -> Launch:
        """Hand the writable paths to the sandbox and wrap the step with its variables `env` (raises
        `BuildError` when it cannot)."""
        try:
            self.sandbox.check()
            self.sandbox.hand_over(self.writable)
            read_only = self.read_only + ((cwd,) if cwd is not None else ())
            return self.sandbox.wrap(argv, Confinement(read_only=read_only, writable=self.writable,
                                                       places=self.places, limits=BUILD_LIMITS, label="build"),
                                     cwd=cwd or Path("/tmp"), env=env)
        except SandboxUnavailable as exc:
            raise BuildError(f"{what} was not run: {exc}") from None

    def finish(self, launch: Launch) -> bool:
        """After the step: give what it wrote back to root, remove its cgroup; whether it ran out of memory."""
        oom = launch.oom_killed()
        launch.close()
        for path in self.writable:
            self.sandbox.take_back(path)
        return oom


async def run_step(
    argv: list[str],
    what: str,
    emit: BuildLog,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    set_env: Mapping[str, str] | None = None,
    timeout: float = STEP_TIMEOUT_SECONDS,
    jail: StepJail | None = None,
) -> str:
    """Run a build step; its output goes to the build log and, on failure, into the `BuildError`.

    `env` is the server's environment (`os.environ` when None), `set_env` what the platform sets for the
    step. In the sandbox the step gets only the variables of `env` the allowlist names, then `set_env`, loaded
    inside its sandbox (`launch.env` is then the launcher's fixed one)."""
    base = env if env is not None else os.environ
    launch = Launch(list(argv), env={**base, **(set_env or {})})
    if jail is not None and jail.sandbox.enabled:
        launch = await asyncio.to_thread(jail.launch, list(argv), cwd, what, jail.environment(base, set_env))
    try:
        return await _run(launch, what, emit, cwd, launch.env, timeout)
    finally:
        if jail is not None and jail.sandbox.enabled:
            if await asyncio.to_thread(jail.finish, launch):
                raise BuildError(f"{what} was stopped: it used more memory than a build step may "
                                 f"({BUILD_LIMITS.describe()}) (OOMKilled)")


async def _run(launch: Launch, what: str, emit: BuildLog, cwd: Path | None, env: dict[str, str], timeout: float) -> str:
    try:
        process = await asyncio.create_subprocess_exec(
            *launch.argv,
            pass_fds=launch.pass_fds,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(cwd) if cwd else None,
            env=env,
        )
    except OSError as exc:
        raise BuildError(f"{what} failed: {exc}") from None
    finally:
        launch.started()
    assert process.stdout is not None
    output: list[str] = []

    async def pump() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            output.append(line)
            emit(line)

    try:
        await asyncio.wait_for(asyncio.gather(pump(), process.wait()), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise BuildError(f"{what} took longer than {timeout:g} s:\n" + "\n".join(output)) from None
    if process.returncode != 0:
        raise BuildError(f"{what} failed (exit code {process.returncode}):\n" + "\n".join(output))
    return "\n".join(output)
