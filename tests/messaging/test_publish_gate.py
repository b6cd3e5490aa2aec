"""The project gate (`Access.project_gate_sync`: the gate of every service, and of publish, pull and acknowledge with
the topic in the same prepared statement) must answer exactly as the gate read through the ORM did (the project,
then `Access.grant_sync`), for every kind of caller and grant: owner, member,
org admin, platform admin, break-glass active and expired, an outsider, a deleted account, service accounts
(granted, disabled, deleted, ungranted, of another project), the automation token and the platform itself;
for every need and axis; and for a project id that is malformed or names no project."""

from __future__ import annotations

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from caiplatform.db.models import (
    MessagingSubscription,
    MessagingTopic,
    Project,
    ProjectMember,
    ServiceAccount,
)
from caiplatform.errors import BadRequest, NotFound, PlatformError
from caiplatform.platform import Platform
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import PROJECT_ADMIN_REQUIRED, Axis, ProjectGrant, Role, _checked
from caiplatform.services.messaging_base import MessagingBase, subscription_of, topic_of
from caiplatform.services.messaging_delivery import _SUBSCRIPTION_GATE, _TOPIC_GATE
from caiplatform.validation import project_uuid
from tests.agents.test_agents_lookup import _build, _principals


def _service_accounts(platform, ids: dict[str, str]) -> dict[str, Principal]:
    now = platform.clock.now()
    made: dict[str, Principal] = {}

    def build(s: Session) -> None:
        for name, project, role, extra in (("sa-member", "P", "member", {}), ("sa-admin", "P", "admin", {}),
                                          ("sa-disabled", "P", "admin", {"disabled": True}),
                                          ("sa-deleted", "P", "member", {"deleted_at": now}),
                                          ("sa-ungranted", "P", None, {}), ("sa-q", "Q", "member", {})):
            sa = ServiceAccount(project_id=ids[project], name=name, created_at=now, **extra)
            s.add(sa)
            s.flush()
            if role:
                s.add(ProjectMember(project_id=ids[project], service_account_id=sa.id, role=role, created_at=now))
            made[name] = Principal(kind=PrincipalKind.SERVICE_ACCOUNT, service_account_id=sa.id,
                                   project_id=ids[project])

    platform.db.run_sync(build)
    return made


def _outcome(call) -> tuple:
    try:
        grant = call()
    except PlatformError as exc:
        return type(exc).__name__, exc.message
    return "ok", grant.project, grant.metadata_role, grant.resource_role


def _orm_gate(access, session: Session, principal: Principal, project_id: str, *, need: Role | None = Role.MEMBER,
              axis: Axis = Axis.RESOURCE, bad_id: type[PlatformError] = BadRequest) -> ProjectGrant:
    """The gate as it was read through the ORM: the project by id, then the caller's grant on it."""
    project = session.get(Project, project_uuid(project_id, bad_id))
    if project is None:
        raise NotFound("not found")
    return _checked(access.grant_sync(session, principal, project), need, axis, PROJECT_ADMIN_REQUIRED)


def test_the_gate_answers_as_the_orm_read(platform):
    _check(platform)


async def test_the_gate_answers_as_the_orm_read_on_postgres(settings, fresh_postgres_url, tmp_path, clock):
    platform = Platform.from_settings(settings.model_copy(update={"database_url": fresh_postgres_url,
                                                                  "data_dir": tmp_path}), clock=clock)
    await platform.start()
    try:
        _check(platform)
    finally:
        await platform.aclose()


def _check(platform) -> None:
    ids = _build(platform)
    principals = {**_principals(ids), **_service_accounts(platform, ids),
                  "user without id": Principal(kind=PrincipalKind.USER), "anonymous": Principal.anonymous(None)}
    access = platform.access
    seen = set()
    for who, principal in principals.items():
        for project_id in (ids["P"], ids["Q"], ids["P"].upper(), "00000000-0000-0000-0000-000000000000", "nope"):
            for need in (Role.MEMBER, Role.ADMIN, None):
                for axis in (Axis.RESOURCE, Axis.METADATA):
                    def old(s: Session, principal=principal, project_id=project_id, need=need, axis=axis) -> object:
                        return _orm_gate(access, s, principal, project_id, need=need, axis=axis, bad_id=NotFound)

                    def new(c: Connection, principal=principal, project_id=project_id, need=need, axis=axis) -> object:
                        grant, rows = access.project_gate_sync(c, principal, project_id, _TOPIC_GATE,
                                                               {"topic": "none"}, need=need, axis=axis,
                                                               bad_id=NotFound)
                        assert all(row.id is None for row in rows)
                        return grant

                    def alone(c: Connection, principal=principal, project_id=project_id, need=need,
                              axis=axis) -> object:
                        return access.project_gate_sync(c, principal, project_id, need=need, axis=axis,
                                                        bad_id=NotFound)[0]

                    expected = _outcome(lambda old=old: platform.db.read_session_sync(old))
                    assert _outcome(lambda new=new: platform.db.read_sync(new)) == expected, (
                        who, project_id, need, axis)
                    assert _outcome(lambda alone=alone: platform.db.read_sync(alone)) == expected, (
                        who, project_id, need, axis)
                    seen.add(expected[0])
    assert seen == {"ok", "NotFound", "Forbidden"}
    _check_topic(platform, ids["P"])


def _check_topic(platform, project_id: str) -> None:
    """A topic read by the gate is the topic the ORM reads (types converted as the dialect converts them)."""
    now = platform.clock.now()
    platform.db.run_sync(lambda s: s.add(MessagingTopic(
        project_id=project_id, name="orders", display_name="Orders", max_bytes="1Mi", max_bytes_value=1 << 20,
        max_age_seconds=90.5, discard="new", phase="Ready", created_at=now, updated_at=now)))
    automation = Principal.automation()

    def gate(c: Connection) -> object:
        grant, rows = platform.access.project_gate_sync(c, automation, project_id, _TOPIC_GATE,
                                                        {"topic": "orders"})
        return topic_of(rows[0], grant.project)

    def orm(s: Session) -> object:
        grant = _orm_gate(platform.access, s, automation, project_id)
        return topic_of(MessagingBase._topic_row(s, project_id, "orders"), grant.project)

    topic = platform.db.read_sync(gate)
    assert topic == platform.db.read_session_sync(orm)
    assert (topic.max_age_seconds, topic.max_bytes_value, topic.created_at) == (90.5, 1 << 20, now)

    def subscribe(s: Session) -> None:
        row = MessagingBase._topic_row(s, project_id, "orders")
        s.add(MessagingSubscription(
            project_id=project_id, topic_id=row.id, topic_name="orders", name="workers", display_name="W",
            type="key-shared", ack_deadline_seconds=30, max_deliver=7, start_from="new", max_ack_pending=50,
            deliver_mode="pull", push_url="", content_mode="binary", dead_letter_topic="", phase="Ready",
            dead_letter_after_attempts=5, created_at=now, updated_at=now))

    platform.db.run_sync(subscribe)

    def subscription_gate(c: Connection, topic: str, name: str) -> tuple:
        grant, rows = platform.access.project_gate_sync(c, automation, project_id, _SUBSCRIPTION_GATE,
                                                        {"topic": topic, "subscription": name})
        row = rows[0]
        found = subscription_of(row, grant.project.short) if row.id is not None else None
        return row.topic_row_id is not None, found

    def subscription_orm(s: Session) -> object:
        topic_row = MessagingBase._topic_row(s, project_id, "orders")
        return subscription_of(MessagingBase._sub_row(s, topic_row, "workers"),
                                         _orm_gate(platform.access, s, automation, project_id).project.short)

    assert platform.db.read_sync(lambda c: subscription_gate(c, "orders", "workers")) == (
        True, platform.db.read_session_sync(subscription_orm))
    assert platform.db.read_sync(lambda c: subscription_gate(c, "orders", "nobody")) == (True, None)
    assert platform.db.read_sync(lambda c: subscription_gate(c, "nothing", "workers")) == (False, None)
