"""The owner gate's read in one statement, for the callers that make most management calls: a person's
credential (session token or personal key), the automation token and the platform itself, without
`?project=`.

What the ORM path (`AgentBase._visible_candidates_sync`) reads in four statements and an ORM session, this
reads in one Core statement on a pooled connection: the agents of that name with their project, the
caller's platform role, whether they administer the project's org, and their grants on the project (an
outer join: one row per grant). The rules that turn these facts into a grant are `access.user_grant`,
shared with the ORM path, so both paths answer alike.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, and_, bindparam, exists, select
from sqlalchemy.engine import Connection

from caiplatform.db.models import OrgMember, Project, ProjectMember, User
from caiplatform.db.models.agents import Agent
from caiplatform.db.prepared import PreparedRead
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import ProjectGrant, ProjectRef, user_grant

#: The callers this read serves; any other (service accounts, workload keys) takes the ORM path.
LEAN_KINDS = (PrincipalKind.USER, PrincipalKind.AUTOMATION, PrincipalKind.INTERNAL)

class AgentRow:
    """The agent columns of a candidate row, under the attribute names `AgentRecord.of` reads."""

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

    def __init__(self, row: Any):
        for f in _RECORD_FIELDS:
            setattr(self, f, getattr(row, f))


# The agent columns the statement selects: the row class's attributes, named once.
_RECORD_FIELDS = tuple(AgentRow.__annotations__)
_PROJECT_FIELDS = ("id", "org_id", "slug", "name", "short")
_USER: BindParameter[str] = bindparam("user_id")

# Built once, compiled once per dialect (`PreparedRead`): per call only the parameters change.
CANDIDATES = PreparedRead(
    select(
        *(getattr(Agent, f) for f in _RECORD_FIELDS),
        *(getattr(Project, f).label(f"project_{f}") for f in _PROJECT_FIELDS),
        select(User.role).where(User.id == _USER).scalar_subquery().label("user_role"),
        exists().where(OrgMember.org_id == Project.org_id, OrgMember.user_id == _USER,
                       OrgMember.role == "admin").label("org_admin"),
        ProjectMember.role.label("member_role"),
        ProjectMember.break_glass.label("member_break_glass"),
        ProjectMember.expires_at.label("member_expires_at"),
    )
    .join_from(Agent, Project, Project.id == Agent.project_id)
    .outerjoin(ProjectMember, and_(ProjectMember.project_id == Project.id, ProjectMember.user_id == _USER))
    .where(Agent.name == bindparam("name"))
    .order_by(Agent.id)
)


def named_agents(connection: Connection, name: str) -> list[tuple[AgentRow, ProjectRef]]:
    """Every agent named `name`, with its project: the invoke target of an anonymous caller, who sees every
    agent (the data plane is open by default). The same statement, without a user: one row per agent."""
    rows = CANDIDATES.all(connection, {"name": name, "user_id": None})
    return [(AgentRow(row), ProjectRef(*(getattr(row, f"project_{f}") for f in _PROJECT_FIELDS))) for row in rows]


def visible_candidates(connection: Connection, principal: Principal, name: str,
                       now: datetime) -> list[tuple[AgentRow, ProjectRef, ProjectGrant]]:
    """The agents named `name` in the projects the caller sees, each with the caller's grant there."""
    user_id = principal.user_id if principal.kind is PrincipalKind.USER else None
    rows = CANDIDATES.all(connection, {"name": name, "user_id": user_id})
    found: list[tuple[AgentRow, ProjectRef, ProjectGrant]] = []
    i = 0
    while i < len(rows):
        first, members = rows[i], []
        while i < len(rows) and rows[i].id == first.id:
            if rows[i].member_role is not None:
                members.append((rows[i].member_role, bool(rows[i].member_break_glass), rows[i].member_expires_at))
            i += 1
        ref = ProjectRef(*(getattr(first, f"project_{f}") for f in _PROJECT_FIELDS))
        if principal.kind is not PrincipalKind.USER:
            grant = ProjectGrant(ref, "admin", "admin")
        elif not user_id:
            grant = ProjectGrant(ref, None, None)
        else:
            grant = user_grant(ref, first.user_role == "admin", bool(first.org_admin), members, now)
        if grant.visible:
            found.append((AgentRow(first), ref, grant))
    return found
