"""Start, watch, restart and stop engine processes (NATS, OpenBao, Valkey, workloads) on one machine.

Every process runs in its own session (``start_new_session=True``), so a stop signals the whole
process group. Each running process is recorded in ``<state_dir>/<name>.json`` (pid, process start
time, argv, ports); a supervisor that crashed leaves those records behind and the next one kills what
they name with :meth:`ProcessSupervisor.reap_stale` — after checking that the pid still runs the same
program (command line and start time), so a reused pid is never killed.

Logs go to ``<state_dir>/logs/<name>.log`` unless the spec names a ``log_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import random
import shutil
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from caiplatform.sandbox import Confinement, Launch, Sandbox

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class ProcessStartError(RuntimeError):
    """A process could not be started or did not become healthy in time."""


@dataclass
class ProcessSpec:
    name: str  # unique key, e.g. "nats", "memorystore-<project>-<name>"
    argv: list[str]
    env: dict[str, str] | None = None  # merged over os.environ unless inherit_env is False
    cwd: Path | None = None
    ports: list[int] = field(default_factory=list)  # recorded for reaping / diagnostics
    # Async probe; start() waits until it answers True. Without one, the process is healthy once every
    # port in `ports` accepts a TCP connection on 127.0.0.1 (or at once when there are no ports).
    health: Callable[[], Awaitable[bool]] | None = None
    startup_timeout: float = 30.0
    restart: bool = True  # restart (with backoff) when it dies unexpectedly
    log_path: Path | None = None
    # Runs after every healthy (re)start, e.g. to unseal OpenBao; an exception fails that start.
    on_ready: Callable[[ManagedProcess], Awaitable[None]] | None = None
    stop_timeout: float = 10.0  # grace between SIGTERM and SIGKILL
    # False: the child sees only `env` (workloads must not inherit the platform's secrets).
    inherit_env: bool = True
    # Deployed code runs confined (`caiplatform.sandbox`): what it may see, write and use.
    sandbox: Sandbox | None = None
    confinement: Confinement | None = None


class ManagedProcess:
    """One supervised process. ``pid`` changes when the supervisor restarts it."""

    def __init__(self, spec: ProcessSpec, log_path: Path):
        self.name = spec.name
        self.spec = spec
        self.log_path = log_path
        self.pid: int | None = None
        self.restarts = 0
        self.returncode: int | None = None
        self.state = "starting"  # starting | running | backoff | exited | stopped
        self.started_at: float | None = None  # time.time() of the current run
        self._started_mono = 0.0
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._watcher: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._launch: Launch | None = None
        self.oom_killed = False  # the last run was stopped by the kernel for exceeding its memory limit

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def out_of_memory(self) -> bool:
        """The last run was killed for exceeding its sandbox's memory limit."""
        launch, proc = self._launch, self._proc
        # The exit code too: under the rlimit fallback it is what says so, maybe before `_watch` ran.
        return self.oom_killed or (launch is not None and launch.oom_killed(proc.returncode if proc else None))

    @property
    def ports(self) -> list[int]:
        return list(self.spec.ports)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the current run has passed its health check (useful after a restart)."""
        await asyncio.wait_for(self._ready.wait(), timeout)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 16384))
                data = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(data.splitlines()[-lines:])

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid={self.pid} state={self.state} restarts={self.restarts}>"


# ---------------------------------------------------------------------------------------------------
# Ports


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that nothing listens on right now (the kernel's pick, so never a standard port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on `port` now (SO_REUSEADDR, as servers set: TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def loopback_address_for(port: int, avoid: Iterable[str] = (), attempts: int = 64) -> str | None:
    """An address of 127.0.0.0/8 where a server can listen on `port` now, or None when the system cannot
    bind another loopback address (only 127.0.0.1 is configured, as on macOS without aliases).

    On Linux the whole 127.0.0.0/8 range is local, so each server can have its own address and keep a
    well-known port. Never 127.0.x.y: 127.0.0.1 is the machine's own engines (a Redis on 6379), 127.0.1.1
    the Debian host name, 127.0.0.53 the resolver. Random, then probed, so platforms that run side by
    side on one machine almost never pick the same address and never take one that is in use."""
    taken = set(avoid)
    for _ in range(attempts):
        host = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        if host in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    return None
                taken.add(host)
                continue
        return host
    return None


async def tcp_ready(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (TimeoutError, OSError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


# ---------------------------------------------------------------------------------------------------
# /proc helpers (Linux)


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, start time in clock ticks) of a live pid, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[3]), int(rest[19])
    except (IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _start_time(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[2] if stat else None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _cmdline_matches(pid: int, record: dict[str, Any]) -> bool:
    """Whether `pid` runs the program the record names.

    Exact argv equality is not required: servers such as Valkey rewrite their process title to
    ``valkey-server 127.0.0.1:<port>``, so the program name (first word) is compared as well.
    """
    current = _cmdline(pid)
    if not current:
        return False
    argv = record.get("argv") or []
    if current == argv:
        return True
    names = {os.path.basename(str(a)) for a in (argv[:1] + [record.get("exe") or ""]) if a}
    first = os.path.basename(current[0].split(" ", 1)[0])
    return bool(first) and first in names


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_members(pgid: int, sig: int) -> None:
    """Signal every process of the group `pgid` except its leader."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == pgid:
            continue
        try:
            raw = (entry / "stat").read_text()
            group = int(raw[raw.rfind(")") + 2 :].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        if group == pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), sig)


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat and stat[1] == sid and stat[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


# ---------------------------------------------------------------------------------------------------


def restart_delay(attempt: int, initial: float, maximum: float) -> float:
    """Exponential backoff: initial, 2*initial, 4*initial, ... capped at maximum (attempt counts from 0)."""
    return float(min(maximum, initial * (2 ** min(attempt, 32))))


class ProcessSupervisor:
    def __init__(
        self,
        state_dir: Path,
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        stable_after: float = 30.0,
        health_interval: float = 0.1,
    ):
        self.state_dir = Path(state_dir)
        self.logs_dir = self.state_dir / "logs"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stable_after = stable_after  # a run this long resets the backoff
        self.health_interval = health_interval
        self._procs: dict[str, ManagedProcess] = {}
        self._owner_start = _start_time(os.getpid())

    # -- records -------------------------------------------------------------------------------------

    def _record_path(self, name: str) -> Path:
        safe = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in name)
        return self.state_dir / f"{safe}.json"

    def _write_record(self, mp: ManagedProcess, exe: str, argv: list[str] | None = None) -> None:
        assert mp.pid is not None
        record = {
            "name": mp.name,
            "pid": mp.pid,
            "pgid": mp.pid,
            "start_time": _start_time(mp.pid),
            "argv": list(argv or mp.spec.argv),
            "exe": exe,
            "ports": list(mp.spec.ports),
            "log_path": str(mp.log_path),
            "owner_pid": os.getpid(),
            "owner_start_time": self._owner_start,
            "recorded_at": time.time(),
        }
        path = self._record_path(mp.name)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, path)

    def _remove_record(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._record_path(name).unlink()

    def records(self) -> list[dict[str, Any]]:
        """The process records in the state dir (live or left over by a crashed run)."""
        out = []
        for path in sorted(self.state_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and "pid" in record:
                record["_path"] = str(path)
                out.append(record)
        return out

    # -- reaping -------------------------------------------------------------------------------------

    def _owner_alive_elsewhere(self, record: dict[str, Any]) -> bool:
        owner = record.get("owner_pid")
        if not isinstance(owner, int) or owner == os.getpid():
            return False
        if not _alive(owner):
            return False
        recorded = record.get("owner_start_time")
        return recorded is None or _start_time(owner) == recorded

    def reap_stale(self, names: Iterable[str] | None = None, grace: float = 5.0) -> list[int]:
        """Kill what a crashed previous run recorded; return the pids that were signalled.

        A record is acted on only when its pid still runs the recorded program and started at the
        recorded time (so a reused pid is left alone), and no other live supervisor owns it.
        Processes this supervisor manages are never touched.
        """
        wanted = set(names) if names is not None else None
        killed: list[int] = []
        for record in self.records():
            name = record.get("name")
            if wanted is not None and name not in wanted:
                continue
            if name in self._procs:
                continue
            if self._owner_alive_elsewhere(record):
                log.warning("process %s is owned by live supervisor pid %s; not reaping", name, record["owner_pid"])
                continue
            pid = int(record["pid"])
            start = record.get("start_time")
            targets: list[int] = []
            leader_ok = _alive(pid) and (start is None or _start_time(pid) == start) and _cmdline_matches(pid, record)
            if leader_ok:
                targets.append(pid)
            if start is not None and (leader_ok or not _alive(pid)):
                # Children left in the session after the leader died (e.g. a shell's workers).
                for member in _session_members(pid):
                    member_start = _start_time(member)
                    if member != pid and member_start is not None and member_start >= start:
                        targets.append(member)
            if targets:
                log.warning("reaping stale process %s: pids %s", name, targets)
                self._kill_detached(pid, targets, grace)
                killed.extend(targets)
            with contextlib.suppress(FileNotFoundError):
                Path(record["_path"]).unlink()
        return killed

    @staticmethod
    def _kill_detached(pgid: int, pids: list[int], grace: float) -> None:
        def signal_all(sig: int) -> None:
            _signal_group(pgid, sig)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

        signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not any(_alive(p) for p in pids):
                return
            time.sleep(0.02)
        signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.02)

    # -- starting ------------------------------------------------------------------------------------

    def get(self, name: str) -> ManagedProcess | None:
        return self._procs.get(name)

    @property
    def processes(self) -> list[ManagedProcess]:
        return list(self._procs.values())

    async def start(self, spec: ProcessSpec) -> ManagedProcess:
        """Spawn, record pid+ports+argv in state_dir/<name>.json and wait until healthy."""
        if not spec.argv:
            raise ValueError("ProcessSpec.argv must not be empty")
        if spec.name in self._procs:
            raise ValueError(f"a process named {spec.name!r} is already supervised")
        # Whatever a crashed run left under this name would hold its ports or files.
        await asyncio.to_thread(self.reap_stale, [spec.name])
        log_path = Path(spec.log_path) if spec.log_path else self.logs_dir / f"{self._record_path(spec.name).stem}.log"
        mp = ManagedProcess(spec, log_path)
        self._procs[spec.name] = mp
        try:
            await self._spawn(mp)
            await self._wait_ready(mp)
        except BaseException:
            self._procs.pop(spec.name, None)
            mp._stopping = True
            await self._terminate(mp)
            self._remove_record(spec.name)
            mp.state = "stopped"
            raise
        mp._watcher = asyncio.create_task(self._watch(mp), name=f"supervise-{spec.name}")
        return mp

    def _resolve_env(self, spec: ProcessSpec) -> dict[str, str]:
        if spec.inherit_env:
            return {**os.environ, **(spec.env or {})}
        return dict(spec.env or {})

    async def _spawn(self, mp: ManagedProcess) -> None:
        spec = mp.spec
        env = self._resolve_env(spec)
        exe = spec.argv[0]
        if os.sep not in exe:
            found = shutil.which(exe, path=env.get("PATH", os.defpath))
            if found is None:
                raise ProcessStartError(f"{spec.name}: executable {exe!r} not found on PATH")
            exe = found
        elif not os.access(exe, os.X_OK):
            raise ProcessStartError(f"{spec.name}: {exe} is not an executable file")
        mp.log_path.parent.mkdir(parents=True, exist_ok=True)
        mp._ready.clear()
        argv, pass_fds = [exe, *spec.argv[1:]], tuple[int, ...]()
        if spec.sandbox is not None:
            from caiplatform.sandbox import Confinement, SandboxUnavailable

            # Started in a session of its own below (no controlling terminal); a second one inside the sandbox
            # would put the workload out of reach of the graceful SIGTERM sent to this session's group.
            confinement = replace(spec.confinement or Confinement(label=spec.name), new_session=False)
            try:
                launch = await asyncio.to_thread(spec.sandbox.wrap, argv, confinement, cwd=spec.cwd or Path("/"), env=env)
            except SandboxUnavailable as exc:
                raise ProcessStartError(f"{spec.name} could not start: {exc}") from None
            # The workload's variables are in the launch (loaded inside the sandbox); the launcher gets none.
            mp._launch, argv, pass_fds, env = launch, launch.argv, launch.pass_fds, launch.env
        mp.oom_killed = False
        with open(mp.log_path, "ab") as logfile:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            logfile.write(f"=== {stamp} supervisor starting {spec.name}: {' '.join(spec.argv)}\n".encode())
            logfile.flush()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    pass_fds=pass_fds,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=str(spec.cwd) if spec.cwd else None,
                    env=env,
                    start_new_session=True,
                )
            finally:
                if mp._launch is not None:
                    mp._launch.started()
        mp._proc = proc
        mp.pid = proc.pid
        mp.returncode = None
        mp.started_at = time.time()
        mp._started_mono = time.monotonic()
        mp.state = "starting"
        if mp._launch is not None and mp._launch.program:  # the pid runs the sandbox, which runs the program
            self._write_record(mp, mp._launch.program[0], mp._launch.program)
        else:
            self._write_record(mp, os.path.realpath(exe))

    async def _default_health(self, spec: ProcessSpec) -> bool:
        for port in spec.ports:
            if not await tcp_ready(port):
                return False
        return True

    async def _wait_ready(self, mp: ManagedProcess) -> None:
        spec = mp.spec
        proc = mp._proc
        assert proc is not None
        probe = spec.health or (lambda: self._default_health(spec))
        deadline = time.monotonic() + spec.startup_timeout
        while True:
            if proc.returncode is not None:
                raise ProcessStartError(
                    f"{spec.name} exited with code {proc.returncode} while starting; "
                    f"log {mp.log_path}:\n{mp.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProcessStartError(
                    f"{spec.name} did not become healthy within {spec.startup_timeout:g} s; "
                    f"log {mp.log_path}:\n{mp.log_tail()}"
                )
            try:
                ok = await asyncio.wait_for(probe(), min(remaining, 5.0))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a probe that raises means "not yet"
                log.debug("health probe of %s failed: %r", spec.name, exc)
                ok = False
            if ok and proc.returncode is None:
                break
            await asyncio.sleep(self.health_interval)
        if spec.on_ready is not None:
            try:
                await spec.on_ready(mp)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise ProcessStartError(f"{spec.name}: post-start step failed: {exc}") from exc
        mp.state = "running"
        mp._ready.set()

    # -- monitoring ----------------------------------------------------------------------------------

    async def _watch(self, mp: ManagedProcess) -> None:
        """Wait for the process to die; restart it with exponential backoff while `restart` is set."""
        attempt = 0
        while not mp._stopping:
            proc = mp._proc
            assert proc is not None
            rc = await proc.wait()
            mp.returncode = rc
            mp._ready.clear()
            if mp._stopping:
                return
            # The leader died on its own: kill what it left in its group (e.g. a shell's children).
            _signal_group(proc.pid, signal.SIGKILL)
            await self._release_launch(mp)
            ran = time.monotonic() - mp._started_mono
            log.warning("process %s (pid %s) exited with code %s after %.1f s", mp.name, mp.pid, rc, ran)
            if not mp.spec.restart:
                mp.state = "exited"
                self._remove_record(mp.name)
                return
            if ran >= self.stable_after:
                attempt = 0
            mp.state = "backoff"
            await asyncio.sleep(restart_delay(attempt, self.backoff_initial, self.backoff_max))
            attempt += 1
            if mp._stopping:
                return
            mp.restarts += 1
            mp._started_mono = time.monotonic()
            try:
                await self._spawn(mp)
                await self._wait_ready(mp)
                log.warning("process %s restarted (pid %s, restart %d)", mp.name, mp.pid, mp.restarts)
            except Exception as exc:
                # Not spawned, or not healthy: kill what runs; the loop then sees a dead process
                # at once and waits the next (longer) backoff.
                log.error("restart of %s failed: %s", mp.name, exc)
                await self._terminate(mp)

    # -- stopping ------------------------------------------------------------------------------------

    async def _terminate(self, mp: ManagedProcess) -> None:
        proc = mp._proc
        if proc is None:
            return
        if proc.returncode is not None:
            # Already reaped (its group was cleaned up when it died); its pid may since have been
            # reused, so the group is not signalled again.
            mp.returncode = proc.returncode
            await self._release_launch(mp)
            return
        if mp._launch is not None and mp.spec.sandbox is not None and mp.spec.sandbox.enabled:
            # Sandboxed: the leader is bubblewrap, which would die of the SIGTERM at once and take the
            # workload with it (`--die-with-parent`) before its own shutdown ran. The rest of the group
            # gets it (the sandbox's init ignores it); bubblewrap ends when the workload has.
            _signal_members(proc.pid, signal.SIGTERM)
        else:
            _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), mp.spec.stop_timeout)
        except TimeoutError:
            log.warning("process %s did not stop within %g s; killing it", mp.name, mp.spec.stop_timeout)
        # Kill whatever is left in the group (the leader after its grace, or its orphaned children).
        _signal_group(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            await proc.wait()
        mp.returncode = proc.returncode
        await self._release_launch(mp)

    @staticmethod
    async def _release_launch(mp: ManagedProcess) -> None:
        """A sandboxed run ended: note an out-of-memory kill, kill what it left, remove its cgroup."""
        launch, mp._launch = mp._launch, None
        if launch is not None:
            mp.oom_killed = launch.oom_killed(mp.returncode)
            await asyncio.to_thread(launch.close)

    async def stop(self, name: str) -> None:
        """SIGTERM the process group, SIGKILL after the grace period, remove the record."""
        mp = self._procs.get(name)
        if mp is None:
            return
        mp._stopping = True
        watcher = mp._watcher
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        try:
            await self._terminate(mp)
        finally:
            self._remove_record(name)
            mp.state = "stopped"
            mp._ready.clear()
            self._procs.pop(name, None)

    async def stop_all(self) -> None:
        names = list(self._procs)
        results = await asyncio.gather(*(self.stop(n) for n in reversed(names)), return_exceptions=True)
        for name, result in zip(reversed(names), results, strict=True):
            if isinstance(result, BaseException):
                log.error("stopping %s failed: %r", name, result)

    async def __aenter__(self) -> ProcessSupervisor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_all()
