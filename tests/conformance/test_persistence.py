"""The persistence conformance suite on every relational backend."""

from __future__ import annotations

import pytest

from caiplatform.db import Database
from caiplatform.testing.conformance.memorystore import apply_notimpl
from caiplatform.testing.conformance.persistence import *  # noqa: F403 - the shared suite


@pytest.fixture(params=["sqlite-memory", "sqlite-file", "postgres"])
def database_factory(request, tmp_path):
    apply_notimpl(request, request.param)
    opened: list[Database] = []
    if request.param == "sqlite-memory":
        shared = Database.in_memory()

        def factory() -> Database:
            return shared

    elif request.param == "sqlite-file":
        path = tmp_path / "platform.db"

        def factory() -> Database:
            db = Database.sqlite_file(path)
            opened.append(db)
            return db
    else:
        url = request.getfixturevalue("fresh_postgres_url")  # fails with how to start PostgreSQL when it is down

        def factory() -> Database:
            db = Database(url)
            opened.append(db)
            return db

    db = factory()
    db.migrate()
    yield factory
    for db in opened:
        db.dispose()
