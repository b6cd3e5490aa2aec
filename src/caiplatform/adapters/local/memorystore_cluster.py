"""Memory stores of replicas that share one PostgreSQL database: every replica reads, rotates and deletes
any instance, one of them runs it, another takes it over when that one dies.

Records live in the table `memorystore_instances` (spec, folder, address, password in force and pending,
owner, last observed state). The replica that runs an instance holds its **work lock**
(`memorystore:<row id>`, a PostgreSQL advisory lock, `caiplatform.worklocks`) for as long as it runs it;
its Valkey is a process of that replica's supervisor, as with one replica (`adapters/local/memorystore.py`).

Every replica runs `round()` every `FOLLOW_SECONDS`:
- an instance it runs: apply a restart someone asked for (rotation), destroy it if it was deleted
  through another replica, record what it observes (state, message) when that changed, and stop it if
  its lock was lost (the lock connection broke and another replica took the lock meanwhile);
- an instance nobody holds the lock of (its replica died or stopped, or it was just adopted): take the
  lock and run it, on the **same folder and address**: a process the dead replica left behind (a kill -9
  of the replica alone leaves its Valkey running) is stopped first through the pid file in the folder,
  and the instance waits while its address is still taken, so two servers never share one data folder.
  The data survives where its folder survives: with persistence the append-only file (synced every
  second) is replayed; without persistence it starts empty, as after any restart.

Reads answer from the row, and from the process when this replica runs it. A row whose owner holds no
lock reads `Degraded` ("its replica is gone") until another replica has taken it over. Stats connect to
the recorded address, so any replica on the same machine answers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio.to_thread
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform.adapters.local.memorystore import LOOPBACK, STANDARD_PORTS, valkey_binary, valkey_version
from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.base import new_id
from caiplatform.db.models import MemoryStoreInstance
from caiplatform.domain.memorystore import DOCUMENTED_PORT, FALLBACK_NOTE, Instance, InstanceSpec, State
from caiplatform.errors import Conflict, NotFound
from caiplatform.periodic import PeriodicWork
from caiplatform.ports.memorystore import MemoryStoreProvisioner, ProvisionerHealth
from caiplatform.supervisor import (
    ProcessSupervisor,
    free_port,
    loopback_address_for,
    port_is_free,
    valkey_spec,
)
from caiplatform.worklocks import held_lock_keys, lock_key

log = logging.getLogger(__name__)

FOLDER = "memorystores"  # under the data dir of the replica that creates an instance
FOLLOW_SECONDS = 1.0
# How long a delete or restart through a replica that does not run the instance waits for its owner.
HANDOVER_WAIT_SECONDS = 5.0
GONE = "the replica that ran it ({owner}) is gone; another replica takes it over within a few seconds"
UNOWNED = "waiting for a replica to run it"


def lock_name(row_id: str) -> str:
    return f"memorystore:{row_id}"


def _conf(value: str) -> str:
    return json.dumps(value)


def _stop_leftover(folder: Path, address: str, grace: float = 5.0) -> bool:
    """Stop a Valkey a dead replica left serving this folder: the pid in the folder's pid file, when that
    process is a Valkey server listening on the instance's address (Valkey's process title names it), so
    a reused pid is never signalled. True when one was stopped."""
    try:
        pid = int((folder / "valkey.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
    except (OSError, ValueError):
        return False
    if "valkey" not in cmdline or address not in cmdline:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)  # Valkey writes its data and exits
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    return True


@dataclass
class _Run:
    """An instance this replica runs."""

    row_id: str
    spec: InstanceSpec
    folder: Path
    host: str
    port: int
    applied_restart: int
    task: asyncio.Task[None] | None = None
    error: str = ""
    written: tuple[str, str, str, int] = ("", "", "", 0)  # (state, message, host, port) last recorded
    transitions: dict[str, str] = field(default_factory=dict)

    @property
    def process_name(self) -> str:
        return f"memorystore-{self.spec.project_id}-{self.spec.name}"


def _transitions(raw: dict[str, Any] | None, created: datetime) -> dict[str, datetime]:
    out: dict[str, datetime] = {}
    for kind, value in (raw or {}).items():
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            out[kind] = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    out.setdefault("CredentialReady", created)
    return out


class ClusterValkeyProvisioner(MemoryStoreProvisioner):
    name = "local"

    def __init__(
        self,
        db: Database,
        locks: Any,
        data_dir: str | os.PathLike[str],
        *,
        supervisor: ProcessSupervisor,
        replica_id: str,
        clock: Clock | None = None,
        interval: float = FOLLOW_SECONDS,
        startup_timeout: float = 30.0,
    ):
        self.db = db
        self.locks = locks
        self.root = Path(data_dir) / FOLDER
        self.root.mkdir(parents=True, exist_ok=True)
        self.supervisor = supervisor
        self.replica_id = replica_id
        self._clock = clock or Clock()
        self._startup_timeout = startup_timeout
        self._running: dict[str, _Run] = {}
        self._mutex = asyncio.Lock()
        self._follower = _Follower(self, interval)
        self._started = False

    # ------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        await self._adopt_local_records()
        await self.round()  # what this replica ran before it restarted comes back before it serves
        self._follower.start()

    async def close(self) -> None:
        """Stop running instances (data stays) and let another replica take them over at once."""
        await self._follower.close()
        async with self._mutex:
            runs, self._running = list(self._running.values()), {}
            await asyncio.gather(*(self._stop(run) for run in runs), return_exceptions=True)
            for run in runs:  # best effort: with the database gone the locks go with the connection anyway
                with contextlib.suppress(Exception):
                    await self._release_row(run.row_id)
                with contextlib.suppress(Exception):
                    await self.locks.release(lock_name(run.row_id))
        self._started = False

    async def _release_row(self, row_id: str) -> None:
        def release(session: Session) -> None:
            self._record_sync(session, row_id, owner="", state=State.UNKNOWN.value, message=UNOWNED)

        await self.db.run(release)

    async def _adopt_local_records(self) -> None:
        """Instances a single replica recorded in its data dir (before it shared a database) become rows."""
        records = sorted(self.root.glob("*/*/instance.json"))
        for path in records:
            try:
                record = json.loads(path.read_text())
                creds = json.loads((path.parent / "credential.json").read_text())
                spec = InstanceSpec.from_json(record["spec"])
                created = datetime.fromisoformat(record["created_at"].replace("Z", "+00:00"))
            except (OSError, ValueError, KeyError, TypeError):
                continue

            def insert(session: Session, spec: InstanceSpec = spec, record: dict[str, Any] = record,
                       creds: dict[str, Any] = creds, created: datetime = created, folder: Path = path.parent) -> None:
                if session.scalar(select(MemoryStoreInstance.id).where(
                        MemoryStoreInstance.project_id == spec.project_id, MemoryStoreInstance.name == spec.name)):
                    return
                now = self._clock.now()
                session.add(MemoryStoreInstance(
                    project_id=spec.project_id, name=spec.name, spec=spec.to_json(), folder=str(folder),
                    password=str(creds["password"]), pending_password=creds.get("pending_password"),
                    host=str(record.get("host") or LOOPBACK), port=int(record["port"]), owner="",
                    state=State.PROVISIONING.value, message=UNOWNED, transitions={}, restart_seq=0,
                    applied_restart_seq=0, deleting=False, created_at=created, updated_at=now))

            try:
                await self.db.run(insert)
            except IntegrityError:
                continue  # its project is gone, or another replica adopted it meanwhile
            path.rename(path.with_name("instance.json.adopted"))  # the database holds it from now on

    # ------------------------------------------------------------------------------------ the round

    async def round(self) -> None:
        async with self._mutex:  # rows read under it: an instance created meanwhile is not taken for deleted
            rows, held = await self.db.run(lambda s: (list(s.scalars(select(MemoryStoreInstance))), held_lock_keys(s)))
            present = {row.id for row in rows}
            for row in rows:
                try:
                    await self._follow(row, held)
                except Exception:  # noqa: BLE001 - one instance must not stop the others; retried next round
                    log.exception("memorystore %s: a round failed", row.name)
            for row_id in [rid for rid in self._running if rid not in present]:  # its project was deleted
                run = self._running.pop(row_id)
                await self._destroy(run.folder, f"{run.host}:{run.port}", run)
                await self.locks.release(lock_name(row_id))

    async def _follow(self, row: MemoryStoreInstance, held: set[int]) -> None:
        lock = lock_name(row.id)
        run = self._running.get(row.id)
        if run is not None and not self.locks.holds(lock):
            log.warning("memorystore %s: another replica took it over; stopping it here", row.name)
            self._running.pop(row.id)
            await self._stop(run)
            return
        if run is None:
            if lock_key(lock) in held or not await self.locks.try_acquire(lock):
                return  # its owner is alive
            if row.deleting:
                await self._destroy(Path(row.folder), f"{row.host}:{row.port}", None)
                await self.db.run(lambda s: self._delete_row_sync(s, row.id))
                await self.locks.release(lock)
                return
            run = self._take(row, took_over=bool(row.owner))
        if row.deleting:
            self._running.pop(row.id)
            await self._destroy(run.folder, f"{run.host}:{run.port}", run)
            await self.db.run(lambda s: self._delete_row_sync(s, row.id))
            await self.locks.release(lock)
            return
        if row.restart_seq > run.applied_restart and (run.task is None or run.task.done()):
            run.applied_restart = row.restart_seq
            await self._stop(run)
            self._spawn(run)
        elif run.task is None or run.task.done():
            mp = self.supervisor.get(run.process_name)
            if mp is None:  # it could not start (its address was taken): try again
                self._spawn(run)
        await self._write_observed(run)

    def _take(self, row: MemoryStoreInstance, *, took_over: bool) -> _Run:
        spec = InstanceSpec.from_json(row.spec)
        run = _Run(row.id, spec, Path(row.folder), row.host, row.port, row.restart_seq,
                   transitions=dict(row.transitions or {}))
        self._running[row.id] = run
        if took_over and row.owner != self.replica_id:
            log.warning("memorystore %s: taking it over from replica %s", spec.name, row.owner)
        self._spawn(run)
        return run

    def _spawn(self, run: _Run) -> None:
        async def launch() -> None:
            with contextlib.suppress(Exception):  # recorded in run.error, reported as Degraded
                await self._launch(run)

        run.task = asyncio.get_running_loop().create_task(launch(), name=f"provision-{run.process_name}")

    async def _launch(self, run: _Run) -> None:
        run.error = ""
        try:
            stopped = await anyio.to_thread.run_sync(_stop_leftover, run.folder, f"{run.host}:{run.port}")
            if stopped:
                log.warning("memorystore %s: stopped the server a dead replica left running", run.spec.name)

            def password(session: Session) -> tuple[str, bool]:
                row = session.get(MemoryStoreInstance, run.row_id, with_for_update=True)
                if row is None:
                    raise NotFound("memorystore not found")
                if row.pending_password:  # a rotation takes effect at this start
                    row.password, row.pending_password = row.pending_password, None
                    return row.password, True
                return row.password, False

            secret, rotated = await self.db.run(password)
            if rotated:
                run.transitions["CredentialReady"] = rfc3339(self._clock.now())
            data = run.folder / "data"
            if not run.spec.persistence_enabled and data.exists():
                shutil.rmtree(data)  # without persistence an instance starts empty
            data.mkdir(parents=True, exist_ok=True)
            if not port_is_free(run.port, run.host):
                # Never another address for an existing folder: a server may still be using it.
                raise RuntimeError(f"its address {run.host}:{run.port} is still in use; retrying")
            spec = valkey_spec(
                run.process_name, data, run.port, secret, run.spec.size.maxmemory_bytes, run.spec.maxmemory_policy,
                run.spec.persistence_enabled, run.folder / "valkey.log", host=run.host,
                extra_config={"pidfile": _conf(str(run.folder / "valkey.pid"))},
            )
            spec.startup_timeout = self._startup_timeout
            spec.restart = True
            await self.supervisor.start(spec)
        except Exception as exc:
            run.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise
        now = rfc3339(self._clock.now())
        for kind in ("ServiceReady", "WorkloadReady", "Ready"):
            run.transitions[kind] = now
        await self._write_observed(run)

    async def _stop(self, run: _Run) -> None:
        if run.task is not None and not run.task.done():
            run.task.cancel()
            with contextlib.suppress(BaseException):
                await run.task
        await self.supervisor.stop(run.process_name)

    async def _destroy(self, folder: Path, address: str, run: _Run | None) -> None:
        if run is not None:
            await self._stop(run)
        await anyio.to_thread.run_sync(_stop_leftover, folder, address)
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(folder, ignore_errors=True))
        with contextlib.suppress(OSError):
            folder.parent.rmdir()  # the project folder, once empty

    def _observed(self, run: _Run) -> tuple[State, str, bool]:
        mp = self.supervisor.get(run.process_name)
        if run.task is not None and not run.task.done():
            return State.PROVISIONING, "the server is starting", False
        if mp is not None and mp.state == "running":
            return State.READY, "", True
        if mp is not None and mp.state in ("starting", "backoff"):
            return State.DEGRADED, f"the server process is restarting ({mp.restarts} restarts)", False
        if run.error:
            return State.DEGRADED, run.error, False
        if mp is not None:
            return State.DEGRADED, f"the server process {mp.state}", False
        return State.UNKNOWN, "the instance is not running yet", False

    async def _write_observed(self, run: _Run) -> None:
        state, message, _ = self._observed(run)
        now = (state.value, message, run.host, run.port)
        if now == run.written:
            return
        await self.db.run(lambda s: self._record_sync(
            s, run.row_id, owner=self.replica_id, state=state.value, message=message, host=run.host, port=run.port,
            transitions=dict(run.transitions), applied_restart_seq=run.applied_restart))
        run.written = now

    def _record_sync(self, session: Session, row_id: str, **values: Any) -> None:
        row = session.get(MemoryStoreInstance, row_id)
        if row is not None:
            for key, value in values.items():
                setattr(row, key, value)
            row.updated_at = self._clock.now()

    @staticmethod
    def _delete_row_sync(session: Session, row_id: str) -> None:
        row = session.get(MemoryStoreInstance, row_id)
        if row is not None:
            session.delete(row)

    # ------------------------------------------------------------------------------------ views

    def _instance(self, row: MemoryStoreInstance, held: set[int]) -> Instance:
        run = self._running.get(row.id)
        created = row.created_at
        if run is not None:
            state, message, workload = self._observed(run)
            transitions = _transitions(run.transitions, created)
        else:
            transitions = _transitions(row.transitions, created)
            try:
                state = State(row.state)
            except ValueError:
                state = State.UNKNOWN
            message = row.message
            if not row.owner:
                state, message = State.PROVISIONING, UNOWNED
            elif lock_key(lock_name(row.id)) not in held:
                state, message = State.DEGRADED, GONE.format(owner=row.owner)
            workload = state is State.READY
        return Instance(
            spec=InstanceSpec.from_json(row.spec), created_at=created, state=state, host=row.host, port=row.port,
            credential_ready=True, service_ready=state is State.READY, workload_ready=workload,
            externally_reachable=False, message=message, transitions=transitions,
            note="" if row.port == DOCUMENTED_PORT else FALLBACK_NOTE,
        )

    async def _rows(self, project_id: str, name: str | None = None) -> tuple[list[MemoryStoreInstance], set[int]]:
        def read(session: Session) -> tuple[list[MemoryStoreInstance], set[int]]:
            query = select(MemoryStoreInstance).where(MemoryStoreInstance.project_id == project_id,
                                                      MemoryStoreInstance.deleting.is_(False))
            if name is not None:
                query = query.where(MemoryStoreInstance.name == name)
            rows = list(session.scalars(query.order_by(MemoryStoreInstance.name)))
            return rows, held_lock_keys(session) if rows else set()

        return await self.db.run(read)

    # ------------------------------------------------------------------------------------ port

    def versions(self) -> list[str]:
        return [valkey_version(valkey_binary())]

    def _choose_endpoint(self, taken: set[tuple[str, int]]) -> tuple[str, int]:
        host = loopback_address_for(DOCUMENTED_PORT, avoid={h for h, _ in taken})
        if host is not None:
            return host, DOCUMENTED_PORT
        while True:
            port = free_port(LOOPBACK)
            if port not in STANDARD_PORTS and (LOOPBACK, port) not in taken:
                return LOOPBACK, port

    async def create(self, spec: InstanceSpec, password: str) -> Instance:
        taken = set(await self.db.run(lambda s: [(h, p) for h, p in s.execute(
            select(MemoryStoreInstance.host, MemoryStoreInstance.port))]))
        host, port = self._choose_endpoint(taken)
        now = self._clock.now()
        row_id = new_id()
        folder = self.root / spec.project_id / f"{spec.name}.{row_id[:8]}"

        def insert(session: Session) -> MemoryStoreInstance:
            if session.scalar(select(MemoryStoreInstance.id).where(
                    MemoryStoreInstance.project_id == spec.project_id, MemoryStoreInstance.name == spec.name)):
                raise Conflict("a memorystore with that name already exists in this project")
            row = MemoryStoreInstance(
                id=row_id, project_id=spec.project_id, name=spec.name, spec=spec.to_json(), folder=str(folder),
                password=password, pending_password=None, host=host, port=port, owner=self.replica_id,
                state=State.PROVISIONING.value, message="the server is starting",
                transitions={"CredentialReady": rfc3339(now)}, restart_seq=0, applied_restart_seq=0, deleting=False,
                created_at=now, updated_at=now)
            session.add(row)
            return row

        # The lock first: no other replica's round can take the instance between its insert and its start.
        if not await self.locks.try_acquire(lock_name(row_id)):
            raise RuntimeError("could not take the work lock of a new memory store")
        async with self._mutex:
            try:
                row = await self.db.run(insert)
            except BaseException as exc:
                await self.locks.release(lock_name(row_id))
                if isinstance(exc, IntegrityError):
                    raise Conflict("a memorystore with that name already exists in this project") from None
                raise
            folder.mkdir(parents=True, mode=0o700)
            self._take(row, took_over=False)
            created = self._instance(row, {lock_key(lock_name(row.id))})
        return created.with_state(State.PROVISIONING, message="the server is starting")

    async def get(self, project_id: str, name: str) -> Instance | None:
        rows, held = await self._rows(project_id, name)
        return self._instance(rows[0], held) if rows else None

    async def list(self, project_id: str) -> list[Instance]:
        rows, held = await self._rows(project_id)
        return [self._instance(row, held) for row in rows]

    async def delete(self, project_id: str, name: str) -> Instance | None:
        rows, held = await self._rows(project_id, name)
        if not rows:
            return None
        row = rows[0]
        observed = self._instance(row, held).with_state(State.DELETING)
        await self.db.run(lambda s: self._record_sync(s, row.id, deleting=True))
        await self._wait_for_owner(lambda s: s.get(MemoryStoreInstance, row.id) is None)
        return observed

    async def rotate_password(self, project_id: str, name: str, password: str) -> Instance:
        rows, held = await self._rows(project_id, name)
        if not rows:
            raise NotFound("memorystore not found")
        now = rfc3339(self._clock.now())

        def rotate(session: Session) -> None:
            row = session.get(MemoryStoreInstance, rows[0].id, with_for_update=True)
            if row is None:
                raise NotFound("memorystore not found")
            row.pending_password = password
            row.transitions = {**(row.transitions or {}), "CredentialReady": now}

        await self.db.run(rotate)
        if (run := self._running.get(rows[0].id)) is not None:
            run.transitions["CredentialReady"] = now
        return self._instance(rows[0], held)

    async def restart(self, project_id: str, name: str) -> Instance:
        rows, _ = await self._rows(project_id, name)
        if not rows:
            raise NotFound("memorystore not found")
        row_id = rows[0].id

        def ask(session: Session) -> int:
            row = session.get(MemoryStoreInstance, row_id, with_for_update=True)
            if row is None:
                raise NotFound("memorystore not found")
            row.restart_seq += 1
            return row.restart_seq

        seq = await self.db.run(ask)
        await self._wait_for_owner(lambda s: (s.get(MemoryStoreInstance, row_id) or _Applied).applied_restart_seq >= seq)
        run = self._running.get(row_id)
        if run is not None and run.task is not None:
            await asyncio.gather(run.task, return_exceptions=True)
        found = await self.get(project_id, name)
        if found is None:
            raise NotFound("memorystore not found")
        return found

    async def _wait_for_owner(self, done: Any) -> None:
        """A round here at once (this replica may run it, or may take it over), then wait a little for the
        replica that runs it: it acts at its next round."""
        deadline = time.monotonic() + HANDOVER_WAIT_SECONDS
        while True:
            await self.round()
            if await self.db.run(done) or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.2)

    async def info(self, project_id: str, name: str) -> str:
        from caiplatform.adapters.redis.info import read_info

        rows, _ = await self._rows(project_id, name)
        if not rows:
            raise NotFound("memorystore not found")
        return await read_info(rows[0].host, rows[0].port, rows[0].password)  # the one in force

    async def health(self) -> dict[str, ProvisionerHealth]:
        kubernetes = ProvisionerHealth("ok", "local process provisioner; no cluster is used")
        try:
            binary = valkey_binary()
        except Exception as exc:
            return {"kubernetes": kubernetes, "memorystore_crd": ProvisionerHealth("missing", str(exc))}
        if not os.access(binary, os.X_OK):
            return {"kubernetes": kubernetes, "memorystore_crd": ProvisionerHealth("missing", f"{binary} is not executable")}
        writable = os.access(self.root, os.W_OK)
        return {"kubernetes": kubernetes, "memorystore_crd": ProvisionerHealth(
            "ok" if writable else "unreachable", "" if writable else f"the instance folder {self.root} is not writable")}


class _Applied:
    applied_restart_seq = 1 << 62  # a row deleted meanwhile: nothing left to wait for


class _Follower(PeriodicWork):
    name = "memorystore-follower"

    def __init__(self, provisioner: ClusterValkeyProvisioner, interval: float):
        super().__init__(interval)
        self.provisioner = provisioner

    async def round(self) -> None:
        await self.provisioner.round()
