"""A pool of warm sandboxes: bubblewrap processes already started and waiting for their one snippet.

The pool holds at most `size` sandboxes at a time, warm or running (document 1: a warm pool of 3 pods,
each runs one snippet). A caller takes a warm one (waiting up to `wait_seconds`, in arrival order, then
503 `no warm sandbox pod available, try again shortly`); the sandbox runs its snippet and is discarded
(its processes killed, its cgroup removed), and a fresh one starts in its place in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from caiplatform.codesandbox.limits import NO_WARM_SANDBOX, SandboxLimits
from caiplatform.errors import Unavailable
from caiplatform.sandbox import Confinement, Launch, Sandbox, cpu_millis, memory_bytes, paths
from caiplatform.sandbox.limits import Limits

log = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("runner.py")
READY_SECONDS = 30.0  # a sandbox that does not say `ready` by then is discarded
GRACE_SECONDS = 10.0  # past timeout_s, the platform kills the whole sandbox itself
RETRY_SECONDS = 1.0
SANDBOX_WORK = "/tmp/work"
# The runner's one-line answer: both capped streams and the capped files, base64 and JSON-escaped.
ANSWER_LIMIT = 64 * 1024 * 1024  # inside the sandbox: its private /tmp


@dataclass
class RunOutcome:
    answer: dict[str, Any] | None  # the runner's JSON line; None when it died without one
    oom_killed: bool
    stderr: str  # the runner's own (not the snippet's): why it failed, when it did


@dataclass
class WarmSandbox:
    id: str
    process: asyncio.subprocess.Process
    launch: Launch
    started: float = field(default_factory=time.monotonic)
    scratch: str | None = None  # the work directory when the sandbox is off (no private /tmp)

    async def run(self, request: dict[str, Any], deadline: float) -> RunOutcome:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            await self.process.stdin.drain()
            self.process.stdin.close()
            line = await asyncio.wait_for(self.process.stdout.readline(), deadline)
        except (TimeoutError, BrokenPipeError, ConnectionResetError, ValueError):
            line = b""
        answer = None
        with contextlib.suppress(ValueError):
            answer = json.loads(line) if line.strip() else None
        oom = await asyncio.to_thread(self.launch.oom_killed) or bool(
            self.launch.rlimited and answer is not None and answer.get("out_of_memory"))
        return RunOutcome(answer, oom, await self._own_stderr())

    async def _own_stderr(self) -> str:
        if self.process.returncode is None:
            return ""
        assert self.process.stderr is not None
        with contextlib.suppress(Exception):
            return (await asyncio.wait_for(self.process.stderr.read(4096), 1)).decode("utf-8", "replace")
        return ""

    async def discard(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.process.wait(), 5)
        await asyncio.to_thread(self.launch.close)  # kills whatever is left in its cgroup
        if self.scratch:
            await asyncio.to_thread(shutil.rmtree, self.scratch, True)


class PooledSandbox(Protocol):
    id: str

    async def run(self, request: dict[str, Any], deadline: float) -> RunOutcome: ...
    async def discard(self) -> None: ...


S = TypeVar("S", bound=PooledSandbox)


class BasePool(Generic[S]):
    """What every warm pool does, wherever its sandboxes live: keep `size` of them warm or running,
    hand the oldest warm one to a caller (503 past `wait_seconds`), discard it after its one snippet and
    start a fresh one in its place, and say how it stands in `/healthz`. A pool says how to start one
    (`_start_one`), whether a warm one still lives (`_still_warm`), and what to do before filling."""

    unit = "sandbox"  # what the log lines call one

    def __init__(self, limits: SandboxLimits, *, name: str, size: int | None, wait_seconds: float | None,
                 network: bool):
        self.limits = limits
        self.name = name
        self.size = limits.pool_size if size is None else size
        self.wait_seconds = limits.wait_seconds if wait_seconds is None else wait_seconds
        self.network = network
        self._ready: asyncio.Queue[S] = asyncio.Queue()
        self._starting = 0
        self._busy = 0
        self._served = 0
        self._failed_starts = 0
        self._refused = 0
        self._last_error = ""
        self._changed = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        # Set by the platform's metrics (`Metrics.pool`): each caller's wait for a warm sandbox, in seconds.
        self.observe_wait: Callable[[float], None] | None = None

    # -- what a pool says of itself ------------------------------------------------------------------

    async def _start_one(self) -> S:
        raise NotImplementedError

    async def _still_warm(self, sandbox: S) -> bool:
        raise NotImplementedError

    async def _before_fill(self) -> None:
        """Anything the sandboxes need before the first starts (idempotent; raising retries it)."""

    def _announce(self) -> None:
        log.info("%s sandbox pool: keeping %d warm %ses (network %s)", self.name, self.size, self.unit,
                 "allowed" if self.network else "none")

    def _described(self) -> dict[str, Any]:
        """Fields of `describe()` that only this kind of pool has."""
        return {}

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Fill the pool in the background (idempotent)."""
        if self._filler is None or self._filler.done():
            self._filler = asyncio.get_running_loop().create_task(self._fill(), name=f"{self.name}-sandbox-pool")
            self._announce()

    async def _stop_filling(self) -> None:
        if self._filler is not None:
            self._filler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._filler

    def describe(self) -> dict[str, Any]:
        """For `/healthz`: how many are warm, starting and running a snippet."""
        warm = self._ready.qsize()
        body: dict[str, Any] = {
            "status": "ok" if warm or self._busy or self._starting else ("idle" if self._filler is None else "empty"),
            **self._described(),
            "size": self.size, "warm": warm, "starting": self._starting, "running": self._busy,
            "served": self._served, "refused": self._refused, "failed_starts": self._failed_starts,
            "network": "allowed" if self.network else "none",
            "limits": {"cpu": self.limits.cpu, "memory": self.limits.memory},
        }
        if self._last_error:
            body["last_error"] = self._last_error
        return body

    async def _fill(self) -> None:
        while True:
            try:
                await self._before_fill()
            except Exception as exc:  # noqa: BLE001 - reported in /healthz, tried again
                self._failed_starts += 1
                self._last_error = str(exc)
                log.warning("%s sandbox pool: %s", self.name, self._last_error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            missing = self.size - (self._ready.qsize() + self._starting + self._busy)
            if missing > 0:
                self._starting += missing
                results = await asyncio.gather(*(self._start_one() for _ in range(missing)), return_exceptions=True)
                self._starting -= missing
                failed = [r for r in results if isinstance(r, BaseException)]
                for result in results:
                    if not isinstance(result, BaseException):
                        self._ready.put_nowait(result)
                if failed:
                    self._failed_starts += len(failed)
                    self._last_error = str(failed[0])
                    log.warning("%s sandbox pool: %d %s(es) failed to start: %s", self.name, len(failed), self.unit,
                                failed[0])
                    await asyncio.sleep(RETRY_SECONDS)
                continue
            self._changed.clear()
            await self._changed.wait()

    # -- use -----------------------------------------------------------------------------------------

    async def acquire(self) -> tuple[S, float]:
        """A warm sandbox and how long the caller waited for it (seconds); 503 past the wait."""
        self.start()
        begun = time.monotonic()
        while True:
            try:
                sandbox = await asyncio.wait_for(self._ready.get(), self.wait_seconds - (time.monotonic() - begun))
            except TimeoutError:
                self._refused += 1
                log.warning("%s sandbox pool: no warm %s within %.0f s (%s)", self.name, self.unit,
                            self.wait_seconds, self.describe())
                raise Unavailable(NO_WARM_SANDBOX) from None
            self._busy += 1
            if await self._still_warm(sandbox):
                waited = time.monotonic() - begun
                if self.observe_wait is not None:
                    self.observe_wait(waited)
                return sandbox, waited
            await self.release(sandbox, ran=False)

    async def release(self, sandbox: S, *, ran: bool = True) -> None:
        """Discard a sandbox that ran its snippet; a fresh one takes its place."""
        try:
            await sandbox.discard()
        finally:
            self._busy -= 1
            self._served += int(ran)
            self._changed.set()


class WarmPool(BasePool[WarmSandbox]):
    """Warm sandboxes made with the platform's `Sandbox`, no network unless `network` is true."""

    def __init__(self, sandbox: Sandbox, limits: SandboxLimits, *, name: str = "code", size: int | None = None,
                 wait_seconds: float | None = None, network: bool = False):
        super().__init__(limits, name=name, size=size, wait_seconds=wait_seconds, network=network)
        self.sandbox = sandbox
        self._ids = itertools.count(1)

    async def close(self) -> None:
        await self._stop_filling()
        while not self._ready.empty():
            await self._ready.get_nowait().discard()

    async def _start_one(self) -> WarmSandbox:
        ident = f"{self.name}-{os.getpid()}-{next(self._ids)}"
        scratch = None if self.sandbox.enabled else tempfile.mkdtemp(prefix=f"cai-{ident}-")
        confinement = Confinement(limits=sandbox_limits(self.limits), label=ident, network=self.network)
        sandbox = await start_sandbox(self.sandbox, [paths.python(), "-I", str(RUNNER), scratch or SANDBOX_WORK],
                                      confinement, ident, READY_SECONDS, scratch=scratch)
        log.debug("%s sandbox pool: %s is warm", self.name, ident)
        return sandbox

    async def _still_warm(self, sandbox: WarmSandbox) -> bool:
        if sandbox.process.returncode is None:
            return True
        log.warning("%s sandbox pool: %s died while warm (exit %s); replaced", self.name, sandbox.id,
                    sandbox.process.returncode)
        return False


def sandbox_limits(limits: SandboxLimits) -> Limits:
    return Limits(memory_bytes=memory_bytes(limits.memory), cpu_millis=cpu_millis(limits.cpu), pids=limits.pids)


async def start_sandbox(sandbox: Sandbox, argv: list[str], confinement: Confinement, ident: str, ready_seconds: float,
                        *, scratch: str | None = None, env: dict[str, str] | None = None,
                        answer_limit: int = ANSWER_LIMIT) -> WarmSandbox:
    """Start `argv` (a runner speaking the `ready` / one JSON line protocol) confined; wait until it is ready."""
    base = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"}
    # The variables are loaded inside the sandbox; the launcher starts with `launch.env` (its fixed one).
    launch = await asyncio.to_thread(sandbox.wrap, argv, confinement, cwd=Path("/tmp"), env={**base, **(env or {})})
    try:
        process = await asyncio.create_subprocess_exec(
            *launch.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, pass_fds=launch.pass_fds, env=launch.env,
            start_new_session=True, limit=answer_limit)
    except BaseException:
        launch.close()
        raise
    launch.started()
    started = WarmSandbox(ident, process, launch, scratch=scratch)
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), ready_seconds)
    except (TimeoutError, ValueError):
        line = b""
    if line.strip() != b"ready":
        why = await started._own_stderr() if process.returncode is not None else "it did not answer"
        await started.discard()
        raise RuntimeError(f"sandbox {ident} did not start: {why.strip() or 'no output'}")
    return started
