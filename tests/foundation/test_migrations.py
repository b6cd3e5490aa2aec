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
