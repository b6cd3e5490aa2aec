"""Hosted MCP servers (document 2): tools from Python source, immutable versions, rollback and yank.

Publishing or deleting a tool snapshots the whole current tool set into a new version and builds it in
the background (`building` → `deploying` → `ready`, or `failed` with `message`). The version becomes
`current` at the publish itself ("`current` moves on publish or rollback"); the server view's `version`
and `status` say what actually serves. Rollback re-points the server at a version's recorded image
without a rebuild.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import McpServer, McpTool, McpVersion, Project
from caiplatform.domain.mcp import TOOL_NAME_MESSAGE, VERSION_VERBS, parse_version
from caiplatform.errors import BadRequest, Conflict, NotFound, Unavailable
from caiplatform.mcp.source import check_helper_import, decorator_credential_keys
from caiplatform.models import mcp as models
from caiplatform.models.base import BodyOrReader, body_after_gate
from caiplatform.pagination import Page, Pager, page_body
from caiplatform.ports.mcp_host import (
    McpBuild,
    McpBuildError,
    McpDeployment,
    McpHost,
    McpImage,
    McpServeError,
)
from caiplatform.principal import Principal
from caiplatform.services.access import Access, ProjectRef, Role
from caiplatform.services.audit import AuditLog
from caiplatform.services.mcp_replicas import build_lock, revoke_workload_keys_sync, stable_workload_key
from caiplatform.services.purge import remove_each
from caiplatform.validation import MCP_TOOL_NAME
from caiplatform.worklocks import LocalWorkLocks

log = logging.getLogger(__name__)

# Document 2, Limits: "MCP request timeout 300 s"; the served process enforces it per request.
REQUEST_TIMEOUT_SECONDS = 300
RESUME_CONCURRENCY = 4


@dataclass(frozen=True)
class _Resumable:
    project: ProjectRef
    name: str
    expose: str
    token: str
    current: int | None  # the version to serve again (it has an image)
    image: McpImage | None
    unfinished: int | None  # the current version, when its build or rollout was under way
    was_ready: bool  # otherwise the status (and a failure's message) stays as it was


def mint_server_token() -> str:
    return "cai_mcp_" + secrets.token_hex(32)


def _server_view(server: McpServer, tools: list[McpTool], current: McpVersion | None) -> dict[str, Any]:
    names = sorted(t.name for t in tools)
    view: dict[str, Any] = {
        "name": server.name,
        "visibility": "private",
        "expose": server.expose,
        "status": server.status or "pending",
        "tool_names": names,
        "tool_count": len(names),
        "created_at": rfc3339(server.created_at),
    }
    if server.url and current is not None:
        view["url"] = server.url
    if current is not None:
        view["version"] = current.version
        view["image"] = current.image
    if server.message:
        view["message"] = server.message
    return view


def _tool_view(tool: McpTool) -> dict[str, Any]:
    keys = list(tool.credential_keys or [])
    return {
        "name": tool.name,
        "description": tool.description,
        "handler": tool.handler,
        "schema": tool.schema or {},
        "credential_keys": keys,
        "credentialKeys": keys,
        "updated_at": rfc3339(tool.updated_at),
    }


def _version_view(version: McpVersion, current: int | None) -> dict[str, Any]:
    names = sorted(t["name"] for t in version.tools)
    view: dict[str, Any] = {
        "version": version.version,
        "credential_keys": list(version.credential_keys or []),
        "tool_names": names,
        "tool_count": len(names),
        "current": version.version == current,
        "created_at": rfc3339(version.created_at),
    }
    if version.image_digest:
        view["image_digest"] = version.image_digest
    if version.yanked:
        view["yanked"] = True
        view["yanked_at"] = rfc3339(version.yanked_at) if version.yanked_at else None
    return view


class McpServerService:
    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        host: McpHost,
        *,
        api_url: str = "",
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.host = host
        self.api_url = api_url
        self._tasks: set[asyncio.Task[None]] = set()
        # Replaced by the platform with locks in its database (several replicas).
        self.locks: Any = LocalWorkLocks()

    # -- helpers --------------------------------------------------------------------------------

    async def _grant(self, principal: Principal, project_id: str, need: Role) -> ProjectRef:
        return await self.access.project_ref(principal, project_id, need)

    @staticmethod
    def _server(session: Session, project_id: str, name: str) -> McpServer:
        server = session.scalar(select(McpServer).where(McpServer.project_id == project_id, McpServer.name == name))
        if server is None:
            raise NotFound(f"mcp server {name} not found")
        return server

    @staticmethod
    def _tools(session: Session, server_id: str) -> list[McpTool]:
        return list(session.scalars(select(McpTool).where(McpTool.server_id == server_id).order_by(McpTool.name)))

    @staticmethod
    def _version(session: Session, server_id: str, version: int) -> McpVersion | None:
        return session.get(McpVersion, (server_id, version))

    def _view(self, session: Session, server: McpServer) -> dict[str, Any]:
        current = self._version(session, server.id, server.current_version) if server.current_version else None
        view = _server_view(server, self._tools(session, server.id), current)
        if "url" in view and self.api_url and getattr(self.host, "routes_through_platform", False):
            project = session.get(Project, server.project_id)
            if project is not None:
                view["url"] = platform_route(self.api_url, project.short, server.name)
        return view

    async def upstream_of(self, project_short: str, name: str) -> str | None:
        """Where the platform's route to a server (`platform_route`) goes: the address its owner serves it
        at (`mcp_servers.url` less `/mcp`), or None when no such server is serving."""

        def read(session: Session) -> str | None:
            url = session.scalar(select(McpServer.url).join(Project, Project.id == McpServer.project_id)
                                 .where(Project.short == project_short, McpServer.name == name))
            return url.removesuffix("/mcp") if url else None

        return await self.db.read_session(read)

    # -- servers --------------------------------------------------------------------------------

    async def create(self, principal: Principal, project_id: str,
                     body: BodyOrReader[models.McpServerCreate]) -> models.McpServer:
        project = await self._grant(principal, project_id, Role.ADMIN)
        body = await body_after_gate(body)
        name, expose = body.name, body.expose

        def create(session: Session) -> dict[str, Any]:
            exists = session.scalar(select(McpServer).where(McpServer.project_id == project.id, McpServer.name == name))
            if exists is not None:
                raise Conflict(f"an mcp server named {name} already exists in this project")
            server = McpServer(
                project_id=project.id, name=name, expose=expose, status="pending", token=mint_server_token(),
                created_at=self.clock.now(),
            )
            session.add(server)
            session.flush()
            self.audit.record(session, project.id, principal, "mcpserver.create", name, {"expose": expose})
            return self._view(session, server)

        return models.McpServer.of(await self.db.run(create))

    async def list(
        self, principal: Principal, project_id: str, page_size: Any = None, page_token: str | None = None
    ) -> models.McpServerList:
        project = await self._grant(principal, project_id, Role.MEMBER)
        request = self.pager.request(f"mcpservers:{project.id}", page_size, page_token)

        def run(session: Session) -> Page[dict[str, Any]]:
            rows = list(
                session.scalars(
                    select(McpServer)
                    .where(McpServer.project_id == project.id)
                    .order_by(McpServer.name)
                    .offset(request.offset)
                    .limit(request.size + 1)
                )
            )
            page = self.pager.page_from_probe(rows, request)
            return Page([self._view(session, s) for s in page.items], page.next_page_token)

        return models.McpServerList.of(page_body("mcpservers", await self.db.run(run)))

    async def get(self, principal: Principal, project_id: str, name: str) -> models.McpServer:
        project = await self._grant(principal, project_id, Role.MEMBER)
        return models.McpServer.of(await self.db.run(lambda s: self._view(s, self._server(s, project.id, name))))

    async def token(self, principal: Principal, project_id: str, name: str) -> str:
        """The server's bearer token, for the project's admins (and the platform when it deploys)."""
        project = await self._grant(principal, project_id, Role.ADMIN)
        return await self.db.run(lambda s: self._server(s, project.id, name).token)

    async def delete(self, principal: Principal, project_id: str, name: str) -> models.McpServerDeleted:
        project = await self._grant(principal, project_id, Role.ADMIN)
        await self._remove(project.id, name, principal)
        return models.McpServerDeleted(name=name, deleted=True)

    async def _remove(self, project_id: str, name: str, principal: Principal | None) -> None:
        """Drop the record (tools and versions cascade), then stop serving it; a build under way finds it
        gone. `principal` None: the platform acts (a project delete)."""

        def delete(session: Session) -> None:
            server = self._server(session, project_id, name)
            revoke_workload_keys_sync(session, project_id, server.id, self.clock.now())
            session.delete(server)
            self.audit.record(session, project_id, principal, "mcpserver.delete", name)

        await self.db.run(delete)
        await self.host.remove(project_id, name)

    async def purge_project(self, project_id: str) -> int:
        """Remove every MCP server of a project being deleted (for the projects area): its hosted process
        and its records. Returns how many servers were removed."""
        names = await self.db.run(lambda s: list(s.scalars(
            select(McpServer.name).where(McpServer.project_id == project_id).order_by(McpServer.name))))
        return await remove_each("mcp server", names, str, lambda name: self._remove(project_id, name, None))

    # -- tools ----------------------------------------------------------------------------------

    async def list_tools(self, principal: Principal, project_id: str, name: str) -> models.McpToolList:
        project = await self._grant(principal, project_id, Role.MEMBER)

        def run(session: Session) -> dict[str, Any]:
            server = self._server(session, project.id, name)
            return {"server": name, "tools": [_tool_view(t) for t in self._tools(session, server.id)]}

        return models.McpToolList.of(await self.db.run(run))

    async def publish_tool(
        self, principal: Principal, project_id: str, name: str, tool: str, body: BodyOrReader[models.McpToolPublish]
    ) -> models.McpToolPublished:
        project = await self._grant(principal, project_id, Role.ADMIN)
        body = await body_after_gate(body)
        if not MCP_TOOL_NAME.match(tool or ""):
            raise BadRequest(TOOL_NAME_MESSAGE)
        handler, description, schema = body.handler, body.description, dict(body.tool_schema)
        keys = list(body.credential_keys)
        problem = check_helper_import(tool, handler)
        if problem:
            raise BadRequest(problem)

        def publish(session: Session) -> tuple[str, int]:
            server = self._server(session, project.id, name)
            record = session.get(McpTool, (server.id, tool))
            if record is None:
                record = McpTool(server_id=server.id, name=tool)
                session.add(record)
            # A publish is a full replace of the tool's record.
            record.description, record.handler, record.schema = description, handler, schema
            record.credential_keys, record.updated_at = keys, self.clock.now()
            session.flush()
            build_id, version = self._new_version(session, server)
            self.audit.record(session, project.id, principal, "mcpserver.tool.publish", f"{name}/{tool}", {"version": version})
            return build_id, version

        build_id, version = await self.db.run(publish)
        self._start_build(project, name, version)
        return models.McpToolPublished(
            server=name, name=tool, published=True, build_id=build_id,
            note=f"building version {version} from the whole tool set; poll the server until status is ready",
        )

    async def delete_tool(self, principal: Principal, project_id: str, name: str, tool: str) -> models.McpToolDeleted:
        project = await self._grant(principal, project_id, Role.ADMIN)

        def delete(session: Session) -> tuple[str, int]:
            server = self._server(session, project.id, name)
            record = session.get(McpTool, (server.id, tool))
            if record is None:
                raise NotFound(f"tool {tool} is not in the tool set of mcp server {name}")
            session.delete(record)
            session.flush()
            build_id, version = self._new_version(session, server)
            self.audit.record(session, project.id, principal, "mcpserver.tool.delete", f"{name}/{tool}", {"version": version})
            return build_id, version

        build_id, version = await self.db.run(delete)
        self._start_build(project, name, version)
        return models.McpToolDeleted(
            server=name, name=tool, deleted=True, build_id=build_id,
            note=f"rebuilding without it as version {version}; poll the server until status is ready",
        )

    def _new_version(self, session: Session, server: McpServer) -> tuple[str, int]:
        tools: list[dict[str, Any]] = [
            {
                "name": t.name,
                "description": t.description,
                "handler": t.handler,
                "schema": t.schema or {},
                "credential_keys": list(t.credential_keys or []),
            }
            for t in self._tools(session, server.id)
        ]
        latest = session.scalar(select(func.max(McpVersion.version)).where(McpVersion.server_id == server.id)) or 0
        # The version's keys: what the records declare plus what the handlers' `@tool(credential_keys=...)` do.
        keys = sorted({k for t in tools for k in [*t["credential_keys"], *decorator_credential_keys(t["handler"])]})
        build_id = str(uuid.uuid4())
        session.add(
            McpVersion(
                server_id=server.id, version=latest + 1, build_id=build_id, tools=tools, credential_keys=keys,
                created_at=self.clock.now(),
            )
        )
        server.status, server.message = "building", ""
        server.selected_version = latest + 1
        return build_id, latest + 1

    # -- builds ---------------------------------------------------------------------------------

    def _start_build(self, project: ProjectRef, name: str, version: int) -> None:
        task = asyncio.get_running_loop().create_task(self._build_once(project, name, version))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _build_once(self, project: ProjectRef, name: str, version: int) -> None:
        """The build under its work lock: a replica resuming unfinished builds at its start leaves alone
        the ones another live replica is running."""
        lock = build_lock(project.id, name, version)
        if not await self.locks.try_acquire(lock):
            return
        try:
            await self._build(project, name, version)
        finally:
            await self.locks.release(lock)

    async def aclose(self) -> None:
        """Cancel the builds under way (they resume at the next start) and let the host stop its servers."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        close = getattr(self.host, "close", None)
        if close is not None:
            await close()

    async def wait_idle(self) -> None:
        """Wait for every build under way (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _still_current(self, session: Session, project_id: str, name: str, version: int) -> McpServer | None:
        """The server while `version` is still its current one (a later publish or a rollback supersedes it)."""
        server = session.scalar(select(McpServer).where(McpServer.project_id == project_id, McpServer.name == name))
        return server if server is not None and server.selected_version == version else None

    async def _build(self, project: ProjectRef, name: str, version: int) -> None:
        def snapshot(session: Session) -> tuple[McpBuild, str, str] | None:
            server = self._still_current(session, project.id, name, version)
            if server is None:
                return None
            record = self._version(session, server.id, version)
            assert record is not None
            build = McpBuild(project.id, project.short, project.namespace, name, version, record.tools, record.credential_keys)
            return build, server.expose, server.token

        try:
            found = await self.db.run(snapshot)
            if found is None:
                return  # deleted, or superseded by a newer publish or a rollback
            build, expose, token = found
            try:
                image = await self.host.build(build)
            except McpBuildError as exc:
                await self._fail(project, name, version, f"build failed: {exc}")
                return

            def record_image(session: Session) -> bool:
                server = self._still_current(session, project.id, name, version)
                record = self._version(session, server.id, version) if server else None
                if server is None or record is None:
                    return False
                record.image, record.image_digest = image.image, image.digest
                server.status = "deploying"
                return True

            if not await self.db.run(record_image):
                return
            try:
                await self._serve(project, name, version, image, expose, token)
            except McpServeError as exc:
                await self._fail(project, name, version, f"rollout failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - a build failure is reported on the server, not raised
            log.exception("mcp build of %s/%s v%s failed", project.slug, name, version)
            await self._fail(project, name, version, f"build failed: {exc}")

    async def _serve(
        self, project: ProjectRef, name: str, version: int, image: McpImage, expose: str, token: str, *, mark_ready: bool = True
    ) -> None:
        def version_facts(session: Session) -> tuple[str, list[str]]:
            server = self._server(session, project.id, name)
            record = self._version(session, server.id, version)
            return server.id, list(record.credential_keys if record else [])

        server_id, keys = await self.db.run(version_facts)
        deployment = McpDeployment(
            project_id=project.id,
            project_short=project.short,
            namespace=project.namespace,
            server=name,
            version=version,
            image=image,
            expose=expose,
            env={
                "CAI_API_URL": self.api_url,
                "CAI_PROJECT_ID": project.id,
                "CAI_MCP_CREDENTIAL_KEYS": json.dumps(keys),
                "PLATFORM_REQUEST_TIMEOUT_SECONDS": str(REQUEST_TIMEOUT_SECONDS),
            },
            secret_env={"CAI_MCP_AUTH_TOKEN": token, "CAI_PROJECT_KEY": await self._project_key(project, server_id)},
        )
        url = await self.host.serve(deployment)

        def ready(session: Session) -> bool:
            server = session.scalar(select(McpServer).where(McpServer.project_id == project.id, McpServer.name == name))
            if server is None or server.id != server_id:
                return False
            server.url, server.current_version = url, version
            server.owner = self.locks.replica_id  # the replica that runs it (services/mcp_replicas.py)
            if mark_ready:
                server.status, server.message = "ready", ""
            return True

        if not await self.db.run(ready):
            # Deleted while this version started: stop what was just started instead of leaking it.
            await self.host.remove(project.id, name)
            raise NotFound(f"mcp server {name} not found")

    async def _project_key(self, project: ProjectRef, server_id: str) -> str:
        """The workload key a server presents to read its project's secrets: minted once, then kept
        across rollouts, restarts and replicas."""
        return await stable_workload_key(self.db, self.clock.now(), project.id, server_id)

    async def resume(self, *, serve: bool = True) -> None:
        """After a platform restart: serve every server's current version again (a fresh process with
        the server's workload key) and restart the builds that were under way when the platform stopped.
        Replicas sharing a database serve through `McpFollower` instead (`serve=False`)."""

        def servers(session: Session) -> list[_Resumable]:
            out = []
            for server in session.scalars(select(McpServer).order_by(McpServer.created_at)):
                project = session.get(Project, server.project_id)
                if project is None:
                    continue
                current = self._version(session, server.id, server.current_version) if server.current_version else None
                out.append(
                    _Resumable(
                        ProjectRef.of(project), server.name, server.expose, server.token,
                        current.version if current and current.image_digest else None,
                        McpImage(current.image, current.image_digest) if current and current.image_digest else None,
                        server.selected_version if server.status in ("building", "deploying") else None,
                        server.status == "ready",
                    )
                )
            return out

        # A few at a time: each start is an interpreter coming up, and the API waits for all of them.
        starting = asyncio.Semaphore(RESUME_CONCURRENCY)

        async def serve_again(item: _Resumable) -> None:
            if serve and item.current is not None and item.image is not None:
                try:
                    # A cluster's server outlives the platform with the key its rollout gave it: leave it be
                    # (serving it again from every replica's start would roll, and re-key, it each time).
                    if await self.host.still_serving(item.project.id, item.project.short, item.name, item.current):
                        item = replace(item, current=None)
                except Exception:  # noqa: BLE001 - not known to serve: serve it again
                    log.warning("could not ask whether mcp server %s/%s still serves", item.project.slug, item.name,
                                exc_info=True)
            if item.current is not None and item.image is not None:
                try:
                    async with starting:
                        await self._serve(
                            item.project, item.name, item.current, item.image, item.expose, item.token,
                            mark_ready=item.was_ready,
                        )
                except Exception as exc:  # noqa: BLE001 - one server that cannot start does not stop the others
                    log.exception("mcp server %s/%s did not start again", item.project.slug, item.name)
                    await self._fail(item.project, item.name, item.current, f"restart failed: {exc}", only_if_current=False)
            if item.unfinished is not None:
                self._start_build(item.project, item.name, item.unfinished)

        await asyncio.gather(*(serve_again(item) for item in await self.db.run(servers)))

    async def _fail(self, project: ProjectRef, name: str, version: int, message: str, *, only_if_current: bool = True) -> None:
        def fail(session: Session) -> None:
            if only_if_current:
                server = self._still_current(session, project.id, name, version)
            else:
                server = session.scalar(select(McpServer).where(McpServer.project_id == project.id, McpServer.name == name))
            if server is not None:
                server.status, server.message = "failed", message[:4000]

        await self.db.run(fail)

    # -- versions -------------------------------------------------------------------------------

    async def versions(self, principal: Principal, project_id: str, name: str) -> models.McpVersionList:
        project = await self._grant(principal, project_id, Role.MEMBER)

        def run(session: Session) -> dict[str, Any]:
            server = self._server(session, project.id, name)
            rows = session.scalars(
                select(McpVersion).where(McpVersion.server_id == server.id).order_by(McpVersion.version.desc())
            )
            return {"server": name, "versions": [_version_view(v, server.selected_version) for v in rows]}

        return models.McpVersionList.of(await self.db.run(run))

    async def version_verb(
        self, principal: Principal, project_id: str, name: str, raw_version: str, verb: str
    ) -> models.McpVersionRollback | models.McpVersionYank:
        self.access.require_management(principal)
        if verb not in VERSION_VERBS:
            raise NotFound(f"unknown method ':{verb}' - the supported ones are ':rollback', ':yank' and ':unyank'")
        project = await self._grant(principal, project_id, Role.ADMIN)
        version = parse_version(raw_version)
        if verb == "rollback":
            return await self._rollback(principal, project, name, version)
        return await self._set_yanked(principal, project, name, version, verb == "yank")

    async def _rollback(self, principal: Principal, project: ProjectRef, name: str, version: int) -> models.McpVersionRollback:
        def check(session: Session) -> tuple[McpImage, str, str]:
            server = self._server(session, project.id, name)
            record = self._version(session, server.id, version)
            if record is None:
                raise NotFound("no such version")
            if record.yanked:
                raise Conflict(f"version {version} is yanked (retired); unyank it before rolling back to it")
            if not record.image_digest:
                raise Conflict(f"version {version} has no recorded image (its build did not succeed); it cannot be a rollback target")
            return McpImage(record.image, record.image_digest), server.expose, server.token

        image, expose, token = await self.db.run(check)
        try:
            await self._serve(project, name, version, image, expose, token)
        except McpServeError as exc:
            raise Unavailable(f"rollback to version {version} did not start: {exc}") from None

        def point_and_audit(session: Session) -> None:
            server = self._server(session, project.id, name)
            server.selected_version = version
            self.audit.record(session, project.id, principal, "mcpserver.version.rollback", name, {"version": version})

        await self.db.run(point_and_audit)
        return models.McpVersionRollback(
            server=name, version=version, image=image.image, rolled_back=True,
            note="the server now serves the recorded image of this version; nothing was rebuilt",
        )

    async def _set_yanked(self, principal: Principal, project: ProjectRef, name: str, version: int, yanked: bool) -> models.McpVersionYank:
        def run(session: Session) -> models.McpVersionYank:
            server = self._server(session, project.id, name)
            record = self._version(session, server.id, version)
            if record is None:
                raise NotFound("no such version")
            if yanked and server.current_version == version:
                raise Conflict(f"cannot yank version {version}: it is the running version (roll to another first)")
            if yanked and server.selected_version == version:
                raise Conflict(f"cannot yank version {version}: it is the current version (roll to another first)")
            record.yanked = yanked
            record.yanked_at = self.clock.now() if yanked else None
            action = "mcpserver.version.yank" if yanked else "mcpserver.version.unyank"
            self.audit.record(session, project.id, principal, action, name, {"version": version})
            answer = models.McpVersionYank if yanked else models.McpVersionUnyank
            return answer(server=name, version=version, yanked=yanked)

        return await self.db.run(run)


#: the platform's own route to a hosted server: `<api>/mcp/<project short>/<server>/<the server's path>`
MCP_ROUTE_PREFIX = "/mcp/"


def platform_route(api_url: str, project_short: str, name: str) -> str:
    """The `url` handed to MCP clients where the host serves on a replica's own loopback port: the
    platform's route to the server, the same whichever replica runs it and across its versions."""
    return f"{api_url.rstrip('/')}{MCP_ROUTE_PREFIX}{project_short}/{name}/mcp"
