"""The owner gate's one-statement read (`services/agents/lookup.py`) answers exactly as the gate did before it
(grants on every visible project read through the ORM, then the agents of that name there), for every kind of
caller and grant: owner, member, org admin, platform admin, break-glass active and expired, an outsider, a
deleted account, service accounts (granted, disabled, deleted, ungranted, of another project), the automation
token and the platform itself."""

from __future__ import annotations

import functools
from datetime import timedelta

from sqlalchemy.orm import Session

from caiplatform import security
from caiplatform.db.models import Org, OrgMember, Project, ProjectMember, User
from caiplatform.db.models.agents import Agent
from caiplatform.errors import PlatformError
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.agents.lookup import visible_candidates
from caiplatform.services.agents.records import AgentRecord
from caiplatform.services.auth import new_short

TWIN, SOLO, ORPHAN = "twin", "solo", "orphan"


def _build(platform) -> dict[str, str]:
    """Projects P (org A) and Q (org B); `twin` in both, `solo` in P only, `orphan` (no owner) in Q."""
    now = platform.clock.now()
    ids: dict[str, str] = {}

    def build(s: Session) -> None:
        org_a, org_b = Org(slug="org-a", name="A", created_at=now), Org(slug="org-b", name="B", created_at=now)
        s.add_all([org_a, org_b])
        s.flush()
        p = Project(org_id=org_a.id, slug="pp", name="P", short=new_short(s), created_at=now, settings={})
        s.add(p)
        s.flush()
        q = Project(org_id=org_b.id, slug="qq", name="Q", short=new_short(s), created_at=now, settings={})
        s.add(q)
        s.flush()

        def user(name: str, role: str = "user", org: Org = org_a, org_role: str | None = None) -> User:
            u = User(email=f"{name}@example.com", password_hash=security.dummy_password_hash(), role=role,
                     must_change_password=False, org_id=org.id, created_at=now)
            s.add(u)
            s.flush()
            if org_role:
                s.add(OrgMember(org_id=org.id, user_id=u.id, role=org_role, created_at=now))
            ids[name] = u.id
            return u

        def grant(project: Project, u: User, role: str, **extra: object) -> None:
            s.add(ProjectMember(project_id=project.id, user_id=u.id, role=role, created_at=now, **extra))

        owner, both, member = user("owner"), user("both"), user("member")
        user("orgadmin", org_role="admin")
        user("platadmin", role="admin")
        user("outsider")
        glass, stale = user("glass", role="admin"), user("stale", role="admin")
        grant(p, owner, "member")
        grant(p, both, "member")
        grant(q, both, "admin")
        grant(p, member, "member")
        grant(q, member, "member")
        grant(q, glass, "admin", break_glass=True, expires_at=now + timedelta(minutes=30))
        grant(p, stale, "admin", break_glass=True, expires_at=now - timedelta(minutes=1))
        grant(q, stale, "member")

        def agent(project: Project, name: str, owner_ref: str | None) -> None:
            s.add(Agent(project_id=project.id, name=name, kind="function", framework="function",
                        owner_ref=owner_ref, created_at=now, updated_at=now))

        agent(p, TWIN, f"user:{owner.id}")
        agent(q, TWIN, f"user:{both.id}")
        agent(p, SOLO, f"user:{both.id}")
        agent(q, ORPHAN, None)
        ids.update(P=p.id, Q=q.id)

    platform.db.run_sync(build)
    return ids


def _principals(ids: dict[str, str]) -> dict[str, Principal]:
    people = {name: Principal(kind=PrincipalKind.USER, user_id=ids[name], email=f"{name}@example.com")
              for name in ("owner", "both", "member", "orgadmin", "platadmin", "glass", "stale", "outsider")}
    people["deleted"] = Principal(kind=PrincipalKind.USER, user_id="00000000-0000-0000-0000-000000000000")
    return {**people, "automation": Principal.automation(), "internal": Principal.internal()}


async def _outcome(call) -> tuple:
    try:
        record: AgentRecord = await call()
    except PlatformError as exc:
        return type(exc).__name__, exc.message
    return "ok", record.id, record.project.id, record.project.slug, record.owner_ref


def _grants(found) -> list[tuple]:
    return sorted((p.id, a.id, g.metadata_role, g.resource_role) for a, p, g in found)


async def _compare(platform, who: str, principal: Principal, name: str) -> None:
    agents = platform.agents
    now = platform.clock.now()
    lean = platform.db.read_sync(lambda c: visible_candidates(c, platform.access, principal, name, now))
    before = platform.db.read_session_sync(
        lambda s: agents._candidates_sync(s, agents._projects_sync(s, principal, None), name))
    assert _grants(lean) == _grants(before), (who, name)

    def gate(session: Session) -> AgentRecord:
        agent, project, _ = agents._locate_sync(session, principal, name, None)
        return AgentRecord.of(agent, project)

    async def orm_gate() -> AgentRecord:
        return platform.db.read_session_sync(gate)

    assert await _outcome(lambda: agents._locate(principal, name, None)) == await _outcome(orm_gate), (who, name)


async def test_the_lean_read_answers_as_the_orm_path_and_as_before(platform):
    from tests.messaging.test_publish_gate import _service_accounts

    ids = _build(platform)
    callers = {**_principals(ids), **_service_accounts(platform, ids)}
    for who, principal in callers.items():
        for name in (TWIN, SOLO, ORPHAN, "missing"):
            await _compare(platform, who, principal, name)


async def test_the_gate_picks_the_callers_own_agent_and_refuses_the_rest(platform):
    ids = _build(platform)
    principals = _principals(ids)
    locate = platform.agents._locate
    assert (await _outcome(lambda: locate(principals["owner"], TWIN, None)))[2] == ids["P"]
    assert (await _outcome(lambda: locate(principals["glass"], TWIN, None)))[2] == ids["Q"]  # break-glass admin in Q
    assert (await _outcome(lambda: locate(principals["both"], TWIN, None)))[2] == ids["Q"]  # P's is someone else's
    assert await _outcome(lambda: locate(principals["stale"], TWIN, None)) == ("NotFound", "unknown agent: twin")
    assert await _outcome(lambda: locate(principals["member"], TWIN, None)) == ("NotFound", "unknown agent: twin")
    assert await _outcome(lambda: locate(principals["outsider"], SOLO, None)) == ("NotFound", "unknown agent: solo")
    assert (await _outcome(lambda: locate(principals["member"], ORPHAN, None)))[0] == "Forbidden"
    assert (await _outcome(lambda: locate(principals["automation"], TWIN, None)))[0] == "Conflict"
    assert (await _outcome(lambda: locate(principals["automation"], TWIN, "qq")))[2] == ids["Q"]


async def _target_outcome(pending) -> tuple:
    try:
        target = await pending
    except PlatformError as exc:
        return type(exc).__name__, exc.message
    return "ok", target.agent_id, target.project_id, target.project_short, target.kind


async def test_the_invoke_targets_lean_read_answers_as_the_orm_path(platform):
    """`invoke_target` without `?project=`: one Core statement for people, the automation token, the platform
    and anonymous callers; the same answer as the ORM reads it replaced (visible projects, then the agents
    of that name there; every agent of that name for an anonymous caller)."""
    ids = _build(platform)
    agents = platform.agents
    principals = {**_principals(ids), "anonymous": Principal.anonymous("127.0.0.1")}

    def before(principal: Principal, name: str):
        def read(s: Session):
            if principal.authenticated:
                return [(a, p) for a, p, _ in agents._candidates_sync(s, agents._projects_sync(s, principal, None), name)]
            return [(a, p) for a in s.query(Agent).filter(Agent.name == name)
                    for p in [s.get(Project, a.project_id)]]

        async def target():
            return agents._one_target(name, platform.db.read_session_sync(read))

        return target()

    for who, principal in principals.items():
        for name in (TWIN, SOLO, ORPHAN, "missing"):
            expected = await _target_outcome(before(principal, name))
            got = await _target_outcome(agents.invoke_target(principal, name, None))
            assert got == expected, (who, name)
            prefetched = platform.db.read_sync(functools.partial(agents.gate_read(name, None).run, principal=principal))
            assert await _target_outcome(agents.invoke_target(principal, name, None, prefetched)) == expected


async def test_a_prefetched_target_counts_only_for_its_own_caller(platform):
    ids = _build(platform)
    principals = _principals(ids)
    agents = platform.agents
    theirs = platform.db.read_sync(functools.partial(agents.gate_read(SOLO, None).run, principal=principals["both"]))
    # The outsider does not see `solo`: read again for them rather than taking someone else's outcome.
    got = await _target_outcome(agents.invoke_target(principals["outsider"], SOLO, None, theirs))
    assert got == ("NotFound", "unknown agent: solo")
    assert (await _target_outcome(agents.invoke_target(principals["both"], SOLO, None, theirs)))[0] == "ok"  # it sees `solo`
