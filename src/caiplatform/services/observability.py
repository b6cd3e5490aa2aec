"""Who may read `GET /metrics` (docs/observability.md, docs/decisions.md "Prometheus metrics").

Anonymous callers read it when the server listens on loopback only (`caiplatform serve --host 127.0.0.1`,
the default) or when the operator opted in (`CAI_METRICS_PUBLIC=true`); otherwise, and whenever the bind is
unknown (a platform built in process), it takes a platform admin's credential or the automation token,
checked as every platform-wide route checks them (`Access.require_platform_admin`).
"""

from __future__ import annotations

import ipaddress

from caiplatform.errors import Unauthenticated
from caiplatform.metrics import Metrics
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import Access
from caiplatform.settings import Settings

METRICS_AUTH_REQUIRED = ("/metrics requires a platform admin's credential or the automation token on a "
                         "non-loopback bind (or CAI_METRICS_PUBLIC=true)")


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ObservabilityService:
    def __init__(self, metrics: Metrics, access: Access, settings: Settings):
        self.metrics = metrics
        self.access = access
        self.settings = settings

    @property
    def anonymous_allowed(self) -> bool:
        return self.settings.metrics_public or is_loopback(self.settings.bind_host)

    async def scrape(self, principal: Principal) -> bytes:
        """The Prometheus text exposition, for a caller allowed to read it."""
        if not self.anonymous_allowed:
            if not principal.authenticated:
                raise Unauthenticated(METRICS_AUTH_REQUIRED)
            if principal.kind is not PrincipalKind.INTERNAL:
                await self.access.require_platform_admin(principal)
        return self.metrics.exposition()
