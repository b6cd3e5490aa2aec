"""The bases of every API model: requests that refuse what they do not know, responses that say what they are.

A request model is what a service method takes. Building one runs the specification's rules: a field
validator raises `BadRequest` (or another `PlatformError`) with the spec's exact message, and pydantic lets
that error through unchanged (it only wraps `ValueError` and `AssertionError`). Whatever pydantic itself
refuses (a wrong type, a missing field, a field the operation does not know) becomes a 400 through
`parse_request`, which names the field.

A response model is what a service method returns. Its required fields are the ones the view always
carries; an optional field that a view leaves out stays unset, and `to_json` leaves it out again, so a
model dumps to exactly the JSON the specification shows.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Self, TypeAlias, TypeVar, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from caiplatform.errors import BadRequest

M = TypeVar("M", bound="RequestModel")


class RequestModel(BaseModel):
    """A request body. Unknown fields are refused (a model that the spec lets ignore them says so)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @classmethod
    def parse(cls, body: Any) -> Self:
        """The model of a decoded JSON body, or `BadRequest` naming what is wrong with it."""
        return parse_request(cls, body)


class ResponseModel(BaseModel):
    """A response view. Undeclared fields are a bug of the service, so they are refused here as well."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this view: set fields only, so an omitted optional field stays omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def to_json_bytes(self) -> bytes:
        """`to_json` encoded, in one step (no intermediate dict for a JSON encoder to walk again)."""
        return self.__pydantic_serializer__.to_json(self, by_alias=True, exclude_unset=True)

    @classmethod
    def of(cls, view: Mapping[str, Any]) -> Self:
        """The model of a view that a service built as a mapping."""
        return cls.model_validate(view)

    @classmethod
    def trusted(cls, **fields: Any) -> Self:
        """The model of values already in the declared types (flat fields read from the database, the
        service's own constants), without validating them again: for the views built on every request.
        The fields given are the fields set, so `to_json` leaves out the others as `of` would."""
        return cast(Self, cls.model_construct(**fields))


class OpenResponseModel(ResponseModel):
    """A view whose keys are the caller's own (a config map, a payload, an env): extra keys are data."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ListPage(ResponseModel):
    """One page of a list: its items under the list's own key, and `next_page_token` while more remain.

    Subclasses declare the items field and name it in `items_field`, so a pagination iterator (the
    remote client's, or a notebook's) can walk any list the same way."""

    items_field: ClassVar[str] = "items"
    next_page_token: str | None = None

    def page_items(self) -> list[Any]:
        return list(getattr(self, self.items_field))


def field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def message_of(error: Mapping[str, Any]) -> str:
    """The one-line 400 message for pydantic's first error."""
    where = field_path(tuple(error.get("loc", ())))
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return f'unknown field "{where}"'
    if kind == "missing":
        return f"{where} is required"
    if not where:
        return f"invalid request body: {error.get('msg', 'invalid value')}"
    return f"invalid {where}: {error.get('msg', 'invalid value')}"


def parse_request(model: type[M], body: Any) -> M:
    if isinstance(body, model):
        return body
    if not isinstance(body, Mapping):
        raise BadRequest("invalid JSON body: expected a JSON object")
    try:
        return model.model_validate(dict(body))
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise BadRequest(message_of(errors[0]) if errors else "invalid request body") from None


B = TypeVar("B")
#: A request body as a service takes it: the model itself (a library caller), or how to read it (a route:
#: the body is read and decoded once the service's project gate has passed, in the one service call).
BodyOrReader: TypeAlias = B | Callable[[], B | Awaitable[B]]


async def body_after_gate(body: BodyOrReader[B]) -> B:
    """`body`, read now if it was given as how to read it (call it after the caller's checks: a caller who
    may not reach the project is refused before its body is read, and its body's faults are not told)."""
    if not callable(body):
        return body
    value = body()
    return cast(B, await value) if inspect.isawaitable(value) else cast(B, value)
