"""A flat route table, built once per app, that sends the plainest routes straight to their handler.

FastAPI (0.16x) finds a request's route by walking every included router's routes twice (`matches`,
then `_handle_selected`), each match saving and restoring keys of the scope; then runs five middleware
layers, the route's request handler and the dependency solver, for a handler that takes only the
`Request` and answers with its own `Response`. On `GET /v1/auth/me` that was about a third of the event
loop's time (docs/performance.md).

`RouteTable` keeps every route of the app in FastAPI's own order, grouped by the first two segments of the
literal start of their path (a route whose path has a parameter earlier is in every group). A request's
route is the first one whose path and method match, as in FastAPI. When that route is *direct* (below)
the table calls its handler itself; any other request, and every request when FastAPI's native telemetry
is on, goes through FastAPI unchanged, so FastAPI still answers 404, 405, redirects and every other route.

A direct route: an `async def` handler whose parameters are the `Request` and `str` path parameters, with
no dependency, no body, no query, header or cookie parameter declared, annotated to return a `Response`.
For such a route FastAPI's request handler only validates strings as strings and returns the handler's
response as it is; the errors it raises go to the app's own exception handlers, as Starlette would send
them (the handler of `Exception` for anything else, as Starlette's error middleware does).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import typing
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger(__name__)

Handler = Callable[..., Any]
TELEMETRY_RECHECK_SECONDS = 1.0


def group_of(path: str) -> str:
    """The group of a request path: its first two segments (`/v1/agents` for `/v1/agents/x/logs`)."""
    return "/".join(path.split("/", 3)[:3])


def _route_group(path_format: str | None) -> str | None:
    """The one group every path this route matches falls in, or None when it can match in several."""
    if not path_format:
        return None
    literal, brace, _ = path_format.partition("{")
    if not brace:
        return group_of(literal)
    return group_of(literal) if literal.count("/") >= 3 else None


class _Entry:
    """One route of the table: how to match it and, when it is direct, what to call."""

    __slots__ = ("route", "regex", "convertors", "methods", "endpoint", "request_param", "path_params", "matcher")

    def __init__(self, route: Any, matcher: Callable[[Scope], tuple[Match, Scope]] | None = None):
        self.route = route
        self.matcher = matcher  # a route the table does not read itself: its own `matches`
        self.regex: Any = getattr(route, "path_regex", None)
        self.convertors = getattr(route, "param_convertors", {})
        self.methods = getattr(route, "methods", None)
        self.endpoint: Handler | None = None
        self.request_param = ""
        self.path_params: frozenset[str] = frozenset()


def _is_plain_str(field: Any) -> bool:
    info = getattr(field, "field_info", None)
    return getattr(field, "type_", getattr(info, "annotation", None)) is str and not getattr(info, "metadata", None)


def _direct(entry: _Entry, context: Any) -> None:
    """Mark `entry` direct when FastAPI's handling of its route adds nothing to calling the handler."""
    dependant = getattr(context, "dependant", None)
    endpoint = getattr(context, "endpoint", None)
    if dependant is None or endpoint is None or not inspect.iscoroutinefunction(endpoint):
        return
    if (dependant.dependencies or dependant.query_params or dependant.header_params or dependant.cookie_params
            or dependant.body_params or getattr(context, "dependencies", None) or getattr(context, "body_field", None)
            or dependant.response_param_name or dependant.background_tasks_param_name
            or dependant.websocket_param_name or dependant.http_connection_param_name
            or dependant.security_scopes_param_name or not dependant.request_param_name
            or getattr(context, "is_sse_stream", False) or getattr(context, "is_json_stream", False)
            or getattr(context, "max_body_size", None) is not None):
        return
    if not all(_is_plain_str(field) for field in dependant.path_params):
        return
    try:
        returns = typing.get_type_hints(endpoint).get("return")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: leave the route to FastAPI
        return
    if not (inspect.isclass(returns) and issubclass(returns, Response)):
        return
    names = frozenset(field.name for field in dependant.path_params)
    if names != frozenset(entry.convertors):
        return
    entry.endpoint = endpoint
    entry.request_param = dependant.request_param_name
    entry.path_params = names


def _flat_routes(app: FastAPI) -> Iterator[_Entry]:
    """Every route of the app in the order FastAPI tries them (included routers expanded in place)."""
    from fastapi.routing import APIRoute

    for route in app.router.routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is None:  # a route or mount of the app itself
            yield _Entry(route, route.matches)
            continue
        for context in contexts():
            if isinstance(context.original_route, APIRoute):
                entry = _Entry(context)
                _direct(entry, context)
                yield entry
            else:
                yield _Entry(context, context.matches)


def _through_last_direct(entries: list[_Entry]) -> list[_Entry]:
    """Past the last direct route, whatever matches first is FastAPI's to answer: the walk stops there."""
    last = max((n for n, entry in enumerate(entries) if entry.endpoint is not None), default=-1)
    return entries[:last + 1]


class Found:
    __slots__ = ("entry", "params")

    def __init__(self, entry: _Entry, params: dict[str, Any]):
        self.entry = entry
        self.params = params


# Direct routes whose service makes one read that can ride along with the credential's read.
_PREFETCH: dict[Handler, Callable[[Request], Any]] = {}


def reads_with_credential(hook: Callable[[Request], Any]) -> Callable[[Handler], Handler]:
    """Declare, on a direct route, the read its service makes (a `caiplatform.db.prefetch.Then`, or None
    for this request) so that the credential's thread job makes it too; the route hands the outcome
    (`prefetched_of`) to its service, which reads again unless the outcome answers its own question."""

    def mark(endpoint: Handler) -> Handler:
        _PREFETCH[endpoint] = hook
        return endpoint

    return mark


def prefetched_of(request: Request) -> Any:
    return request.scope.get("state", {}).get("prefetched")


class RouteTable:
    def __init__(self, app: FastAPI):
        self.app = app
        self._groups: dict[str, list[_Entry]] | None = None
        self._anywhere: list[_Entry] = []
        self._handlers: dict[Any, Any] = {}
        self._telemetry = False
        self._telemetry_asked_until = 0.0
        self._building = threading.Lock()

    def build(self) -> None:
        """Build the table now (a server does it in a worker thread while it starts, rather than on its first
        request); while a build runs elsewhere, requests go through FastAPI."""
        with self._building:
            if self._groups is None:
                self._groups = self._build()

    def _build(self) -> dict[str, list[_Entry]]:
        entries = list(_flat_routes(self.app))
        groups: dict[str, list[int]] = {}
        anywhere: list[int] = []
        for i, entry in enumerate(entries):
            # A route without a path of its own (a host, a context FastAPI did not fill) is tried everywhere.
            route = getattr(entry.route, "starlette_route", None) or entry.route
            group = _route_group(getattr(route, "path_format", None))
            (anywhere if group is None else groups.setdefault(group, [])).append(i)
        self._handlers = dict(self.app.exception_handlers)
        self._anywhere = _through_last_direct([entries[i] for i in anywhere])
        return {group: tried for group, members in groups.items()
                if (tried := _through_last_direct([entries[i] for i in sorted([*members, *anywhere])]))}

    def _telemetry_on(self) -> bool:
        # Asked again every second rather than on every request (three provider checks, about 4 % of a
        # request's time): a provider configured while serving is seen within a second.
        now = time.monotonic()
        if now >= self._telemetry_asked_until:
            telemetry = getattr(self.app, "_native_telemetry", None)
            self._telemetry = telemetry is not None and telemetry.enabled()
            self._telemetry_asked_until = now + TELEMETRY_RECHECK_SECONDS
        return self._telemetry

    def find(self, scope: Scope) -> Found | None:
        """The request's route when it is direct (its path parameters then in the scope, as FastAPI puts
        them), else None."""
        if scope.get("root_path") or self.app.root_path or self._telemetry_on():
            return None
        if self._groups is None:
            if self._building.locked():  # being built in another thread: FastAPI answers meanwhile
                return None
            self.build()
        assert self._groups is not None
        path = scope["path"]
        method = scope["method"]
        for entry in self._groups.get(group_of(path), self._anywhere):
            if entry.matcher is not None:
                match, _ = entry.matcher(scope)
                if match is Match.FULL:
                    return None
                continue
            matched = entry.regex.match(path)
            if matched is None or (entry.methods and method not in entry.methods):
                continue
            if entry.endpoint is None:
                return None
            params = {key: entry.convertors[key].convert(value) for key, value in matched.groupdict().items()}
            scope["app"] = self.app
            scope["router"] = self.app.router
            scope["endpoint"] = entry.endpoint
            scope["route"] = entry.route.original_route
            scope["path_params"] = {**scope.get("path_params", {}), **params}
            return Found(entry, params)
        return None

    def prefetch(self, found: Found, scope: Scope) -> Any:
        """What the route declared to read with the credential (`reads_with_credential`), or None."""
        hook = _PREFETCH.get(found.entry.endpoint) if found.entry.endpoint is not None else None
        if hook is None:
            return None
        try:
            return hook(Request(scope))
        except Exception:  # an optimization only: the route then reads as it always does
            log.exception("the prefetch of %s failed", scope.get("path"))
            return None

    async def call(self, found: Found, scope: Scope, receive: Receive, send: Send) -> None:
        entry, params = found.entry, found.params
        assert entry.endpoint is not None
        request = Request(scope, receive, send)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            response = await entry.endpoint(**{entry.request_param: request}, **params)
            if not isinstance(response, Response):
                raise TypeError(f"{entry.endpoint.__qualname__} returned {type(response).__name__}, not a Response")
            await response(scope, receive, tracked)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise
            answer = handler(request, exc)
            if inspect.isawaitable(answer):
                answer = await answer
            if not started:
                await answer(scope, receive, send)

    def _handler_for(self, exc: Exception) -> Any:
        """The app's handler for `exc`, looked up as Starlette does (an HTTP status first, then the class
        and its bases; the handler of `Exception` is the one Starlette's error middleware calls)."""
        if isinstance(exc, HTTPException) and exc.status_code in self._handlers:
            return self._handlers[exc.status_code]
        for cls in type(exc).__mro__:
            if cls in self._handlers:
                return self._handlers[cls]
        return self._handlers.get(500)
