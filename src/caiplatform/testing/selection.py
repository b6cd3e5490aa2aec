"""Which kind of test an item is, decided when pytest collects it, so `-m unit` selects before running.

Every collected test gets exactly one of four markers (unless it already carries one):

- ``unit``: in-memory adapters, the in-process ASGI app, the conformance suites on memory or SQLite;
  no engine, no child process, no network. ``nox -s unit`` runs these, and there a guard fails a
  ``unit`` test that starts a child process (mark it ``process``, or request a fixture below).
- ``engine``: needs a real engine: it requests ``postgres_url``, ``redis_url``, ``nats_url`` or
  ``openbao``, or a parametrized fixture of it names one (``postgres``, ``nats``, ``openbao``, ...).
- ``process``: starts child processes (supervised engines, workloads, builds, harness processes):
  it requests a fixture of ``PROCESS_FIXTURES``, a parameter names a process-backed adapter, or the
  test's module names one of ``PROCESS_WORDS``.
- ``e2e``: starts a real ``caiplatform serve`` process (marked by the module).

A test may also need what the machine may lack: the ``agents`` extra, or the Go, Ruby or Node.js
toolchain. :func:`missing_needs` names it, and the session deselects such tests with one summary line
per missing thing instead of failing them.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import shutil
import types
from collections.abc import Iterable
from functools import cache
from typing import Any

KINDS = ("unit", "engine", "process", "e2e")

ENGINE_FIXTURES = frozenset({"postgres_url", "redis_url", "nats_url", "openbao", "fresh_postgres_url", "own_openbao"})
# Values of parametrized fixtures and arguments that select a real engine's adapter.
ENGINE_PARAMS = frozenset({"postgres", "redis", "nats", "nats-pinned", "openbao", "valkey"})
# Fixtures that start child processes for the test, and parameter values naming a process adapter.
PROCESS_FIXTURES = frozenset(
    {"harness_client", "wired", "model_server", "harness_env", "served", "_model_server", "model", "_scripted"}
)
PROCESS_PARAMS = frozenset({"local"})
# A module that names one of these starts an engine, or processes, in (some of) its tests.
ENGINE_WORDS = re.compile(r"\b(start_openbao_dev|fresh_postgres_database|engine_url)\b")
PROCESS_WORDS = re.compile(
    r"\b(subprocess|ProcessSupervisor|Platform\.embedded|Platform\.from_settings|serve_process|"
    r"start_nats|start_openbao|valkey_spec|LocalRuntime|LocalProvisioner|LocalMcpHost|run_serve|uvicorn\.Server)\b"
)

TOOLCHAINS = {  # what a test names -> the command it needs
    "go": re.compile(r"""["'](function-go|go-function|go)["']"""),
    "ruby": re.compile(r"""["'](function-ruby|ruby-function|ruby)["']"""),
    "node": re.compile(r"""["'](function-nodejs|node-function|nodejs)["']"""),
}
AGENT_FRAMEWORKS = re.compile(
    r"""["'](langgraph|adk|langgraph-weather|adk-weather)["']|\b(LANGGRAPH_WEATHER|ADK_WEATHER)\b"""
)
AGENTS_EXTRA_MODULES = ("langgraph", "google.adk")
HOW_TO_GET = {
    "agents": "pip install 'caiplatform[agents]'",
    "go": "bash backends/toolchains/install.sh",
    "ruby": "bash backends/toolchains/install.sh",
    "node": "bash backends/toolchains/install.sh",
}


@cache
def _module_source(module: Any) -> str:
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return ""


@cache
def _module_words(module: Any) -> tuple[bool, bool]:
    """Whether a module's source names an engine starter, and whether it names a process starter: one
    search per module, not per test (a module holds many tests)."""
    source = _module_source(module)
    return bool(ENGINE_WORDS.search(source)), bool(PROCESS_WORDS.search(source))


@cache
def _module_lines(module: Any) -> list[str]:
    return _module_source(module).splitlines()


def _code_span(code: types.CodeType) -> tuple[int, int]:
    """The lines of a function's source, decorators included, from its code object: from its first line
    (a decorated function's is its first decorator's) to the last line any of its instructions, or of
    the functions defined in it, comes from. Much cheaper than parsing modules or `inspect.getsource`."""
    last = code.co_firstlineno
    codes = [code]
    while codes:
        current = codes.pop()
        for _, end, _, _ in current.co_positions():
            if end is not None and end > last:
                last = end
        codes.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return code.co_firstlineno, last


@cache
def _function_source(function: Any) -> str:
    # Hypothesis' `given` puts a stand-in of its own code in the test's place, and keeps the test here.
    inner = getattr(getattr(function, "hypothesis", None), "inner_test", function)
    code = getattr(inspect.unwrap(inner), "__code__", None)
    module = inspect.getmodule(function)
    if code is not None and module is not None and code.co_filename == getattr(module, "__file__", None):
        first, last = _code_span(code)
        return "\n".join(_module_lines(module)[first - 1 : last])
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _param_words(params: dict[str, Any]) -> set[str]:
    words: set[str] = set()
    for value in params.values():
        if isinstance(value, str):
            words.add(value)
        elif isinstance(value, tuple | list):
            words.update(v for v in value if isinstance(v, str))
    return words


def kind_of(fixtures: Iterable[str], params: dict[str, Any], modules: Iterable[Any], explicit: Iterable[str]) -> str:
    """The one kind of a test: an explicit marker wins; then engine, process, unit. `modules` are the
    test's module and the module that defines its function (a shared conformance suite)."""
    marked = [name for name in explicit if name in KINDS]
    if marked:
        return "e2e" if "e2e" in marked else marked[0]
    fixtures = set(fixtures)
    words = _param_words(params)
    found = [_module_words(m) for m in modules if m is not None]
    if fixtures & ENGINE_FIXTURES or words & ENGINE_PARAMS or any(engine for engine, _ in found):
        return "engine"
    if fixtures & PROCESS_FIXTURES or words & PROCESS_PARAMS or any(process for _, process in found):
        return "process"
    return "unit"


EXPLICIT_UNIT = re.compile(r"\bmark\.unit\b")
MODULE_KIND_MARK = re.compile(r"^pytestmark\s*=.*\bmark\.(e2e|engine|process)\b", re.MULTILINE)


def never_unit(source: str) -> bool:
    """Whether no test of a module with this source can be `unit`, so that `-m unit` need not import it:
    the module names an engine or process starter (every test of it is then `engine` or `process`, see
    `kind_of`) or marks all its tests with another kind, and no test of it says `unit` explicitly."""
    if EXPLICIT_UNIT.search(source):
        return False
    return bool(ENGINE_WORDS.search(source) or PROCESS_WORDS.search(source) or MODULE_KIND_MARK.search(source))


def needs_of(params: dict[str, Any], function: Any, explicit: list[str] | None) -> set[str]:
    """What a test needs beyond the project's own install: what its `needs` marker names (an empty
    `needs()` says nothing), else the agent frameworks and function languages its parameters or body name."""
    if explicit is not None:
        return set(explicit)
    needs: set[str] = set()
    text = _function_source(function) + "\n" + "\n".join(repr(w) for w in _param_words(params))
    for tool, pattern in TOOLCHAINS.items():
        if pattern.search(text):
            needs.add(tool)
    if AGENT_FRAMEWORKS.search(text):
        needs.add("agents")
    return needs


@cache
def available(need: str) -> bool:
    if need == "agents":
        return all(_importable(name) for name in AGENTS_EXTRA_MODULES)
    return shutil.which(need) is not None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False


def missing_needs(needs: Iterable[str]) -> list[str]:
    return sorted(need for need in needs if not available(need))
