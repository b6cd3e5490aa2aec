"""A SELECT made on every request, compiled once per dialect and run on the DB-API cursor.

`Connection.execute` spends about twice the database's own time on a small read: the statement's cache
key, an execution context, a cursor result with its metadata, for one or two rows (measured with the
owner gate's statement on SQLite: 70 µs through `execute`, 35 µs on the cursor, docs/performance.md).
`PreparedRead` keeps what SQLAlchemy would compute for that statement, once per dialect: the SQL text, the
order of its parameters, the dialect's converters of each parameter and each result column (SQLite's
text timestamps and JSON, booleans stored as integers); per call it only binds, executes and converts.
The rows it returns are named tuples with the statement's column names, as `Row` would be read.

A parameter a call does not give keeps the statement's own value (a literal in the statement).
"""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Float
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.sql import Select

Converter = Callable[[Any], Any] | None


class _Plan:
    __slots__ = ("binds", "named", "row", "sql", "converters")

    def __init__(self, statement: Select[*tuple[Any, ...]], dialect: Dialect):
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.named = not compiled.positional
        names = list(compiled.positiontup or []) if compiled.positional else list(compiled.binds)
        # (name in the SQL, key a call gives it by, the statement's own value, the dialect's converter)
        self.binds: list[tuple[str, str, Any, Converter]] = []
        for name in names:
            bind = compiled.binds[name]
            self.binds.append((name, bind.key, bind.effective_value, bind.type.dialect_impl(dialect).bind_processor(dialect)))
        columns = list(statement.selected_columns)
        self.converters: list[Converter] = [_result_converter(col, dialect) for col in columns]
        self.row: Any = namedtuple("PreparedRow", list(statement.selected_columns.keys()))  # type: ignore[misc]


def _result_converter(column: Any, dialect: Dialect) -> Converter:
    try:
        return column.type.dialect_impl(dialect).result_processor(dialect, None)
    except (InvalidRequestError, TypeError):
        # PostgreSQL's numeric types choose their converter by the column's type code, which a plan made
        # before any execution does not have; the driver already returns a plain float as a float.
        if isinstance(column.type, Float) and not column.type.asdecimal:
            return None
        raise


class PreparedRead:
    def __init__(self, statement: Select[*tuple[Any, ...]]):
        self.statement = statement
        self._plans: dict[str, _Plan] = {}
        self._lock = threading.Lock()

    def _plan(self, dialect: Dialect) -> _Plan:
        plan = self._plans.get(dialect.name)
        if plan is None:
            with self._lock:
                plan = self._plans.get(dialect.name) or _Plan(self.statement, dialect)
                self._plans[dialect.name] = plan
        return plan

    def all(self, connection: Connection, params: Mapping[str, Any]) -> list[Any]:
        """The statement's rows for `params` (values by bind name), read on `connection`'s DB-API cursor."""
        plan = self._plan(connection.dialect)
        values = []
        for _, key, literal, converter in plan.binds:
            value = params[key] if key in params else literal
            values.append(converter(value) if converter is not None else value)
        bound: Sequence[Any] | dict[str, Any] = (
            {name: value for (name, *_), value in zip(plan.binds, values, strict=True)} if plan.named else tuple(values))
        cursor = connection.connection.cursor()
        try:
            cursor.execute(plan.sql, bound)
            raw = cursor.fetchall()
        finally:
            cursor.close()
        converters = plan.converters
        make = plan.row._make
        return [make([c(v) if c is not None else v for c, v in zip(converters, row, strict=True)]) for row in raw]

    def first(self, connection: Connection, params: Mapping[str, Any]) -> Any:
        rows = self.all(connection, params)
        return rows[0] if rows else None
