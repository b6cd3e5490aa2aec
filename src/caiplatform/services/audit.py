"""The append-only audit log.

An audit write never fails the request it records: it runs in a savepoint whose failure is swallowed
(and logged). The one exception, secret reveal, uses `record_strict` so the caller can fail closed.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy.orm import Session

from caiplatform.clock import Clock
from caiplatform.db.models import AuditEntry
from caiplatform.principal import Principal, PrincipalKind

log = logging.getLogger(__name__)


def actor_of(principal: Principal | None) -> str:
    """Empty means the platform acted."""
    if principal is None:
        return ""
    if principal.email:
        return principal.email
    if principal.kind is PrincipalKind.AUTOMATION:
        return "automation-token"
    if principal.kind is PrincipalKind.WORKLOAD:
        return f"workload:{principal.project_id}"
    return ""


class AuditLog:
    def __init__(self, clock: Clock):
        self.clock = clock

    def _entry(self, project_id: str | None, principal: Principal | None, action: str, target: str, detail: Any) -> AuditEntry:
        text = detail if isinstance(detail, str) else json.dumps(detail, sort_keys=True, default=str) if detail else ""
        return AuditEntry(
            project_id=project_id, ts=self.clock.now(), actor=actor_of(principal), action=action, target=target, detail=text
        )

    def record(
        self, session: Session, project_id: str | None, principal: Principal | None, action: str, target: str = "", detail: Any = None
    ) -> None:
        try:
            with session.begin_nested():
                session.add(self._entry(project_id, principal, action, target, detail))
        except Exception:  # noqa: BLE001 - an audit failure must not fail the request it records
            log.exception("audit write failed for %s on %s", action, target)

    def record_strict(
        self, session: Session, project_id: str | None, principal: Principal | None, action: str, target: str = "", detail: Any = None
    ) -> None:
        with session.begin_nested():
            session.add(self._entry(project_id, principal, action, target, detail))
