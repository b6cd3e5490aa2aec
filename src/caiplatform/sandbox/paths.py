"""Where a sandboxed process sees its own files: fixed, neutral paths, never the data directory's (issue 34).

The platform keeps a workload's image, Python environment, home and state under `<data-dir>/...`; a build step
writes under it too. Inside the sandbox each of these is at a fixed path that says nothing of the server's
storage:

    /app/code               the image's code (`CAI_CODE_DIR`), also a build step's copy of the source
    /app/bin                what the image's language step compiled (a Go function's program)
    /app/venv               the image's Python environment (built there: its scripts and `pyvenv.cfg` name it)
    /home/app               its home
    /var/lib/cai/state      its state directory (an agent's session database); more: state-2, state-3, ...
    /var/cache/cai/<name>   a build step's package cache (pip's, Go's)
    /build                  a build step's scratch directory

This module is the one place that maps a host path to the path seen inside: a `Confinement` lists its
`places` (host path, path inside), bubblewrap mounts each host path there, and `PathMap` rewrites everything
the platform hands the process (its command line, its variables, its working directory) to match. The
platform's own interpreter and package, and the system, keep their paths: they are not the data directory.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

CODE = "/app/code"
BIN = "/app/bin"
VENV = "/app/venv"
HOME = "/home/app"
STATE = "/var/lib/cai/state"
CACHE = "/var/cache/cai"
BUILD = "/build"

Place = tuple[Path, str]  # (host path, path inside)


def python() -> str:
    """The server's own interpreter by a path a sandboxed process can run it at. Python keeps a relative
    command's `..` in `sys.executable` (`cd app && ../.venv/bin/python -m caiplatform serve` gives
    `<cwd>/../.venv/bin/python`), and inside the sandbox `<cwd>` is not there to go up from; the interpreter's
    environment (`sys.prefix`, normalized the same way) is."""
    return os.path.abspath(sys.executable) if sys.executable else sys.executable


def state_places(dirs: Iterable[Path]) -> tuple[Place, ...]:
    """A workload's state directories, in order: /var/lib/cai/state, then state-2, state-3, ..."""
    return tuple((Path(d), STATE if i == 0 else f"{STATE}-{i + 1}") for i, d in enumerate(dirs))


def image_places(env: Mapping[str, str], command: list[str] | None) -> tuple[Place, ...]:
    """An image's code (`CAI_CODE_DIR`), the directory of its compiled program (`CAI_FUNCTION_BINARY`) and
    the Python environment its command runs in (a venv: `pyvenv.cfg` beside `bin/`), where present."""
    places: list[Place] = []
    if env.get("CAI_CODE_DIR"):
        places.append((Path(env["CAI_CODE_DIR"]), CODE))
    if env.get("CAI_FUNCTION_BINARY"):
        places.append((Path(env["CAI_FUNCTION_BINARY"]).parent, BIN))
    if command and Path(command[0]).is_absolute():
        environment = Path(command[0]).parent.parent
        if (environment / "pyvenv.cfg").is_file():
            places.append((environment, VENV))
    return tuple((Path(os.path.abspath(host)), inside) for host, inside in places)


class PathMap:
    """Rewrites host paths of `places` (and anything below them) into the paths seen inside.

    A host path is replaced wherever it starts a path in a string (a whole value, an entry of `PATH`, an
    `--option=/path`, the path of a `sqlite:////...` URL), and only where it is not part of a longer name, so
    `/data/images/ab` does not rewrite `/data/images/abc`. The longest host path wins (a place inside another
    is its own)."""

    def __init__(self, places: Iterable[Place]):
        self.places = sorted(((str(Path(os.path.abspath(h))), i) for h, i in places), key=lambda p: -len(p[0]))
        self._inside = dict(self.places)
        # Not inside a longer name on either side (`/mnt/data/x` is not `/data/x`, `/data/xy` not `/data/x`).
        self._pattern = (re.compile("|".join(f"(?<![\\w.+~-])({re.escape(h)})(?=/|$|[^\\w.+~-])"
                                             for h, _ in self.places)) if self.places else None)

    def text(self, value: str) -> str:
        if self._pattern is None:
            return value
        return self._pattern.sub(lambda m: self._inside[m.group(0)], value)

    def path(self, path: Path | str) -> str:
        return self.text(os.path.abspath(path))

    def argv(self, argv: Iterable[str]) -> list[str]:
        return [self.text(a) for a in argv]

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: self.text(v) for k, v in env.items()}
