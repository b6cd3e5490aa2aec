"""Conformance suite of the relational persistence port (SQLite and PostgreSQL through SQLAlchemy).

Each test takes a `database_factory` fixture: a zero-argument callable returning a `Database` on the
same storage every time it is called (so a second call is "the server restarted").
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError

from caiplatform.db import Database
from caiplatform.db.models import Org, Project, ProjectMember, User


def _org(slug: str) -> Org:
    return Org(slug=slug, name=slug.title(), created_at=datetime.now(UTC))


def _head_revisions() -> set[str]:
    from importlib.resources import files

    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(files("caiplatform.db") / "migrations"))
    return set(ScriptDirectory.from_config(config).get_heads())


def _applied_revisions(db: Database) -> set[str]:
    return set(db.run_sync(lambda s: s.scalars(text("SELECT version_num FROM alembic_version")).all()))


def test_migrate_is_idempotent(database_factory):
    """Migrating a migrated database again changes neither its schema, its revision nor its rows."""
    db: Database = database_factory()
    db.run_sync(lambda s: s.add(_org("before-remigrate")))
    tables = set(inspect(db.engine).get_table_names())
    assert _applied_revisions(db) == _head_revisions()
    db.migrate()
    db.migrate()
    assert set(inspect(db.engine).get_table_names()) == tables
    assert _applied_revisions(db) == _head_revisions()
    rows = db.run_sync(lambda s: s.scalars(select(Org.slug).where(Org.slug == "before-remigrate")).all())
    assert rows == ["before-remigrate"]


def test_a_failed_transaction_changes_nothing(database_factory):
    db: Database = database_factory()

    def half_then_fail(session):
        session.add(_org("half-done"))
        session.flush()
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        db.run_sync(half_then_fail)
    assert db.run_sync(lambda s: s.scalar(select(Org).where(Org.slug == "half-done"))) is None


def test_datetimes_round_trip_as_aware_utc(database_factory):
    db: Database = database_factory()
    moment = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    db.run_sync(lambda s: s.add(Org(slug="dt-check", name="x", created_at=moment)))
    back = db.run_sync(lambda s: s.scalar(select(Org).where(Org.slug == "dt-check")))
    assert back.created_at == moment and back.created_at.tzinfo is not None
    later = moment + timedelta(hours=1)
    found = db.run_sync(lambda s: s.scalars(select(Org).where(Org.created_at < later, Org.slug == "dt-check")).all())
    assert len(found) == 1


def test_unique_constraints_hold(database_factory):
    db: Database = database_factory()
    db.run_sync(lambda s: s.add(_org("unique-slug")))
    with pytest.raises(IntegrityError):
        db.run_sync(lambda s: s.add(_org("unique-slug")))


def test_check_constraints_hold(database_factory):
    db: Database = database_factory()
    now = datetime.now(UTC)
    with pytest.raises(IntegrityError):
        db.run_sync(lambda s: s.add(User(email="bad-role@example.com", password_hash="x", role="root", created_at=now)))


def test_foreign_keys_cascade(database_factory):
    db: Database = database_factory()
    now = datetime.now(UTC)

    def setup(session):
        org = _org("cascade-org")
        session.add(org)
        session.flush()
        project = Project(org_id=org.id, slug="cascade-p", name="p", short="cscd01", created_at=now, settings={"a": [1]})
        user = User(email="cascade@example.com", password_hash="x", role="user", created_at=now)
        session.add_all([project, user])
        session.flush()
        session.add(ProjectMember(project_id=project.id, user_id=user.id, role="member", created_at=now))
        return project.id, user.id

    project_id, user_id = db.run_sync(setup)
    db.run_sync(lambda s: s.delete(s.get(User, user_id)))
    rows = db.run_sync(lambda s: s.scalars(select(ProjectMember).where(ProjectMember.project_id == project_id)).all())
    assert rows == []


def test_json_columns_round_trip(database_factory):
    db: Database = database_factory()
    now = datetime.now(UTC)

    def setup(session):
        org = _org("json-org")
        session.add(org)
        session.flush()
        session.add(Project(org_id=org.id, slug="json-p", name="p", short="json01", created_at=now, settings={"q": {"pods": 50}}))

    db.run_sync(setup)
    project = db.run_sync(lambda s: s.scalar(select(Project).where(Project.slug == "json-p")))
    assert project.settings == {"q": {"pods": 50}}


@pytest.mark.notimpl(["sqlite-memory"], reason="an in-memory database does not outlive its process by design")
def test_committed_state_survives_a_restart(database_factory):
    db: Database = database_factory()
    db.run_sync(lambda s: s.add(_org("survivor")))
    db.dispose()
    again: Database = database_factory()
    again.migrate()
    assert again.run_sync(lambda s: s.scalar(select(Org).where(Org.slug == "survivor"))) is not None


def test_deleting_a_project_cascades_to_grants_keys_and_service_accounts(database_factory):
    """The identity services delete a project (or an account) with one DELETE and rely on the database
    to remove what hangs off it, on every backend."""
    from caiplatform.db.models import ApiKey, Invitation, ServiceAccount

    db: Database = database_factory()
    now = datetime.now(UTC)

    def build(session):
        org = _org("cascade-org")
        session.add(org)
        session.flush()
        project = Project(org_id=org.id, slug="cascade-p", name="P", short="cascad", created_at=now, settings={})
        user = User(email="cascade@example.com", password_hash="x", role="user", org_id=org.id, created_at=now)
        session.add_all([project, user])
        session.flush()
        sa = ServiceAccount(project_id=project.id, name="bot", created_at=now)
        session.add(sa)
        session.flush()
        session.add_all([
            ProjectMember(project_id=project.id, user_id=user.id, role="admin", created_at=now),
            ProjectMember(project_id=project.id, service_account_id=sa.id, role="member", created_at=now),
            ApiKey(key_id="cascadekey01", secret_hash="h", kind="service_account", service_account_id=sa.id,
                   project_id=project.id, created_at=now),
            ApiKey(key_id="cascadekey02", secret_hash="h", kind="personal", user_id=user.id, created_at=now),
            Invitation(project_id=project.id, email="i@example.com", role="member", token_hash="cascade-token",
                       created_at=now, expires_at=now),
        ])
        return project.id, user.id

    project_id, user_id = db.run_sync(build)
    db.run_sync(lambda s: s.delete(s.get(Project, project_id)))

    def left(session):
        return (
            session.scalars(select(ProjectMember).where(ProjectMember.project_id == project_id)).all(),
            session.scalars(select(ServiceAccount).where(ServiceAccount.project_id == project_id)).all(),
            session.scalars(select(ApiKey).where(ApiKey.key_id == "cascadekey01")).all(),
            session.scalars(select(Invitation).where(Invitation.project_id == project_id)).all(),
        )

    assert left_all_empty(db.run_sync(left))
    db.run_sync(lambda s: s.delete(s.get(User, user_id)))
    assert db.run_sync(lambda s: s.scalars(select(ApiKey).where(ApiKey.key_id == "cascadekey02")).all()) == []


def left_all_empty(groups) -> bool:
    return all(len(group) == 0 for group in groups)
