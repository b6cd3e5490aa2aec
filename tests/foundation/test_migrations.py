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
