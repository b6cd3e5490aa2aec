"""Forget a user everywhere, with a receipt (`platform.erasures`; rules in `caiplatform.domain.erasure`).

`forget` authorizes, resolves the agents in scope and records the erasure (`pending`) in one transaction;
a second request for the same user and scope while one is unfinished answers that one. The erasure runs
in the background, on whichever replica claims it:

- the claim is a lease in the erasure's row (`claimed_by`, `lease_until`), taken by a compare-and-set
  update and renewed while the steps run; an unfinished erasure whose lease lapsed (its replica died) is
  taken by the next round of any replica. A platform that is the only replica (SQLite) lets go of every
  claim when it starts: whoever held them was this data dir's previous process;
- each step (one store of one agent, `domain.erasure.STORES`) is all or nothing in its store and
  idempotent; its receipt is recorded when it finishes, so a resumed erasure runs only the steps left;
- the last step's transaction marks the erasure `done` and writes the `user.forget` audit entry with the
  receipt (counts and times, never contents).

The stores are reached without the agent running: its own session store (the one its revisions use:
SQLite under the data dir, Valkey/Redis, or the in-process store), the vector engine's memory collection,
and the runtime's saved log history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from sqlalchemy import CursorResult, Result, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import Agent, AuditEntry, Erasure, Project
from caiplatform.domain import erasure as rules
from caiplatform.errors import Forbidden, NotFound
from caiplatform.models import erasures as api
from caiplatform.periodic import PeriodicWork
from caiplatform.ports.runtime import WorkloadRuntime
from caiplatform.ports.sessions import SessionStore
from caiplatform.principal import Principal
from caiplatform.services.access import Access, ProjectGrant, ProjectRef, Role
from caiplatform.services.agent_directory import InvokeTarget
from caiplatform.services.agents.records import unknown_agent
from caiplatform.services.audit import actor_of

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0


@runtime_checkable
class UserMemory(Protocol):
    """What the erasure needs of agents' long-term memory (`caiplatform.services.invoke_memory.VectorMemory`)."""

    async def forget_user(self, target: InvokeTarget, user_id: str) -> int: ...


def _rowcount(result: Result[Any]) -> int:
    """The rows an UPDATE matched (a DML statement's result is a CursorResult)."""
    return int(cast(CursorResult[Any], result).rowcount or 0)


def erasure_not_found(erasure_id: str) -> NotFound:
    return NotFound(f"erasure {erasure_id} not found")


def open_agent_sessions(spec: str, project_id: str, agent: str) -> SessionStore:
    """The session store an agent's revisions use (`CAI_SESSION_STORE`), opened the harness's way."""
    from caiplatform.harness.app import open_store

    return open_store({"CAI_SESSION_STORE": spec, "CAI_PROJECT_ID": project_id}, agent)


class ErasureService:
    def __init__(self, db: Database, access: Access, clock: Clock, *, agents: Any,
                 runtime: Callable[[], WorkloadRuntime], memory: Callable[[], object],
                 replica_id: str, shared: bool, step_pause: float = 0.0):
        self.db = db
        self.access = access
        self.clock = clock
        self.agents = agents  # the agents area's service: owner gate, records, each agent's session store
        self._runtime = runtime
        self._memory = memory
        self.replica_id = replica_id
        self.shared = shared  # other replicas may share the database (PostgreSQL)
        self.step_pause = step_pause
        self._rounds: _Rounds | None = None
        self._kicks: set[asyncio.Task[None]] = set()

    # -- requests ---------------------------------------------------------------------------------

    async def forget(self, principal: Principal, project_id: str, request: api.ForgetRequest) -> api.Erasure:
        """Erase `request.user_id` from the agents in scope; answers the erasure (pending or under way)."""
        self.access.require_management(principal)
        now = self.clock.now()

        def record(session: Session) -> api.Erasure:
            pid = self._scope_sync(session, principal, project_id, request.agents)
            return self._record_sync(session, principal, pid, request.user_id, request.agents, now)

        view = await self.db.run(record)
        self._kick()
        return view

    async def forget_everywhere(self, principal: Principal, request: api.ForgetEverywhere) -> api.ErasureList:
        """Erase `request.user_id` from every agent of every project (platform admin): one erasure per
        project, each with its own receipt, audit entry and progress."""
        await self.access.require_platform_admin(principal)
        now = self.clock.now()

        def record(session: Session) -> list[api.Erasure]:
            return [self._record_sync(session, principal, pid, request.user_id, None, now)
                    for pid in session.scalars(select(Project.id).order_by(Project.created_at, Project.id))]

        views = await self.db.run(record)
        self._kick()
        return api.ErasureList(erasures=views)

    def _record_sync(self, session: Session, principal: Principal, pid: str, user_id: str,
                     named: list[str] | None, now: datetime) -> api.Erasure:
        """The unfinished erasure of this user and scope, or a new one over the agents in scope now (a
        unique index keeps one unfinished erasure per user and scope, so a request that races another
        answers the other's)."""
        scope = rules.scope_key(named)
        unfinished = select(Erasure).where(Erasure.project_id == pid, Erasure.user_id == user_id,
                                           Erasure.scope == scope, Erasure.state != rules.DONE)
        existing = session.scalars(unfinished).first()
        if existing is not None:
            return self._view(existing)
        names = named if named is not None else list(
            session.scalars(select(Agent.name).where(Agent.project_id == pid).order_by(Agent.name)))
        row = Erasure(project_id=pid, user_id=user_id, scope=scope, agents=names, state=rules.PENDING,
                      requested_by=actor_of(principal), receipts=[], created_at=now)
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            return self._view(session.scalars(unfinished).one())
        return self._view(row)

    async def get(self, principal: Principal, project_id: str, erasure_id: str) -> api.Erasure:
        """One erasure and its receipt; readable by whoever may erase in the whole project."""
        self.access.require_management(principal)

        def read(session: Session) -> api.Erasure:
            pid = self._gate_sync(session, principal, project_id)
            row = session.get(Erasure, erasure_id) if len(erasure_id) <= 36 else None
            if row is None or row.project_id != pid:
                raise erasure_not_found(erasure_id)
            return self._view(row)

        return await self.db.run(read)

    def _gate_sync(self, session: Session, principal: Principal, project_id: str) -> str:
        """The project's id when the caller may erase there: project admin, or a platform admin (every
        project); no role at all is 404, another role 403 (document 2)."""
        try:
            return self.access.project_gate_sync(session.connection(), principal, project_id, need=Role.ADMIN, bad_id=NotFound)[0].project.id
        except Forbidden:
            if self.access.is_platform_admin(session, principal):
                return self.access.project_gate_sync(session.connection(), principal, project_id, need=None, bad_id=NotFound)[0].project.id
            raise

    def _scope_sync(self, session: Session, principal: Principal, project_id: str, named: list[str] | None) -> str:
        """The project's id once the caller may erase in the scope asked for (every agent, or the named ones)."""
        if named is None:
            return self._gate_sync(session, principal, project_id)
        grant: ProjectGrant | None = None
        try:
            grant = self.access.project_gate_sync(session.connection(), principal, project_id, need=Role.MEMBER, bad_id=NotFound)[0]
            pid = grant.project.id
        except Forbidden:
            if not self.access.is_platform_admin(session, principal):
                raise
            pid = self._gate_sync(session, principal, project_id)
        for name in named:
            agent = session.scalars(select(Agent).where(Agent.project_id == pid, Agent.name == name)).first()
            if agent is None:
                raise NotFound(unknown_agent(name))
            if grant is not None:
                self.agents._owner_gate(principal, grant, agent)  # its owner or a project admin
        return pid

    def _view(self, row: Erasure) -> api.Erasure:
        receipts = [api.StoreReceipt(**r) for r in row.receipts or []]
        return api.Erasure(
            erasure_id=row.id, state=row.state, project_id=row.project_id, user_id=row.user_id,
            agents=list(row.agents or []), requested_by=row.requested_by, created_at=rfc3339(row.created_at),
            started_at=rfc3339(row.started_at) if row.started_at else None,
            finished_at=rfc3339(row.finished_at) if row.finished_at else None,
            steps_done=len(receipts), steps_total=len(rules.steps_for(row.agents or [])),
            receipts=receipts, notes=dict(rules.NOTHING_ELSE),
        )

    # -- the background work ------------------------------------------------------------------------

    async def start(self) -> None:
        if not self.shared:
            def release(session: Session) -> None:  # this data dir's previous process held them: it is gone
                session.execute(update(Erasure).where(Erasure.state != rules.DONE)
                                .values(claimed_by=None, lease_until=None))

            await self.db.run(release)
        if self._rounds is None:
            self._rounds = _Rounds(self)
            self._rounds.start()

    async def aclose(self) -> None:
        rounds, self._rounds = self._rounds, None
        if rounds is not None:
            await rounds.close()
        for task in list(self._kicks):
            task.cancel()
        await asyncio.gather(*self._kicks, return_exceptions=True)

    def _kick(self) -> None:
        """Run a round now rather than at the next poll (a claim is taken once, so rounds may overlap)."""
        if self._rounds is None:
            return
        task = asyncio.get_running_loop().create_task(self._kicked(), name="erasure-round")
        self._kicks.add(task)
        task.add_done_callback(self._kicks.discard)

    async def _kicked(self) -> None:
        try:
            await self.run_pending()
        except Exception:  # noqa: BLE001 - the periodic round tries again
            log.exception("erasure round failed")

    async def run_pending(self) -> int:
        """Claim and run every unfinished erasure no live replica holds; how many this round finished."""
        finished = 0
        while (erasure_id := await self._claim()) is not None:
            if await self._run(erasure_id):
                finished += 1
        return finished

    def _lease(self) -> datetime:
        return self.clock.now() + timedelta(seconds=rules.LEASE_SECONDS)

    async def _claim(self) -> str | None:
        def claim(session: Session) -> str | None:
            now = self.clock.now()
            candidates = session.scalars(
                select(Erasure.id).where(Erasure.state != rules.DONE).order_by(Erasure.created_at)).all()
            for erasure_id in candidates:
                taken = _rowcount(session.execute(
                    update(Erasure)
                    .where(Erasure.id == erasure_id, Erasure.state != rules.DONE,
                           (Erasure.lease_until.is_(None)) | (Erasure.lease_until < now))
                    .values(claimed_by=self.replica_id, lease_until=self._lease(), state=rules.RUNNING)))
                if taken:
                    row = session.get(Erasure, erasure_id)
                    if row is not None and row.started_at is None:
                        row.started_at = now
                    return erasure_id
            return None

        return await self.db.run(claim)

    async def _renew(self, erasure_id: str) -> bool:
        def renew(session: Session) -> bool:
            return bool(_rowcount(session.execute(
                update(Erasure).where(Erasure.id == erasure_id, Erasure.claimed_by == self.replica_id,
                                      Erasure.state != rules.DONE)
                .values(lease_until=self._lease()))))

        return await self.db.run(renew)

    async def _run(self, erasure_id: str) -> bool:
        """Run the steps left; True when this replica finished the erasure."""
        def load(session: Session) -> tuple[str, str, list[str], set[str]]:
            row = session.get(Erasure, erasure_id)
            assert row is not None
            return row.project_id, row.user_id, list(row.agents or []), {
                f"{r['agent']}/{r['store']}" for r in row.receipts or []}

        project_id, user_id, agent_names, done = await self.db.run(load)
        agent_names = await self._with_leftovers(erasure_id, agent_names)
        keeper = asyncio.get_running_loop().create_task(self._keep_lease(erasure_id))
        try:
            for step in rules.steps_for(agent_names):
                if step.key in done:
                    continue
                started = self.clock.now()
                removed = await self._erase(project_id, step, user_id)
                if not await self._record(erasure_id, step, removed, started):
                    return False  # another replica took it over: it runs what is left
                if self.step_pause:
                    await asyncio.sleep(self.step_pause)
            return await self._finish(erasure_id)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def _keep_lease(self, erasure_id: str) -> None:
        while True:
            await asyncio.sleep(rules.LEASE_SECONDS / 3)
            with contextlib.suppress(Exception):
                await self._renew(erasure_id)

    async def _record(self, erasure_id: str, step: rules.Step, removed: dict[str, int], started: datetime) -> bool:
        finished = self.clock.now()

        def record(session: Session) -> bool:
            row = session.get(Erasure, erasure_id)
            if row is None or row.claimed_by != self.replica_id or row.state == rules.DONE:
                return False
            receipt = {"agent": step.agent, "store": step.store, "removed": removed,
                       "started_at": rfc3339(started), "finished_at": rfc3339(finished)}
            row.receipts = [*(row.receipts or []), receipt]
            row.lease_until = self._lease()
            return True

        return await self.db.run(record)

    async def _finish(self, erasure_id: str) -> bool:
        now = self.clock.now()

        def finish(session: Session) -> bool:
            row = session.get(Erasure, erasure_id)
            if row is None or row.claimed_by != self.replica_id or row.state == rules.DONE:
                return False
            row.state, row.finished_at, row.claimed_by, row.lease_until = rules.DONE, now, None, None
            view = self._view(row)
            detail = {"erasure_id": row.id, "user_id": row.user_id, "agents": view.agents,
                      "started_at": view.started_at, "finished_at": view.finished_at,
                      "receipts": [r.model_dump() for r in view.receipts], "totals": totals(view.receipts)}
            session.add(AuditEntry(project_id=row.project_id, ts=now, actor=row.requested_by, action=rules.ACTION,
                                   target=row.user_id, detail=json.dumps(detail, sort_keys=True)))
            return True

        return await self.db.run(finish)

    # -- the stores ---------------------------------------------------------------------------------

    async def _with_leftovers(self, erasure_id: str, names: list[str]) -> list[str]:
        """For an erasure of every agent: also the sessions that deleted agents left behind (deleting an
        agent leaves its sessions, document 1), added to the erasure's agents once found."""
        def project_of(session: Session) -> tuple[ProjectRef, str] | None:
            row = session.get(Erasure, erasure_id)
            project = session.get(Project, row.project_id) if row is not None else None
            return (ProjectRef.of(project), row.scope) if project is not None and row is not None else None

        found = await self.db.run(project_of)
        if found is None or found[1] != rules.scope_key(None):
            return names
        extra = [name for name in await self._stored_session_agents(found[0]) if name not in names]
        if not extra:
            return names

        def add(session: Session) -> list[str]:
            row = session.get(Erasure, erasure_id)
            assert row is not None
            row.agents = [*(row.agents or []), *extra]
            return list(row.agents)

        return await self.db.run(add)

    async def _stored_session_agents(self, project: ProjectRef) -> list[str]:
        """Names of the project's agents that have a session store, live or deleted."""
        settings, mode = self.agents.settings, self.agents.mode
        if settings.redis_url:
            from redis import asyncio as aioredis

            prefix = f"cai:sessions:{project.id}:"
            client = aioredis.from_url(settings.redis_url, decode_responses=True)
            try:
                keys = [key async for key in client.scan_iter(match=f"{prefix}*:u", count=500)]
            finally:
                await client.aclose()
            return sorted({key[len(prefix):].rsplit(":", 1)[0] for key in keys})
        if mode == "memory":
            from caiplatform.harness.app import _memory_stores

            return sorted(agent for pid, agent in list(_memory_stores) if pid == project.id)
        sessions = Path(settings.data_dir) / "sessions"
        start = f"{project.short}-"
        return sorted(path.parent.name[len(start):] for path in sessions.glob(f"{start}*/sessions.sqlite3"))

    async def _record_of(self, project_id: str, agent: str) -> Any:
        agent_id = await self.db.run(lambda s: s.scalars(
            select(Agent.id).where(Agent.project_id == project_id, Agent.name == agent)).first())
        return None if agent_id is None else await self.agents._record_by_id(agent_id)

    async def _erase(self, project_id: str, step: rules.Step, user_id: str) -> dict[str, int]:
        record = await self._record_of(project_id, step.agent)
        if record is None:  # a deleted agent: its log history and memory went with it, its sessions did not
            store = await self._leftover_store(project_id, step.agent) if step.store == rules.SESSIONS else None
            return {} if store is None else await self._forget_sessions(store, step.agent, user_id)
        if step.store == rules.SESSIONS:
            return await self._forget_sessions(self._sessions(record), record.name, user_id)
        if step.store == rules.MEMORY:
            return {"memories": await self._erase_memory(record, user_id)}
        session_ids, texts = await self._user_traces(record, user_id)
        needles = rules.log_needles(user_id, session_ids, texts)
        return {"lines": await self._runtime().erase_log_lines(record.workload, needles)}

    @staticmethod
    async def _forget_sessions(store: SessionStore, agent: str, user_id: str) -> dict[str, int]:
        try:
            gone = await store.forget_user(agent, user_id)
        finally:
            await store.aclose()
        return {"sessions": gone.sessions, "events": gone.events}

    async def _leftover_store(self, project_id: str, agent: str) -> SessionStore | None:
        """The session store a deleted agent's revisions used (on Valkey through the platform's own user),
        or None when it has none (nothing is created to find that out)."""
        project = await self.db.run(lambda s: s.get(Project, project_id))
        if project is None:
            return None
        if self.agents.settings.redis_url:
            return open_agent_sessions(self.agents.settings.redis_url, project_id, agent)
        if agent not in await self._stored_session_agents(ProjectRef.of(project)):
            return None
        spec = "memory" if self.agents.mode == "memory" else self.agents._session_store(_Named(ProjectRef.of(project), agent))
        return open_agent_sessions(spec, project_id, agent)

    def _sessions(self, record: Any) -> SessionStore:
        return open_agent_sessions(self.agents._session_store(record), record.project.id, record.name)

    async def _user_traces(self, record: Any, user_id: str) -> tuple[list[str], list[str]]:
        """The user's session ids and message texts in this agent (what marks their log lines)."""
        store = self._sessions(record)
        session_ids: list[str] = []
        texts: list[str] = []
        try:
            offset = 0
            while True:
                listing = await store.list_sessions(record.name, user_id, offset=offset, limit=200)
                session_ids += [s.session_id for s in listing.items]
                if not listing.more:
                    break
                offset += len(listing.items)
            for session_id in session_ids:
                session = await store.get(record.name, session_id)
                for event in session.events if session else []:
                    if event.get("author") == "user":
                        texts += [str(p.get("text", "")) for p in (event.get("content") or {}).get("parts") or []
                                  if isinstance(p, dict) and p.get("text")]
        finally:
            await store.aclose()
        return session_ids, texts

    async def _erase_memory(self, record: Any, user_id: str) -> int:
        memory = self._memory()
        if not isinstance(memory, UserMemory):
            return 0  # a platform without long-term memory keeps none
        return await memory.forget_user(self.agents._target_of(record), user_id)

@dataclass(frozen=True)
class _Named:
    """What locating an agent's session store reads of its record, for an agent deleted since."""

    project: ProjectRef
    name: str


class _Rounds(PeriodicWork):
    """The erasures' poll: claim and run what no live replica holds (an erasure asked for elsewhere, or
    one whose replica died)."""

    name = "erasures"

    def __init__(self, service: ErasureService):
        super().__init__(POLL_SECONDS)
        self.service = service

    async def round(self) -> None:
        await self.service.run_pending()


def totals(receipts: list[api.StoreReceipt]) -> dict[str, int]:
    """Every count of the receipt summed over the agents (`sessions`, `events`, `memories`, `lines`)."""
    summed: dict[str, int] = {}
    for receipt in receipts:
        for what, count in receipt.removed.items():
            summed[what] = summed.get(what, 0) + count
    return summed
