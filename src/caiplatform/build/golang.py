"""Compiling a `function-go` function into the program the harness runs.

The function is a Go package whose `main.go` defines `Handle` (see the template's shape). The build
works on a throw-away copy of the source: without a `go.mod` it runs `go mod init function`; a
`package main` gets the generated `zz_caiplatform_main.go` beside its files (so it must not define
`main` itself), any other package a generated `caiplatform_function_main` command that imports it.
`go build` then writes one static program (`CGO_ENABLED=0`), which is run once with
`CAI_FUNCTION_CHECK=1` so that a `Handle` of the wrong shape fails the build, not the first invoke.
Dependencies come the module's usual way (`vendor/`, the module cache, or `GOPROXY`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from caiplatform.build.steps import StepJail, run_step
from caiplatform.ports.builder import BuildError, BuildLog
from caiplatform.sandbox import paths

MAIN_TEMPLATE = Path(__file__).with_name("go_function_main.go.tmpl")
GENERATED_FILE = "zz_caiplatform_main.go"
WRAPPER_DIR = "caiplatform_function_main"
BINARY_NAME = "function"
CHECK_TIMEOUT_SECONDS = 30.0


def go_binary(env: Mapping[str, str] | None = None) -> str | None:
    return shutil.which("go", path=(env or {}).get("PATH") or os.environ.get("PATH"))


def go_settings(base: Mapping[str, str], cache_dir: Path) -> dict[str, str]:
    """What the platform sets for a Go step on top of the server's environment `base`."""
    env = {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
    # Go needs a build cache and a module path; a service account without a home has neither.
    if not any(base.get(name) for name in ("GOCACHE", "HOME", "XDG_CACHE_HOME")):
        env["GOCACHE"] = str(cache_dir / "go-build")
    if not any(base.get(name) for name in ("GOPATH", "HOME")):
        env["GOPATH"] = str(cache_dir / "go")
    return env


async def build_go_function(
    source: Path, output: Path, emit: BuildLog, *, env: Mapping[str, str] | None = None, cache_dir: Path | None = None,
    jail: StepJail | None = None,
) -> None:
    """Compile the function in `source` into the program `output` (raises `BuildError` with Go's output)."""
    base = dict(env if env is not None else os.environ)
    go = go_binary(base)
    if go is None:
        raise BuildError("function-go functions need the Go toolchain (`go`), which is not installed here")
    cache = cache_dir or Path(tempfile.gettempdir()) / "caiplatform-go"
    genv = go_settings(base, cache)
    with tempfile.TemporaryDirectory(prefix="cai-go-build-") as tmp:
        work = Path(tmp) / "src"
        await asyncio.to_thread(shutil.copytree, source, work, symlinks=False, ignore=shutil.ignore_patterns(".git"))
        output.parent.mkdir(parents=True, exist_ok=True)
        if jail is not None:
            # In the sandbox: its own build and module caches (the builder's, per project), no home of the server.
            jail = jail.with_paths(writable=(Path(tmp), output.parent, cache),
                                   places=((Path(tmp), paths.BUILD), (output.parent, paths.BIN),
                                           (cache, f"{paths.CACHE}/go")))
            genv.update({"GOCACHE": str(cache / "go-build"), "GOPATH": str(cache / "go"), "HOME": "/tmp"})
        if not (work / "go.mod").is_file():
            await run_step([go, "mod", "init", "function"], "creating go.mod (go mod init)", emit, cwd=work, env=base, set_env=genv, jail=jail)
        listing = await run_step(
            [go, "list", "-f", "{{.Name}} {{.ImportPath}}", "."], "reading the Go package (go list)", emit,
            cwd=work, env=base, set_env=genv, jail=jail)
        name, import_path = listing.strip().splitlines()[-1].split(" ", 1)
        template = MAIN_TEMPLATE.read_text()
        if name == "main":
            (work / GENERATED_FILE).write_text(template.replace("{{IMPORT}}", "").replace("{{HANDLE}}", "Handle"))
            target = "."
        else:
            (work / WRAPPER_DIR).mkdir()
            (work / WRAPPER_DIR / "main.go").write_text(
                template.replace("{{IMPORT}}", f"userfunction {json.dumps(import_path)}")
                .replace("{{HANDLE}}", "userfunction.Handle"))
            target = f"./{WRAPPER_DIR}"
        emit("compiling the Go function (go build)")
        await run_step([go, "build", "-trimpath", "-o", str(output), target], "compiling the Go function (go build)",
                       emit, cwd=work, env=base, set_env=genv, jail=jail)
    checking = StepJail(jail.sandbox, read_only=(output.parent,), places=((output.parent, paths.BIN),)) if jail else None
    await check_handle(output, base, checking, set_env=genv)


async def check_handle(program: Path, env: Mapping[str, str], jail: StepJail | None = None,
                       set_env: Mapping[str, str] | None = None) -> None:
    """Run the program once with `CAI_FUNCTION_CHECK=1`: it says whether `Handle` has a shape it can call
    (its packages' `init` functions run too, so in the sandbox when there is one)."""
    try:
        out = await run_step([str(program)], "checking the compiled Go function", lambda _line: None,
                             env=env, set_env={**(set_env or {}), "CAI_FUNCTION_CHECK": "1"},
                             timeout=CHECK_TIMEOUT_SECONDS, jail=jail)
    except BuildError as exc:
        if "took longer than" in exc.message:
            raise BuildError(f"the compiled Go function did not start within {CHECK_TIMEOUT_SECONDS:g} s") from None
        out = exc.message
    for line in reversed(out.splitlines()):
        try:
            hello = json.loads(line)
        except ValueError:
            continue
        if isinstance(hello, dict) and "ready" in hello:
            if hello["ready"]:
                return
            raise BuildError(f"main.go: {hello.get('error')}")
    raise BuildError("the compiled Go function exited before it was ready")
