"""The import rules of docs/architecture.md, read from the source (every import, at module level or inside a
function): which package may import which."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src"
LIBRARY = SRC / "caiplatform"

# The library's entry points that start the platform's server (`caiplatform serve`, the in-process client,
# the OpenAPI generator): they import `caiplatform_server.app`, which is what they run.
SERVER_ENTRY_POINTS = {"cli/serve.py", "client/in_process.py", "client/generate.py"}


def _imports(path: Path) -> set[str]:
    """The absolute names a module imports (relative imports resolved against its package)."""
    package = path.relative_to(SRC).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _offenders(files: list[Path], forbidden: str, allowed: set[str] = frozenset()) -> list[str]:
    found = []
    for path in files:
        name = path.relative_to(LIBRARY).as_posix() if path.is_relative_to(LIBRARY) else path.as_posix()
        if name in allowed:
            continue
        wrong = sorted(n for n in _imports(path) if n == forbidden or n.startswith(forbidden + "."))
        if wrong:
            found.append(f"{name}: {', '.join(wrong)}")
    return found


def test_no_adapter_imports_a_service():
    assert _offenders(_modules(LIBRARY / "adapters"), "caiplatform.services") == []


def test_no_production_module_imports_the_test_doubles():
    production = [p for p in _modules(SRC) if not p.is_relative_to(LIBRARY / "testing")]
    assert _offenders(production, "caiplatform.testing") == []


def test_the_library_does_not_import_the_server():
    """Only its entry points that run the server do, and the test helpers (`caiplatform.testing`), which
    serve the whole platform to the tests."""
    library = [p for p in _modules(LIBRARY) if not p.is_relative_to(LIBRARY / "testing")]
    assert _offenders(library, "caiplatform_server", SERVER_ENTRY_POINTS) == []


def test_models_import_only_the_domain_rules():
    models = _modules(LIBRARY / "models") + [LIBRARY / "codesandbox" / "models.py"]
    assert _offenders(models, "caiplatform.services") == []
    assert _offenders(models, "caiplatform.adapters") == []
    assert _offenders([LIBRARY / "codesandbox" / "models.py"], "caiplatform.codesandbox.service") == []


def test_the_domain_imports_no_model_service_or_adapter():
    """The spec's rules (`domain/`) are what models and services use; they use neither."""
    domain = _modules(LIBRARY / "domain")
    for forbidden in ("caiplatform.models", "caiplatform.services", "caiplatform.adapters"):
        assert _offenders(domain, forbidden) == []


def test_the_workload_library_imports_no_adapter():
    """`caiplatform.workload` runs inside workloads: it reaches the platform over HTTP, never an adapter."""
    assert _offenders([LIBRARY / "workload.py"], "caiplatform.adapters") == []


def test_services_do_not_import_adapters():
    assert _offenders(_modules(LIBRARY / "services"), "caiplatform.adapters") == []


# What opens a connection itself: the sockets and HTTP machinery below a client library, and asyncio's
# stream openers. Services use a client (httpx, `caiplatform.web.harness_http`); they do not write one.
CONNECTION_MODULES = ("socket", "ssl", "h11", "httpcore")
CONNECTION_CALLS = {"open_connection", "open_unix_connection", "start_server", "start_unix_server",
                    "create_connection", "create_unix_connection"}


def _opens_connections(path: Path) -> list[str]:
    found = sorted(n for n in _imports(path) for m in CONNECTION_MODULES if n == m or n.startswith(m + "."))
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in CONNECTION_CALLS:
            found.append(f"{node.attr} (line {node.lineno})")
    return found


def test_no_service_is_an_http_client():
    """Infrastructure is not in `services/`: the HTTP clients and transports (the harness client, the
    transport to private hostnames) live in `caiplatform/web/` or `adapters/`."""
    found = {path.relative_to(LIBRARY).as_posix(): opened for path in _modules(LIBRARY / "services")
             if (opened := _opens_connections(path))}
    assert found == {}
    assert _opens_connections(LIBRARY / "web" / "harness_http.py")  # the rule sees what it forbids


def test_the_rules_see_the_imports_they_forbid():
    """The reader above finds imports inside functions and relative ones (a rule that sees nothing passes)."""
    assert "caiplatform.services.agents.AgentService" in _imports(LIBRARY / "platform.py")  # in a function
    assert "caiplatform.services.access" in _imports(LIBRARY / "services" / "messaging.py")
