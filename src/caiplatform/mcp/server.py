"""The process a hosted MCP server version runs: every `tools/<name>.py` served over streamable HTTP.

`python -m caiplatform.mcp.server --source DIR --port N` (or `--socket PATH`) serves MCP at `/mcp` and an open
`GET /healthz`.
Every other request must carry `Authorization: Bearer <CAI_MCP_AUTH_TOKEN>`. Parameter schemas are
inferred by the `mcp` package from each function's signature; the description is the docstring unless
the tool record set one.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hmac
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from caiplatform.mcp import TOOL_MARK

REQUEST_TIMEOUT_SECONDS = 300
# The request timeout a hosted server is given (the workload helper also sizes its read tokens by it).
REQUEST_TIMEOUT_ENV = "PLATFORM_REQUEST_TIMEOUT_SECONDS"


class ToolLoadError(RuntimeError):
    pass


def load_tool(path: Path) -> tuple[Callable[..., Any], dict[str, Any]]:
    """Import `tools/<name>.py` and find its tool: the decorated function (or the one named like the file)."""
    name = path.stem
    spec = importlib.util.spec_from_file_location(f"cai_mcp_tools.{name}", path)
    if spec is None or spec.loader is None:
        raise ToolLoadError(f"cannot import {path.name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    marked = [
        obj
        for obj in vars(module).values()
        if inspect.isfunction(obj) and getattr(obj, TOOL_MARK, None) is not None and obj.__module__ == module.__name__
    ]
    if len(marked) > 1:
        raise ToolLoadError(f"{path.name} marks {len(marked)} functions with @tool; a tool module has exactly one")
    if not marked:
        candidate = getattr(module, name, None)
        if not inspect.isfunction(candidate):
            raise ToolLoadError(f"{path.name} has no function decorated with @tool (and none named {name!r})")
        marked = [candidate]
    fn = marked[0]
    return fn, dict(getattr(fn, TOOL_MARK, None) or {})


def surface_platform_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same tool, but a refused or failed secret read reaches the client with its message (the `mcp`
    package hides the text of any other exception). The signature is kept, so schemas are unchanged."""
    from mcp.server.mcpserver.exceptions import ToolError

    from caiplatform.mcp import UndeclaredCredentialError
    from caiplatform.workload import WorkloadError

    expected = (UndeclaredCredentialError, WorkloadError)
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except expected as exc:
                raise ToolError(str(exc)) from exc

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except expected as exc:
            raise ToolError(str(exc)) from exc

    return run


def load_manifest(source: Path) -> dict[str, Any]:
    manifest = source / "mcp.json"
    return json.loads(manifest.read_text()) if manifest.exists() else {}


class BearerAuth:
    """Every request is authenticated with the per-server token, except the open health route."""

    def __init__(self, app: ASGIApp, token: str):
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/healthz":
            header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
            scheme, _, presented = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip(), self.token):
                from starlette.responses import JSONResponse

                response = JSONResponse({"error": "missing or invalid MCP server token"}, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style (`Args:`) or Sphinx-style
    (`:param x:`) docstring; the description is the text before the parameter section."""
    if not doc:
        return "", {}
    params: dict[str, str] = {}
    summary: list[str] = []
    current: str | None = None
    in_args = False
    entry_indent = 0
    for line in doc.splitlines():
        stripped = line.strip()
        sphinx = re.match(r":param\s+(?:[^:]*\s)?(\w+):\s*(.*)", stripped)
        if sphinx:
            current, in_args = sphinx[1], False
            params[current] = sphinx[2]
            continue
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args, current, entry_indent = True, None, 0
            continue
        if in_args and not stripped:
            continue
        if in_args and line[:1].isspace():
            indent = len(line) - len(line.lstrip())
            entry_indent = entry_indent or indent
            google = re.match(r"(\w+)\s*(?:\([^)]*\))?:\s*(.*)", stripped)
            if google and indent <= entry_indent:
                current = google[1]
                params[current] = google[2]
            elif current is not None:
                params[current] = f"{params[current]} {stripped}".strip()
            continue
        in_args = False  # an unindented line ends the section (Returns:, Raises:, ...)
        if current is None and not params and not re.match(r"(Returns?|Raises|Yields|Examples?):$", stripped):
            summary.append(line)
        else:
            current = None
    return "\n".join(summary).strip(), params


class RequestTimeout:
    """Answers 504 when a request takes longer than the server's request timeout (300 s)."""

    def __init__(self, app: ASGIApp, seconds: float):
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Any) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, tracking_send), self.seconds)
        except TimeoutError:
            if started:
                raise
            from starlette.responses import JSONResponse

            response = JSONResponse({"error": f"request timed out after {self.seconds:g} s"}, status_code=504)
            await response(scope, receive, send)


def request_timeout_seconds() -> float:
    raw = os.environ.get(REQUEST_TIMEOUT_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return REQUEST_TIMEOUT_SECONDS
    return value if value > 0 else REQUEST_TIMEOUT_SECONDS


def build_server(source: Path, *, name: str | None = None, version: str = "") -> Any:
    """The MCP server of a built tool tree: every `tools/<name>.py`, schemas inferred from signatures
    (types, defaults) and docstrings (descriptions)."""
    from mcp.server.mcpserver import MCPServer

    manifest = load_manifest(source)
    server = MCPServer(name=name or "cai-mcp", version=version)
    descriptions = {t["name"]: t.get("description") for t in manifest.get("tools", [])}
    tools_dir = source / "tools"
    for path in sorted(tools_dir.glob("*.py")) if tools_dir.exists() else []:
        fn, marks = load_tool(path)
        summary, param_docs = parse_docstring(inspect.getdoc(fn))
        description = descriptions.get(path.stem) or marks.get("description") or summary or None
        server.add_tool(surface_platform_errors(fn), name=path.stem, description=description)
        registered = server._tool_manager.get_tool(path.stem)  # the inferred schema, to add parameter docs
        properties = registered.parameters.get("properties", {}) if registered is not None else {}
        for param, text in param_docs.items():
            if param in properties and text and "description" not in properties[param]:
                properties[param]["description"] = text
    return server


def build_app(source: Path, token: str, *, name: str | None = None, version: str = "") -> ASGIApp:
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    server = build_server(source, name=name, version=version)

    @server.custom_route("/healthz", methods=["GET"])
    async def healthz(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)
    return BearerAuth(RequestTimeout(app, request_timeout_seconds()), token)


def main(argv: list[str] | None = None) -> int:
    from caiplatform.web import serving

    parser = argparse.ArgumentParser(prog="caiplatform.mcp.server")
    parser.add_argument("--source", default=".")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    parser.add_argument("--socket", default=None, help="listen on this Unix socket instead of host:port")
    parser.add_argument("--name", default=None, help="the server name clients see")
    parser.add_argument("--version", default="", help="the version clients see")
    parser.add_argument("--check", action="store_true", help="load every tool and infer its schema, then exit")
    args = parser.parse_args(argv)
    if args.check:
        try:
            build_server(Path(args.source), name=args.name, version=args.version)
        except Exception as exc:  # noqa: BLE001 - the build's message is the first error, nothing else
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        return 0
    token = os.environ.get("CAI_MCP_AUTH_TOKEN")
    if not token:
        print("CAI_MCP_AUTH_TOKEN is not set; refusing to serve an unauthenticated MCP server", file=sys.stderr)
        return 2
    app = build_app(Path(args.source), token, name=args.name, version=args.version)
    serving.run(app, host=args.host, port=args.port, timeout_keep_alive=REQUEST_TIMEOUT_SECONDS, log_level="warning",
                uds=args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
