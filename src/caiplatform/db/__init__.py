"""Relational state: SQLAlchemy 2 on SQLite (embedded default, and in memory) or PostgreSQL.

Services reach the database through `Database.run(fn)`, which runs `fn(session)` in a worker thread
inside one transaction: committed when `fn` returns, rolled back when it raises. That is the unit of
all-or-nothing for every write.
"""

from caiplatform.db.base import Base, UTCDateTime, new_id
from caiplatform.db.database import Database

__all__ = ["Base", "Database", "UTCDateTime", "new_id"]
