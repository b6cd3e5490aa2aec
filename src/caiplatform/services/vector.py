"""IndexService: the vector index API's rules, over a vector-engine port.

Members list, read and create indexes and use the four data verbs; project admins also PATCH and
DELETE an index and read the direct credential. The platform keeps one record per index (relational,
so it survives a restart); the points live in the engine's collection `p_<short>_<name>`.

Create answers `pending` and creates the collection in the background; reads and data verbs finish a
pending creation first, so an index is ready as soon as its collection exists, and a creation that
failed (engine down) is retried by the next call or the next start.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import anyio
import jwt
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform.clock import Clock
from caiplatform.db import Database
from caiplatform.db.models.vector import VectorIndex
from caiplatform.domain.vector import (
    ENGINE_REJECTED,
    MAX_CREDENTIAL_COLLECTIONS,
    MAX_POINTS_PER_REQUEST,
    MAX_TOP_K,
    NAME_TAKEN,
    NOT_FOUND,
    NOT_READY,
    Index,
    IndexSpec,
    State,
    collection_name,
    collection_prefix,
    engine_settings_json,
    engine_settings_of,
    is_index_name,
    parse_query,
    parse_upsert,
    quantization_json,
    quantization_of,
)
from caiplatform.errors import BadRequest, Conflict, NotFound, PlatformError, Unavailable
from caiplatform.models import vector as vector_models
from caiplatform.models.base import BodyOrReader, body_after_gate
from caiplatform.models.vector import MISSING_VERB as MISSING_VERB
from caiplatform.models.vector import UNKNOWN_VERB as UNKNOWN_VERB
from caiplatform.models.vector import (
    IndexCreate,
    IndexCredential,
    IndexDeletePoints,
    IndexList,
    IndexPatch,
    IndexQuery,
    IndexScroll,
    IndexUpsert,
)
from caiplatform.pagination import Page, Pager, page_body
from caiplatform.ports.vector import VectorEngine, VectorEngineRejected
from caiplatform.principal import Principal
from caiplatform.services.access import Access, ProjectRef, Role
from caiplatform.services.audit import AuditLog
from caiplatform.services.purge import remove_each

log = logging.getLogger(__name__)

T = TypeVar("T")

HEALTH_BUDGET_SECONDS = 5.0
CREDENTIAL_NOTE = (
    "the platform does not enforce per-project access control on the vector database, so no token is "
    "minted: use the service URL with the collection names listed, and only those. The list is a snapshot; "
    "fetch this again after creating an index. The engine's master key is never returned."
)
TOKEN_NOTE = (
    "present the token as the api-key header (or a Bearer token) to the service URL: it reads and writes "
    "the listed collections only, cannot create collections, and expires in one hour. The list is a "
    "snapshot; fetch this again after creating an index. The engine's master key is never returned."
)
TOKEN_TTL_SECONDS = 3600

#: a health check: returns the error text, or None when healthy
HealthCheck = Callable[[], Awaitable[str | None]]


class NotConfigured(str):
    """A dependency this platform does not use (no cluster on one machine): reported as such, not as ok."""


@dataclass(frozen=True)
class _Record:
    """One index row, detached from its session."""

    id: str
    project_id: str
    project_short: str
    spec: IndexSpec
    collection: str
    state: str
    message: str
    created_at: Any

    @classmethod
    def of(cls, row: VectorIndex, short: str) -> _Record:
        hnsw, indexing_threshold = engine_settings_of(row.engine_settings)
        spec = IndexSpec(
            name=row.name,
            dimensions=row.dimensions,
            distance=row.distance,
            on_disk=row.on_disk,
            payload_on_disk=row.payload_on_disk,
            quantization=quantization_of(row.quantization),
            shards=row.shards,
            replicas=row.replicas,
            hnsw=hnsw,
            indexing_threshold=indexing_threshold,
        )
        return cls(row.id, row.project_id, short, spec, row.collection, row.state, row.message, row.created_at)

    def index(self, info: Any = None, *, state: str | None = None, message: str | None = None) -> Index:
        return Index(
            project_id=self.project_id,
            project_short=self.project_short,
            spec=self.spec,
            collection=self.collection,
            state=state or self.state,
            message=self.message if message is None else message,
            created_at=self.created_at,
            info=info,
        )


class IndexService:
    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        engine: VectorEngine,
        *,
        max_points: int = MAX_POINTS_PER_REQUEST,
        max_top_k: int = MAX_TOP_K,
        checks: Mapping[str, HealthCheck | NotConfigured] | None = None,
        token_key: str | None = None,
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.engine = engine
        self.max_points = max_points
        self.max_top_k = max_top_k
        self._checks = dict(checks or {})
        # Set when the engine enforces per-project access control (Qdrant's JWT RBAC, whose tokens are
        # signed with the engine's API key); None: no token is minted.
        self._token_key = token_key
        self._locks: dict[str, asyncio.Lock] = {}
        # Ready records by (project id, name), so the data path skips a database read per call. Only
        # this service changes records (create, PATCH, DELETE drop the entry); a collection gone behind
        # its back makes the engine refuse, which drops the entry too.
        self._ready_records: dict[tuple[str, str], _Record] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------------ helpers

    async def _project(self, principal: Principal, project_id: str, *, admin: bool = False) -> ProjectRef:
        """The project gate (a malformed project id is 400)."""
        return await self.access.project_ref(principal, project_id, Role.ADMIN if admin else Role.MEMBER,
                                             bad_id=BadRequest)

    async def require_member(self, principal: Principal, project_id: str) -> ProjectRef:
        """The member gate alone, so that a route can refuse a stranger before it reads the body. A data
        verb's route hands the project it returns to `data`, which then does not read the roles again."""
        return await self._project(principal, project_id)

    async def _record(self, project: ProjectRef, name: str) -> _Record:
        if not is_index_name(name):
            raise NotFound(NOT_FOUND)

        def load(session: Session) -> _Record | None:
            row = session.scalar(
                select(VectorIndex).where(VectorIndex.project_id == project.id, VectorIndex.name == name)
            )
            return None if row is None else _Record.of(row, project.short)

        record = await self.db.run(load)
        if record is None:
            raise NotFound(NOT_FOUND)
        return record

    async def _engine(self, call: Awaitable[T]) -> T:
        """One engine call: its refusals become 400 in the engine's words, its absence 503."""
        try:
            return await call
        except PlatformError:
            raise
        except VectorEngineRejected as exc:
            raise BadRequest(ENGINE_REJECTED + str(exc)) from None
        except Exception as exc:  # connection failures and the like
            log.warning("vector database call failed", exc_info=True)
            raise Unavailable(f"the vector database is unreachable: {exc or type(exc).__name__}") from exc

    async def _set_state(self, record_id: str, state: str, message: str) -> None:
        def update(session: Session) -> None:
            row = session.get(VectorIndex, record_id)
            if row is not None:
                row.state, row.message = state, message

        await self.db.run(update)

    async def _reconcile(self, record: _Record) -> _Record:
        """Create the collection of a pending index (adopting one that exists) and mark it ready."""
        if record.state != State.PENDING:
            return record
        lock = self._locks.setdefault(record.id, asyncio.Lock())
        async with lock:
            current = await self.db.run(lambda s: s.get(VectorIndex, record.id))
            if current is None:
                raise NotFound(NOT_FOUND)
            if current.state != State.PENDING:
                return _Record.of(current, record.project_short)
            try:
                if await self.engine.collection_info(record.collection) is None:
                    await self.engine.create_collection(record.collection, record.spec.collection_config())
            except Exception as exc:  # noqa: BLE001 - kept as the reason; retried on the next call
                message = f"could not create the collection: {exc or type(exc).__name__}"
                if isinstance(exc, VectorEngineRejected):
                    message = ENGINE_REJECTED + str(exc)
                await self._set_state(record.id, State.PENDING, message)
                return replace(record, message=message)
            await self._set_state(record.id, State.READY, "")
            self._locks.pop(record.id, None)
            return replace(record, state=State.READY, message="")

    def _reconcile_later(self, record: _Record) -> None:
        async def run() -> None:
            try:
                await self._reconcile(record)
            except Exception:  # noqa: BLE001 - the next read retries
                log.warning("creating the collection of index %s failed", record.spec.name, exc_info=True)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_reconciled(self) -> None:
        """Wait for background collection creations (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def start(self) -> None:
        """Finish the creations a previous run left pending."""
        pending = await self.db.run(
            lambda s: list(s.scalars(select(VectorIndex.id).where(VectorIndex.state == State.PENDING)))
        )
        for record_id in pending:
            record = await self.db.run(functools.partial(self._detached, record_id=record_id))
            if record is not None:
                self._reconcile_later(record)

    @staticmethod
    def _detached(session: Session, record_id: str) -> _Record | None:
        from caiplatform.db.models import Project

        row = session.get(VectorIndex, record_id)
        if row is None:
            return None
        project = session.get(Project, row.project_id)
        return _Record.of(row, project.short if project is not None else "")

    async def _view(self, record: _Record) -> Index:
        """The index with the engine's live status and counts."""
        record = await self._reconcile(record)
        if not record.state == State.READY:
            return record.index()
        try:
            info = await self.engine.collection_info(record.collection)
        except Exception as exc:  # noqa: BLE001 - reported as the index's state
            return record.index(state=State.DEGRADED, message=f"the vector database did not answer: {exc}")
        if info is None:
            return record.index(state=State.DEGRADED, message="its collection is missing from the vector database")
        return record.index(info)

    async def _ready(self, principal: Principal, project_id: str, name: str,
                     project: ProjectRef | None = None) -> _Record:
        if project is None:
            project = await self._project(principal, project_id)
        cached = self._ready_records.get((project.id, name))
        if cached is not None:
            return cached
        record = await self._reconcile(await self._record(project, name))
        if record.state != State.READY:
            raise Conflict(NOT_READY)
        self._ready_records[(project.id, name)] = record
        return record

    async def _data(self, record: _Record, call: Awaitable[T]) -> T:
        """A data-path engine call; a refusal also forgets the cached record (it may be stale)."""
        try:
            return await self._engine(call)
        except BadRequest:
            self._ready_records.pop((record.project_id, record.spec.name), None)
            raise

    # ------------------------------------------------------------------------------------ resource

    async def create(self, principal: Principal, project_id: str, body: BodyOrReader[IndexCreate]) -> vector_models.Index:
        """201: the index in state `pending`; its collection is created right after."""
        project = await self._project(principal, project_id)
        body = await body_after_gate(body)
        spec = body.spec()
        now = self.clock.now()

        def insert(session: Session) -> _Record:
            taken = session.scalar(
                select(VectorIndex.id).where(VectorIndex.project_id == project.id, VectorIndex.name == spec.name)
            )
            if taken is not None:
                raise Conflict(NAME_TAKEN)
            row = VectorIndex(
                project_id=project.id,
                name=spec.name,
                collection=collection_name(project.short, spec.name),
                dimensions=spec.dimensions,
                distance=spec.distance,
                on_disk=spec.on_disk,
                payload_on_disk=spec.payload_on_disk,
                quantization=quantization_json(spec.quantization),
                shards=spec.shards,
                replicas=spec.replicas,
                engine_settings=engine_settings_json(spec) or None,
                state=State.PENDING,
                message="the collection is being created",
                created_at=now,
            )
            session.add(row)
            session.flush()
            self.audit.record(session, project.id, principal, "vector_index.create", spec.name,
                              {"dimensions": spec.dimensions, "distance": spec.distance})
            return _Record.of(row, project.short)

        try:
            record = await self.db.run(insert)
        except IntegrityError:  # a concurrent create of the same name
            raise Conflict(NAME_TAKEN) from None
        self._reconcile_later(record)
        return vector_models.Index.of(record.index().to_json())

    async def list(
        self, principal: Principal, project_id: str, *, page_size: Any = None, page_token: str | None = None
    ) -> IndexList:
        """200 `{indexes, next_page_token?}`: the token is omitted on the last page."""
        project = await self._project(principal, project_id)
        request = self.pager.request(f"indexes:{project.id}", page_size, page_token)

        def load(session: Session) -> list[_Record]:
            rows = session.scalars(
                select(VectorIndex)
                .where(VectorIndex.project_id == project.id)
                .order_by(VectorIndex.name)
                .offset(request.offset)
                .limit(request.size + 1)
            )
            return [_Record.of(row, project.short) for row in rows]

        page = self.pager.page_from_probe(await self.db.run(load), request)
        items = [(await self._view(record)).to_json() for record in page.items]
        return IndexList.of(page_body("indexes", Page(items, page.next_page_token, page.extra), omit_empty_token=True))

    async def get(self, principal: Principal, project_id: str, name: str) -> vector_models.Index:
        project = await self._project(principal, project_id)
        return vector_models.Index.of((await self._view(await self._record(project, name))).to_json())

    async def update(self, principal: Principal, project_id: str, name: str, body: IndexPatch) -> vector_models.Index:
        """PATCH (admin): `replicas` and `payload_on_disk` only."""
        project = await self._project(principal, project_id, admin=True)
        record = await self._record(project, name)
        changes = body.changes()
        self._ready_records.pop((project.id, name), None)
        record = await self._reconcile(record)
        if record.state == State.READY:
            await self._engine(self.engine.update_collection(record.collection, **changes))

        def save(session: Session) -> _Record:
            row = session.get(VectorIndex, record.id)
            if row is None:
                raise NotFound(NOT_FOUND)
            for key, value in changes.items():
                setattr(row, key, value)
            self.audit.record(session, project.id, principal, "vector_index.update", name, changes)
            return _Record.of(row, project.short)

        return vector_models.Index.of((await self._view(await self.db.run(save))).to_json())

    async def delete(self, principal: Principal, project_id: str, name: str) -> None:
        """DELETE (admin): the collection and every point in it are destroyed; no backup exists."""
        project = await self._project(principal, project_id, admin=True)
        await self._remove(await self._record(project, name), principal)

    async def _remove(self, record: _Record, principal: Principal | None) -> None:
        """Drop the collection, then the record. `principal` None: the platform acts (a project delete)."""
        key = (record.project_id, record.spec.name)
        self._ready_records.pop(key, None)
        lock = self._locks.setdefault(record.id, asyncio.Lock())
        async with lock:
            await self._engine(self.engine.drop_collection(record.collection))

            def remove(session: Session) -> None:
                row = session.get(VectorIndex, record.id)
                if row is not None:
                    session.delete(row)
                self.audit.record(session, record.project_id, principal, "vector_index.delete", record.spec.name)

            await self.db.run(remove)
        self._locks.pop(record.id, None)
        self._ready_records.pop(key, None)

    async def purge_project(self, project_id: str) -> int:
        """Remove every index of a project being deleted (for the projects area): its collection and
        every point in it, and its record. Returns how many indexes were removed."""

        def load(session: Session) -> list[_Record]:
            ids = session.scalars(select(VectorIndex.id).where(VectorIndex.project_id == project_id).order_by(VectorIndex.name))
            return [r for r in (self._detached(session, i) for i in list(ids)) if r is not None]

        records = await self.db.run(load)
        return await remove_each("index", records, lambda r: r.spec.name, lambda r: self._remove(r, None))

    # ------------------------------------------------------------------------------------ data verbs

    async def data(
        self, principal: Principal, project_id: str, name: str, request: vector_models.IndexDataRequest,
        *, member_of: ProjectRef | None = None,
    ) -> vector_models.IndexDataResult:
        """The verb a request model stands for (`POST .../indexes/{name}:{verb}`). `member_of`: what
        `require_member(principal, project_id)` returned for this same request (one roles read, not two)."""
        if isinstance(request, IndexUpsert):
            return await self.upsert(principal, project_id, name, request, member_of=member_of)
        if isinstance(request, IndexQuery):
            return await self.query(principal, project_id, name, request, member_of=member_of)
        if isinstance(request, IndexScroll):
            return await self.scroll(principal, project_id, name, request, member_of=member_of)
        return await self.delete_points(principal, project_id, name, request, member_of=member_of)

    async def upsert(
        self, principal: Principal, project_id: str, name: str, body: IndexUpsert,
        *, member_of: ProjectRef | None = None,
    ) -> vector_models.IndexUpsertResult:
        record = await self._ready(principal, project_id, name, member_of)
        points = parse_upsert(body.as_body(), record.spec.name, record.spec.dimensions, self.max_points)
        await self._data(record, self.engine.upsert(record.collection, points))
        return vector_models.IndexUpsertResult(index=record.spec.name, upserted_count=len(points))

    async def query(
        self, principal: Principal, project_id: str, name: str, body: IndexQuery,
        *, member_of: ProjectRef | None = None,
    ) -> vector_models.IndexQueryResult:
        record = await self._ready(principal, project_id, name, member_of)
        request = parse_query(body.as_body(), record.spec.name, record.spec.dimensions, self.max_top_k)
        hits = await self._data(
            record,
            self.engine.query(
                record.collection,
                # the engines take any array of floats (np.asarray or iteration); the port says Sequence
                cast(Sequence[float], request.vector),
                top_k=request.top_k,
                filter=request.filter,
                with_payload=request.with_payload,
                with_vector=request.with_vector,
                score_threshold=request.score_threshold,
                offset=request.offset,
                params=request.params,
            )
        )
        # The engine's answer is the platform's own: built without re-validating every coordinate.
        results = []
        for hit in hits:
            item: dict[str, Any] = {"id": hit.id, "score": hit.score}
            if request.with_payload:
                item["payload"] = hit.payload or {}
            if request.with_vector and hit.vector is not None:
                item["vector"] = hit.vector
            results.append(vector_models.IndexQueryHit.model_construct(**item))
        return vector_models.IndexQueryResult.model_construct(index=record.spec.name, results=results)

    async def scroll(
        self, principal: Principal, project_id: str, name: str, body: IndexScroll,
        *, member_of: ProjectRef | None = None,
    ) -> vector_models.IndexScrollResult:
        record = await self._ready(principal, project_id, name, member_of)
        points, next_offset = await self._data(
            record, self.engine.scroll(record.collection, limit=body.limit, offset=body.offset, filter=body.filter)
        )
        out: dict[str, Any] = {
            "index": record.spec.name,
            "points": [{"id": p.id, "payload": p.payload} for p in points],
        }
        if next_offset is not None:
            out["next_offset"] = next_offset
        return vector_models.IndexScrollResult.of(out)

    async def delete_points(
        self, principal: Principal, project_id: str, name: str, body: IndexDeletePoints,
        *, member_of: ProjectRef | None = None,
    ) -> vector_models.IndexDeletePointsResult:
        record = await self._ready(principal, project_id, name, member_of)
        await self._data(record, self.engine.delete_points(record.collection, ids=body.ids, filter=body.filter))
        out: dict[str, Any] = {"index": record.spec.name, "status": "ok"}
        if body.ids is not None:
            out["ids_requested"] = len(body.ids)
        return vector_models.IndexDeletePointsResult.of(out)

    # ------------------------------------------------------------------------------------ credential

    async def credentials(self, principal: Principal, project_id: str) -> IndexCredential:
        """The direct engine credential (admin); a token only when the engine enforces per-project access."""
        project = await self._project(principal, project_id, admin=True)
        names = await self.db.run(
            lambda s: list(
                s.scalars(
                    select(VectorIndex.collection)
                    .where(VectorIndex.project_id == project.id)
                    .order_by(VectorIndex.collection)
                    .limit(MAX_CREDENTIAL_COLLECTIONS + 1)
                )
            )
        )
        collections = names[:MAX_CREDENTIAL_COLLECTIONS]
        token = ""  # always present (the document marks only the external URL optional); empty: not minted
        if self._token_key:
            claims = {
                "access": [{"collection": name, "access": "rw"} for name in collections],
                "exp": int(self.clock.time()) + TOKEN_TTL_SECONDS,
            }
            token = jwt.encode(claims, self._token_key, algorithm="HS256")
        return IndexCredential(
            service_url=self.engine.service_url(),
            token=token,
            collection_prefix=collection_prefix(project.short),
            collections=collections,
            truncated=len(names) > MAX_CREDENTIAL_COLLECTIONS,
            note=TOKEN_NOTE if token else CREDENTIAL_NOTE,
        )

    # ------------------------------------------------------------------------------------ health

    async def health(self) -> tuple[int, vector_models.VectorHealth]:
        """`/healthz`: (200 or 503, `{status, dependencies: {vector_store, kubernetes, database}}`)."""

        async def engine_check() -> str | None:
            await self.engine.health()
            return None

        checks: dict[str, HealthCheck | NotConfigured] = {"vector_store": engine_check, **self._checks}
        dependencies: dict[str, Any] = {}
        for key in ("vector_store", "kubernetes", "database"):
            check = checks.get(key)
            if isinstance(check, NotConfigured):
                # Nothing to probe and nothing wrong: the entry keeps the document's shape and says so.
                dependencies[key] = {"ok": True, "latency_ms": 0, "status": "not configured", "detail": str(check)}
                continue
            started = time.perf_counter()
            error: str | None
            if check is None:
                error = f"no {key} check is configured"
            else:
                try:
                    with anyio.fail_after(HEALTH_BUDGET_SECONDS):
                        error = await check()
                except TimeoutError:
                    error = f"no answer within {HEALTH_BUDGET_SECONDS:g} s"
                except Exception as exc:  # noqa: BLE001 - reported, not raised
                    error = str(exc) or type(exc).__name__
            entry: dict[str, Any] = {"ok": error is None, "latency_ms": round((time.perf_counter() - started) * 1000, 3)}
            if error is not None:
                entry["error"] = error
            dependencies[key] = entry
        healthy = all(d["ok"] for d in dependencies.values())
        return (200 if healthy else 503), vector_models.VectorHealth.of(
            {"status": "ok" if healthy else "degraded", "dependencies": dependencies})
