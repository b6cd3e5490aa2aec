"""Qdrant's filter grammar as qdrant-client's REST models define it (generated from Qdrant's OpenAPI).

Both Qdrant adapters read a JSON filter through `parse_filter`: the server adapter sends the model on,
the embedded one (Qdrant Edge) converts it to Edge's own classes. Checks a Qdrant server makes on its
side and a client-side model cannot express (every `has_id` entry is an unsigned integer or a UUID) are
made here, so every engine refuses the same filters with the same words.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import ValidationError
from qdrant_client.http import models

from caiplatform.ports.vector import VectorEngineRejected


def _conditions(clause: Any) -> list[Any]:
    if clause is None:
        return []
    return list(clause) if isinstance(clause, list) else [clause]


def walk_conditions(flt: models.Filter) -> Iterator[Any]:
    """Every condition of the filter, nested filters and `nested` conditions included."""
    clauses = [flt.must, flt.should, flt.must_not, flt.min_should.conditions if flt.min_should else None]
    for clause in clauses:
        for condition in _conditions(clause):
            yield condition
            if isinstance(condition, models.Filter):
                yield from walk_conditions(condition)
            elif isinstance(condition, models.NestedCondition):
                yield from walk_conditions(condition.nested.filter)


def point_id(value: Any) -> int | str:
    """An unsigned 64-bit integer, or a UUID in its canonical hyphenated form; refused otherwise."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64:
        return value
    if isinstance(value, str):
        try:
            return str(uuid.UUID(value))
        except ValueError:
            pass
    raise VectorEngineRejected(
        f"Format error in JSON body: invalid point id {value!r}: ids are unsigned integers or UUIDs"
    )


def parse_filter(spec: Mapping[str, Any] | None) -> models.Filter | None:
    """The filter as qdrant-client's model, `has_id` ids canonical; a refusal names the first problem."""
    if spec is None:
        return None
    try:
        flt = models.Filter.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith(("list[", "union[")))
        raise VectorEngineRejected(
            f"Format error in JSON body: {exc.error_count()} problems in the filter, first at {where}: {first['msg']}"
        ) from None
    for condition in walk_conditions(flt):
        if isinstance(condition, models.HasIdCondition):
            condition.has_id = [point_id(i) for i in condition.has_id]
    return flt
