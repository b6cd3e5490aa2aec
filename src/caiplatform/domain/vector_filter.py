"""Qdrant's payload filter grammar, evaluated in process (the in-memory vector engine's filters).

A filter is the JSON object Qdrant accepts: `must`, `should`, `must_not` (a condition or a list of
them) and `min_should` (`{conditions, min_count}`). A condition is a field condition
(`{key, match | range | is_empty | is_null | values_count}`), `{is_empty: {key}}`, `{is_null: {key}}`,
`{has_id: [...]}`, `{nested: {key, filter}}`, or a filter itself. Keys are JSON paths (`a.b`, `a[].b`,
`a[0].b`). The semantics follow Qdrant's own local mode (qdrant-client `local/payload_filters.py`) so
that the in-memory engine and Qdrant answer every filter the same; the conformance suite checks it.

`compile_filter` validates the whole filter first (raising `FilterError`, as Qdrant refuses a malformed
filter before touching any point) and returns a predicate over `(point_id, payload)`.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Any, Mapping[str, Any]], bool]

_NESTED_SENTINEL_ID = -1  # the id a nested filter sees: it belongs to no point, so has_id never matches


class FilterError(ValueError):
    """The filter does not follow the grammar; the message says where."""


# ------------------------------------------------------------------------------------------- paths

_SEGMENT = re.compile(r"^([^\[\]]+)((?:\[\d*\])*)$")


def parse_path(key: Any) -> list[str | int | None]:
    """`a.b[].c[2]` into `["a", "b", None, "c", 2]` (None is the `[]` wildcard)."""
    if not isinstance(key, str) or not key:
        raise FilterError("key must be a non-empty string")
    items: list[str | int | None] = []
    for segment in key.split("."):
        match = _SEGMENT.match(segment)
        if not match:
            raise FilterError(f"invalid key {key!r}")
        items.append(match.group(1))
        for index in re.findall(r"\[(\d*)\]", match.group(2)):
            items.append(int(index) if index else None)
    return items


def values_at(payload: Any, path: list[str | int | None], *, flat: bool = True) -> list[Any] | None:
    """Every value the path selects (an array at the end is unwrapped one level when `flat`), or None."""
    # Fast path for the leading object keys (the common `a.b` case): they select at most one value.
    data = payload
    for at, head in enumerate(path):
        if not isinstance(head, str):
            return _walk(data, path[at:], flat)
        if not isinstance(data, dict) or head not in data:
            return None
        data = data[head]
    if isinstance(data, list) and flat:
        return list(data) or None
    return [data]


def _walk(payload: Any, path: list[str | int | None], flat: bool) -> list[Any] | None:
    found: list[Any] = []

    def walk(data: Any, rest: list[str | int | None]) -> None:
        if not rest:
            if isinstance(data, list) and flat:
                found.extend(data)
            else:
                found.append(data)
            return
        head, tail = rest[0], rest[1:]
        if isinstance(head, str):
            if isinstance(data, dict) and head in data:
                walk(data[head], tail)
        elif head is None:
            if isinstance(data, list):
                for item in data:
                    walk(item, tail)
        elif isinstance(data, list) and head < len(data):
            walk(data[head], tail)

    walk(payload, path)
    return found or None


# ------------------------------------------------------------------------------------------- values


def _same_value(value: Any, other: Any) -> bool:
    # Qdrant keeps bool, integer and float apart for exact matches, where Python would mix them.
    if isinstance(value, bool) != isinstance(other, bool):
        return False
    if isinstance(value, float) != isinstance(other, float):
        return False
    return value == other


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, list) and not value)


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, list) and any(v is None for v in value))


def _words(text: str) -> list[str]:
    return [token.lower() for token in re.findall(r"[^\W_]+", text)]


def normalize_point_id(value: Any) -> int | str:
    """An unsigned integer, or a UUID string in its canonical hyphenated form."""
    if isinstance(value, bool):
        raise FilterError(f"invalid point id {value!r}")
    if isinstance(value, int):
        if 0 <= value < 2**64:
            return value
        raise FilterError(f"invalid point id {value!r}")
    if isinstance(value, str):
        try:
            return str(uuid.UUID(value))
        except ValueError:
            raise FilterError(f"invalid point id {value!r}: a string id must be a UUID") from None
    raise FilterError(f"invalid point id {value!r}")


# ------------------------------------------------------------------------------------------- compile


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FilterError(f"{where} must be an object")
    return value


def _only(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise FilterError(f"{where}: unknown field {extra[0]!r}")


def _match(spec: Any, where: str) -> Callable[[Any], bool]:
    spec = _object(spec, where)
    present = [k for k in ("value", "any", "except", "text") if k in spec]
    _only(spec, {"value", "any", "except", "text"}, where)
    if len(present) != 1:
        raise FilterError(f"{where} must have exactly one of value, any, except or text")
    kind = present[0]
    operand = spec[kind]
    if kind == "value":
        if not isinstance(operand, bool | int | str):
            raise FilterError(f"{where}.value must be a string, an integer or a boolean")
        return lambda v: _same_value(v, operand)
    if kind == "text":
        if not isinstance(operand, str):
            raise FilterError(f"{where}.text must be a string")
        wanted = _words(operand)
        return lambda v: isinstance(v, str) and bool(wanted) and set(wanted) <= set(_words(v))
    if not isinstance(operand, list) or not (
        all(isinstance(x, str) for x in operand)
        or all(isinstance(x, int) and not isinstance(x, bool) for x in operand)
    ):
        raise FilterError(f"{where}.{kind} must be a list of strings or a list of integers")
    options = list(operand)
    if kind == "any":
        return lambda v: any(_same_value(v, o) for o in options)
    return lambda v: v is not None and not any(_same_value(v, o) for o in options)


def _bounds(spec: Any, where: str) -> Callable[[Any], bool]:
    spec = _object(spec, where)
    _only(spec, {"gt", "gte", "lt", "lte"}, where)
    bounds: dict[str, float | None] = {}
    for name in ("gt", "gte", "lt", "lte"):
        value = spec.get(name)
        if value is not None and not isinstance(value, int | float):
            raise FilterError(f"{where}.{name} must be a number (datetime ranges are not supported here)")
        bounds[name] = None if value is None else float(value)
    gt, gte, lt, lte = bounds["gt"], bounds["gte"], bounds["lt"], bounds["lte"]

    def check(value: Any) -> bool:
        if not _is_number(value) or (isinstance(value, float) and math.isnan(value)):
            return False
        return (
            (gt is None or value > gt)
            and (gte is None or value >= gte)
            and (lt is None or value < lt)
            and (lte is None or value <= lte)
        )

    return check


def _field_condition(spec: Mapping[str, Any], where: str) -> Predicate:
    _only(spec, {"key", "match", "range", "is_empty", "is_null", "values_count"}, where)
    path = parse_path(spec.get("key"))
    checks = [k for k in ("values_count", "is_empty", "is_null", "match", "range") if spec.get(k) is not None]
    if not checks:
        raise FilterError(f"{where}: a field condition needs match, range, values_count, is_empty or is_null")
    kind = checks[0]  # Qdrant looks at them in this order and ignores the rest
    if kind == "values_count":
        counted = _bounds(spec["values_count"], f"{where}.values_count")

        def count_values(_pid: Any, payload: Mapping[str, Any]) -> bool:
            values = values_at(payload, path, flat=False) or []
            if all(v is None for v in values):
                counts = [0]
            else:
                counts = [0 if v is None else len(v) if isinstance(v, list) else 1 for v in values]
            return any(counted(c) for c in counts)

        return count_values
    if kind in ("is_empty", "is_null"):
        wanted = spec[kind]
        if not isinstance(wanted, bool):
            raise FilterError(f"{where}.{kind} must be true or false")
        test = _empty_check(path) if kind == "is_empty" else _null_check(path)
        return lambda pid, payload: test(pid, payload) == wanted
    value_check = _match(spec["match"], f"{where}.match") if kind == "match" else _bounds(spec["range"], f"{where}.range")

    def field(_pid: Any, payload: Mapping[str, Any]) -> bool:
        values = values_at(payload, path)
        return values is not None and any(value_check(v) for v in values)

    return field


def _empty_check(path: list[str | int | None]) -> Predicate:
    def check(_pid: Any, payload: Mapping[str, Any]) -> bool:
        values = values_at(payload, path, flat=False)
        return values is None or all(_is_empty(v) for v in values)

    return check


def _null_check(path: list[str | int | None]) -> Predicate:
    def check(_pid: Any, payload: Mapping[str, Any]) -> bool:
        values = values_at(payload, path, flat=False)
        return values is not None and any(_is_null(v) for v in values)

    return check


def _key_of(spec: Any, where: str) -> list[str | int | None]:
    spec = _object(spec, where)
    _only(spec, {"key"}, where)
    return parse_path(spec.get("key"))


def _condition(spec: Any, where: str) -> Predicate:
    spec = _object(spec, where)
    if "key" in spec:
        return _field_condition(spec, where)
    if "is_empty" in spec:
        _only(spec, {"is_empty"}, where)
        return _empty_check(_key_of(spec["is_empty"], f"{where}.is_empty"))
    if "is_null" in spec:
        _only(spec, {"is_null"}, where)
        return _null_check(_key_of(spec["is_null"], f"{where}.is_null"))
    if "has_id" in spec:
        _only(spec, {"has_id"}, where)
        ids = spec["has_id"]
        if not isinstance(ids, list):
            raise FilterError(f"{where}.has_id must be a list of point ids")
        wanted = {normalize_point_id(i) for i in ids}
        return lambda pid, _payload: pid in wanted
    if "nested" in spec:
        _only(spec, {"nested"}, where)
        nested = _object(spec["nested"], f"{where}.nested")
        _only(nested, {"key", "filter"}, f"{where}.nested")
        key = nested.get("key")
        if isinstance(key, str) and len(key) > 2 and key.endswith("[]"):
            key = key[:-2]
        path = parse_path(key)
        inner = _filter(nested.get("filter"), f"{where}.nested.filter")

        def nested_check(_pid: Any, payload: Mapping[str, Any]) -> bool:
            elements = [
                element
                for value in values_at(payload, path, flat=False) or []
                if isinstance(value, list)
                for element in value
                if isinstance(element, dict)
            ]
            return any(inner(_NESTED_SENTINEL_ID, element) for element in elements)

        return nested_check
    return _filter(spec, where)


def _clause(spec: Any, where: str) -> list[Predicate]:
    if spec is None:
        return []
    items = spec if isinstance(spec, list) else [spec]
    return [_condition(item, f"{where}[{i}]") for i, item in enumerate(items)]


def _filter(spec: Any, where: str) -> Predicate:
    spec = _object(spec, where)
    _only(spec, {"must", "should", "must_not", "min_should"}, where)
    must = _clause(spec.get("must"), f"{where}.must")
    should = _clause(spec.get("should"), f"{where}.should")
    must_not = _clause(spec.get("must_not"), f"{where}.must_not")
    min_should: tuple[list[Predicate], int] | None = None
    if spec.get("min_should") is not None:
        block = _object(spec["min_should"], f"{where}.min_should")
        _only(block, {"conditions", "min_count"}, f"{where}.min_should")
        count = block.get("min_count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise FilterError(f"{where}.min_should.min_count must be an integer of at least 1")
        conditions = block.get("conditions")
        if not isinstance(conditions, list):
            raise FilterError(f"{where}.min_should.conditions must be a list")
        min_should = (_clause(conditions, f"{where}.min_should.conditions"), count)

    def check(pid: Any, payload: Mapping[str, Any]) -> bool:
        if not all(c(pid, payload) for c in must):
            return False
        if any(c(pid, payload) for c in must_not):
            return False
        # An empty `should` states no alternatives, which Qdrant treats as no constraint.
        if should and not any(c(pid, payload) for c in should):
            return False
        if min_should is not None:
            conditions, count = min_should
            if sum(1 for c in conditions if c(pid, payload)) < count:
                return False
        return True

    return check


def compile_filter(spec: Mapping[str, Any]) -> Predicate:
    """Validate a whole filter and return `predicate(point_id, payload)`. Raises `FilterError`."""
    return _filter(spec, "filter")


def has_conditions(spec: Mapping[str, Any]) -> bool:
    """False for a filter that constrains nothing (`{}`, `{"must": []}`, ...), which matches every point."""
    for clause in ("must", "should", "must_not"):
        value = spec.get(clause)
        if value is None:
            continue
        if isinstance(value, list):
            if value:
                return True
        else:
            return True
    block = spec.get("min_should")
    return isinstance(block, Mapping) and bool(block.get("conditions"))
