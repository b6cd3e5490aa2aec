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


#: exceptions whose handler makes an import in its `try` one that may fail without failing the load
_IMPORT_GUARDS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _guards_import(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(_dotted(n).rsplit(".", 1)[-1] in _IMPORT_GUARDS for n in names)


def _imports(body: list[ast.stmt], sure: bool) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import of `body`, each with whether loading the module certainly runs it and fails with it:
    a module-level import outside any `if`, loop, `with` or `try` that catches import errors. An import in
    a function runs when the tool is called, one in a branch may not run, and a guarded one (`try: from
    caiplatform.mcp import tool` / `except ImportError: from elsewhere import tool`) may fail harmlessly."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, sure))
        elif isinstance(node, ast.Try | ast.TryStar):
            guarded = any(_guards_import(h) for h in node.handlers)
            found += _imports(node.body, sure and not guarded)
            for handler in node.handlers:
                found += _imports(handler.body, False)
            found += _imports(node.orelse, False) + _imports(node.finalbody, sure)
        elif isinstance(node, ast.ClassDef):
            found += _imports(node.body, sure)  # a class body runs at load
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += _imports(node.body, False)
        else:
            for field in ("body", "orelse", "handlers", "finalbody"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    found += _imports([n for n in inner if isinstance(n, ast.stmt)], False)
            for case in getattr(node, "cases", []):
                found += _imports(case.body, False)
    return found


def check_helper_import(name: str, handler: str) -> str | None:
    """Why loading the handler certainly fails for the helper's names, or None.

    Read without importing it, so a publish is refused with the module to import instead of a build that
    fails later with `ModuleNotFoundError`. Only what must fail is refused: an unconditional module-level
    import of `tool`, `secret` or `asecret` from a module other than `caiplatform.mcp`, or `@tool` on a
    function with no import of it anywhere. An import the module may survive (guarded by `except
    ImportError`, in a branch, in a function) is left to the build, which loads the tools and reports what
    fails (`the tools do not load: ...`). Source that does not compile is left to the build to report."""
    try:
        tree = ast.parse(handler)
    except SyntaxError:
        return None
    helper_modules: set[str] = set()  # names bound to the helper module itself
    from_helper: set[str] = set()  # names imported from it
    maybe: set[str] = set()  # names bound by an import the load may not run or may survive failing
    for node, sure in _imports(tree.body, True):
        if not sure:
            maybe |= {(a.asname or a.name).split(".")[0] for a in node.names}
        if isinstance(node, ast.Import):
            helper_modules |= {a.asname or a.name for a in node.names if a.name == HELPER_MODULE}
            continue
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            if module == "caiplatform" and alias.name == "mcp":
                helper_modules.add(alias.asname or "mcp")
            elif module == HELPER_MODULE:
                from_helper.add(alias.asname or alias.name)
            elif alias.name in HELPER_NAMES:
                if sure:
                    return f"tools/{name}.py imports {alias.name!r} from {module!r}; {HELPER_HINT}"
    from_helper |= maybe
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for dec in fn.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if isinstance(target, ast.Name) and target.id == "tool" and not ({"tool"} & (from_helper | defined)):
                return f"tools/{name}.py decorates {fn.name} with @tool but never imports it; {HELPER_HINT}"
            if (isinstance(target, ast.Attribute) and target.attr == "tool" and _dotted(target.value) not in helper_modules
                    and _dotted(target.value).split(".")[0] not in maybe):
                return f"tools/{name}.py decorates {fn.name} with @{_dotted(target)}, not the helper's; {HELPER_HINT}"
    return None
