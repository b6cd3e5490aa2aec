"""Import an agent's entry file from its code directory."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from caiplatform.turns.base import TurnError

ENTRY_FILES = {"adk": "agent.py", "crewai": "crew.py", "langgraph": "graph.py", "function": "main.py"}
REQUIRED = {"adk": "root_agent", "crewai": "crew", "langgraph": "graph", "function": "handle"}


class EntryError(TurnError):
    """The code directory does not hold what its framework needs."""


def load_entry(code_dir: str | Path, framework: str) -> ModuleType:
    """Import `<code_dir>/<entry file>`, with `code_dir` first on `sys.path` so sibling modules import."""
    if framework not in ENTRY_FILES:
        raise EntryError(f"unsupported framework: {framework}")
    code_dir = Path(code_dir).resolve()
    path = code_dir / ENTRY_FILES[framework]
    if not path.is_file():
        raise EntryError(f"{framework} agents need {ENTRY_FILES[framework]} in the code directory")
    if str(code_dir) not in sys.path:
        sys.path.insert(0, str(code_dir))
    name = "cai_entry_" + hashlib.sha256(str(path).encode()).hexdigest()[:12] + "_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise EntryError(f"cannot import {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules.pop(name, None)
        raise
    attribute = REQUIRED[framework]
    if not hasattr(module, attribute):
        raise EntryError(f"{path.name} must define module-level `{attribute}`")
    return module
