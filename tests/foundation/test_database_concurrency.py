"""The in-memory database shares one connection; concurrent units of work must still be whole transactions."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select

from caiplatform.db import Database


async def test_concurrent_units_of_work_on_the_in_memory_database():
    db = Database.in_memory()
    metadata = MetaData()
    rows = Table("concurrency_probe", metadata, Column("id", Integer, primary_key=True), Column("n", Integer))
    metadata.create_all(db.engine)

    def write(n: int):
        def unit(session):
            session.execute(insert(rows).values(n=n))
            session.execute(select(func.count()).select_from(rows)).scalar()

        return unit

    await asyncio.gather(*(db.run(write(n)) for n in range(200)))
    assert await db.run(lambda s: s.execute(select(func.count()).select_from(rows)).scalar()) == 200
    db.dispose()


def test_a_snapshot_puts_back_the_whole_database_and_only_an_in_memory_one_is_copied(tmp_path):
    db = Database.in_memory()
    metadata = MetaData()
    rows = Table("snapshot_probe", metadata, Column("id", Integer, primary_key=True), Column("n", Integer))
    metadata.create_all(db.engine)
    db.run_sync(lambda s: s.execute(insert(rows).values(n=1)))
    snapshot = db.snapshot()
    db.run_sync(lambda s: s.execute(insert(rows).values(n=2)))
    db.run_sync(lambda s: s.execute(rows.delete().where(rows.c.n == 1)))
    db.restore(snapshot)
    assert db.run_sync(lambda s: s.execute(select(rows.c.n)).scalars().all()) == [1]
    db.run_sync(lambda s: s.execute(insert(rows).values(n=3)))  # the restored database takes writes
    assert db.run_sync(lambda s: s.execute(select(rows.c.n).order_by(rows.c.n)).scalars().all()) == [1, 3]
    snapshot.close()
    db.dispose()
    on_disk = Database.sqlite_file(tmp_path / "db.sqlite")
    with pytest.raises(ValueError, match="in-memory"):
        on_disk.snapshot()
    on_disk.dispose()


async def test_a_sqlite_files_held_read_connection_sees_every_commit(tmp_path):
    """The read threads keep their connection to a SQLite file between reads: each read must still see
    the newest commit (a revoked key counts on the next request), even after a read that left a transaction
    open, and a read that fails gives its connection up."""
    db = Database.sqlite_file(tmp_path / "held.db")
    metadata = MetaData()
    rows = Table("held_probe", metadata, Column("id", Integer, primary_key=True), Column("n", Integer))
    metadata.create_all(db.engine)

    def count(connection) -> int:
        return connection.execute(select(func.count()).select_from(rows)).scalar()

    def count_in_a_transaction(connection) -> int:
        connection.exec_driver_sql("BEGIN")  # a snapshot that must not outlive this read
        return connection.exec_driver_sql("SELECT count(*) FROM held_probe").scalar()

    try:
        assert await db.read(count) == 0
        for n in range(1, 4):
            await db.run(lambda s, n=n: s.execute(insert(rows).values(n=n)))
            assert await db.read(count_in_a_transaction) == n
            assert await db.read(count) == n
        with pytest.raises(Exception, match="no such table"):
            await db.read(lambda c: c.exec_driver_sql("SELECT * FROM missing_table").all())
        assert await db.read(count) == 3
    finally:
        db.dispose()
