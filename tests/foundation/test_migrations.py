"""The Alembic migrations and the models describe the same schema."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

import caiplatform.db.models  # noqa: F401
from caiplatform.db import Base, Database


def test_migrations_match_the_models(tmp_path):
    db = Database.sqlite_file(tmp_path / "m.db")
    db.migrate()
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"models and migrations differ; add a migration: {diff}"


def test_mcp_selected_version_is_filled_in_for_servers_that_exist(tmp_path):
    """0100: a build under way or failed was the last publish (the newest version); else what serves."""
    from importlib.resources import files

    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    db = Database.sqlite_file(tmp_path / "m.db")
    config = Config()
    config.set_main_option("script_location", str(files("caiplatform.db") / "migrations"))
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0090_serverless")
        connection.execute(text("INSERT INTO orgs (id, slug, name, created_at) VALUES ('o', 'o', 'o', '2026-01-01 00:00:00')"))
        connection.execute(text(
            "INSERT INTO projects (id, org_id, slug, name, short, created_at, settings)"
            " VALUES ('p', 'o', 'p', 'p', 'p', '2026-01-01 00:00:00', '{}')"
        ))
        for server, status, running, versions in (("ready", "ready", 1, 2), ("failed", "failed", 1, 2),
                                                  ("building", "building", None, 1)):
            connection.execute(text(
                "INSERT INTO mcp_servers (id, project_id, name, expose, status, message, current_version, url, token,"
                " created_at) VALUES (:id, 'p', :id, '', :status, '', :running, '', 't', '2026-01-01 00:00:00')"
            ), {"id": server, "status": status, "running": running})
            for version in range(1, versions + 1):
                connection.execute(text(
                    "INSERT INTO mcp_versions (server_id, version, build_id, tools, credential_keys, image,"
                    " image_digest, yanked, created_at) VALUES (:id, :v, 'b', '[]', '[]', '', '', 0, '2026-01-01 00:00:00')"
                ), {"id": server, "v": version})
    db.migrate()
    with db.engine.connect() as connection:
        selected = dict(connection.execute(text("SELECT id, selected_version FROM mcp_servers")).all())
    assert selected == {"ready": 1, "failed": 2, "building": 1}


def test_agent_secrets_are_sealed_by_0140_and_opened_by_its_downgrade(tmp_path):
    """0140 (issue 34): the plain-text values of existing agent secrets are sealed with the platform's key;
    a database with secrets refuses the migration without a key; the downgrade opens them again."""
    from importlib.resources import files

    import pytest
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from caiplatform.secret_box import SecretBox, is_sealed

    db = Database.sqlite_file(tmp_path / "m.db")
    config = Config()
    config.set_main_option("script_location", str(files("caiplatform.db") / "migrations"))
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0130_agent_build_log")
        connection.execute(text("INSERT INTO orgs (id, slug, name, created_at) VALUES ('o', 'o', 'o', '2026-01-01 00:00:00')"))
        connection.execute(text(
            "INSERT INTO projects (id, org_id, slug, name, short, created_at, settings)"
            " VALUES ('p', 'o', 'p', 'p', 'p', '2026-01-01 00:00:00', '{}')"))
        connection.execute(text(
            "INSERT INTO agents (id, project_id, name, kind, framework, owner_email, state, message, image,"
            " latest_revision, generation, env, config, external_url, created_at, updated_at) VALUES ('a', 'p', 'a',"
            " 'agent', 'langgraph', '', 'ready', '', '', '', 0, '{}', '{}', '', '2026-01-01 00:00:00',"
            " '2026-01-01 00:00:00')"))
        connection.execute(text("INSERT INTO platform_settings (key, value) VALUES ('model_api_key', 'plain-model-key')"))
        for key, value in (("API_TOKEN", "plain-api-token"), ("EMPTYISH", " ")):
            connection.execute(text("INSERT INTO agent_secrets (agent_id, key, value) VALUES ('a', :k, :v)"),
                               {"k": key, "v": value})
    with pytest.raises(RuntimeError, match="CAI_SECRETS_KEY"):
        db.migrate()  # no key: the rows stay as they are, the migration does not pretend
    box = SecretBox(b"the-platform-key")
    db.migrate(secret_box=box)
    with db.engine.connect() as connection:
        rows = dict(connection.execute(text("SELECT key, value FROM agent_secrets")).all())
    assert all(is_sealed(v) and "plain-api-token" not in v for v in rows.values()), rows
    assert {k: box.open(v) for k, v in rows.items()} == {"API_TOKEN": "plain-api-token", "EMPTYISH": " "}
    with db.engine.connect() as connection:
        model_key = connection.execute(text("SELECT value FROM platform_settings WHERE key = 'model_api_key'")).scalar()
    assert is_sealed(model_key) and box.open(model_key) == "plain-model-key"
    with db.engine.begin() as connection:
        config.attributes.update(connection=connection, secret_box=box)
        command.downgrade(config, "0130_agent_build_log")
        assert dict(connection.execute(text("SELECT key, value FROM agent_secrets")).all()) == {
            "API_TOKEN": "plain-api-token", "EMPTYISH": " "}
        assert connection.execute(text("SELECT value FROM platform_settings WHERE key = 'model_api_key'")).scalar() == \
            "plain-model-key"


def test_a_wrong_key_is_named_not_an_integrity_error():
    from caiplatform.secret_box import SecretBox, SecretKeyMismatch

    sealed = SecretBox(b"one").seal("value")
    assert SecretBox(b"one").open(sealed) == "value"
    try:
        SecretBox(b"two").open(sealed)
    except SecretKeyMismatch as exc:
        assert "another key" in str(exc) and "CAI_SECRETS_KEY" in str(exc)
    else:
        raise AssertionError("another key opened the secret")
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    try:
        SecretBox(b"one").open(tampered)
    except SecretKeyMismatch as exc:
        assert "integrity" in str(exc)
    else:
        raise AssertionError("a changed value opened")


def test_a_current_schema_is_told_without_alembic_and_an_older_one_is_migrated(tmp_path):
    """A restart reads `alembic_version` against the package's heads (`migration_heads`, read from the
    scripts) and skips Alembic only when they are the same; the heads are Alembic's own."""
    from importlib.resources import files

    from alembic import command
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from caiplatform.db.database import migration_heads

    config = Config()
    config.set_main_option("script_location", str(files("caiplatform.db") / "migrations"))
    assert migration_heads() == frozenset(ScriptDirectory.from_config(config).get_heads())
    db = Database.sqlite_file(tmp_path / "m.db")
    assert not db.schema_is_current()  # no version table yet
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0090_serverless")
    assert not db.schema_is_current()
    db.migrate()
    assert db.schema_is_current()
    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
