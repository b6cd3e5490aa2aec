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


def decorator_credential_keys(handler: str) -> list[str]:
    """The keys a handler declares with `@tool(credential_keys=[...])` (string literals), read statically."""
    try:
        tree = ast.parse(handler)
    except SyntaxError:
        return []
    keys: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            target = dec.func
            named = (isinstance(target, ast.Name) and target.id == "tool") or (
                isinstance(target, ast.Attribute) and target.attr == "tool"
            )
            for kw in dec.keywords if named else []:
                if kw.arg == "credential_keys" and isinstance(kw.value, ast.List | ast.Tuple | ast.Set):
                    keys += [e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return keys


def canonical_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("name", "description", "handler", "credential_keys")
    return sorted(({k: t.get(k) for k in keys} for t in tools), key=lambda t: t["name"])


def image_digest(tools: list[dict[str, Any]], *, project: str) -> str:
    """The tool set's content hash within its project: the same tools in another project are another
    image (no project runs, or learns of, what another project published)."""
    payload = json.dumps({"project": project, "tools": canonical_tools(tools)}, sort_keys=True,
                         separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def write_source_tree(root: Path, tools: list[dict[str, Any]], *, project: str) -> None:
    """The directory a tool set builds from: `tools/<name>.py` per tool plus a manifest.

    Only what the digest covers goes in, so the same tool set always makes the same tree (the server's
    name and version are given to the process that serves it, not baked into the image)."""
    (root / "tools").mkdir(parents=True, exist_ok=True)
    for tool in tools:
        (root / "tools" / f"{tool['name']}.py").write_text(tool["handler"])
    manifest = {
        "digest": image_digest(tools, project=project),
        "tools": [
            {"name": t["name"], "description": t.get("description") or None, "credential_keys": t.get("credential_keys") or []}
            for t in canonical_tools(tools)
        ],
    }
    (root / "mcp.json").write_text(json.dumps(manifest, indent=2))


HELPER_MODULE = "caiplatform.mcp"
HELPER_NAMES = ("tool", "secret", "asecret")
HELPER_HINT = (
    "a tool handler imports the MCP helper module: `from caiplatform.mcp import tool, secret` "
    "(`@tool` marks the tool's function, `@tool(credential_keys=[...])` declares the secrets it reads, "
    "`secret(name)`, or `await asecret(name)` in an async tool, reads one at call time)"
)


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def check_helper_import(name: str, handler: str) -> str | None:
    """Why the handler takes the helper's names from somewhere other than `caiplatform.mcp`, or None.

    Read without importing it, so a publish is refused with the module to import instead of a build that
    fails later with `ModuleNotFoundError`. Source that does not compile is left to the build to report."""
    try:
        tree = ast.parse(handler)
    except SyntaxError:
        return None
    helper_modules: set[str] = set()  # names bound to the helper module itself
    from_helper: set[str] = set()  # names imported from it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            helper_modules |= {a.asname or a.name for a in node.names if a.name == HELPER_MODULE}
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                if module == "caiplatform" and alias.name == "mcp":
                    helper_modules.add(alias.asname or "mcp")
                elif module == HELPER_MODULE:
                    from_helper.add(alias.asname or alias.name)
                elif alias.name in HELPER_NAMES:
                    return f"tools/{name}.py imports {alias.name!r} from {module!r}; {HELPER_HINT}"
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for dec in fn.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if isinstance(target, ast.Name) and target.id == "tool" and not ({"tool"} & (from_helper | defined)):
                return f"tools/{name}.py decorates {fn.name} with @tool but never imports it; {HELPER_HINT}"
            if isinstance(target, ast.Attribute) and target.attr == "tool" and _dotted(target.value) not in helper_modules:
                return f"tools/{name}.py decorates {fn.name} with @{_dotted(target)}, not the helper's; {HELPER_HINT}"
    return None
