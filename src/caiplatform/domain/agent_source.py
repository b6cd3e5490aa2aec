"""Stored agent source: the uploaded `.tar.gz` checked and unpacked into files, and the limits every
way of changing the stored tree shares (1 MiB per file, 200 files, 64 MiB expanded, no symlinks, no
path escaping the root).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zlib
from pathlib import Path

from caiplatform.errors import BadRequest

MiB = 1024 * 1024
MAX_FILE_BYTES = 1 * MiB
MAX_FILES = 200
MAX_EXPANDED_BYTES = 64 * MiB
ARCHIVE = "invalid 'code' archive: "


def clean_path(raw: str, *, prefix: str = "invalid file path: ") -> str:
    """A relative POSIX path inside the source tree; anything that could escape it is refused."""
    text = raw.replace("\\", "/") if isinstance(raw, str) else ""
    while text.startswith("./"):
        text = text[2:]
    if not text or "\x00" in text or text.startswith("/"):
        raise BadRequest(f"{prefix}{raw!r} (must be a relative path inside the source tree)")
    parts = text.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BadRequest(f"{prefix}{raw!r} (must be a relative path inside the source tree)")
    return posixpath.join(*parts)


def check_limits(files: dict[str, bytes], *, prefix: str = "") -> None:
    if len(files) > MAX_FILES:
        raise BadRequest(f"{prefix}too many files: {len(files)} (at most {MAX_FILES} per agent)")
    for path, content in files.items():
        if len(content) > MAX_FILE_BYTES:
            raise BadRequest(f"{prefix}file {path} is {len(content)} bytes, more than the 1 MiB per-file limit")
    total = sum(len(c) for c in files.values())
    if total > MAX_EXPANDED_BYTES:
        raise BadRequest(f"{prefix}the source expands to {total} bytes, more than the 64 MiB limit")


def extract_tarball(data: bytes) -> dict[str, bytes]:
    """Unpack a `.tar.gz` into {path: content}, refusing links, devices, traversal and oversize input.

    Sizes are counted on the bytes actually read, never trusted from headers. A tree wrapped in one
    top-level directory is unwrapped (as `tar czf x.tar.gz mydir/` produces).
    """
    files: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive:
                if member.issym() or member.islnk():
                    raise BadRequest(f"{ARCHIVE}links are not allowed ({member.name})")
                if member.isdir():
                    parts = member.name.replace("\\", "/").split("/")
                    if member.name.startswith("/") or ".." in parts:
                        raise BadRequest(f"{ARCHIVE}path escapes the source tree: {member.name!r}")
                    continue
                if not member.isfile():
                    raise BadRequest(f"{ARCHIVE}only regular files and directories are allowed ({member.name})")
                path = clean_path(member.name, prefix=ARCHIVE + "path escapes the source tree: ")
                if member.size > MAX_FILE_BYTES:
                    raise BadRequest(f"{ARCHIVE}file {path} is larger than the 1 MiB per-file limit")
                handle = archive.extractfile(member)
                content = handle.read(MAX_FILE_BYTES + 1) if handle else b""
                if len(content) > MAX_FILE_BYTES:
                    raise BadRequest(f"{ARCHIVE}file {path} is larger than the 1 MiB per-file limit")
                total += len(content)
                if total > MAX_EXPANDED_BYTES:
                    raise BadRequest(f"{ARCHIVE}the archive expands to more than the 64 MiB limit")
                files[path] = content
                if len(files) > MAX_FILES:
                    raise BadRequest(f"{ARCHIVE}more than {MAX_FILES} files")
    except BadRequest:
        raise
    except (tarfile.TarError, zlib.error, EOFError, OSError) as exc:
        raise BadRequest(f"{ARCHIVE}not a readable .tar.gz ({exc})") from None
    if not files:
        raise BadRequest(f"{ARCHIVE}it holds no files")
    return _unwrap(files)


def _unwrap(files: dict[str, bytes]) -> dict[str, bytes]:
    tops = {p.split("/", 1)[0] for p in files}
    if len(tops) == 1 and all("/" in p for p in files):
        top = tops.pop() + "/"
        return {p[len(top):]: c for p, c in files.items()}
    return files


def write_tree(files: dict[str, bytes], root: Path) -> None:
    for path, content in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
