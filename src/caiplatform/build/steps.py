"""Running one build step (pip, go, bundle, ...) with its output in the build log."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from caiplatform.ports.builder import BuildError, BuildLog

STEP_TIMEOUT_SECONDS = 900.0


async def run_step(
    argv: list[str],
    what: str,
    emit: BuildLog,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = STEP_TIMEOUT_SECONDS,
) -> str:
    """Run a build step; its output goes to the build log and, on failure, into the `BuildError`."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(cwd) if cwd else None,
            env=dict(env) if env is not None else {**os.environ},
        )
    except OSError as exc:
        raise BuildError(f"{what} failed: {exc}") from None
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
