"""Entry-file checks: static, per framework, with messages that say what to fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from caiplatform.build.checks import check_source, framework_for
from caiplatform.ports.builder import BuildError, truncate_build_message
from caiplatform.testing import sources


def check(tmp_path: Path, files: dict[str, str], framework: str, runtime: str | None = None) -> None:
    check_source(sources.write_tree(tmp_path / "src", files), framework, runtime)


def refused(tmp_path: Path, files: dict[str, str], framework: str, runtime: str | None = None) -> str:
    with pytest.raises(BuildError) as caught:
        check(tmp_path, files, framework, runtime)
    return caught.value.message


@pytest.mark.parametrize("body", [
    "root_agent = make()\n",
    "root_agent: Agent = make()\n",
    "from agents import root_agent\n",
    "from agents import agent as root_agent\n",
    "def root_agent():\n    pass\n",
    "try:\n    root_agent = make()\nexcept ImportError:\n    root_agent = None\n",
    "if True:\n    root_agent = make()\n",
    "a, root_agent = 1, 2\n",
])
def test_module_level_bindings_count(tmp_path: Path, body: str):
    check(tmp_path, {"agent.py": body}, "adk")


@pytest.mark.parametrize("body", [
    "def build():\n    root_agent = 1\n",
    "class A:\n    root_agent = 1\n",
    "root_agent_v2 = 1\n",
    "# root_agent = 1\n",
    "print('root_agent')\n",
])
def test_names_not_at_module_level_are_refused(tmp_path: Path, body: str):
    assert "module-level `root_agent`" in refused(tmp_path, {"agent.py": body}, "adk")


def test_user_code_is_never_imported(tmp_path: Path):
    marker = tmp_path / "imported"
    body = f"open({str(marker)!r}, 'w').write('x')\nroot_agent = 1\n"
    check(tmp_path, {"agent.py": body}, "adk")
    assert not marker.exists()


def test_crew_placeholder_rules(tmp_path: Path):
    crew = sources.CREWAI["crew.py"]
    check(tmp_path / "a", {"crew.py": crew}, "crewai")
    # Descriptions in YAML or built at run time cannot be read statically: they pass.
    check(tmp_path / "b", {"crew.py": "crew = build()\n", "config/tasks.yaml": "answer:\n  description: '{message}'\n"},
          "crewai")
    check(tmp_path / "c", {"crew.py": "from crewai import Task\nt = Task(description=text)\ncrew = 1\n"}, "crewai")
    check(tmp_path / "d", {"crew.py": "def crew():\n    return None\n"}, "crewai")
    # A sibling module's literal description counts like crew.py's own.
    check(tmp_path / "e", {"crew.py": "from tasks import crew\n",
                           "tasks.py": "from crewai import Task\nt = Task(description='Reply to {message}')\ncrew = 1\n"},
          "crewai")
    message = refused(tmp_path / "f", {"crew.py": crew.replace("{message}", "the question")}, "crewai")
    assert "{message}" in message


@pytest.mark.parametrize("source", [
    "exports.handle = async (event) => event;\n",
    "module.exports.handle = function (event) { return event };\n",
    "async function handle(e) { return e }\nmodule.exports = { handle };\n",
    "module.exports = {\n  other,\n  handle: async (e) => e,\n};\n",
    "export async function handle(event, context) { return event }\n",
    "export const handle = (e) => e;\n",
    "function handle(e) { return e }\nexport { handle };\n",
])
def test_node_export_forms(tmp_path: Path, source: str):
    check(tmp_path, {"index.js": source}, "function-nodejs")


def test_go_and_ruby_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool, *a, **k: f"/usr/bin/{tool}" if tool in ("go", "ruby") else real_which(tool))
    check(tmp_path / "go", sources.GO_FUNCTION, "function-go")
    check(tmp_path / "rb", sources.RUBY_FUNCTION, "function", "ruby")
    assert "func Handle" in refused(tmp_path / "go2", {"main.go": "package main\nfunc handle() {}\n"}, "function-go")
    assert "def handle" in refused(tmp_path / "rb2", {"main.rb": "def other(e)\nend\n"}, "function-ruby")


def test_missing_toolchain_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    message = refused(tmp_path, sources.GO_FUNCTION, "function-go")
    assert message.startswith("function-go functions need the Go toolchain (`go`)")


def test_unknown_framework_and_non_utf8(tmp_path: Path):
    assert "unsupported framework 'rust'" in refused(tmp_path / "a", sources.FUNCTION, "rust")
    root = tmp_path / "b"
    root.mkdir()
    (root / "main.py").write_bytes(b"\xff\xfe handle")
    with pytest.raises(BuildError, match="not UTF-8"):
        check_source(root, "function")


def test_symlinked_entry_is_refused(tmp_path: Path):
    root = sources.write_tree(tmp_path / "src", {"real.py": "root_agent = 1\n"})
    (root / "agent.py").symlink_to(root / "real.py")
    with pytest.raises(BuildError, match="agent.py"):
        check_source(root, "adk")


def test_framework_for_runtime():
    assert framework_for("function", "nodejs") == "function-nodejs"
    assert framework_for("function", "python") == "function"
    assert framework_for("function", None) == "function"
    assert framework_for("adk", None) == "adk"


def test_build_message_is_truncated():
    assert truncate_build_message("x" * 4000) == "x" * 4000
    cut = BuildError("y" * 5000).message
    assert cut == "y" * 4000 + "...(truncated)"
