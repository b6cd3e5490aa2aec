"""Hosted MCP servers of replicas that share one PostgreSQL database: one replica runs each server's
process, any replica answers for it, another takes it over when that one dies.

- **Owner.** `mcp_servers.owner` names the replica that runs the server's current version (its process
  is one of that replica's, as with one replica). A rollout (a publish's build, a rollback) is served by
  the replica that does it, which records itself as the owner in the same transaction as the new `url`;
  the previous owner stops its process at its next round.
- **Liveness.** Every replica holds the work lock `replica:<replica id>` (a PostgreSQL advisory lock,
  `caiplatform.worklocks`) for as long as it lives; an owner whose lock nobody holds is dead.
- **Takeover.** Every `FOLLOW_SECONDS` each replica reads the servers: one whose owner is dead (or none)
  is claimed by a compare-and-set of its `owner` (one replica wins) and served here: its current
  version's image is built again from the version's recorded tool set when this replica lacks it (same
  tool set, same digest), then started with the server's recorded token and workload key.
- **Builds.** A build runs under its work lock (`mcp-build:...`, `McpServerService._build_once`); a
  server still `building` or `deploying` whose build lock nobody held on two rounds in a row is built
  again here (one round would race a publish between its commit and its lock).
- **Routes.** Every other replica routes a server's apps host (`expose: apps`) to the owner's process.
- **Workload key.** A server's `cai_wl_` key (`CAI_PROJECT_KEY`) is minted once and kept in its row, so
  neither a rollout, a restart nor another replica replaces it (`stable_workload_key`); it is revoked
  with the server.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from caiplatform.db import Database
from caiplatform.db.models import ApiKey, McpServer, McpVersion, Project
from caiplatform.periodic import PeriodicWork
from caiplatform.ports.mcp_host import McpBuild, McpImage
from caiplatform.routing import Upstream, upstream_at
from caiplatform.services.access import ProjectRef
from caiplatform.worklocks import held_lock_keys, lock_key

if TYPE_CHECKING:
    from caiplatform.services.mcp import McpServerService

log = logging.getLogger(__name__)

FOLLOW_SECONDS = 2.0
SETTLED_SECONDS = 5.0


def replica_lock(replica_id: str) -> str:
    return f"replica:{replica_id}"


def build_lock(project_id: str, name: str, version: int) -> str:
    return f"mcp-build:{project_id}:{name}:{version}"


def workload_key_label(server_id: str) -> str:
    return f"mcp:{server_id}"


async def stable_workload_key(db: Database, now: datetime, project_id: str, server_id: str) -> str:
    """The server's `cai_wl_` key: the one kept in its row while that key is live, else a new one (the
    earlier keys of the server revoked in the same transaction). The row is locked meanwhile, so two
    replicas never mint one each."""
    from caiplatform.services.credentials import new_key

    def run(session: Session) -> str:
        server = session.scalar(select(McpServer).where(McpServer.id == server_id).with_for_update())
        if server is not None and server.workload_key and server.workload_key_id:
            key = session.scalar(select(ApiKey).where(ApiKey.key_id == server.workload_key_id))
            if key is not None and key.revoked_at is None and (key.expires_at is None or key.expires_at > now):
                return server.workload_key
        revoke_workload_keys_sync(session, project_id, server_id, now)
        row, secret = new_key(session, now, kind="workload", display_name=workload_key_label(server_id),
                              expires_at=None, project_id=project_id)
        if server is not None:
            server.workload_key_id, server.workload_key = row.key_id, secret
        return secret

    return await db.run(run)


def revoke_workload_keys_sync(session: Session, project_id: str, server_id: str, now: datetime) -> int:
    rows = list(session.scalars(select(ApiKey).where(
        ApiKey.project_id == project_id, ApiKey.kind == "workload", ApiKey.display_name == workload_key_label(server_id),
        ApiKey.revoked_at.is_(None))))
    for key in rows:
        key.revoked_at = now
    return len(rows)


@dataclass(frozen=True)
class _Row:
    id: str
    project: ProjectRef
    name: str
    expose: str
    token: str
    owner: str
    status: str
    message: str
    url: str
    version: int | None
    image: McpImage | None
    tools: list[dict[str, Any]]
    keys: list[str]
    building: int | None  # the version whose build or rollout is under way


class McpFollower(PeriodicWork):
    name = "mcp-follower"

    def __init__(self, mcp: McpServerService, interval: float = FOLLOW_SECONDS):
        super().__init__(interval)
        self.mcp = mcp
        self._routes: dict[str, str] = {}  # apps host → the owner's base URL this replica routes it to
        self._failures: dict[str, tuple[int, float]] = {}  # server id → (failed starts, next try)
        # (server id, version) of builds under way that nobody held the lock of, last round and this one
        self._unlocked_builds: set[tuple[str, int]] = set()
        self._unlocked_now: set[tuple[str, int]] = set()

    @property
    def replica_id(self) -> str:
        return str(self.mcp.locks.replica_id)

    async def claim_liveness(self) -> None:
        """Hold `replica:<id>` for this replica's life (another live replica with the same id is an error)."""
        if not await self.mcp.locks.try_acquire(replica_lock(self.replica_id)):
            log.error("another live replica uses the replica id %s: give each replica its own CAI_REPLICA_ID",
                      self.replica_id)

    async def round(self) -> None:
        await self.follow()

    async def close(self) -> None:
        """A replica stopping hands its servers over at once: it gives up their ownership and its replica
        lock, so another replica claims them at its next round (its own processes stop with the host)."""
        await super().close()
        me = self.replica_id
        with contextlib.suppress(Exception):  # without the database the lock goes with the connection
            await self.mcp.db.run(lambda s: s.execute(update(McpServer).where(McpServer.owner == me).values(owner="")))
        with contextlib.suppress(Exception):
            await self.mcp.locks.release(replica_lock(me))

    async def follow(self) -> None:
        svc = self.mcp
        me = self.replica_id

        def read(session: Session) -> tuple[list[_Row], set[int]]:
            out = []
            for server in session.scalars(select(McpServer).order_by(McpServer.created_at)):
                project = session.get(Project, server.project_id)
                if project is None:
                    continue
                current = session.get(McpVersion, (server.id, server.current_version)) if server.current_version else None
                image = McpImage(current.image, current.image_digest) if current and current.image_digest else None
                out.append(_Row(server.id, ProjectRef.of(project), server.name, server.expose, server.token,
                                server.owner, server.status, server.message, server.url, current.version if current else None, image,
                                list(current.tools) if current else [], list(current.credential_keys) if current else [],
                                server.selected_version if server.status in ("building", "deploying") else None))
            return out, held_lock_keys(session)

        rows, held = await svc.db.run(read)
        served = set(self._served())
        # Only a process that has served a while is stopped for another owner or a delete: one this replica
        # just started for a rollout records this replica as the owner moments later.
        settled = set(self._served(SETTLED_SECONDS))
        present: set[tuple[str, str]] = set()
        self._unlocked_now = set()
        for row in rows:
            key = (row.project.id, row.name)
            present.add(key)
            try:
                await self._follow(row, key in served, key in settled, held, me)
            except Exception:  # noqa: BLE001 - one server must not stop the others; retried next round
                log.exception("mcp server %s/%s: could not follow it here", row.project.slug, row.name)
        self._unlocked_builds = self._unlocked_now
        for project_id, name in settled - present:  # deleted through another replica
            await svc.host.remove(project_id, name)
        hosts = self._hosts()
        if hosts is not None:
            live = {hosts.host_for(r.name, r.project.short) for r in rows if r.expose == "apps"}
            for host in [h for h in self._routes if h not in live]:
                hosts.unregister(host)
                self._routes.pop(host)

    async def _follow(self, row: _Row, running_here: bool, settled: bool, held: set[int], me: str) -> None:
        svc = self.mcp
        if row.building is not None and lock_key(build_lock(row.project.id, row.name, row.building)) not in held:
            # Unlocked on two rounds in a row: its replica died (a publish takes the lock within moments).
            if (row.id, row.building) in self._unlocked_builds:
                svc._start_build(row.project, row.name, row.building)
            self._unlocked_now.add((row.id, row.building))
        if svc.host.shared:
            return  # a cluster serves it for every replica: nothing to serve here, nothing to take over
        if row.owner != me and settled:  # another replica rolled it out or took it over
            await svc.host.remove(row.project.id, row.name)
            running_here = False
        if running_here:  # the host routes its apps host to its own process
            self._forget_route(row)
            if row.owner != me:
                return  # started here moments ago for a rollout, which records this replica next
        if row.version is None or row.image is None:
            return  # nothing was ever served
        owner_alive = bool(row.owner) and lock_key(replica_lock(row.owner)) in held
        if row.owner == me and not running_here:
            await self._serve(row)  # this replica restarted under the same id, or a start failed before
            return
        if row.owner != me and not owner_alive:
            def claim(session: Session) -> bool:  # compare-and-set: one replica wins
                # a DML statement's result is a CursorResult (Session.execute is typed for any statement)
                result = cast(CursorResult[Any], session.execute(
                    update(McpServer).where(McpServer.id == row.id, McpServer.owner == row.owner).values(owner=me)))
                return result.rowcount == 1

            won = await svc.db.run(claim)
            if won:
                log.warning("mcp server %s/%s: taking it over from replica %s", row.project.slug, row.name,
                            row.owner or "(none)")
                await self._serve(row)
            return
        if row.owner != me:
            self._route(row)

    async def _serve(self, row: _Row) -> None:
        """Serve the current version here; a failure is recorded on the server (`failed`, "restart
        failed: ...") and retried with a backoff of 2 s doubling to 5 minutes."""
        attempts, retry_at = self._failures.get(row.id, (0, 0.0))
        if time.monotonic() < retry_at:
            return
        try:
            await self._start(row)
        except Exception as exc:
            self._failures[row.id] = (attempts + 1, time.monotonic() + min(300.0, 2.0 * 2 ** attempts))
            log.exception("mcp server %s/%s did not start here", row.project.slug, row.name)
            await self.mcp._fail(row.project, row.name, row.version or 0, f"restart failed: {exc}",
                                 only_if_current=False)
            return
        self._failures.pop(row.id, None)

    async def _start(self, row: _Row) -> None:
        svc = self.mcp
        assert row.version is not None and row.image is not None
        image = await svc.host.build(McpBuild(row.project.id, row.project.short, row.project.namespace, row.name,
                                              row.version, row.tools, row.keys))  # reused when it is here
        if image.digest != row.image.digest:
            raise LookupError(f"version {row.version} rebuilt to {image.digest}, recorded {row.image.digest}")
        self._forget_route(row)  # served here now: the host's own route replaces the one to the old owner
        recovered = row.status == "failed" and row.message.startswith("restart failed")
        await svc._serve(row.project, row.name, row.version, row.image, row.expose, row.token,
                         mark_ready=row.status == "ready" or recovered)

    def _route(self, row: _Row) -> None:
        hosts = self._hosts()
        if hosts is None or row.expose != "apps" or not row.url:
            return
        host = hosts.host_for(row.name, row.project.short)
        base = row.url.removesuffix("/mcp")
        if self._routes.get(host) == base:
            return

        async def upstream() -> Upstream:
            return upstream_at(base)

        hosts.register(host, upstream)
        self._routes[host] = base

    def _forget_route(self, row: _Row) -> None:
        hosts = self._hosts()
        if hosts is not None:
            self._routes.pop(hosts.host_for(row.name, row.project.short), None)

    def _hosts(self) -> Any:
        return getattr(self.mcp.host, "hosts", None)

    def _served(self, older_than: float = 0.0) -> list[tuple[str, str]]:
        served = getattr(self.mcp.host, "served", None)
        return list(served(older_than)) if served is not None else []

