"""What a tool set builds from: static checks of handler source and the content hash of a build."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import Any


def check_tool_source(name: str, handler: str) -> str | None:
    """A reason the handler cannot serve as `tools/<name>.py`, or None. Checked without importing it."""
    try:
        tree = ast.parse(handler, filename=f"tools/{name}.py")
    except SyntaxError as exc:
        return f"tools/{name}.py does not compile: {exc.msg} (line {exc.lineno})"
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]

    def decorated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        for dec in fn.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if (isinstance(target, ast.Name) and target.id == "tool") or (
                isinstance(target, ast.Attribute) and target.attr == "tool"
            ):
                return True
        return False

    marked = [f for f in functions if decorated(f)]
    if len(marked) > 1:
        return f"tools/{name}.py decorates {len(marked)} functions with @tool; a tool module has exactly one"
    if not marked and not any(f.name == name for f in functions):
        return f"tools/{name}.py has no function decorated with @tool (and none named {name!r})"
    return None


def canonical_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("name", "description", "handler", "credential_keys")
    return sorted(({k: t.get(k) for k in keys} for t in tools), key=lambda t: t["name"])


def image_digest(tools: list[dict[str, Any]]) -> str:
    payload = json.dumps(canonical_tools(tools), sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def write_source_tree(root: Path, server: str, version: int, tools: list[dict[str, Any]]) -> None:
    """The directory a version builds from: `tools/<name>.py` per tool plus a manifest."""
    (root / "tools").mkdir(parents=True, exist_ok=True)
    for tool in tools:
        (root / "tools" / f"{tool['name']}.py").write_text(tool["handler"])
    manifest = {
        "server": server,
        "version": version,
        "tools": [{"name": t["name"], "description": t.get("description") or None} for t in canonical_tools(tools)],
    }
    (root / "mcp.json").write_text(json.dumps(manifest, indent=2))
