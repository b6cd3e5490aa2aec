"""The crewai environment the tests share: built once by the platform's local builder into the checkout's
git-ignored `.caiplatform/test-cache/` (or `CAI_TEST_CACHE_DIR`), never under the user's home, and reused
by every later run (environments are keyed by the requirements, the interpreter and the platform's paths).

`build_in_cache` builds a crew there (a file lock keeps two concurrent runs from installing the same
environment at once). `seed_environment` lets a `caiplatform serve` under test start from that installed
environment: it places a hard-linked copy where the serve's builder looks for the environment of a
project's requirements, so the deploy still goes through the builder (a real build of the agent's
source) but skips installing crewai a second time. Test-only: in production an environment is never
shared across projects, since its install step runs the user's code.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import uuid
from pathlib import Path

from caiplatform.adapters.local.builder import READY_MARKER, LocalBuilder
from caiplatform.ports.builder import BuildRequest, Image
from tests.cache_support import shared_cache_dir

# Pinned so the cached environment is what the tests describe (a new crewai release is a new environment).
REQUIREMENTS = "crewai==1.15.30\n"


def cache_root() -> Path:
    return shared_cache_dir() / "crewai"


def build_in_cache(source: Path, workload: str) -> Image:
    """The crew at `source` built by the local builder whose data dir is the test cache (the first
    build installs crewai; later ones reuse the environment and only copy the source)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        request = BuildRequest(str(uuid.uuid4()), "crewtest", workload, "crewai", source)
        return asyncio.run(LocalBuilder(root / "data").build(request))


def environment_of(image: Image) -> Path:
    """The environment an image of the local builder runs in (`<env>/bin/python -m ...`)."""
    return Path(image.command[0]).parent.parent


def seed_environment(env: Path, data_dir: Path, source: Path, project_id: str) -> Path:
    """Place a copy of the installed environment `env` where a `caiplatform serve` on `data_dir` (on this
    interpreter and checkout) will look for the environment of `source`'s requirements in the project
    `project_id`, with its ready marker; return that path.

    Files are hard-linked (no 800 MB copy) when the two trees share a file system, except what the builder
    rewrites when an environment moves (the scripts naming their interpreter, `pyvenv.cfg`): those are
    fresh files, so neither side can change the other's through a shared inode."""
    builder = LocalBuilder(data_dir)
    key, requirements = builder.environment_key(source, project_id)  # as `LocalBuilder.build` keys it
    target = builder.envs / key
    assert (env / READY_MARKER).read_text() == requirements, "the cached environment has other requirements"
    staging = target.with_name(f"{key}.seeding")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(env, staging, symlinks=True, copy_function=link)
    old, new = str(env).encode(), str(target).encode()
    for path in [*(staging / "bin").iterdir(), staging / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        mode = path.stat().st_mode
        path.unlink()  # a new inode: the cached environment's file stays as it was
        path.write_bytes(data.replace(old, new) if data.startswith(b"#!") or path.name == "pyvenv.cfg" else data)
        path.chmod(mode)
    os.replace(staging, target)
    return target
