"""The embedded vector engine: the in-memory numpy engine, written ahead to SQLite in the data dir.

Searches run in memory (exact, as fast as a numpy scan); every change is committed to
`<dir>/vectors.db` in one transaction before it is applied in memory, so a refused or failed write
changes nothing and an accepted one survives a restart, when `start()` loads everything back. Qdrant's
semantics come from the in-memory engine, which the conformance suite compares with Qdrant answer for
answer; see docs/decisions/vector.md for why this, not Qdrant's local mode, is the embedded default.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from caiplatform.adapters.memory.vector import InMemoryVectorEngine, _Collection
from caiplatform.ports.vector import CollectionConfig, PointId, Quantization

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (name TEXT PRIMARY KEY, config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    collection TEXT NOT NULL REFERENCES collections(name) ON DELETE CASCADE,
    id TEXT NOT NULL,          -- an unsigned integer in decimal, or a UUID
    is_int INTEGER NOT NULL,
    vector BLOB NOT NULL,      -- float32, as stored (unit-normalised for cosine)
    payload TEXT NOT NULL,
    PRIMARY KEY (collection, id, is_int)
);
"""


def _config_json(config: CollectionConfig) -> str:
    return json.dumps(asdict(config))


def _config_of(text: str) -> CollectionConfig:
    data: dict[str, Any] = json.loads(text)
    data["quantization"] = Quantization(**data.get("quantization", {}))
    return CollectionConfig(**data)


def _key(point_id: PointId) -> tuple[str, int]:
    return (point_id, 0) if isinstance(point_id, str) else (str(point_id), 1)


class LocalVectorEngine(InMemoryVectorEngine):
    name = "local"

    def __init__(self, directory: str | Path):
        super().__init__()
        self.directory = Path(directory)
        self._db: sqlite3.Connection | None = None

    def service_url(self) -> str:
        return (self.directory / "vectors.db").resolve().as_uri()

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.directory / "vectors.db", isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.executescript(SCHEMA)
            self._db = db
        return self._db

    async def start(self) -> None:
        """Load every collection back into memory."""
        if self._db is not None:
            return
        db = self._conn()
        self._collections.clear()
        for name, config in db.execute("SELECT name, config FROM collections").fetchall():
            collection = _Collection(_config_of(config))
            rows = db.execute(
                "SELECT id, is_int, vector, payload FROM points WHERE collection = ? ORDER BY rowid", (name,)
            ).fetchall()
            if rows:
                vectors = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(
                    len(rows), collection.config.dimensions
                )
                collection.vectors = vectors.copy()
                collection.size = len(rows)
                collection.ids = [int(r[0]) if r[1] else r[0] for r in rows]
                collection.rows = {pid: i for i, pid in enumerate(collection.ids)}
                collection.payloads = [json.loads(r[3]) for r in rows]
            self._collections[name] = collection

    async def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def health(self) -> None:
        self._conn().execute("SELECT 1").fetchone()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # Write-ahead: each hook commits one transaction before the change is applied in memory.

    def _persist_create(self, name: str, config: CollectionConfig) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO collections (name, config) VALUES (?, ?)", (name, _config_json(config)))

    def _persist_drop(self, name: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM points WHERE collection = ?", (name,))
            db.execute("DELETE FROM collections WHERE name = ?", (name,))

    def _persist_config(self, name: str, config: CollectionConfig) -> None:
        self._conn().execute("UPDATE collections SET config = ? WHERE name = ?", (_config_json(config), name))

    def _persist_upsert(self, name: str, rows: Sequence[tuple[PointId, np.ndarray, dict[str, Any]]]) -> None:
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO points (collection, id, is_int, vector, payload) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (collection, id, is_int) DO UPDATE SET vector = excluded.vector, payload = excluded.payload",
                [(name, *_key(pid), row.astype(np.float32).tobytes(), json.dumps(payload)) for pid, row, payload in rows],
            )

    def _persist_delete(self, name: str, ids: Sequence[PointId]) -> None:
        with self._transaction() as db:
            db.executemany(
                "DELETE FROM points WHERE collection = ? AND id = ? AND is_int = ?",
                [(name, *_key(pid)) for pid in ids],
            )
