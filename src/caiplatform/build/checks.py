"""Entry-file checks per framework, run by every builder before it installs anything.

Everything here reads the source statically (Python's `ast`, plain text for other languages): user
code is never imported into the platform's process. A failed check raises `BuildError` with a message
that says which file is missing or what it must define, so a broken upload fails its build instead
of its first invoke.

Shapes (document 1's directory layout and DECISIONS.md's functions; Go and Ruby are our choice, see
docs/decisions/runtime.md):

| framework        | entry file  | must define                                              |
|------------------|-------------|----------------------------------------------------------|
| adk              | agent.py    | module-level `root_agent`                                |
| langgraph        | graph.py    | module-level `graph`                                     |
| crewai           | crew.py     | module-level `crew`; a task description with `{message}` |
| function         | main.py     | `handle(event, context)`                                 |
| function-nodejs  | index.js    | an exported `handle`                                     |
| function-go      | main.go     | `func Handle(...)`                                       |
| function-ruby    | main.rb     | `def handle(event, context)`                             |
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from caiplatform.ports.builder import AGENT_FRAMEWORKS, FUNCTION_FRAMEWORKS, BuildError

ENTRY_FILES = {
    "adk": "agent.py",
    "langgraph": "graph.py",
    "crewai": "crew.py",
    "function": "main.py",
    "function-nodejs": "index.js",
    "function-go": "main.go",
    "function-ruby": "main.rb",
}
PYTHON_NAMES = {"adk": "root_agent", "langgraph": "graph", "crewai": "crew", "function": "handle"}
#: Toolchains a function in another language needs on the building (and running) machine.
TOOLCHAINS = {"function-nodejs": ("node", "Node.js"), "function-go": ("go", "Go"), "function-ruby": ("ruby", "Ruby")}
#: The `runtime` form value each function framework implies.
FUNCTION_RUNTIMES = {"function": "python", "function-nodejs": "nodejs", "function-go": "go", "function-ruby": "ruby"}

MESSAGE_PLACEHOLDER = "{message}"

_NODE_EXPORTS = [
    r"\bexports\.handle\s*=",
    r"\bmodule\.exports\.handle\s*=",
    r"\bmodule\.exports\s*=\s*\{[^}]*\bhandle\b",
    r"\bexport\s+(async\s+)?function\s+handle\b",
    r"\bexport\s+(const|let|var)\s+handle\b",
    r"\bexport\s*\{[^}]*\bhandle\b[^}]*\}",
]
_GO_HANDLE = re.compile(r"^\s*func\s+Handle\s*\(", re.MULTILINE)
_RUBY_HANDLE = re.compile(r"^\s*def\s+(self\.)?handle\b", re.MULTILINE)


def framework_for(framework: str, runtime: str | None) -> str:
    """The framework a function's `runtime` names (`function` + `nodejs` → `function-nodejs`)."""
    if framework == "function" and runtime and runtime != "python":
        return f"function-{runtime}"
    return framework


def check_source(source_dir: Path, framework: str, runtime: str | None = None, *, toolchains: bool = True) -> None:
    """Raise `BuildError` when the tree lacks what `framework` needs to start. `toolchains` False: the
    language's toolchain is not looked for on this machine (a cluster build finds it in its base image)."""
    framework = framework_for(framework, runtime)
    if framework not in AGENT_FRAMEWORKS and framework not in FUNCTION_FRAMEWORKS:
        known = ", ".join(AGENT_FRAMEWORKS + FUNCTION_FRAMEWORKS)
        raise BuildError(f"unsupported framework {framework!r} (known: {known})")
    source_dir = Path(source_dir)
    entry = ENTRY_FILES[framework]
    path = source_dir / entry
    if not path.is_file() or path.is_symlink():
        raise BuildError(f"{_kind(framework)} needs {entry} at the top level of the source ({_needs(framework)})")
    text = _read(path)
    if framework in PYTHON_NAMES:
        tree = _parse(path.name, text)
        name = PYTHON_NAMES[framework]
        if name not in module_level_names(tree):
            raise BuildError(f"{entry} must define module-level `{name}` ({_needs(framework)})")
        if framework == "crewai":
            _check_crew_placeholder(source_dir)
        return
    tool, language = TOOLCHAINS[framework]
    if framework == "function-nodejs" and not any(re.search(p, text) for p in _NODE_EXPORTS):
        raise BuildError(f"{entry} must export `handle` (`exports.handle = async (event, context) => ...`)")
    if framework == "function-go" and not _GO_HANDLE.search(text):
        raise BuildError(f"{entry} must define `func Handle(event map[string]any, context map[string]any) (any, error)`")
    if framework == "function-ruby" and not _RUBY_HANDLE.search(text):
        raise BuildError(f"{entry} must define `def handle(event, context)`")
    if toolchains and shutil.which(tool) is None:
        raise BuildError(
            f"{framework} functions need the {language} toolchain (`{tool}`) on the machine that builds and "
            f"runs them, and it is not installed here; install {language} or deploy a Python function"
        )


def module_level_names(tree: ast.Module) -> set[str]:
    """Names bound at module level: assignments, imports, defs, classes, and those inside top-level
    `if`/`try`/`with` blocks (which still run at import)."""
    names: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names.update(_target_names(target))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and getattr(node, "value", None) is not None:
                names.update(_target_names(node.target))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name != "*":
                        names.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While)):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                visit(node.body)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return names


def _target_names(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        out: set[str] = set()
        for element in target.elts:
            out |= _target_names(element.value if isinstance(element, ast.Starred) else element)
        return out
    return set()


def _check_crew_placeholder(source_dir: Path) -> None:
    """A crew answers the caller's message only if a task description holds `{message}`.

    Checked where it can be: task descriptions written as string literals in `Task(description=...)`
    calls anywhere in the tree. Descriptions built at run time or kept in YAML (crewai's config files)
    cannot be read statically, so a YAML file carrying the placeholder also counts, and a tree with no
    literal description passes."""
    literal_descriptions: list[str] = []
    for path in sorted(source_dir.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        if path.suffix in (".yaml", ".yml", ".json", ".toml", ".txt", ".md") and MESSAGE_PLACEHOLDER in _read(path):
            return
        if path.suffix != ".py":
            continue
        try:
            tree = ast.parse(_read(path))
        except SyntaxError:
            continue  # only crew.py must parse; others surface when imported
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called != "Task":
                continue
            for keyword in node.keywords:
                if keyword.arg == "description":
                    if isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str):
                        literal_descriptions.append(keyword.value.value)
                    else:
                        return  # computed: cannot be checked statically
    if literal_descriptions and not any(MESSAGE_PLACEHOLDER in d for d in literal_descriptions):
        raise BuildError(
            "crew.py: no task description contains the placeholder {message}, so the crew would never see "
            "the caller's message; add {message} to a task description ({history} carries prior conversation)"
        )


def _parse(filename: str, text: str) -> ast.Module:
    try:
        return ast.parse(text, filename=filename)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        raise BuildError(f"{filename} is not valid Python ({where}): {exc.msg}") from None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BuildError(f"{path.name} is not UTF-8 text") from None


def _kind(framework: str) -> str:
    return f"a {framework} agent" if framework in AGENT_FRAMEWORKS else f"a {framework} function"


def _needs(framework: str) -> str:
    return {
        "adk": "module-level `root_agent`",
        "langgraph": "a module-level compiled `graph` over the messages state",
        "crewai": "module-level `crew`, a crew or a zero-argument function returning one",
        "function": "`handle(event, context)`, sync or async",
        "function-nodejs": "an exported `handle(event, context)`",
        "function-go": "`func Handle(...)`",
        "function-ruby": "`def handle(event, context)`",
    }[framework]
