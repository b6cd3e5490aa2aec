"""In-memory workload runtime: each instance is an ASGI app built in this process.

`app_factory(image, env)` builds an instance's app (sync or async); the default is the harness's
`caiplatform.harness.app.create_harness_app(env)`. Requests reach it through a `StreamingASGITransport`
on the `Endpoint` (a streamed body arrives chunk by chunk, not all at once when the app ends). Revisions, the split, scaling, readiness and idle stop are the shared
`InstanceRuntime`'s, so this adapter behaves like the local one without processes or ports.

Logs: an instance's lines are its access log (method, path, status, duration; health probes left
out), its start and stop, tracebacks of requests that raised, and every `logging` record emitted while
one of its requests runs (the instance is tracked through a context variable, so concurrent instances
never mix their lines). Nothing is persisted: the history lives as long as the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import secrets
import time
import traceback
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from caiplatform.adapters.instances import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_LOG_RETENTION,
    HEALTH_PATH,
    ImageResolver,
    Instance,
    InstanceRuntime,
    InstanceStartError,
    Revision,
    Workload,
    instance_env,
)
from caiplatform.adapters.memory.asgi_transport import StreamingASGITransport
from caiplatform.ports.builder import Image
from caiplatform.ports.runtime import InstanceTransport, LogLine, WorkloadRef

AppFactory = Callable[[Image, Mapping[str, str]], Any]

#: Lines an instance keeps for live reading, and a workload for its history.
LIVE_LINES = 10_000
HISTORY_LINES = 50_000

_current_sink: contextvars.ContextVar[_InstanceLog | None] = contextvars.ContextVar("cai_instance_log", default=None)


def default_app_factory(image: Image, env: Mapping[str, str]) -> Any:
    if image.framework == "container" or not image.env:
        raise InstanceStartError(
            "ImagePullBackOff",
            f"the in-memory runtime cannot run {image.reference}: it was not built by this platform's builder",
        )
    from caiplatform.harness.app import create_harness_app

    return create_harness_app(env)


class _InstanceLog:
    """Lines of one instance: a live buffer with a wake-up for followers, copied into the history."""

    def __init__(self, runtime: InMemoryRuntime, ref: WorkloadRef, revision: str, pod: str):
        self.runtime = runtime
        self.ref = ref
        self.revision = revision
        self.pod = pod
        self.lines: deque[str] = deque(maxlen=LIVE_LINES)
        self.written = 0
        self.closed = False
        self.event = asyncio.Event()

    def write(self, stream: str, message: str) -> None:
        for line in message.splitlines() or [""]:
            self.lines.append(line)
            self.written += 1
            self.runtime._remember(self.ref, LogLine(datetime.now(UTC), self.revision, self.pod, stream, line))
        self.event.set()

    def close(self) -> None:
        self.closed = True
        self.event.set()


class _ContextLogHandler(logging.Handler):
    """Copies a record into the log of the instance whose request emitted it."""

    def emit(self, record: logging.LogRecord) -> None:
        sink = _current_sink.get()
        if sink is None or sink.closed:
            return
        try:
            sink.write("stderr" if record.levelno >= logging.WARNING else "stdout", self.format(record))
        except Exception:  # noqa: BLE001 - logging must never break the request
            self.handleError(record)


_handler = _ContextLogHandler()
_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))


def _install_handler() -> None:
    root = logging.getLogger()
    if _handler not in root.handlers:
        root.addHandler(_handler)


class _Lifespan:
    """Runs an ASGI app's lifespan protocol (startup on start, shutdown on stop), as a server would."""

    def __init__(self, app: Any):
        self.app = app
        self.state: dict[str, Any] = {}
        self._receive: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._send: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.supported = True

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self.app(scope, self._receive.get, self._send.put)
        except Exception as exc:  # noqa: BLE001 - an app without lifespan support raises here
            await self._send.put({"type": "lifespan.unsupported", "message": f"{type(exc).__name__}: {exc}"})

    async def startup(self, timeout: float) -> None:
        self._task = asyncio.create_task(self._run())
        await self._receive.put({"type": "lifespan.startup"})
        message = await asyncio.wait_for(self._send.get(), timeout)
        if message["type"] == "lifespan.startup.failed":
            raise InstanceStartError("ContainerFailed", message.get("message") or "the app failed to start")
        if message["type"] == "lifespan.unsupported":
            self.supported = False

    async def shutdown(self, timeout: float = 10.0) -> None:
        if self._task is None:
            return
        if self.supported and not self._task.done():
            await self._receive.put({"type": "lifespan.shutdown"})
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._send.get(), timeout)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


def _observed(app: Any, sink: _InstanceLog, state: dict[str, Any]) -> Any:
    """The app with its requests attributed to `sink` (access lines, tracebacks, logging records)."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        scope = {**scope, "state": {**state, **scope.get("state", {})}}
        token = _current_sink.set(sink)
        status = {"code": 500}
        started = time.perf_counter()

        async def observe(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await app(scope, receive, observe)
        except Exception:
            sink.write("stderr", traceback.format_exc().rstrip())
            raise
        finally:
            _current_sink.reset(token)
            if scope.get("path") != HEALTH_PATH:
                elapsed = (time.perf_counter() - started) * 1000
                sink.write("stdout", f"{scope.get('method')} {scope.get('path')} {status['code']} {elapsed:.0f}ms")

    return wrapped


class InMemoryRuntime(InstanceRuntime):
    name = "memory"

    def __init__(
        self,
        *,
        app_factory: AppFactory | None = None,
        images: ImageResolver | None = None,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        log_retention: timedelta | str = DEFAULT_LOG_RETENTION,
        readiness_timeout: float = 30.0,
    ):
        super().__init__(
            images=images, idle_seconds=idle_seconds, log_retention=log_retention, readiness_timeout=readiness_timeout
        )
        self.app_factory = app_factory or default_app_factory
        self._history: dict[str, deque[LogLine]] = {}
        _install_handler()

    # -- instances ----------------------------------------------------------------------------------

    async def _start_instance(self, workload: Workload, revision: Revision, image: Image | None, timeout: float) -> Instance:
        spec = revision.spec
        if image is None:
            image = Image(reference=spec.image, digest="", framework="container")
        pod = self._pod_name(revision)
        sink = _InstanceLog(self, workload.ref, revision.name, pod)
        secret = secrets.token_urlsafe(24)  # the per-instance secret its harness asks of every caller
        env = {**instance_env(image, spec, spec.port), "CAI_HARNESS_TOKEN": secret}
        begun = time.perf_counter()
        sink.write("stdout", f"starting {pod} (image {image.reference})")
        token = _current_sink.set(sink)  # what the app logs while it is built counts as its output
        try:
            app = self.app_factory(image, env)
            if inspect.isawaitable(app):
                app = await asyncio.wait_for(app, timeout)
            lifespan = _Lifespan(app)
            await lifespan.startup(timeout)
        except InstanceStartError as exc:
            sink.write("stderr", exc.message)
            sink.close()
            raise
        except Exception as exc:
            sink.write("stderr", traceback.format_exc().rstrip())
            sink.close()
            raise InstanceStartError("ContainerFailed", f"{type(exc).__name__}: {exc}") from None
        finally:
            _current_sink.reset(token)
        transport = InstanceTransport(secret, inner=StreamingASGITransport(_observed(app, sink, lifespan.state)))
        base_url = f"http://{pod}.{workload.ref.namespace}.svc"
        built_here = bool(image.env)
        deadline = time.monotonic() + timeout
        last = "no answer"
        async with httpx.AsyncClient(transport=transport, base_url=base_url, timeout=max(0.5, timeout)) as client:
            while True:
                try:
                    response = await client.get(HEALTH_PATH)
                    if response.status_code == 200 or (not built_here and response.status_code < 500):
                        break
                    last = f"GET {HEALTH_PATH} answered {response.status_code}: {response.text[:500]}"
                except Exception as exc:  # noqa: BLE001 - the app's failure is the revision's reason
                    last = f"GET {HEALTH_PATH} raised {type(exc).__name__}: {exc}"
                if time.monotonic() >= deadline:
                    await lifespan.shutdown()
                    sink.write("stderr", last)
                    sink.close()
                    raise InstanceStartError("HealthCheckFailed", f"{pod} did not become healthy within {timeout:g} s: {last}")
                await asyncio.sleep(0.02)
        sink.write("stdout", f"{pod} is ready (started in {(time.perf_counter() - begun) * 1000:.0f} ms)")
        return Instance(
            name=pod,
            revision=revision.name,
            base_url=base_url,
            started_at=datetime.now(UTC),
            transport=transport,
            handle=(lifespan, sink),
        )

    async def _stop_instance(self, workload: Workload, instance: Instance) -> None:
        lifespan, sink = instance.handle
        await lifespan.shutdown()
        sink.write("stdout", f"{instance.name} stopped")
        sink.close()

    # -- logs ---------------------------------------------------------------------------------------

    def _remember(self, ref: WorkloadRef, line: LogLine) -> None:
        if ref.key not in self._workloads:
            return  # deleted: its history is gone
        self._history.setdefault(ref.key, deque(maxlen=HISTORY_LINES)).append(line)

    def _forget(self, ref: WorkloadRef) -> None:
        self._history.pop(ref.key, None)

    async def erase_log_lines(self, ref: WorkloadRef, needles: Sequence[str]) -> int:
        history = self._history.get(ref.key)
        wanted = [n for n in needles if n]
        if not history or not wanted:
            return 0
        kept = [line for line in history if not any(n in line.message for n in wanted)]
        gone = len(history) - len(kept)
        if gone:
            self._history[ref.key] = deque(kept, maxlen=history.maxlen)
        return gone

    def logs(self, ref: WorkloadRef, *, tail: int = 500, follow: bool = False) -> AsyncIterator[str] | None:
        instance = self._newest_live(ref)
        if instance is None:
            return None
        sink: _InstanceLog = instance.handle[1]

        async def lines() -> AsyncIterator[str]:
            seen = sink.written
            backlog = list(sink.lines)[-tail:] if tail > 0 else []
            for line in backlog:
                yield line
            while follow and not sink.closed:
                sink.event.clear()
                if sink.written == seen:
                    await sink.event.wait()
                fresh = sink.written - seen
                seen = sink.written
                for line in list(sink.lines)[-fresh:] if fresh else []:
                    yield line

        return lines()

    async def log_history(self, ref: WorkloadRef, *, since: datetime | None = None, limit: int = 500) -> list[LogLine]:
        history = self._history.get(ref.key)
        if not history:
            return []
        cutoff = datetime.now(UTC) - self.log_retention
        while history and history[0].ts < cutoff:
            history.popleft()
        lines = [line for line in history if since is None or line.ts >= since]
        return lines[-limit:] if limit > 0 else []
