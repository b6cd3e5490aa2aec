"""The owner gate's read in one statement: the agents of a name with their project and the caller's grant
there, for every caller without `?project=` (with it, `AgentBase._projects_sync` resolves the project by
slug, short or id first).

One Core statement on a pooled connection reads the agents of that name with their project, the caller's
platform role, whether they administer the project's org, and their grants on the project (an outer join:
one row per grant), the columns of the project gate (`access.GATE_COLUMNS`). The grant is the project
gate's own (`Access.gate_grant_sync`: `access.user_grant` for a person, a service account's grant read as
every gate reads it), so the owner gate and the project gate answer alike.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol, cast

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from caiplatform.db.models import Project, ProjectMember
from caiplatform.db.models.agents import Agent
from caiplatform.db.prepared import PreparedRead
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import (
    GATE_COLUMNS,
    GATE_MEMBER_JOIN,
    Access,
    ProjectGrant,
    ProjectRef,
    gate_project,
)


class AgentRow(Protocol):
    """The agent columns of a candidate row, under the attribute names `AgentRecord.of` reads (the row
    itself: a `PreparedRead` row, read in place rather than copied into an object of its own)."""

    id: str
    name: str
    kind: str
    framework: str
    runtime: str | None
    owner_ref: str | None
    owner_email: str
    state: str
    message: str
    image: str
    latest_revision: str
    generation: int
    env: dict[str, Any]
    config: dict[str, Any]
    embed: dict[str, Any] | None
    external_url: str
    created_at: datetime
    updated_at: datetime


# The agent columns the statement selects: the row class's attributes, named once.
_RECORD_FIELDS = tuple(AgentRow.__annotations__)

# Built once, compiled once per dialect (`PreparedRead`): per call only the parameters change. The grant's
# columns and join are the project gate's own (`access.GATE_COLUMNS`), shared with messaging's gate.
CANDIDATES = PreparedRead(
    select(*(getattr(Agent, f) for f in _RECORD_FIELDS), *GATE_COLUMNS)
    .join_from(Agent, Project, Project.id == Agent.project_id)
    .outerjoin(ProjectMember, GATE_MEMBER_JOIN)
    .where(Agent.name == bindparam("name"))
    .order_by(Agent.id)
)


def named_agents(connection: Connection, name: str) -> list[tuple[AgentRow, ProjectRef]]:
    """Every agent named `name`, with its project: the invoke target of an anonymous caller, who sees every
    agent (the data plane is open by default). The same statement, without a user: one row per agent."""
    rows = CANDIDATES.all(connection, {"name": name, "grant_user": None})
    return [(cast(AgentRow, row), gate_project(row)) for row in rows]


def visible_candidates(connection: Connection, access: Access, principal: Principal, name: str,
                       now: datetime) -> list[tuple[AgentRow, ProjectRef, ProjectGrant]]:
    """The agents named `name` in the projects the caller sees, each with the caller's grant there."""
    user_id = principal.user_id if principal.kind is PrincipalKind.USER else None
    rows = CANDIDATES.all(connection, {"name": name, "grant_user": user_id})
    found: list[tuple[AgentRow, ProjectRef, ProjectGrant]] = []
    i = 0
    while i < len(rows):
        first, start = rows[i], i
        while i < len(rows) and rows[i].id == first.id:
            i += 1
        ref = gate_project(first)
        grant = access.gate_grant_sync(connection, principal, ref, rows[start:i], now)
        if grant.visible:
            found.append((cast(AgentRow, first), ref, grant))
    return found
