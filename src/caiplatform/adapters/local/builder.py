"""Local builder: an image is a directory under `<data-dir>/images/<digest-hex>/`.

Layout:

    images/<digest-hex>/src/          the checked source, copied, plus what the language step installed
                                      (`vendor/bundle`, `node_modules`); the image never changes after the build
    images/<digest-hex>/bin/function  a Go function's compiled program (`caiplatform.build.languages`)
    images/<digest-hex>/image.json    framework, runtime, the environment it runs in, references
    images/envs/<requirements-hash>/  a Python environment with the image's requirements.txt installed
    images/pip-cache/<project>/       pip's download and wheel cache, one per project (a rebuild never downloads twice)
    images/go-cache/<project>/        Go's build cache, one per project

Environments are keyed by the hash of the requirements (plus the interpreter and the platform it
sees), so images with the same requirements share one and a rebuild with unchanged requirements only
copies the source. An environment is a venv of the platform's own interpreter; a `.pth` file makes the
platform and the packages next to it importable *after* the environment's own site-packages, so an
agent's pinned versions win while the frameworks the harness needs are there without a download (a
nested venv's `--system-site-packages` would not see the platform's venv, hence the `.pth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import site
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

import caiplatform
from caiplatform.adapters.memory.builder import HARNESS_MODULE, copy_tree
from caiplatform.build.digest import digest_of_reference
from caiplatform.build.languages import build_function, function_env
from caiplatform.build.prepare import check_request
from caiplatform.build.steps import StepJail, run_step
from caiplatform.ports.builder import Builder, BuildLog, BuildRequest, Image
from caiplatform.sandbox import Sandbox, paths, shared_sandbox

READY_MARKER = ".cai-ready"


def platform_paths() -> list[str]:
    """What an image's Python must see of the platform: the `caiplatform` package root, then the
    site-packages of the interpreter running the platform."""
    root = str(Path(caiplatform.__file__).resolve().parent.parent)
    sites = [p for p in site.getsitepackages() if Path(p).is_dir()]
    return [root, *[p for p in sites if p != root]]


def requirements_key(source_dir: Path, project: str = "", seen_at: str = "") -> tuple[str, str]:
    """(hash, normalised requirements text) of the tree's requirements.txt ('' when there is none).
    `project`: environments are shared within a project only (an install step runs the user's code).
    `seen_at`: the path the environment is built for (its scripts and `pyvenv.cfg` name it)."""
    path = Path(source_dir) / "requirements.txt"
    lines: list[str] = []
    if path.is_file() and not path.is_symlink():
        for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = raw.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    text = "\n".join(lines)
    h = hashlib.sha256()
    for part in (sys.executable, sys.version, caiplatform.__version__, *platform_paths(), project, seen_at, text):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:32], text


class LocalBuilder(Builder):
    name = "local"

    def __init__(self, data_dir: str | Path, *, registry_host: str = "registry.local", python: str | None = None,
                 sandbox: Sandbox | None = None):
        self.registry_host = registry_host
        self.sandbox = sandbox or shared_sandbox()
        self.root = Path(data_dir) / "images"
        self.envs = self.root / "envs"
        self.pip_cache = self.root / "pip-cache"
        self.python = python or sys.executable
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    # -- build --------------------------------------------------------------------------------------

    async def build(self, request: BuildRequest, log: BuildLog | None = None) -> Image:
        emit = log or (lambda _line: None)
        checked = await check_request(request, self.registry_host)
        source, framework, digest, reference = checked.source, checked.framework, checked.digest, checked.reference
        hexdigest = digest.removeprefix("sha256:")
        async with self._lock(hexdigest):
            existing = self._load(hexdigest)
            if existing is not None:
                emit(f"reusing image {digest} (this project built the same source before)")
                self._add_reference(hexdigest, reference)
                return replace(self._image(existing, reference), reused=True)
            started = time.monotonic()
            project = request.project_id  # environments and caches are never shared across projects
            env_key, requirements = await anyio.to_thread.run_sync(self.environment_key, source, project)
            env_dir = await self._environment(env_key, requirements, source, emit, project)
            emit(f"copying the source into image {digest}")
            location = self.root / hexdigest
            staging = self.root / f"{hexdigest}.partial"
            await anyio.to_thread.run_sync(self._stage_source, source, staging)
            try:
                await build_function(framework, staging / "src", staging / "bin", emit,
                                     cache_dir=self._cache("go-cache", project), jail=StepJail(self.sandbox))
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            await anyio.to_thread.run_sync(self.sandbox.share, staging)  # the workload reads it in its sandbox
            await anyio.to_thread.run_sync(self._finish_image, staging, location, {
                "digest": digest,
                "framework": framework,
                "runtime": request.runtime,
                "env": env_key,
                "python": str(env_dir / "bin" / "python"),
                "references": [reference],
                "created_at": time.time(),
            })
            emit(f"built image {digest} in {time.monotonic() - started:.1f} s")
            record = self._load(hexdigest)
            assert record is not None
            return self._image(record, reference)

    @staticmethod
    def _stage_source(source: Path, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)
        copy_tree(source, staging / "src")

    @staticmethod
    def _finish_image(staging: Path, location: Path, record: dict[str, Any]) -> None:
        (staging / "image.json").write_text(json.dumps(record, indent=2))
        shutil.rmtree(location, ignore_errors=True)
        os.replace(staging, location)

    def environment_key(self, source: Path, project: str) -> tuple[str, str]:
        """(key, requirements) of the environment this builder runs `source` in for `project`."""
        return requirements_key(source, project, self._seen_at())

    def _seen_at(self) -> str:
        """Where the workload sees its Python environment: /app/venv in the sandbox (`sandbox/paths.py`),
        where the environment is built too, so its scripts and `pyvenv.cfg` name no path of the data
        directory; its own path without the sandbox."""
        return paths.VENV if self.sandbox.enabled else ""

    def _cache(self, name: str, project: str) -> Path:
        """A package manager's cache, one per project (a build could poison it, or learn from it what
        another project installed)."""
        return self.root / name / project

    async def _environment(self, key: str, requirements: str, source: Path, emit: BuildLog, project: str) -> Path:
        """The environment for these requirements, created and installed once."""
        env_dir = self.envs / key
        async with self._lock(f"env:{key}"):
            if (env_dir / READY_MARKER).is_file() and (env_dir / "bin" / "python").exists():
                emit("requirements unchanged: reusing the installed environment")
                return env_dir
            staging = self.envs / f"{key}.partial"
            shutil.rmtree(staging, ignore_errors=True)
            staging.parent.mkdir(parents=True, exist_ok=True)
            emit("creating the image's Python environment")
            await self._run([self.python, "-m", "venv", "--without-pip", str(staging)], "creating the environment", emit)
            if self._seen_at():  # made here, used there: its scripts and pyvenv.cfg name where it is used
                await self._fix_scripts(staging, Path(self._seen_at()), staging)
            purelib = await self._purelib(staging)
            lines = [*platform_paths()[:1], *(f"import site; site.addsitedir({p!r})" for p in platform_paths()[1:])]
            (purelib / "00-caiplatform.pth").write_text("\n".join(lines) + "\n")
            if requirements:
                emit("installing requirements.txt")
                # The step reads the source as the sandbox's unprivileged uid (a temporary directory is 0700).
                await anyio.to_thread.run_sync(self.sandbox.share, source)
                await self._run(
                    [
                        str(staging / "bin" / "python"), "-m", "pip", "install",
                        "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
                        "--cache-dir", str(self._cache("pip-cache", project)),
                        "-r", "requirements.txt",
                    ],
                    "installing requirements.txt",
                    emit,
                    cwd=source,  # relative paths in requirements.txt are relative to the source
                    jail=StepJail(self.sandbox, read_only=(source,),
                                  writable=(staging, self._cache("pip-cache", project)),
                                  places=((staging, paths.VENV), (self._cache("pip-cache", project),
                                                                  f"{paths.CACHE}/pip"), (source, paths.CODE))),
                )
            (staging / READY_MARKER).write_text(requirements)
            await anyio.to_thread.run_sync(self.sandbox.share, staging)
            shutil.rmtree(env_dir, ignore_errors=True)
            os.replace(staging, env_dir)
            # A venv's scripts name their interpreter by absolute path: re-point them after the move (in the
            # sandbox they name /app/venv already).
            await self._fix_scripts(staging, env_dir, env_dir)
            return env_dir

    async def _purelib(self, env: Path) -> Path:
        out = await self._run(
            [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            "inspecting the environment", lambda _line: None,
        )
        path = Path(out.strip().splitlines()[-1])
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    async def _fix_scripts(old: Path, new: Path, env_dir: Path) -> None:
        """Rewrite the environment `env_dir`'s scripts and `pyvenv.cfg` from naming `old` to naming `new`."""
        def fix() -> None:
            old_prefix, new_prefix = str(old).encode(), str(new).encode()
            for script in (env_dir / "bin").iterdir():
                if script.is_symlink() or not script.is_file():
                    continue
                with contextlib.suppress(OSError):
                    data = script.read_bytes()
                    # the shebang of a script, VIRTUAL_ENV of the activate scripts (text only: no binary changes)
                    if old_prefix in data and b"\0" not in data:
                        script.write_bytes(data.replace(old_prefix, new_prefix))
            cfg = env_dir / "pyvenv.cfg"
            if cfg.is_file():
                cfg.write_text(cfg.read_text().replace(str(old), str(new)))

        await anyio.to_thread.run_sync(fix)

    @staticmethod
    async def _run(argv: list[str], what: str, emit: BuildLog, cwd: Path | None = None, jail: StepJail | None = None) -> str:
        return await run_step(argv, what, emit, cwd=cwd, set_env={"PIP_NO_INPUT": "1", "PYTHONNOUSERSITE": "1"},
                              jail=jail)

    # -- records ------------------------------------------------------------------------------------

    def _load(self, hexdigest: str) -> dict[str, Any] | None:
        if not all(c in "0123456789abcdef" for c in hexdigest) or len(hexdigest) != 64:
            return None
        try:
            record = json.loads((self.root / hexdigest / "image.json").read_text())
        except (OSError, ValueError):
            return None
        if not Path(record.get("python", "")).exists() or not (self.root / hexdigest / "src").is_dir():
            return None  # its environment was removed: build again
        return record

    def _image(self, record: dict[str, Any], reference: str) -> Image:
        code_dir = self.root / record["digest"].removeprefix("sha256:") / "src"
        return Image(
            reference=reference,
            digest=record["digest"],
            framework=record["framework"],
            runtime=record.get("runtime"),
            command=[record["python"], "-m", HARNESS_MODULE],
            env={"CAI_FRAMEWORK": record["framework"], "CAI_CODE_DIR": str(code_dir),
                 **function_env(record["framework"], code_dir.parent / "bin")},
            location=str(code_dir.parent),
        )

    def _save(self, hexdigest: str, record: dict[str, Any]) -> None:
        path = self.root / hexdigest / "image.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, path)

    def _add_reference(self, hexdigest: str, reference: str) -> None:
        record = self._load(hexdigest)
        if record is not None and reference not in record["references"]:
            record["references"].append(reference)
            self._save(hexdigest, record)

    async def resolve(self, reference: str) -> Image | None:
        digest = digest_of_reference(reference)
        if digest is None:
            return None
        record = self._load(digest.removeprefix("sha256:"))
        if record is None or reference not in record.get("references", []):
            return None
        return self._image(record, reference)

    async def remove(self, reference: str) -> None:
        digest = digest_of_reference(reference)
        if digest is None:
            return
        hexdigest = digest.removeprefix("sha256:")
        async with self._lock(hexdigest):
            record = self._load(hexdigest)
            if record is None or reference not in record.get("references", []):
                return
            record["references"].remove(reference)
            if record["references"]:
                self._save(hexdigest, record)  # another workload still runs the same content
            else:
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(self.root / hexdigest, ignore_errors=True))
