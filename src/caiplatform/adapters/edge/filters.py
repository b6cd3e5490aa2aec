"""A filter in qdrant-client's REST model, rebuilt with Qdrant Edge's classes (same grammar, other types).

Edge evaluates the filter itself (Qdrant's own code); this module only translates. A condition Edge has
no class for (a `slice` condition) is refused with Qdrant's kind of words.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

import numpy as np
import qdrant_edge as edge
from qdrant_client.http import models

from caiplatform.ports.vector import VectorEngineRejected


def _clause(clause: Any) -> list[Any] | None:
    if clause is None:
        return None
    return [_condition(c) for c in (clause if isinstance(clause, list) else [clause])]


def to_edge(flt: models.Filter) -> edge.Filter:
    min_should = None
    if flt.min_should is not None:
        min_should = edge.MinShould(conditions=_clause(flt.min_should.conditions) or [],
                                    min_count=flt.min_should.min_count)
    return edge.Filter(must=_clause(flt.must), should=_clause(flt.should), must_not=_clause(flt.must_not),
                       min_should=min_should)


def _condition(condition: Any) -> Any:
    if isinstance(condition, models.Filter):
        return to_edge(condition)
    if isinstance(condition, models.FieldCondition):
        return _field(condition)
    if isinstance(condition, models.IsEmptyCondition):
        return edge.IsEmptyCondition(condition.is_empty.key)
    if isinstance(condition, models.IsNullCondition):
        return edge.IsNullCondition(condition.is_null.key)
    if isinstance(condition, models.HasIdCondition):
        return edge.HasIdCondition(set(condition.has_id))
    if isinstance(condition, models.HasVectorCondition):
        return edge.HasVectorCondition(condition.has_vector)
    if isinstance(condition, models.NestedCondition):
        return edge.NestedCondition(condition.nested.key, to_edge(condition.nested.filter))
    raise VectorEngineRejected(f"Bad request: the {type(condition).__name__} is not supported by this engine")


def _field(c: models.FieldCondition) -> edge.FieldCondition:
    return edge.FieldCondition(
        c.key,
        match=_match(c.match) if c.match is not None else None,
        range=_range(c.range) if c.range is not None else None,
        geo_bounding_box=edge.GeoBoundingBox(_geo(c.geo_bounding_box.top_left), _geo(c.geo_bounding_box.bottom_right))
        if c.geo_bounding_box is not None else None,
        geo_radius=edge.GeoRadius(_geo(c.geo_radius.center), c.geo_radius.radius) if c.geo_radius is not None else None,
        geo_polygon=edge.GeoPolygon([_geo(p) for p in c.geo_polygon.exterior.points],
                                    [[_geo(p) for p in ring.points] for ring in c.geo_polygon.interiors or []])
        if c.geo_polygon is not None else None,
        values_count=edge.ValuesCount(lt=c.values_count.lt, gt=c.values_count.gt, lte=c.values_count.lte,
                                      gte=c.values_count.gte) if c.values_count is not None else None,
        is_empty=c.is_empty,
        is_null=c.is_null,
    )


def _geo(point: models.GeoPoint) -> edge.GeoPoint:
    return edge.GeoPoint(lon=point.lon, lat=point.lat)


_MATCHES: list[tuple[type, Any]] = [
    (models.MatchValue, lambda m: edge.MatchValue(_value(m.value))),
    (models.MatchText, lambda m: edge.MatchText(m.text)),
    (models.MatchTextAny, lambda m: edge.MatchTextAny(m.text_any)),
    (models.MatchPhrase, lambda m: edge.MatchPhrase(m.phrase)),
    (models.MatchPrefix, lambda m: edge.MatchPrefix(m.prefix)),
    (models.MatchSubstring, lambda m: edge.MatchSubstring(m.substring)),
    (models.MatchAny, lambda m: edge.MatchAny(list(m.any))),
    (models.MatchExcept, lambda m: edge.MatchExcept(list(m.except_))),
]


def _value(value: bool | int | str) -> Any:
    # qdrant-edge-py 0.9 reads a Python bool as the integer 1 or 0 (bool is an int), so `true` would
    # match `1`; numpy's bool is not an int, and Edge reads it as the boolean it is.
    return np.bool_(value) if isinstance(value, bool) else value


def _match(match: Any) -> Any:
    for model, build in _MATCHES:
        if isinstance(match, model):
            return build(match)
    raise VectorEngineRejected(f"Bad request: the {type(match).__name__} is not supported by this engine")


def _moment(value: datetime | date | None) -> str | None:
    return value.isoformat() if value is not None else None


def _range(r: models.Range | models.DatetimeRange) -> Any:
    if isinstance(r, models.DatetimeRange):
        return edge.RangeDateTime(gte=_moment(r.gte), gt=_moment(r.gt), lte=_moment(r.lte), lt=_moment(r.lt))
    return edge.RangeFloat(gte=r.gte, gt=r.gt, lte=r.lte, lt=r.lt)
