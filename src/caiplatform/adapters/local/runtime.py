"""Local process runtime (the embedded default): every instance is a supervised subprocess behind a Unix socket.

An instance runs the image's command (or the revision's `command`/`args`) under the platform's
`ProcessSupervisor` with only the variables it is given (`inherit_env=False`: the platform's own
secrets never reach a workload) plus `PATH`, a per-workload `HOME` and Python's unbuffered output, inside
the platform's sandbox (`caiplatform.sandbox`): it sees its image, its environment, its home and its
`state_dirs`, nothing else of the data directory, within its `resources.limits` (an instance the kernel
stops for exceeding its memory is reported as `OOMKilled` on its revision).
Each instance has a network namespace of its own (`caiplatform.sandbox.network`) and is reached only
through a Unix socket in a directory bound into its sandbox alone (`/run/cai/harness.sock` inside), with a
per-instance secret on every request (`CAI_HARNESS_TOKEN`, `X-CAI-Harness-Token`; `InstanceTransport`):
no other workload can see the socket, and no port of the host leads to an instance. A harness the platform
built listens on the socket itself; a revision's own `command` listens on TCP `$PORT` in its namespace,
behind a relay inside the same sandbox from the socket to that port (`caiplatform.sandbox.relay`).
Health: `GET /healthz` answering 200 for images the platform built; a connection to the socket for other
commands (the relay opens it once the port accepts: Knative's default TCP probe). Routing, scaling and
idle stop are the shared `InstanceRuntime`'s.

State in `<data-dir>/runtime/`:

    workloads/<key>.json          revisions (their specs, secret values included: mode 0600) and the split
    logs/<key>/<pod>.log          what each instance wrote (stdout and stderr together)
    history/<key>.jsonl           persisted log lines, `LOG_RETENTION` long (default 14 days)
    home/<key>/                   the workload's HOME
    warm.json                     the revisions that had instances at the last stop (read once by `start()`)

A restarted platform loads the workloads and serves the same revisions (instances start on demand;
`min_scale` ones come back warm, and so do the instances that were running when the platform stopped,
as a cluster's pods outlive a restart of its control plane: `warm.json`, written by `close()`). Processes a crashed run left behind are reaped through the
supervisor's records before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from caiplatform import logjson, tracing
from caiplatform.adapters.instances import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_LOG_RETENTION,
    HEALTH_PATH,
    READINESS_TIMEOUT_SECONDS,
    ImageResolver,
    Instance,
    InstanceRuntime,
    InstanceStartError,
    Revision,
    Workload,
    instance_env,
)
from caiplatform.adapters.log_files import erase_lines
from caiplatform.ports.builder import Image
from caiplatform.ports.runtime import (
    InstanceTransport,
    LogLine,
    Resources,
    RevisionSpec,
    Scaling,
    TrafficTarget,
    WorkloadRef,
)
from caiplatform.sandbox import (
    Confinement,
    Sandbox,
    SandboxUnavailable,
    paths,
    shared_sandbox,
    workload_limits,
)
from caiplatform.sandbox.network import given_ports
from caiplatform.sandbox.sockets import SocketDirs
from caiplatform.supervisor import ProcessSpec, ProcessStartError, ProcessSupervisor, free_port

RELAY = str(Path(__file__).resolve().parents[2] / "sandbox" / "relay.py")
SOCKET_NAME = "harness.sock"
#: The Host of requests to an instance (it is reached by its socket, not by a name).
INSTANCE_ORIGIN = "http://harness"

PROCESS_PREFIX = "workload-"
#: Lines the supervisor writes into a log file itself (not the workload's output).
SUPERVISOR_BANNER = "=== "
COMPACT_EVERY_SECONDS = 600.0
STOP_GRACE_SECONDS = 5.0


@dataclass(eq=False)
class _Process:
    name: str  # supervisor name
    log_path: Path
    offset: int = 0  # bytes of the log already copied into the history
    process: Any = None  # ManagedProcess


# How often a starting instance's `/healthz` is asked: the first invoke after scale to zero waits for the
# probe that sees it ready (half this on average). A refused loopback connection costs well under a
# millisecond, so 40 probes a second while an instance imports its framework cost little.
INSTANCE_PROBE_SECONDS = 0.025
# Instances restored after a restart that start at the same time (each imports its framework: two cores).
WARM_STARTS_AT_ONCE = 2


class LocalProcessRuntime(InstanceRuntime):
    name = "local"

    def __init__(
        self,
        data_dir: str | Path,
        *,
        supervisor: ProcessSupervisor | None = None,
        images: ImageResolver | None = None,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        log_retention: timedelta | str = DEFAULT_LOG_RETENTION,
        readiness_timeout: float = READINESS_TIMEOUT_SECONDS,
        sandbox: Sandbox | None = None,
    ):
        super().__init__(
            images=images, idle_seconds=idle_seconds, log_retention=log_retention, readiness_timeout=readiness_timeout
        )
        self.root = Path(data_dir) / "runtime"
        self.sandbox = sandbox or shared_sandbox()
        self._sockets = SocketDirs()  # instances' socket directories
        self._own_supervisor = supervisor is None
        self.supervisor = supervisor or ProcessSupervisor(self.root / "run", health_interval=INSTANCE_PROBE_SECONDS)
        self._loaded = False
        self._last_compaction = 0.0
        # Instance logs still being copied into the history, by process name.
        self._pending: dict[str, tuple[WorkloadRef, str, str, _Process]] = {}
        # Awaited with a project's id before an instance of it starts: what its network reaches besides its
        # given ports is made known first (its memory stores, services/memorystore_reach.py).
        self.before_run: Callable[[str], Awaitable[None]] | None = None
        # Recorded workloads are known at once (reads work before `start()`); instances wait for it.
        self._load()

    # -- paths --------------------------------------------------------------------------------------

    def _workload_path(self, key: str) -> Path:
        return self.root / "workloads" / f"{key}.json"

    def _history_path(self, key: str) -> Path:
        return self.root / "history" / f"{key}.jsonl"

    def _logs_dir(self, key: str) -> Path:
        return self.root / "logs" / key

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        if not self._loaded:
            self._loaded = True
            stale = [r["name"] for r in self.supervisor.records() if str(r.get("name", "")).startswith(PROCESS_PREFIX)]
            if stale:
                await asyncio.to_thread(self.supervisor.reap_stale, stale)
            for workload in self._workloads.values():
                for revision in workload.revisions.values():
                    if revision.state == "unknown":  # it was starting when the previous run ended
                        self._spawn(self._prove_ready(workload, revision), f"ready-{revision.name}")
            self._rewarm(self._take_warm_record())
        await super().start()

    def _take_warm_record(self) -> list[tuple[str, str, int]]:
        """What `close()` recorded as running, most recently used first; the record is used once (a run
        that crashes after this start restores nothing it did not itself record)."""
        path = self.root / "warm.json"
        try:
            entries = json.loads(path.read_text())
            path.unlink()
            return [(str(e["workload"]), str(e["revision"]), int(e["instances"])) for e in entries]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def _rewarm(self, entries: list[tuple[str, str, int]]) -> None:
        """Start again, in the background, the instances a revision had when the platform stopped, if it is
        still ready and routed: a restart does not make the next invoke of a busy agent a cold start. They
        start WARM_STARTS_AT_ONCE at a time (the server's own start shares the machine) and stop after the
        usual idle time if nobody calls them. One still waiting for its turn is not counted as starting, so an
        invoke that comes first starts its own instance at once instead of waiting behind the queue."""
        gate = asyncio.Semaphore(WARM_STARTS_AT_ONCE)
        for key, name, count in entries:
            workload = self._workloads.get(key)
            revision = workload.revisions.get(name) if workload is not None else None
            if workload is None or revision is None or revision.state != "ready" or name not in workload.routed():
                continue
            want = min(count, revision.ceiling)
            for _ in range(want):
                self._spawn(self._warm_gated(gate, workload, revision, want), f"rewarm-{name}")

    async def _warm_gated(self, gate: asyncio.Semaphore, workload: Workload, revision: Revision, want: int) -> None:
        async with gate:
            if self._closed or revision.state != "ready" or len(revision.instances) + revision.starting >= want:
                return  # an invoke already started what it needed
            revision.starting += 1
            await self._warm(workload, revision)

    def _record_warm(self) -> None:
        """Which revisions have instances now (most recently used first), for the next start."""
        running = [
            (max(i.last_used for i in live), workload.ref.key, revision.name, len(live))
            for workload in self._workloads.values()
            for revision in workload.revisions.values()
            if (live := [i for i in revision.instances if not i.stopping])
        ]
        entries = [{"workload": key, "revision": name, "instances": count}
                   for _, key, name, count in sorted(running, reverse=True)]
        path = self.root / "warm.json"
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(entries))

    async def close(self) -> None:
        if self._loaded and not self._closed:
            self._record_warm()
        await super().close()
        if self._own_supervisor:
            await self.supervisor.stop_all()
        self._sockets.close()

    def _load(self) -> None:
        """The workloads a previous run recorded (synchronous: a few small files)."""
        directory = self.root / "workloads"
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            try:
                workload = _workload_from_json(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            self._workloads[workload.ref.key] = workload

    def _persist(self, workload: Workload) -> None:
        path = self._workload_path(workload.ref.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # secret values inside
        with os.fdopen(fd, "w") as fh:
            json.dump(_workload_to_json(workload), fh, indent=1)
        os.replace(tmp, path)

    def _forget(self, ref: WorkloadRef) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._workload_path(ref.key).unlink()
        with contextlib.suppress(FileNotFoundError):
            self._history_path(ref.key).unlink()
        shutil.rmtree(self._logs_dir(ref.key), ignore_errors=True)

    # -- instances ----------------------------------------------------------------------------------

    async def _start_instance(self, workload: Workload, revision: Revision, image: Image | None, timeout: float) -> Instance:
        spec = revision.spec
        if spec.command:
            argv = [*spec.command, *(spec.args or [])]
        elif image is not None and image.command:
            argv = [*image.command, *(spec.args or [])]
        else:
            raise InstanceStartError(
                "ImagePullBackOff",
                f"cannot run {spec.image} on this machine: it was not built by the platform's builder "
                "and the revision names no command",
            )
        key = workload.ref.key
        pod = self._pod_name(revision)
        try:
            await asyncio.to_thread(self.sandbox.check)
            await asyncio.to_thread(self.sandbox.check_network)
        except SandboxUnavailable as exc:
            raise InstanceStartError("SandboxUnavailable", f"{pod} was not started: {exc}") from None
        # The port the revision's own server listens on, inside its own network namespace (any port
        # would do there; a free one keeps a run without the sandbox's network working).
        port = free_port()
        home = self.root / "home" / key
        state = [Path(p) for p in spec.state_dirs]
        sockets = self._sockets.new()
        await asyncio.to_thread(self.sandbox.hand_over, [home, *state, sockets])
        socket_inside = f"{self.sandbox.socket_dir_inside(sockets)}/{SOCKET_NAME}"
        socket_path = str(sockets / SOCKET_NAME)
        transport = InstanceTransport(secrets.token_urlsafe(32), uds=socket_path)
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",  # an image directory never changes
            **instance_env(image, spec, port),
            # After the tenant's variables: theirs never redirect the platform's spans or change its log format.
            **tracing.workload_env(),
            **logjson.workload_env(),
            "CAI_HARNESS_TOKEN": transport.token,
        }
        log_path = self._logs_dir(key) / f"{pod}.log"
        built_here = image is not None and bool(image.env) and not spec.command
        if built_here:  # the harness listens on the socket itself
            env["CAI_HARNESS_SOCKET"] = socket_inside
        else:  # the revision's own server on $PORT, behind the relay
            argv = [paths.python(), "-I", RELAY, socket_inside, str(port), "--", *argv]
        cwd = Path(image.env["CAI_CODE_DIR"]) if image is not None and "CAI_CODE_DIR" in image.env else home
        health = _HttpHealth(transport) if built_here else None
        if self.before_run is not None:
            await self.before_run(workload.ref.project_id)
        own = paths.image_places(image.env, image.command) if image is not None else ()
        begun = time.perf_counter()
        process = _Process(name=f"{PROCESS_PREFIX}{key}-{pod.rsplit('-', 1)[-1]}-{revision.spec.generation}", log_path=log_path)
        self._ingest_later(workload.ref, revision.name, pod, process)
        try:
            process.process = await self.supervisor.start(ProcessSpec(
                name=process.name,
                argv=argv,
                env=env,
                cwd=cwd if cwd.is_dir() else home,
                health=health if health is not None else (lambda: _socket_ready(socket_path)),
                startup_timeout=max(0.5, timeout),
                restart=False,  # a dead instance is replaced on demand, like a pod
                log_path=log_path,
                stop_timeout=STOP_GRACE_SECONDS,
                inherit_env=False,
                sandbox=self.sandbox,
                confinement=Confinement(
                    read_only=tuple(host for host, _ in own), writable=(home, *state),
                    places=(*own, (home, paths.HOME), *paths.state_places(state)),
                    limits=workload_limits(spec.resources.limits), label=process.name,
                    forward=tuple(sorted({*given_ports(env), *tracing.collector_ports()})), socket_dir=sockets,
                    project=workload.ref.project_id,
                ),
            ))
        except ProcessStartError as exc:
            await transport.close()
            shutil.rmtree(sockets, ignore_errors=True)
            error = _start_error(pod, str(exc), log_path, health.last if health is not None else "")
            if self.supervisor_oom(process):
                error = InstanceStartError("OOMKilled", _oom_message(pod, spec) + ":\n" + error.message)
            self._finish_log(workload.ref, revision.name, pod, process)
            raise error from None
        except (OSError, ValueError) as exc:
            await transport.close()
            shutil.rmtree(sockets, ignore_errors=True)
            self._pending.pop(process.name, None)
            raise InstanceStartError("ContainerFailed", f"{pod} could not start: {exc}") from None
        self._append_history(workload.ref, [LogLine(
            datetime.now(UTC), revision.name, pod, "stdout",
            f"{pod} is ready (started in {(time.perf_counter() - begun) * 1000:.0f} ms)")])
        return Instance(
            name=pod,
            revision=revision.name,
            base_url=INSTANCE_ORIGIN,
            started_at=datetime.now(UTC),
            transport=transport,
            handle=process,
        )

    async def _stop_instance(self, workload: Workload, instance: Instance) -> None:
        process: _Process = instance.handle
        await self.supervisor.stop(process.name)
        self._finish_log(workload.ref, instance.revision, instance.name, process)
        transport: InstanceTransport = instance.transport
        await transport.close()
        if transport.uds:
            shutil.rmtree(Path(transport.uds).parent, ignore_errors=True)

    def _instance_alive(self, instance: Instance) -> bool:
        """Running, and none of its processes was killed for memory (a child such as the Node.js runner may
        be the one the kernel picks: the whole instance is then stopped, as a container is)."""
        process: _Process = instance.handle
        return process.process is not None and process.process.running and not self.supervisor_oom(process)

    @staticmethod
    def supervisor_oom(process: _Process) -> bool:
        managed = process.process
        return managed is not None and managed.out_of_memory

    def _exit_reason(self, workload: Workload, revision: Revision, instance: Instance) -> tuple[str, str] | None:
        process: _Process = instance.handle
        if self.supervisor_oom(process):
            message = _oom_message(instance.name, revision.spec)
            self._append_history(workload.ref, [LogLine(datetime.now(UTC), revision.name, instance.name, "stdout", message)])
            return "OOMKilled", message
        return None

    # -- logs ---------------------------------------------------------------------------------------

    def _ingest_later(self, ref: WorkloadRef, revision: str, pod: str, process: _Process) -> None:
        self._pending[process.name] = (ref, revision, pod, process)

    def _finish_log(self, ref: WorkloadRef, revision: str, pod: str, process: _Process) -> None:
        """The instance is gone: copy the rest of its output (a last unfinished line too), drop the file."""
        self._ingest(ref, revision, pod, process, final=True)
        self._pending.pop(process.name, None)
        with contextlib.suppress(OSError):
            process.log_path.unlink()

    def _ingest(self, ref: WorkloadRef, revision: str, pod: str, process: _Process, final: bool = False) -> None:
        """Copy the complete lines an instance wrote since last time into the workload's history."""
        if ref.key not in self._workloads:
            return
        try:
            with open(process.log_path, "rb") as fh:
                fh.seek(process.offset)
                data = fh.read()
        except OSError:
            return
        end = len(data) - 1 if final and data else data.rfind(b"\n")
        if end < 0:
            return
        process.offset += end + 1
        now = datetime.now(UTC)
        self._append_history(ref, [
            LogLine(now, revision, pod, "stdout", line)
            for line in data[: end + 1].decode("utf-8", "replace").splitlines()
            if not line.startswith(SUPERVISOR_BANNER)
        ])

    def _append_history(self, ref: WorkloadRef, lines: list[LogLine]) -> None:
        if not lines or ref.key not in self._workloads:
            return
        path = self._history_path(ref.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(_line_to_json(line)) + "\n" for line in lines))

    async def _housekeep_logs(self) -> None:
        for ref, revision, pod, process in list(self._pending.values()):
            self._ingest(ref, revision, pod, process)
        if time.monotonic() - self._last_compaction >= COMPACT_EVERY_SECONDS:
            self._last_compaction = time.monotonic()
            await asyncio.to_thread(self._compact)

    def _compact(self) -> None:
        """Drop history lines older than the retention."""
        cutoff = datetime.now(UTC) - self.log_retention
        directory = self.root / "history"
        for path in directory.glob("*.jsonl") if directory.is_dir() else []:
            lines = _read_history(path)
            kept = [line for line in lines if line.ts >= cutoff]
            if len(kept) != len(lines):
                tmp = path.with_suffix(".jsonl.tmp")
                tmp.write_text("".join(json.dumps(_line_to_json(line)) + "\n" for line in kept))
                os.replace(tmp, path)

    def logs(self, ref: WorkloadRef, *, tail: int = 500, follow: bool = False) -> AsyncIterator[str] | None:
        instance = self._newest_live(ref)
        if instance is None:
            return None
        process: _Process = instance.handle

        async def lines() -> AsyncIterator[str]:
            with open(process.log_path, "rb") as fh:
                backlog = [
                    raw.decode("utf-8", "replace") for raw in fh.read().splitlines(keepends=True)
                ]
                complete = [line.rstrip("\n") for line in backlog if line.endswith("\n")]
                partial = "".join(line for line in backlog if not line.endswith("\n"))
                for line in [line for line in complete if not line.startswith(SUPERVISOR_BANNER)][-tail:] if tail > 0 else []:
                    yield line
                while follow:
                    chunk = fh.read()
                    if chunk:
                        partial += chunk.decode("utf-8", "replace")
                        *done, partial = partial.split("\n")
                        for line in done:
                            if not line.startswith(SUPERVISOR_BANNER):
                                yield line
                        continue
                    if instance.stopping or not self._instance_alive(instance):
                        return
                    await asyncio.sleep(0.1)

        return lines()

    def _ingest_pending(self, ref: WorkloadRef) -> None:
        for pending_ref, revision, pod, process in list(self._pending.values()):
            if pending_ref.key == ref.key:
                self._ingest(pending_ref, revision, pod, process)

    async def erase_log_lines(self, ref: WorkloadRef, needles: Sequence[str]) -> int:
        wanted = [n for n in needles if n]
        if not wanted or ref.key not in self._workloads:
            return 0
        self._ingest_pending(ref)
        # On the event loop, like the ingestion that appends to the same file: no line is appended meanwhile.
        return erase_lines(self._history_path(ref.key), lambda message: any(n in message for n in wanted))

    async def log_history(self, ref: WorkloadRef, *, since: datetime | None = None, limit: int = 500) -> list[LogLine]:
        self._ingest_pending(ref)
        path = self._history_path(ref.key)
        if ref.key not in self._workloads or not path.is_file():
            return []
        cutoff = datetime.now(UTC) - self.log_retention
        lines = await asyncio.to_thread(_read_history, path)
        lines = [line for line in lines if line.ts >= cutoff and (since is None or line.ts >= since)]
        return lines[-limit:] if limit > 0 else []


# ---------------------------------------------------------------------------------------------------


async def _socket_ready(path: str) -> bool:
    """The relay listens on the socket once the revision's server accepts on its port."""
    try:
        _, writer = await asyncio.open_unix_connection(path)
    except OSError:
        return False
    writer.close()
    return True


class _HttpHealth:
    """`GET /healthz` answers 200; remembers the last other answer for the not-ready message."""

    def __init__(self, transport: InstanceTransport):
        self.transport = transport
        self.last = ""

    async def __call__(self) -> bool:
        uds = self.transport.uds
        if uds is not None and not os.path.exists(uds):
            # Nothing listens yet (the harness binds its socket once its framework is imported): a stat
            # instead of a client and a refused connection, 40 times a second while an instance starts.
            self.last = f"GET {HEALTH_PATH}: ConnectError"
            return False
        try:
            # Over the instance's socket, with its secret (the harness refuses every other caller).
            async with httpx.AsyncClient(transport=self.transport, timeout=2.0, trust_env=False) as client:
                response = await client.get(f"{INSTANCE_ORIGIN}{HEALTH_PATH}")
        except httpx.HTTPError as exc:
            self.last = f"GET {HEALTH_PATH}: {type(exc).__name__}"
            return False
        if response.status_code != 200:
            self.last = f"GET {HEALTH_PATH} answered {response.status_code}: {response.text[:500]}"
        return response.status_code == 200


def _oom_message(pod: str, spec: RevisionSpec) -> str:
    limit = spec.resources.limits.get("memory") or "the default limit"
    return f"{pod} was stopped: it used more memory than its limit ({limit}) (OOMKilled)"


def _start_error(pod: str, text: str, log_path: Path, last_probe: str = "") -> InstanceStartError:
    """The supervisor's failure, told without the platform's paths, with the instance's last lines."""
    first = text.split(";", 1)[0]
    try:
        output = [
            line for line in log_path.read_text(errors="replace").splitlines() if not line.startswith(SUPERVISOR_BANNER)
        ][-20:]
    except OSError:
        output = []
    detail = first.replace(first.split(" ", 1)[0], pod, 1)
    if last_probe:
        detail += f" ({last_probe})"
    message = detail + (":\n" + "\n".join(output) if output else "")
    reason = "ContainerFailed" if "exited with code" in first else "HealthCheckFailed"
    return InstanceStartError(reason, message)


def _read_history(path: Path) -> list[LogLine]:
    out = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for raw in text.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            d = json.loads(raw)
            out.append(LogLine(datetime.fromisoformat(d["ts"]), d["revision"], d["pod"], d["stream"], d["message"]))
    return out


def _line_to_json(line: LogLine) -> dict[str, Any]:
    return {"ts": line.ts.isoformat(), "revision": line.revision, "pod": line.pod, "stream": line.stream,
            "message": line.message}


def _workload_to_json(workload: Workload) -> dict[str, Any]:
    return {
        "ref": asdict(workload.ref),
        "created_at": workload.created_at.isoformat(),
        "traffic": [asdict(t) for t in workload.traffic],
        "revisions": [
            {
                "spec": {k: v for k, v in asdict(r.spec).items() if k != "workload"},
                "created_at": r.created_at.isoformat(),
                "state": r.state,
                "reason": r.reason,
                "message": r.message,
            }
            for r in workload.revisions.values()
        ],
    }


def _workload_from_json(data: dict[str, Any]) -> Workload:
    ref = WorkloadRef(**data["ref"])
    workload = Workload(ref=ref, created_at=datetime.fromisoformat(data["created_at"]))
    workload.traffic = [TrafficTarget(**t) for t in data["traffic"]]
    for item in data["revisions"]:
        fields = dict(item["spec"])
        fields["resources"] = Resources(**fields.get("resources", {}))
        fields["scaling"] = Scaling(**fields.get("scaling", {}))
        spec = RevisionSpec(workload=ref, **fields)
        workload.revisions[spec.revision] = Revision(
            spec=spec,
            created_at=datetime.fromisoformat(item["created_at"]),
            state=item.get("state", "unknown"),
            reason=item.get("reason", ""),
            message=item.get("message", ""),
        )
    return workload
