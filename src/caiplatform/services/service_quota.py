"""The project services quota, one check for every area whose revisions become cluster services.

Document 3: each serverless revision permanently holds two cluster services against the project
services quota; agents and functions run as the same kind of revision (document 1). On Kubernetes the
ResourceQuota admission refuses the third object; on one machine nothing does, so the areas ask this
check before they hand a new revision to the workload runtime. "Used" is the runtime's
`usage(namespace)["services"]` (the number the quota view shows), "hard" the project's quota.

The check and the apply that follows run under one lock per project, shared by all areas (the
platform builds one `ServiceQuota`), so an agent and a service cannot both take the last places.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from caiplatform.domain.identity import FALLBACK_QUOTA, QUOTA_KEY
from caiplatform.quantity import parse_quantity

# A Knative revision keeps a public and a private Kubernetes service.
SERVICES_PER_REVISION = 2


class ServiceQuotaExceeded(Exception):
    """The project has fewer free service places than a new revision needs."""

    def __init__(self, used: int, hard: int, needed: int):
        super().__init__(f"services quota: {used} / {hard} used, {needed} needed")
        self.used, self.hard, self.needed = used, hard, needed


def services_hard(settings: dict[str, Any] | None) -> int:
    """The project's services quota; 0 means unlimited.

    A project created without the quota field gets the fallback of 60 (document 2, Limits), the same
    value the quota view reports; a quota without a `services` entry, or an unparsable one, is unlimited."""
    quota = (settings or {}).get(QUOTA_KEY) or FALLBACK_QUOTA
    if not isinstance(quota, dict) or quota.get("services") is None:
        return 0
    return parse_quantity("services", str(quota["services"]))


class ServiceQuota:
    def __init__(self, usage: Callable[[str], Awaitable[dict[str, int]]], *, enforced: bool = True):
        self.usage = usage
        # On one machine nothing else limits cluster services, and every revision ever rolled holds two
        # of them, so a project reaches the default quota after some 15 changes; the operator opts in
        # (`CAI_ENFORCE_SERVICE_QUOTA`). A cluster's own quota admission is always in force.
        self.enforced = enforced
        self._locks: dict[str, asyncio.Lock] = {}

    async def used(self, namespace: str) -> int:
        return int((await self.usage(namespace)).get("services", 0))

    async def check(self, namespace: str, hard: int, needed: int = SERVICES_PER_REVISION) -> None:
        """Raise `ServiceQuotaExceeded` when `needed` more services do not fit (a check without the lock,
        for refusing early, before any work)."""
        if hard <= 0 or not self.enforced:
            return
        used = await self.used(namespace)
        if used + needed > hard:
            raise ServiceQuotaExceeded(used, hard, needed)

    @contextlib.asynccontextmanager
    async def claim(self, project_id: str, namespace: str, hard: int,
                    needed: int = SERVICES_PER_REVISION) -> AsyncIterator[None]:
        """Check, then run the body (the apply) under the project's lock, so the places counted free
        are still free when the body takes them."""
        if hard <= 0 or not self.enforced:
            yield
            return
        async with self._locks.setdefault(project_id, asyncio.Lock()):
            await self.check(namespace, hard, needed)
            yield
