"""The process a hosted MCP server version runs: every `tools/<name>.py` served over streamable HTTP.

`python -m caiplatform.mcp.server --source DIR --port N` serves MCP at `/mcp` and an open `GET /healthz`.
Every other request must carry `Authorization: Bearer <CAI_MCP_AUTH_TOKEN>`. Parameter schemas are
inferred by the `mcp` package from each function's signature; the description is the docstring unless
the tool record set one.
"""

from __future__ import annotations

import argparse
import hmac
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from caiplatform.mcp import TOOL_MARK

REQUEST_TIMEOUT_SECONDS = 300


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


def build_app(source: Path, token: str, *, name: str | None = None) -> ASGIApp:
    from mcp.server.mcpserver import MCPServer
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    manifest = load_manifest(source)
    server = MCPServer(name=name or manifest.get("server") or "cai-mcp", version=str(manifest.get("version", "")))
    descriptions = {t["name"]: t.get("description") for t in manifest.get("tools", [])}
    tools_dir = source / "tools"
    for path in sorted(tools_dir.glob("*.py")) if tools_dir.exists() else []:
        fn, marks = load_tool(path)
        description = descriptions.get(path.stem) or marks.get("description") or inspect.getdoc(fn) or None
        server.add_tool(fn, name=path.stem, description=description)

    @server.custom_route("/healthz", methods=["GET"])
    async def healthz(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return BearerAuth(server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True), token)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="caiplatform.mcp.server")
    parser.add_argument("--source", default=".")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    args = parser.parse_args(argv)
    token = os.environ.get("CAI_MCP_AUTH_TOKEN")
    if not token:
        print("CAI_MCP_AUTH_TOKEN is not set; refusing to serve an unauthenticated MCP server", file=sys.stderr)
        return 2
    app = build_app(Path(args.source), token)
    uvicorn.run(app, host=args.host, port=args.port, timeout_keep_alive=REQUEST_TIMEOUT_SECONDS, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
