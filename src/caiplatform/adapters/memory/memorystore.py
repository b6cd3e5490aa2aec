"""In-process memory store provisioner: instances recorded in memory, each served by a fakeredis server.

Each instance gets its own `fakeredis` server behind a `TcpFakeServer` on its own loopback address and
the documented port 6379 (as the local provisioner; 127.0.0.1 and a free port where the system cannot
bind another loopback address), so the `uri` handed out on create works with redis-py and redis-cli. fakeredis has no INFO command, so INFO is
assembled from what the fake really knows (uptime, clients, configured maxmemory and policy, keyspace);
everything else is absent and therefore omitted from stats, never zeroed.

Known gaps of the double (see the conformance suite's `notimpl` marks): it does not refuse commands
from a connection that never authenticated, it does not check `HELLO ... AUTH`, it keeps no keyspace
hit/miss or memory counters, and it does not enforce `maxmemory`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime

import anyio
import fakeredis

from caiplatform.clock import Clock
from caiplatform.domain.memorystore import DOCUMENTED_PORT, FALLBACK_NOTE, Instance, InstanceSpec, State
from caiplatform.errors import Conflict, NotFound
from caiplatform.ports.memorystore import MemoryStoreProvisioner, ProvisionerHealth
from caiplatform.supervisor import loopback_address_for

FAKE_VERSION = "8.0"
LOOPBACK = "127.0.0.1"


class _FakeServer(fakeredis.TcpFakeServer):
    allow_reuse_address = True  # a restart binds the same address and port again at once


@dataclass
class _Record:
    spec: InstanceSpec
    created_at: datetime
    created_mono: float
    password: str
    host: str = LOOPBACK
    pending_password: str | None = None
    acl_password: str | None = None
    server: fakeredis.TcpFakeServer | None = None
    thread: threading.Thread | None = None
    started_mono: float = 0.0
    ready_at: datetime | None = None
    transitions: dict[str, datetime] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1]) if self.server else 0


class InMemoryProvisioner(MemoryStoreProvisioner):
    name = "memory"

    def __init__(self, *, clock: Clock | None = None, provisioning_seconds: float = 0.0):
        self._clock = clock or Clock()
        self._delay = provisioning_seconds
        self._records: dict[tuple[str, str], _Record] = {}
        self._lock = anyio.Lock()

    def versions(self) -> list[str]:
        return [FAKE_VERSION]

    # ------------------------------------------------------------------------------------ lifecycle

    def _serve(self, rec: _Record, keep_data: bool) -> None:
        old = rec.server.fake_server if (rec.server and keep_data) else None
        # Its own address takes the documented port; the 127.0.0.1 fallback takes a free one.
        port = rec.port or (DOCUMENTED_PORT if rec.host != LOOPBACK else 0)
        server = _FakeServer((rec.host, port), server_type="valkey", server_version=(8, 0))
        if old is not None:
            server.fake_server = old
        client = fakeredis.FakeRedis(server=server.fake_server)
        # fakeredis ignores `resetpass`, so the password in force is removed by name before the new one is set.
        stale = [f"<{rec.acl_password}"] if rec.acl_password and rec.acl_password != rec.password else []
        client.execute_command("ACL", "SETUSER", "default", "on", *stale, f">{rec.password}", "~*", "&*", "+@all")
        client.close()
        rec.acl_password = rec.password
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                  name=f"fakeredis-{rec.spec.name}")
        thread.start()
        rec.server, rec.thread = server, thread
        rec.started_mono = self._clock.monotonic()

    @staticmethod
    def _stop(rec: _Record) -> None:
        if rec.server is not None:
            rec.server.shutdown()
            rec.server.server_close()
        if rec.thread is not None:
            rec.thread.join(5)
        rec.thread = None

    def _observe(self, rec: _Record, *, settle: bool = True) -> Instance:
        now = self._clock.now()
        if settle and rec.ready_at is None and self._clock.monotonic() - rec.created_mono >= self._delay:
            # Provisioning completes the first time the instance is observed after its delay.
            rec.ready_at = now
            for kind in ("ServiceReady", "WorkloadReady", "Ready"):
                rec.transitions[kind] = now
        ready = rec.ready_at is not None
        return Instance(
            spec=rec.spec,
            created_at=rec.created_at,
            state=State.READY if ready else State.PROVISIONING,
            host=rec.host,
            port=rec.port,
            credential_ready=True,
            service_ready=ready,
            workload_ready=ready,
            externally_reachable=False,
            message="" if ready else "the instance is being provisioned",
            transitions=dict(rec.transitions),
            note="" if rec.port == DOCUMENTED_PORT else FALLBACK_NOTE,
        )

    async def close(self) -> None:
        async with self._lock:
            for rec in self._records.values():
                await anyio.to_thread.run_sync(self._stop, rec)

    # ------------------------------------------------------------------------------------ port

    def _get(self, project_id: str, name: str) -> _Record:
        rec = self._records.get((project_id, name))
        if rec is None:
            raise NotFound("memorystore not found")
        return rec

    async def create(self, spec: InstanceSpec, password: str) -> Instance:
        async with self._lock:
            key = (spec.project_id, spec.name)
            if key in self._records:
                raise Conflict("a memorystore with that name already exists in this project")
            host = loopback_address_for(DOCUMENTED_PORT, avoid={r.host for r in self._records.values()})
            rec = _Record(spec=spec, created_at=self._clock.now(), created_mono=self._clock.monotonic(),
                          password=password, host=host or LOOPBACK)
            rec.transitions["CredentialReady"] = rec.created_at
            await anyio.to_thread.run_sync(self._serve, rec, False)
            self._records[key] = rec
            # The create response always reports Provisioning; a later read sees Ready.
            return self._observe(rec, settle=False)

    async def get(self, project_id: str, name: str) -> Instance | None:
        rec = self._records.get((project_id, name))
        return self._observe(rec) if rec else None

    async def list(self, project_id: str) -> list[Instance]:
        recs = [r for (pid, _), r in self._records.items() if pid == project_id]
        return [self._observe(r) for r in sorted(recs, key=lambda r: r.spec.name)]

    async def delete(self, project_id: str, name: str) -> Instance | None:
        async with self._lock:
            rec = self._records.pop((project_id, name), None)
            if rec is None:
                return None
            await anyio.to_thread.run_sync(self._stop, rec)
            if rec.server is not None:
                rec.server.fake_server.dbs.clear()
            return self._observe(rec).with_state(State.DELETING)

    async def rotate_password(self, project_id: str, name: str, password: str) -> Instance:
        async with self._lock:
            rec = self._get(project_id, name)
            rec.pending_password = password
            rec.transitions["CredentialReady"] = self._clock.now()
            return self._observe(rec)

    async def restart(self, project_id: str, name: str) -> Instance:
        async with self._lock:
            rec = self._get(project_id, name)
            await anyio.to_thread.run_sync(self._stop, rec)
            if rec.pending_password:
                rec.password, rec.pending_password = rec.pending_password, None
            if not rec.spec.persistence_enabled and rec.server is not None:
                rec.server.fake_server.dbs.clear()  # no persistence: a restart starts empty
            await anyio.to_thread.run_sync(self._serve, rec, True)
            return self._observe(rec)

    async def info(self, project_id: str, name: str) -> str:
        rec = self._get(project_id, name)
        if rec.server is None:
            raise ConnectionError("the instance is not running")
        fake = rec.server.fake_server
        uptime = int(self._clock.monotonic() - rec.started_mono)
        lines = [
            "# Server",
            f"valkey_version:{FAKE_VERSION}",
            f"uptime_in_seconds:{uptime}",
            "# Clients",
            f"connected_clients:{len(rec.server.clients)}",
            "# Memory",
            f"maxmemory:{rec.spec.size.maxmemory_bytes}",
            f"maxmemory_policy:{rec.spec.maxmemory_policy}",
            "# Keyspace",
        ]
        for index, db in sorted(fake.dbs.items()):
            keys = len(db)
            if keys:
                lines.append(f"db{index}:keys={keys},expires=0,avg_ttl=0")
        return "\r\n".join(lines) + "\r\n"

    async def health(self) -> dict[str, ProvisionerHealth]:
        return {
            "kubernetes": ProvisionerHealth("ok", "in-process provisioner; no cluster is used"),
            "memorystore_crd": ProvisionerHealth("ok", "instances are recorded in process memory"),
        }
