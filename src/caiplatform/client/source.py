"""An agent's source as the deploy route takes it: the framework read off the entry file, and the
directory as a .tar.gz that leaves out what `.caiignore` names (gitignore syntax)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pathspec

IGNORE_FILE = ".caiignore"
# Never uploaded, whatever .caiignore says: version control, caches, environments.
ALWAYS_IGNORED = [".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", "node_modules/", ".DS_Store"]

# Document 1: `crew.py` means crewai, `graph.py` means langgraph, anything else adk; the platform's own
# functions are recognised by their entry files first.
FRAMEWORK_BY_ENTRY = [("crew.py", "crewai"), ("graph.py", "langgraph"), ("agent.py", "adk"),
                      ("main.py", "function"), ("index.js", "function-nodejs"), ("main.go", "function-go"),
                      ("main.rb", "function-ruby")]


def detect_framework(directory: Path) -> str:
    for entry, framework in FRAMEWORK_BY_ENTRY:
        if (directory / entry).is_file():
            return framework
    return "adk"


def ignore_spec(directory: Path) -> pathspec.PathSpec:
    lines = list(ALWAYS_IGNORED)
    ignore = directory / IGNORE_FILE
    if ignore.is_file():
        lines += ignore.read_text().splitlines()
    return pathspec.PathSpec.from_lines("gitwildmatch", lines)


def included_files(directory: Path) -> list[Path]:
    spec = ignore_spec(directory)
    files = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory).as_posix()
        if path.is_dir() or spec.match_file(relative) or any(
                spec.match_file(parent.as_posix() + "/") for parent in path.relative_to(directory).parents
                if parent.as_posix() != "."):
            continue
        files.append(path)
    return files


def tar_directory(directory: Path) -> bytes:
    """The directory's files (not what `.caiignore` names) as a gzip tarball, paths relative to it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in included_files(directory):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(directory).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()
