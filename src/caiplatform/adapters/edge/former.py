"""Bring the former embedded engine's data (`vectors.db`: numpy written ahead to SQLite) into Qdrant Edge.

A data dir written by an earlier version holds `<dir>/vectors.db`; the Edge engine, started on the same
directory, creates each collection it finds there with its settings, upserts its points in batches, and
then renames the file `vectors.db.imported` (with its WAL files), so it is imported once. An import cut
short is done again at the next start (upserts by id: nothing is doubled).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from caiplatform.ports.vector import CollectionConfig, Point, Quantization

BATCH = 2000


def former_collections(database: Path) -> Iterator[tuple[str, CollectionConfig, Iterator[list[Point]]]]:
    """Each collection of `vectors.db`: its name, its settings and its points in batches."""
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        for name, text in db.execute("SELECT name, config FROM collections ORDER BY name").fetchall():
            data: dict[str, Any] = json.loads(text)
            data["quantization"] = Quantization(**data.get("quantization", {}))
            config = CollectionConfig(**data)
            yield name, config, _batches(db, name, config.dimensions)
    finally:
        db.close()


def _batches(db: sqlite3.Connection, name: str, dimensions: int) -> Iterator[list[Point]]:
    rows = db.execute("SELECT id, is_int, vector, payload FROM points WHERE collection = ? ORDER BY rowid", (name,))
    while chunk := rows.fetchmany(BATCH):
        yield [
            Point(int(pid) if is_int else pid, np.frombuffer(vector, dtype=np.float32, count=dimensions).tolist(),
                  json.loads(payload))
            for pid, is_int, vector, payload in chunk
        ]


def set_aside(database: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        path = database.with_name(database.name + suffix)
        if path.exists():
            path.rename(database.with_name(f"vectors.db.imported{suffix}"))
