"""Serverless services accepted through another replica, served here too.

Every replica of a platform on one shared database runs its own workload runtime (the local runtime
runs instances as processes of the replica; Kubernetes would be one runtime for all). A service is
created, changed or deleted through one replica, which applies it to its runtime at once; every other
replica follows within `FOLLOW_SECONDS`: it hands its runtime the revisions it does not know yet and the
traffic split, routes the service's public and private hostnames (push delivery), and removes what was
deleted. A replica that cannot run a revision (its image is not in this replica's builder) leaves it out
without recording anything: the replica that accepted the revision recorded its readiness.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.db.models import Project
from caiplatform.db.models.serverless import ServerlessRevision
from caiplatform.db.models.serverless import ServerlessService as ServiceRow
from caiplatform.domain.serverless import ServiceSpec
from caiplatform.periodic import PeriodicWork
from caiplatform.services.access import ProjectRef

if TYPE_CHECKING:
    from caiplatform.services.serverless import ServerlessService

log = logging.getLogger(__name__)

FOLLOW_SECONDS = 3.0


class ServiceFollower(PeriodicWork):
    name = "serverless-follower"

    def __init__(self, service: ServerlessService, interval: float = FOLLOW_SECONDS):
        super().__init__(interval)
        self.service = service
        self._seen: dict[str, tuple[ProjectRef, str, int]] = {}  # workload key → (project, name, generation)

    async def round(self) -> None:
        await self.follow()

    async def follow(self) -> None:
        """One round: serve what changed since the last one, drop what was deleted."""
        svc = self.service

        def read(session: Session) -> list[tuple[ProjectRef, ServiceRow, list[ServerlessRevision]]]:
            out = []
            for row in session.scalars(select(ServiceRow)):
                project = session.get(Project, row.project_id)
                if project is not None:
                    out.append((ProjectRef.of(project), row, svc._revisions_sync(session, row.id)))
            return out

        present: set[str] = set()
        for project, row, revisions in await svc.db.run(read):
            key = svc.ref(project, row.name).key
            present.add(key)
            seen = self._seen.get(key)
            if seen is not None and seen[2] == row.generation:
                continue
            try:
                await self._serve(project, row, revisions)
            except Exception:  # noqa: BLE001 - one service must not stop the others
                log.exception("serverless: could not serve %s here", row.name)
                continue
            self._seen[key] = (project, row.name, row.generation)
        for key in [k for k in self._seen if k not in present]:
            project, name, _ = self._seen.pop(key)
            await svc.runtime.delete(svc.ref(project, name))
            svc.hosts.unregister(svc.hosts.host_for(name, project.short))
            svc._route_internal(project, name, False)

    async def _serve(self, project: ProjectRef, row: ServiceRow, revisions: list[ServerlessRevision]) -> None:
        svc = self.service
        ref = svc.ref(project, row.name)
        spec = ServiceSpec.model_validate(row.spec)
        if svc.runtime.shared:  # a cluster: the replica that rolled the revision applied it for every replica
            svc._publish(project, spec)
            svc._route_internal(project, row.name, True)
            return
        status = await svc.runtime.status(ref)
        known = {r.name for r in status.revisions} if status is not None else set()
        for revision in reversed(revisions):  # oldest first: the newest ends as the runtime's latest
            if revision.reason or await svc._problem(project, revision.template) is not None:
                continue
            spec_of_revision = svc.revision_spec(project, row.name, revision.number, revision.template,
                                                 await self._secret_env(project, revision.template))
            if spec_of_revision.revision not in known:
                await svc.runtime.apply(spec_of_revision, None)
        if svc._runnable(spec, revisions):
            await svc._push_traffic(project, row.name, spec)
        svc._publish(project, spec)
        svc._route_internal(project, row.name, True)

    async def _secret_env(self, project: ProjectRef, template: dict[str, Any]) -> dict[str, str]:
        return await self.service._secret_env(project, template)
