"""The in-memory database shares one connection; concurrent units of work must still be whole transactions."""

from __future__ import annotations

import asyncio

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
