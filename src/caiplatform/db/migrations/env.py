"""Alembic environment: migrations run on the connection the platform hands over."""

from alembic import context

import caiplatform.db.models  # noqa: F401  (registers every table on Base.metadata)
from caiplatform.db.base import Base

connection = context.config.attributes.get("connection")
if connection is None:  # `alembic` CLI use: take the URL from the config
    from sqlalchemy import create_engine

    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    connection = engine.connect()

context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
