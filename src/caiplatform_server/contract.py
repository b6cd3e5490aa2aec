"""What each route declares in `/openapi.json`: its body, its answers, its errors and who may call it.

Routes decode their bodies themselves (bounded reads, the spec's JSON messages), so FastAPI cannot see
the request model; `operation(...)` names it, with the response model, the error statuses the route can
answer and the credentials it accepts, and `openapi_document` turns those names into the schema:
components for every model, the error envelope, the security schemes, no 422 (the platform answers bad
input with the spec's 400). `reply` writes a service's model once, as the JSON the spec shows.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

from caiplatform.models.base import ResponseModel


class ErrorEnvelope(BaseModel):
    """Every error of every API: the message, the request id, and for a few errors more fields."""

    model_config = ConfigDict(extra="allow", title="Error")

    error: str
    request_id: str


# -- security schemes: every credential is a bearer token; the kinds differ in who holds them ----------

SESSION = "session"
API_KEY = "api_key"
SERVICE_ACCOUNT_KEY = "service_account_key"
WORKLOAD_KEY = "workload_key"
INTERNAL_TOKEN = "internal_token"
AUTOMATION_TOKEN = "automation_token"

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    SESSION: {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
              "description": "A session token from POST /v1/auth/login."},
    API_KEY: {"type": "http", "scheme": "bearer", "bearerFormat": "cai_<key id>_<secret>",
              "description": "A personal API key (POST /v1/users/me/keys); acts as its user."},
    SERVICE_ACCOUNT_KEY: {"type": "http", "scheme": "bearer", "bearerFormat": "cai_<key id>_<secret>",
                          "description": "A service account's key; acts within its one project."},
    WORKLOAD_KEY: {"type": "http", "scheme": "bearer", "bearerFormat": "cai_wl_<key id>_<secret>",
                   "description": "A workload's own key, given to it in its environment."},
    INTERNAL_TOKEN: {"type": "http", "scheme": "bearer",
                     "description": "The platform's internal token (CAI_INTERNAL_TOKEN), for the harness."},
    AUTOMATION_TOKEN: {"type": "http", "scheme": "bearer",
                       "description": "The cluster's machine credential (CAI_AUTOMATION_TOKEN)."},
}

#: who may call most routes: a person (session or API key) or a service account
CALLERS: tuple[str, ...] = (SESSION, API_KEY, SERVICE_ACCOUNT_KEY)
#: a person only (account and organization routes)
PEOPLE: tuple[str, ...] = (SESSION, API_KEY)
#: no credential (sign-in, public embed routes, health)
ANONYMOUS: tuple[str, ...] = ()

STATUS_TEXT = {
    400: "Bad request: the message names the field or rule",
    401: "No valid credential",
    403: "The caller may not do this",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict with the current state",
    410: "Gone",
    413: "Body too large",
    424: "A dependency failed",
    429: "Rate limited (Retry-After says when to retry)",
    500: "Internal error",
    501: "Not implemented here",
    502: "A workload or engine answered badly",
    503: "A dependency is unavailable; retry",
    504: "A workload or engine did not answer in time",
}
#: every authenticated route can answer these, whatever else it does
COMMON_ERRORS = (400, 401, 429, 503)

PAGINATION_PARAMETERS = [
    {"name": "page_size", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
     "description": "Items per page, 1 to 200 (never clamped)."},
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": 200},
     "description": "An alias of page_size."},
    {"name": "page_token", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "The next_page_token of the previous page."},
]

_request_models: dict[str, type[BaseModel]] = {}
# Documents already built, by everything they are made of: FastAPI takes about 3 s of CPU to build one,
# and every app of a process (tests make hundreds) has the same routes and handlers.
_documents: dict[tuple[Any, ...], dict[str, Any]] = {}


def _schema_ref(model: type[BaseModel]) -> dict[str, str]:
    _request_models[model.__name__] = model
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def one_of(models: Sequence[type[BaseModel]]) -> dict[str, Any]:
    """The schema of a body that is one of several models (a verb route: one model per verb)."""
    return {"oneOf": [_schema_ref(model) for model in models]}


def _body_schema(body: type[BaseModel] | Sequence[type[BaseModel]]) -> dict[str, Any]:
    return one_of(body) if isinstance(body, Sequence) else _schema_ref(body)


def operation(
    *,
    body: type[BaseModel] | Sequence[type[BaseModel]] | None = None,
    body_required: bool = True,
    no_body: bool = False,
    multipart: type[BaseModel] | None = None,
    response: Any = None,
    status: int = 200,
    errors: Iterable[int] = (),
    security: Sequence[str] = CALLERS,
    paginated: bool = False,
    query: Sequence[dict[str, Any]] = (),
    content_type: str | None = None,
    other_success: dict[int, type[BaseModel]] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of a route decorator that declare its contract.

    `response`: the model of the success body (None: no body, as a 204). `content_type`: a success answer
    that is not JSON (a script, a stream). `errors`: the statuses the route may answer besides the common
    ones. A tuple of models as `body` or `response` declares one of them (a verb route: one model per
    verb); `other_success`: more success statuses with their models (a 207 partial success)."""
    statuses = sorted(set(errors) | (set(COMMON_ERRORS) if security else {400, 429, 503}))
    # The envelope by reference, as FastAPI would write it for `"model": ErrorEnvelope`, without FastAPI
    # building a pydantic field (a TypeAdapter) for each status of each route, twice (once for the route and
    # once for its inclusion): about half of the server's route building at start (docs/performance.md).
    responses: dict[int | str, dict[str, Any]] = {
        code: {"description": STATUS_TEXT.get(code, "Error"),
               "content": {"application/json": {"schema": _schema_ref(ErrorEnvelope)}}} for code in statuses
    }
    extra: dict[str, Any] = {"security": [{name: []} for name in security]}
    if body is not None:
        extra["requestBody"] = {"required": body_required,
                                "content": {"application/json": {"schema": _body_schema(body)}}}
    if no_body:
        extra["x-cai-no-body"] = True  # a write that reads no body (a rotate, a rollback)
    if multipart is not None:
        extra["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": _schema_ref(multipart)}}}
    parameters = [*(PAGINATION_PARAMETERS if paginated else []), *query]
    if parameters:
        extra["parameters"] = parameters
    kwargs: dict[str, Any] = {"status_code": status, "responses": responses, "openapi_extra": extra}
    if content_type is not None:
        responses[status] = {"description": "Success", "content": {content_type: {"schema": {"type": "string"}}}}
        kwargs["response_model"] = None
        # The route answers with its own Response; without this FastAPI would also advertise JSON.
        kwargs["response_class"] = Response
    elif isinstance(response, tuple):
        responses[status] = {"description": "Success: the verb's result",
                             "content": {"application/json": {"schema": one_of(response)}}}
        kwargs["response_model"] = None
    elif response is None:
        kwargs["response_model"] = None
        responses[status] = {"description": "Success, no body"}
    else:
        kwargs["response_model"] = response
    for code, model in (other_success or {}).items():
        responses[code] = {"description": "Partial success", "content": {"application/json": {"schema": _schema_ref(model)}}}
    return kwargs


class ModelResponse(JSONResponse):
    """A JSON answer whose body pydantic already encoded (`ResponseModel.to_json_bytes`)."""

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else super().render(content)


def reply(model: ResponseModel | None, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    """A service's model as the route's JSON answer (`None`: an empty object), encoded by pydantic in one
    step rather than dumped to a dict that `json.dumps` walks again."""
    return ModelResponse(model.to_json_bytes() if model is not None else b"{}", status_code=status, headers=headers)


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The served document: FastAPI's, with request models, security schemes and no 422."""
    if app.openapi_schema:
        return app.openapi_schema
    key = (app.title, app.version, app.openapi_version, app.description, len(_request_models),
           tuple(_route_key(r) for r in app.routes if getattr(r, "include_in_schema", True)))
    if key not in _documents:
        _documents[key] = _build_document(app)
    app.openapi_schema = copy.deepcopy(_documents[key])
    return app.openapi_schema


def _route_key(route: Any) -> tuple[Any, ...]:
    """What a route contributes to the document: its handler, or for an included router (FastAPI wraps the
    module's one router anew in every app) its prefix and its routes."""
    router = getattr(route, "original_router", None)
    if router is not None:
        return (getattr(route.include_context, "prefix", None),
                tuple(_route_key(r) for r in router.routes if getattr(r, "include_in_schema", True)))
    endpoint = getattr(route, "endpoint", None)
    # A handler defined inside `create_app` is a new function per app over the same code.
    return (getattr(route, "path", None), tuple(sorted(getattr(route, "methods", None) or ())),
            getattr(endpoint, "__code__", endpoint))


def _build_document(app: FastAPI) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=app.version, openapi_version=app.openapi_version,
                           description=app.description, routes=app.routes)
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    if _request_models:
        _, defs = models_json_schema([(m, "validation") for m in _request_models.values()],
                                     ref_template="#/components/schemas/{model}")
        for name, schema in defs.get("$defs", {}).items():
            schemas.setdefault(name, schema)
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    components["securitySchemes"] = SECURITY_SCHEMES
    for item in document.get("paths", {}).values():
        for op in item.values():
            if isinstance(op, dict):
                op.get("responses", {}).pop("422", None)
    return document
