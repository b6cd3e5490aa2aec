"""Search across what a caller can see (`GET /v1/search`), from a registry of sources.

A source is an async function `(principal, query, grants) -> list[result]` registered under a `kind`.
The service resolves the caller's grants once and hands each source only the projects it may look
into: the `project` source sees every visible project (metadata), content sources (`service_account`,
`secret`, `mcp_server`, and `agent`, `function`, `service` which their areas register) only the
projects where the caller holds resource authority. Secrets match by name only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.db import Database
from caiplatform.db.models import McpServer, ServiceAccount
from caiplatform.models.accounts import SearchResult, SearchResults
from caiplatform.pagination import Pager
from caiplatform.principal import Principal
from caiplatform.services.access import Access, ProjectGrant

log = logging.getLogger(__name__)

SearchFn = Callable[[Principal, str, list[ProjectGrant]], Awaitable[list[SearchResult]]]
KIND_ORDER = ("project", "agent", "function", "service", "mcp_server", "service_account", "secret")


def result(kind: str, name: str, grant: ProjectGrant, route: str, subtitle: str = "") -> SearchResult:
    """One result; `kind` is one of `SearchKind` (a source of another kind is a bug, refused here)."""
    return SearchResult.of({"kind": kind, "name": name, "project": grant.project.slug,
                            "project_short": grant.project.short, "route": route, "subtitle": subtitle})


@dataclass(frozen=True)
class SearchSource:
    kind: str
    search: SearchFn
    contents: bool  # True: only projects where the caller holds resource authority


class SearchService:
    def __init__(self, db: Database, access: Access, pager: Pager):
        self.db = db
        self.access = access
        self.pager = pager
        self.sources: dict[str, SearchSource] = {}

    def register(self, kind: str, search: SearchFn, *, contents: bool = True) -> None:
        self.sources[kind] = SearchSource(kind, search, contents)

    async def search(
        self,
        principal: Principal,
        q: str | None,
        project: str | None = None,
        page_size: int | str | None = None,
        page_token: str | None = None,
    ) -> SearchResults:
        self.access.require_management(principal)
        query = (q or "").strip().lower()
        request = self.pager.request(f"search:{query}:{project or ''}", page_size, page_token)
        grants = await self.db.run(lambda s: self.access.visible_projects_sync(s, principal))
        if project:
            grants = [g for g in grants if project in (g.project.slug, g.project.short, g.project.id)]
        results: list[SearchResult] = []
        if query:
            for source in self.sources.values():
                allowed = [g for g in grants if g.resource_role] if source.contents else grants
                if not allowed:
                    continue
                try:
                    results.extend(await source.search(principal, query, allowed))
                except Exception:  # noqa: BLE001 - one unreachable source must not hide the others
                    log.exception("search source %s failed", source.kind)
        rank = {k: i for i, k in enumerate(KIND_ORDER)}
        results.sort(key=lambda r: (rank.get(r.kind, len(rank)), r.project, r.name))
        page = self.pager.page(results, request)
        return SearchResults(results=page.items, next_page_token=page.next_page_token)


# -- the sources of the identity area and of tables that exist today --------------------------------


def project_source(db: Database) -> SearchFn:
    async def search(_principal: Principal, query: str, grants: list[ProjectGrant]) -> list[SearchResult]:
        return [
            result("project", g.project.slug, g, f"/projects/{g.project.slug}", g.project.name)
            for g in grants
            if query in g.project.slug.lower() or query in g.project.name.lower()
        ]

    return search


def service_account_source(db: Database) -> SearchFn:
    async def search(_principal: Principal, query: str, grants: list[ProjectGrant]) -> list[SearchResult]:
        by_id = {g.project.id: g for g in grants}

        def fetch(session: Session) -> list[SearchResult]:
            rows = session.scalars(
                select(ServiceAccount).where(ServiceAccount.project_id.in_(by_id), ServiceAccount.deleted_at.is_(None))
            )
            return [
                result(
                    "service_account", sa.name, by_id[sa.project_id],
                    f"/projects/{by_id[sa.project_id].project.slug}/service-accounts/{sa.name}",
                    sa.display_name or f"{sa.name}@{by_id[sa.project_id].project.short}.cai.local",
                )
                for sa in rows
                if query in sa.name.lower() or query in (sa.display_name or "").lower()
            ]

        return await db.run(fetch)

    return search


def rows_source(
    db: Database, kind: str, model: Any, route: str, *, where: tuple[Any, ...] = (),
    subtitle: Callable[[Any], str] = lambda _row: "",
) -> SearchFn:
    """A content source over one table whose rows have `project_id` and `name` (MCP servers, agents,
    functions, serverless services): a row matches when the query is part of its name."""

    async def search(_principal: Principal, query: str, grants: list[ProjectGrant]) -> list[SearchResult]:
        by_id = {g.project.id: g for g in grants}

        def fetch(session: Session) -> list[SearchResult]:
            rows = session.scalars(select(model).where(model.project_id.in_(by_id), *where))
            return [
                result(
                    kind, row.name, by_id[row.project_id],
                    f"/projects/{by_id[row.project_id].project.slug}/{route}/{row.name}", subtitle(row),
                )
                for row in rows
                if query in row.name.lower()
            ]

        return await db.run(fetch)

    return search


def mcp_server_source(db: Database) -> SearchFn:
    return rows_source(db, "mcp_server", McpServer, "mcpservers", subtitle=lambda s: s.status or "pending")


def secret_source(list_names: Callable[[str], Awaitable[list[str]]]) -> SearchFn:
    """Secrets match by name only; the values never leave the store."""

    async def search(_principal: Principal, query: str, grants: list[ProjectGrant]) -> list[SearchResult]:
        found: list[SearchResult] = []
        for grant in grants:
            for name in await list_names(grant.project.id):
                if query in name.lower():
                    found.append(result("secret", name, grant, f"/projects/{grant.project.slug}/secrets/{name}", "secret"))
        return found

    return search
