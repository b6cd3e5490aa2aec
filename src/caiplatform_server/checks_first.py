"""Authenticate, then authorize, then read the body: the answer a route owes when it refused a request for its
shape before its service checked the caller (issue 40).

Most routes decode and validate their body (or a query parameter) and then call one service method, whose
first step checks the caller. Answered as raised, a malformed body to `PUT /v1/projects/{id}/platform-cloud`
was `400 missing 'provider'` with no credential at all, and the same `400` for a project the caller has no
grant to: what a route reads and which routes exist, told to anyone. Instead of moving every route's decoding
behind its service's checks, the error answer is decided here, in the app's exception handlers, as if the
checks had run first:

- a route that requires a credential (its documented `security` names no anonymous caller), called without
  one, answers `401` whatever else was wrong with the request;
- a route about one project (`{projectID}` or `{project_id}` in its path) or one agent (`/v1/agents/...`,
  with its `?project=`), refused for its shape, runs the caller's checks of that project or agent: a project
  the caller cannot see answers `404`, an agent it may not manage its owner gate's `404` or `403`; a caller
  that passes them gets the shape's own answer.

Nothing of this runs on a request the route accepts (no extra read on the success path), and an answer
that comes after the service's checks is theirs already, so it passes unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request

from caiplatform.errors import Forbidden, NotFound, PlatformError, Unauthenticated
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import AUTH_REQUIRED

log = logging.getLogger(__name__)

#: answers a route gives for what the request holds (its body, a query, a verb), before any check of the caller
SHAPE_STATUSES = frozenset({400, 405, 411, 413, 415, 422})
#: answers that are the caller's checks (or come before any): never replaced
CHECK_STATUSES = frozenset({401, 429})
PROJECT_PARAMS = ("projectID", "project_id")
BROWSE_ROUTES = ("/v1/agents/{name}/users", "/v1/agents/{name}/sessions")


def _requires_credential(route: Any) -> bool:
    """Whether the route's documented security names no anonymous caller (`[]` is public; `{}` among the
    requirements is identity-optional, as the invoke routes are)."""
    extra = getattr(route, "openapi_extra", None) or {}
    requirements = extra.get("security")
    return isinstance(requirements, list) and bool(requirements) and {} not in requirements


async def checked_first(request: Request, status: int) -> PlatformError | None:
    """The refusal the caller's checks owe a request the route answered `status` before making them, or
    None when the route's own answer stands."""
    if status < 400 or status >= 500 or status in CHECK_STATUSES:
        return None
    route = request.scope.get("route")
    if route is None or not _requires_credential(route):
        return None
    principal = request.scope.get("state", {}).get("principal")
    if not isinstance(principal, Principal) or not principal.authenticated:
        return Unauthenticated(AUTH_REQUIRED)
    if status not in SHAPE_STATUSES:
        return None
    platform = request.app.state.platform
    params = request.path_params
    path = getattr(route, "path", "")
    project_id = next((params[name] for name in PROJECT_PARAMS if name in params), None)
    if principal.kind is PrincipalKind.WORKLOAD:
        # An agent's workload key (the code sandbox's caller) belongs to one project: any other is not found;
        # its own project's routes check the rest themselves.
        return NotFound("not found") if project_id is not None and project_id != principal.project_id else None
    try:
        if project_id is not None:
            await platform.access.project(principal, project_id, need=None)
        elif path.startswith(BROWSE_ROUTES):  # the invoke service's own routes, its own gate
            await platform.invoke.gate(principal, params["name"], request.query_params.get("project") or None)
        elif path.startswith("/v1/agents"):
            project = request.query_params.get("project") or None
            await platform.agents.gate(principal, params.get("name"), project)
    except (Unauthenticated, Forbidden, NotFound) as refusal:
        return refusal
    except PlatformError:
        return None  # the checks found nothing to refuse for the caller (a malformed id): the route's answer
    return None
