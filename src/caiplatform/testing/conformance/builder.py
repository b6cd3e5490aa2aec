"""Conformance suite for `Builder` adapters.

Use it from a test module that defines a `builder` fixture (the adapter) and a `backend` fixture (its
registry name), then import the tests:

    from caiplatform.testing.conformance.builder import *  # noqa: F403

Sources come from `caiplatform.testing.sources`; every test writes its own tree under `tmp_path`.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from caiplatform.ports.builder import Builder, BuildError, BuildRequest, Image
from caiplatform.testing import sources
from caiplatform.testing.conformance.memorystore import apply_notimpl
from caiplatform.turns.line_function import runner_class

__all__ = [
    "test_build_names_the_image_and_how_it_starts",
    "test_every_framework_builds",
    "test_same_source_reuses_the_image",
    "test_same_source_for_another_workload_has_the_same_digest",
    "test_same_source_in_another_project_is_another_image",
    "test_changed_source_changes_the_digest",
    "test_image_is_a_copy_of_the_source",
    "test_missing_entry_file_fails",
    "test_missing_entry_name_fails",
    "test_syntax_error_fails",
    "test_crew_without_message_placeholder_fails",
    "test_function_without_handle_fails",
    "test_missing_toolchain_fails",
    "test_function_in_another_language_runs_from_its_image",
    "test_go_function_runs_without_the_toolchain_once_built",
    "test_go_compile_error_fails_with_the_compiler_output",
    "test_go_handle_of_the_wrong_shape_fails",
    "test_go_package_of_its_own_module_with_typed_arguments",
    "test_ruby_syntax_error_fails",
    "test_ruby_gems_vendored_for_bundler_are_installed",
    "test_node_dependencies_are_installed",
    "test_resolve_and_remove",
    "test_build_log_receives_lines",
    "test_requirements_are_installed_into_the_image",
    "test_uninstallable_requirement_fails_with_pip_output",
    "apply_notimpl",
]

notimpl = pytest.mark.notimpl
REFERENCE = re.compile(r"^registry\.local/cai-([0-9a-f]{8})-([a-z0-9-]+)@sha256:[0-9a-f]{64}$")


def request_for(source: Path, framework: str = "langgraph", workload: str | None = None,
                project: str | None = None, runtime: str | None = None) -> BuildRequest:
    project = project or str(uuid.uuid4())
    return BuildRequest(
        project_id=project,
        project_short=project[:8],
        workload=workload or f"w-{secrets.token_hex(3)}",
        framework=framework,
        source_dir=source,
        runtime=runtime,
    )


#: A file that makes this run's trees differ from any other run's, so an adapter whose image store
#: outlives one test (a shared data dir) still builds rather than reuses.
RUN_NONCE = {"nonce.txt": secrets.token_hex(8)}


def tree(tmp_path: Path, files: Mapping[str, str | bytes] | None = None, name: str | None = None) -> Path:
    return sources.write_tree(tmp_path / (name or f"src-{secrets.token_hex(3)}"), {**(files or sources.LANGGRAPH), **RUN_NONCE})


async def expect_build_error(builder: Builder, request: BuildRequest, *fragments: str) -> str:
    with pytest.raises(BuildError) as caught:
        await builder.build(request)
    message = caught.value.message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ---------------------------------------------------------------------------------------------------


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the platform's disk")
async def test_build_names_the_image_and_how_it_starts(builder: Builder, tmp_path: Path):
    request = request_for(tree(tmp_path))
    image = await builder.build(request)
    match = REFERENCE.match(image.reference)
    assert match, image.reference
    assert match.groups() == (request.project_short, request.workload)
    assert image.reference.endswith("@" + image.digest)
    assert image.framework == "langgraph" and not image.reused
    assert image.command[-2:] == ["-m", "caiplatform.harness"]
    assert image.env["CAI_FRAMEWORK"] == "langgraph"
    code_dir = Path(image.env["CAI_CODE_DIR"])
    assert (code_dir / "graph.py").read_text() == sources.LANGGRAPH["graph.py"]


@pytest.mark.parametrize("framework", list(sources.BY_FRAMEWORK))
async def test_every_framework_builds(builder: Builder, tmp_path: Path, framework: str):
    image = await builder.build(request_for(tree(tmp_path, sources.BY_FRAMEWORK[framework]), framework))
    assert image.framework == framework and image.env["CAI_FRAMEWORK"] == framework


async def test_same_source_reuses_the_image(builder: Builder, tmp_path: Path):
    request = request_for(tree(tmp_path))
    first = await builder.build(request)
    again = await builder.build(request_for(tree(tmp_path), workload=request.workload, project=request.project_id))
    assert again.reused and again.reference == first.reference and again.digest == first.digest
    assert again.env == first.env and again.command == first.command


async def test_same_source_for_another_workload_has_the_same_digest(builder: Builder, tmp_path: Path):
    request = request_for(tree(tmp_path))
    first = await builder.build(request)
    other = await builder.build(request_for(tree(tmp_path), project=request.project_id))
    assert other.digest == first.digest and other.reference != first.reference


async def test_same_source_in_another_project_is_another_image(builder: Builder, tmp_path: Path):
    """Issue 34: the project is part of the image key; another project's build of the same source
    neither reuses nor shares the image (a build runs the tenant's code)."""
    first = await builder.build(request_for(tree(tmp_path)))
    lines: list[str] = []
    other = await builder.build(request_for(tree(tmp_path)), lines.append)
    assert other.digest != first.digest and not other.reused
    assert other.location != first.location or not first.location
    assert not any("reus" in line for line in lines), lines


async def test_changed_source_changes_the_digest(builder: Builder, tmp_path: Path):
    project = str(uuid.uuid4())  # one project: only the source and the framework differ
    first = await builder.build(request_for(tree(tmp_path), project=project))
    changed = await builder.build(request_for(tree(tmp_path, {**sources.LANGGRAPH, "notes.txt": "v2"}), project=project))
    as_function = await builder.build(request_for(tree(tmp_path, {**sources.LANGGRAPH, **sources.FUNCTION}), "function",
                                                  project=project))
    assert len({first.digest, changed.digest, as_function.digest}) == 3
    assert not changed.reused


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the platform's disk")
async def test_image_is_a_copy_of_the_source(builder: Builder, tmp_path: Path):
    source = tree(tmp_path)
    image = await builder.build(request_for(source))
    (source / "graph.py").write_text("graph = None  # edited after the build\n")
    (source / "extra.py").write_text("x = 1\n")
    code_dir = Path(image.env["CAI_CODE_DIR"])
    assert (code_dir / "graph.py").read_text() == sources.LANGGRAPH["graph.py"]
    assert not (code_dir / "extra.py").exists()


async def test_missing_entry_file_fails(builder: Builder, tmp_path: Path):
    await expect_build_error(builder, request_for(tree(tmp_path, {"main.py": "x = 1\n"}), "adk"), "agent.py", "root_agent")
    await expect_build_error(builder, request_for(tree(tmp_path, sources.ADK), "langgraph"), "graph.py")
    await expect_build_error(builder, request_for(tree(tmp_path, sources.ADK), "crewai"), "crew.py")
    await expect_build_error(builder, request_for(tree(tmp_path, sources.ADK), "function"), "main.py", "handle")


async def test_missing_entry_name_fails(builder: Builder, tmp_path: Path):
    source = tree(tmp_path, {"graph.py": "from langgraph.graph import StateGraph\napp = None\n"})
    await expect_build_error(builder, request_for(source), "graph.py", "`graph`")
    source = tree(tmp_path, {"agent.py": "agent = object()\n"})
    await expect_build_error(builder, request_for(source, "adk"), "agent.py", "`root_agent`")


async def test_syntax_error_fails(builder: Builder, tmp_path: Path):
    source = tree(tmp_path, {"agent.py": "root_agent = (\n"})
    await expect_build_error(builder, request_for(source, "adk"), "agent.py is not valid Python", "line")


async def test_crew_without_message_placeholder_fails(builder: Builder, tmp_path: Path):
    crew = sources.CREWAI["crew.py"].replace("Answer: {message}", "Answer the question")
    await expect_build_error(builder, request_for(tree(tmp_path, {"crew.py": crew}), "crewai"), "{message}")


async def test_function_without_handle_fails(builder: Builder, tmp_path: Path):
    await expect_build_error(
        builder, request_for(tree(tmp_path, {"main.py": "def handler(event):\n    return 1\n"}), "function"), "`handle`")
    await expect_build_error(
        builder, request_for(tree(tmp_path, {"index.js": "function handle() {}\n"}), "function-nodejs"), "export")


@pytest.mark.needs()  # empties PATH itself: runs whether or not the toolchains are installed
@notimpl(["kubernetes", "kubernetes-cluster"],
         reason="a cluster build finds the toolchains in the harness image it starts from, not on the control plane's machine")
async def test_missing_toolchain_fails(builder: Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    for framework, tool in (("function-go", "`go`"), ("function-ruby", "`ruby`"), ("function-nodejs", "`node`")):
        source = tree(tmp_path, sources.BY_FRAMEWORK[framework])
        await expect_build_error(builder, request_for(source, framework), tool, "toolchain")
    # `framework=function` with a `runtime` names the same toolchain.
    source = tree(tmp_path, sources.GO_FUNCTION)
    await expect_build_error(builder, request_for(source, "function", runtime="go"), "`go`")


async def call_built_function(image: Image, event: Any, env: dict[str, str] | None = None) -> Any:
    """Start a function in another language from its image, as its harness does, and call it once."""
    runner = runner_class(image.framework).from_dir(
        image.env["CAI_CODE_DIR"], env={**(env or os.environ), **image.env}, agent="fn")
    try:
        context = {"agent": "fn", "session_id": "s", "user_id": "u", "invocation_id": "i", "history": []}
        return await runner.call(event, context)
    finally:
        await runner.aclose()


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
@pytest.mark.parametrize("framework", ["function-nodejs", "function-go", "function-ruby"])
async def test_function_in_another_language_runs_from_its_image(builder: Builder, tmp_path: Path, framework: str):
    source = tree(tmp_path, sources.BY_FRAMEWORK[framework])
    image = await builder.build(request_for(source, framework))
    for path in source.iterdir():
        path.unlink()  # the image runs from its own copy
    assert await call_built_function(image, {"message": "hi"}) == {"echo": {"message": "hi"}}


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
async def test_go_function_runs_without_the_toolchain_once_built(builder: Builder, tmp_path: Path):
    image = await builder.build(request_for(tree(tmp_path, sources.GO_FUNCTION), "function-go"))
    assert Path(image.env["CAI_FUNCTION_BINARY"]).is_file()
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    answer = await call_built_function(image, {"n": 1}, env={**os.environ, "PATH": str(empty)})
    assert answer == {"echo": {"n": 1}}


@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
async def test_go_compile_error_fails_with_the_compiler_output(builder: Builder, tmp_path: Path):
    source = tree(tmp_path, {"main.go": "package main\n\nfunc Handle(event any) (any, error) {\n\treturn missing, nil\n}\n"})
    await expect_build_error(builder, request_for(source, "function-go"), "go build", "undefined: missing")


@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
async def test_go_handle_of_the_wrong_shape_fails(builder: Builder, tmp_path: Path):
    source = tree(tmp_path, {"main.go": "package main\n\nfunc Handle(a, b, c int) int {\n\treturn a\n}\n"})
    await expect_build_error(builder, request_for(source, "function-go"), "main.go: Handle must look like",
                             "func(int, int, int) int")


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
async def test_go_package_of_its_own_module_with_typed_arguments(builder: Builder, tmp_path: Path):
    """A package other than `main`, importing a package of its module, taking a `context.Context` and structs."""
    source = tree(tmp_path, {
        "go.mod": "module example.com/greeter\n\ngo 1.19\n",
        "words/words.go": "package words\n\nfunc Hello() string { return \"hello\" }\n",
        "main.go": (
            "package greeter\n\n"
            "import (\n\t\"context\"\n\n\t\"example.com/greeter/words\"\n)\n\n"
            "type Event struct {\n\tMessage string `json:\"message\"`\n}\n\n"
            "type Info struct {\n\tAgent string `json:\"agent\"`\n}\n\n"
            "func Handle(ctx context.Context, event Event, info Info) (string, error) {\n"
            "\treturn words.Hello() + \" \" + event.Message + \" from \" + info.Agent, ctx.Err()\n}\n"
        ),
    })
    image = await builder.build(request_for(source, "function-go"))
    assert await call_built_function(image, {"message": "Ada"}) == "hello Ada from fn"


@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
async def test_ruby_syntax_error_fails(builder: Builder, tmp_path: Path):
    source = tree(tmp_path, {"main.rb": "def handle(event, context\n  1\n"})
    await expect_build_error(builder, request_for(source, "function-ruby"), "ruby -c", "main.rb")


def _vendored_gem(tmp_path: Path) -> bytes:
    """A tiny gem (`Shout.call(text)`), packed by `gem build` as `bundle cache` would vendor it."""
    gem_dir = sources.write_tree(tmp_path / f"gem-{secrets.token_hex(3)}", {
        "shout.gemspec": (
            'Gem::Specification.new do |s|\n  s.name = "shout"\n  s.version = "1.0.0"\n  s.summary = "Shouts"\n'
            '  s.authors = ["caiplatform"]\n  s.files = ["lib/shout.rb"]\nend\n'
        ),
        "lib/shout.rb": 'module Shout\n  def self.call(text) = "#{text.upcase}!"\nend\n',
    })
    subprocess.run(["gem", "build", "shout.gemspec"], cwd=gem_dir, check=True, capture_output=True, timeout=60)
    return (gem_dir / "shout-1.0.0.gem").read_bytes()


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
async def test_ruby_gems_vendored_for_bundler_are_installed(builder: Builder, tmp_path: Path):
    source = tree(tmp_path, {
        "Gemfile": 'source "https://rubygems.org"\ngem "shout"\n',
        "main.rb": 'require "shout"\n\ndef handle(event, context)\n  Shout.call(event["message"])\nend\n',
    })
    (source / "vendor" / "cache").mkdir(parents=True)
    (source / "vendor" / "cache" / "shout-1.0.0.gem").write_bytes(_vendored_gem(tmp_path))
    image = await builder.build(request_for(source, "function-ruby"))
    assert (Path(image.env["CAI_CODE_DIR"]) / "vendor" / "bundle").is_dir()
    assert not (source / "vendor" / "bundle").exists()  # installed into the image, not the upload
    assert await call_built_function(image, {"message": "hi"}) == "HI!"


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
async def test_node_dependencies_are_installed(builder: Builder, tmp_path: Path):
    source = tree(tmp_path, {
        "package.json": '{"name": "fn", "version": "1.0.0", "dependencies": {"shout": "file:./shout"}}\n',
        "shout/package.json": '{"name": "shout", "version": "1.0.0", "main": "index.js"}\n',
        "shout/index.js": 'module.exports = (text) => text.toUpperCase() + "!";\n',
        "index.js": 'const shout = require("shout");\nexports.handle = (event) => shout(event.message);\n',
    })
    image = await builder.build(request_for(source, "function-nodejs"))
    assert (Path(image.env["CAI_CODE_DIR"]) / "node_modules").exists() and not (source / "node_modules").exists()
    assert await call_built_function(image, {"message": "hi"}) == "HI!"


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the platform's disk")
async def test_resolve_and_remove(builder: Builder, tmp_path: Path):
    request = request_for(tree(tmp_path))
    image = await builder.build(request)
    resolved = await builder.resolve(image.reference)
    assert resolved is not None and resolved.digest == image.digest and resolved.env == image.env
    assert await builder.resolve(image.reference.replace(image.digest, "sha256:" + "0" * 64)) is None
    await builder.remove(image.reference)
    assert await builder.resolve(image.reference) is None
    await builder.remove(image.reference)  # idempotent
    rebuilt = await builder.build(request_for(tree(tmp_path), project=request.project_id))
    assert rebuilt.digest == image.digest and Path(rebuilt.env["CAI_CODE_DIR"]).is_dir()


async def test_build_log_receives_lines(builder: Builder, tmp_path: Path):
    lines: list[str] = []
    await builder.build(request_for(tree(tmp_path)), lines.append)
    assert lines and all(isinstance(line, str) for line in lines)


def _image_python_imports(image: Image, module: str) -> bool:
    result = subprocess.run([image.command[0], "-c", f"import {module}"], capture_output=True, timeout=60)
    return result.returncode == 0


@notimpl(["kubernetes-cluster"], reason="a cluster's image lives in its registry; CAI_CODE_DIR is a path inside the image, not on the test's disk")
@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
@notimpl(["memory"], reason="the in-memory builder runs everything on the platform's own Python and installs nothing")
async def test_requirements_are_installed_into_the_image(builder: Builder, tmp_path: Path):
    # A wheel of the source tree, installed without any index: tests use no network.
    wheel = "wheels/cai_tiny_dependency-1.0-py3-none-any.whl"
    source = tree(tmp_path, {
        **sources.FUNCTION,
        wheel: sources.pure_python_wheel("cai_tiny_dependency", "ANSWER = 42\n"),
        "requirements.txt": f"--no-index\n./{wheel}\n",
    })
    image = await builder.build(request_for(source, "function"))
    assert _image_python_imports(image, "cai_tiny_dependency")
    assert _image_python_imports(image, "caiplatform.harness") or _image_python_imports(image, "caiplatform")


@notimpl(["kubernetes"], reason="the language step and pip run inside the BuildKit build Job, which the API emulator does not run")
@notimpl(["memory"], reason="the in-memory builder installs nothing, so nothing can fail to install")
async def test_uninstallable_requirement_fails_with_pip_output(builder: Builder, tmp_path: Path):
    source = tree(tmp_path, {**sources.FUNCTION, "requirements.txt": "./no-such-package-dir\n"})
    message = await expect_build_error(builder, request_for(source, "function"), "requirements.txt")
    assert "no-such-package-dir" in message
    assert len(message) <= 4000 + len("...(truncated)")
