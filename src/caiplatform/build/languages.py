"""The language step of a function build, run by every builder on the image's own copy of the source.

- `function-go`: compile the program the harness runs (`caiplatform.build.golang`) into `bin_dir`.
- `function-ruby`: `ruby -c main.rb`; with a `Gemfile`, `bundle install` into `vendor/bundle` (`--local`
  when the gems are vendored in `vendor/cache`).
- `function-nodejs`: with a `package.json` that has dependencies and no `node_modules`,
  `npm install --omit=dev` (a `file:` dependency installs without a registry).

Python frameworks have their own step (the environment for `requirements.txt`), so nothing happens
here for them.

`python -m caiplatform.build.languages <framework> <code dir> <bin dir>` runs the same step inside a
container build (the Kubernetes builder's Containerfile, `adapters/kubernetes/builder.py`), without a
sandbox of its own (the build container is one): its output goes to standard output and a failure
prints the build's message and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path

from caiplatform.build.golang import BINARY_NAME, build_go_function
from caiplatform.build.steps import StepJail, run_step
from caiplatform.ports.builder import BuildError, BuildLog
from caiplatform.sandbox import paths
from caiplatform.turns.ruby import bundle_env


async def build_function(framework: str, code_dir: Path, bin_dir: Path, emit: BuildLog, *, cache_dir: Path,
                         jail: StepJail | None = None) -> None:
    """`cache_dir`: the builder's own cache (Go's build cache when the process has no home). `jail`: the
    sandbox the steps run in (they run the user's code), writing only the image's source and `bin_dir`."""
    if jail is not None:
        jail = jail.with_paths(writable=(code_dir,), places=((code_dir, paths.CODE),))
    if framework == "function-go":
        await build_go_function(code_dir, bin_dir / BINARY_NAME, emit, cache_dir=cache_dir, jail=jail)
    elif framework == "function-ruby":
        await _ruby(code_dir, emit, jail)
    elif framework == "function-nodejs":
        await _node(code_dir, emit, jail)


def function_env(framework: str, bin_dir: Path) -> dict[str, str]:
    """What the harness of a built function needs to find what the language step made."""
    if framework == "function-go":
        return {"CAI_FUNCTION_BINARY": str(bin_dir / BINARY_NAME)}
    return {}


def _tool(name: str, why: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BuildError(f"{why} needs `{name}`, which is not installed here")
    return found


async def _ruby(code_dir: Path, emit: BuildLog, jail: StepJail | None) -> None:
    ruby = _tool("ruby", "function-ruby")
    await run_step([ruby, "-c", "main.rb"], "checking main.rb (ruby -c)", emit, cwd=code_dir, jail=jail)
    if (code_dir / "Gemfile").is_file():
        bundle = _tool("bundle", "a Ruby function with a Gemfile (Bundler)")
        emit("installing the Gemfile's gems into vendor/bundle (bundle install)")
        # Gems vendored with `bundle cache` install without a registry, as Bundler's own `--local` does.
        local = ["--local"] if (code_dir / "vendor" / "cache").is_dir() else []
        await run_step([bundle, "install", *local], "installing the Gemfile's gems (bundle install)", emit,
                       cwd=code_dir, set_env={"BUNDLE_SILENCE_ROOT_WARNING": "1", **bundle_env(code_dir)},
                       jail=jail)


async def _node(code_dir: Path, emit: BuildLog, jail: StepJail | None) -> None:
    manifest = code_dir / "package.json"
    if not manifest.is_file() or (code_dir / "node_modules").exists():
        return
    try:
        dependencies = json.loads(manifest.read_text(encoding="utf-8")).get("dependencies")
    except (ValueError, AttributeError) as exc:
        raise BuildError(f"package.json is not a JSON object: {exc}") from None
    if not dependencies:
        return
    npm = _tool("npm", "a Node.js function with dependencies in package.json")
    emit("installing package.json's dependencies (npm install --omit=dev)")
    await run_step([npm, "install", "--omit=dev", "--no-audit", "--no-fund", "--no-update-notifier"],
                   "installing package.json's dependencies (npm install)", emit, cwd=code_dir, jail=jail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m caiplatform.build.languages",
                                     description="the language step of a function build, in a container build")
    parser.add_argument("framework", choices=["function-go", "function-nodejs", "function-ruby"])
    parser.add_argument("code_dir", type=Path)
    parser.add_argument("bin_dir", type=Path)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "caiplatform-build-cache")
    args = parser.parse_args(argv)

    def emit(line: str) -> None:
        print(line, flush=True)

    try:
        asyncio.run(build_function(args.framework, args.code_dir, args.bin_dir, emit, cache_dir=args.cache_dir))
    except BuildError as exc:
        print(exc.message, file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
