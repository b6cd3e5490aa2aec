"""Stored agent source: the uploaded `.tar.gz` checked and unpacked into files, and the limits every
way of changing the stored tree shares (1 MiB per file, 200 files, 64 MiB expanded, no symlinks, no
path escaping the root).
"""

from __future__ import annotations

import gzip
import io
import posixpath
import zlib
from collections.abc import Iterator
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

    The archive is read by `_TarReader`, a strict streaming reader of ustar, pax and GNU long-name
    headers, not by `tarfile`: `tarfile` reads a pax or long-name header's whole data into memory before
    anything can look at its size (a 300 KB upload holding a 300 MiB pax header took the server to
    900 MiB), and keeps every member it has seen. Here every byte the archive expands to (file contents,
    the 512-byte header blocks, pax and long-name data) counts against the 64 MiB budget and is checked
    before it is read, one extended header holds at most 64 KiB, and at most `MAX_ENTRIES` headers are
    read. A tree wrapped in one top-level directory is unwrapped (as `tar czf x.tar.gz mydir/` produces).
    """
    files: dict[str, bytes] = {}
    try:
        for member in _TarReader(data).members():
            if member.kind == "link":
                raise BadRequest(f"{ARCHIVE}links are not allowed ({member.name})")
            if member.kind == "dir":
                parts = member.name.replace("\\", "/").split("/")
                if member.name.startswith("/") or ".." in parts:
                    raise BadRequest(f"{ARCHIVE}path escapes the source tree: {member.name!r}")
                continue
            if member.kind != "file":
                raise BadRequest(f"{ARCHIVE}only regular files and directories are allowed ({member.name})")
            path = clean_path(member.name, prefix=ARCHIVE + "path escapes the source tree: ")
            files[path] = member.content
            if len(files) > MAX_FILES:
                raise BadRequest(f"{ARCHIVE}more than {MAX_FILES} files")
    except BadRequest:
        raise
    except (zlib.error, EOFError, OSError) as exc:
        raise BadRequest(f"{ARCHIVE}not a readable .tar.gz ({exc})") from None
    if not files:
        raise BadRequest(f"{ARCHIVE}it holds no files")
    return _unwrap(files)


BLOCK = 512
MAX_ENTRIES = 2000  # headers of every kind (files, directories, pax and long-name headers) in one archive
MAX_HEADER_BYTES = 64 * 1024  # the data of one pax or GNU long-name header
_FILE_TYPES = (b"0", b"\0", b"7")
_LINK_TYPES = (b"1", b"2")
_EXTENDED = (b"x", b"g", b"L", b"K")


class _Member:
    __slots__ = ("kind", "name", "content")

    def __init__(self, kind: str, name: str, content: bytes = b""):
        self.kind, self.name, self.content = kind, name, content


class _TarReader:
    """The members of a gzip-compressed tar, read block by block with every read bounded.

    Each read asks for at most what the budget has left: the gzip stream is never inflated beyond
    the budget (a gzip bomb stops there), and nothing is buffered but one header's data (64 KiB at
    most) and the files kept (1 MiB each, 64 MiB in all).
    """

    def __init__(self, data: bytes):
        self.stream = gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb")
        self.budget = MAX_EXPANDED_BYTES
        self.entries = 0
        self.offset = 0

    def _read(self, size: int, *, counted: bool = True) -> bytes:
        if counted:
            if size > self.budget:
                raise BadRequest(f"{ARCHIVE}the archive expands to more than the 64 MiB limit")
            self.budget -= size
        chunks: list[bytes] = []
        left = size
        while left:
            chunk = self.stream.read(min(left, MiB))
            if not chunk:
                raise BadRequest(f"{ARCHIVE}not a readable .tar.gz (truncated at byte {self.offset})")
            chunks.append(chunk)
            left -= len(chunk)
            self.offset += len(chunk)
        return b"".join(chunks)

    def _padding(self, size: int) -> None:
        if size % BLOCK:
            self._read(BLOCK - size % BLOCK, counted=False)

    def _header(self) -> bytes | None:
        """The next 512-byte header block, or None at the end of the archive (a zero block, or the end
        of the stream at a block boundary)."""
        block = self.stream.read(BLOCK)
        self.offset += len(block)
        if not block or block == bytes(BLOCK):
            return None
        if len(block) < BLOCK:
            raise BadRequest(f"{ARCHIVE}not a readable .tar.gz (truncated at byte {self.offset})")
        if self.budget < BLOCK:
            raise BadRequest(f"{ARCHIVE}the archive expands to more than the 64 MiB limit")
        self.budget -= BLOCK
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise BadRequest(f"{ARCHIVE}more than {MAX_ENTRIES} entries (files, directories and headers)")
        stored = _number(block[148:156], self.offset)
        rest = block[:148] + block[156:]
        unsigned = sum(rest) + 8 * 32
        signed = unsigned - 256 * sum(1 for b in rest if b > 127)
        if stored not in (unsigned, signed):
            raise BadRequest(f"{ARCHIVE}not a readable .tar.gz (bad header checksum at byte {self.offset - BLOCK})")
        return block

    def members(self) -> Iterator[_Member]:
        pax: dict[bytes, bytes] = {}  # the pending pax records and GNU long name/link, for the next member
        long_name: bytes | None = None
        pending = False
        while (block := self._header()) is not None:
            kind = block[156:157]
            size = _number(block[124:136], self.offset)
            if kind in _EXTENDED:
                if size > MAX_HEADER_BYTES:
                    raise BadRequest(f"{ARCHIVE}an extended header (pax or long name) of {size} bytes is larger "
                                     f"than the {MAX_HEADER_BYTES // 1024} KiB limit")
                payload = self._read(size)
                self._padding(size)
                pending = True
                if kind == b"x":
                    pax.update(_pax_records(payload))
                elif kind == b"g":
                    _pax_records(payload)  # checked and counted; global records rename no member
                elif kind == b"L":
                    long_name = payload.split(b"\0", 1)[0]
                continue  # a GNU long link (K) names a link's target, and every link is refused
            raw = block[0:100].split(b"\0", 1)[0]
            if block[257:263] == b"ustar\0" and (prefix := block[345:500].split(b"\0", 1)[0]):
                raw = prefix + b"/" + raw
            name = _text(pax.get(b"path", long_name if long_name is not None else raw))
            if b"size" in pax:
                if not pax[b"size"].isdigit() or len(pax[b"size"]) > 20:
                    raise BadRequest(f"{ARCHIVE}not a readable .tar.gz (pax size {pax[b'size'][:20]!r} of {name})")
                size = int(pax[b"size"])
            sparse = any(key.startswith(b"GNU.sparse.") for key in pax)
            pax, long_name, pending = {}, None, False
            if kind == b"\0" and name.endswith("/"):
                kind = b"5"  # an old-style directory
            if kind == b"5":
                yield _Member("dir", name)  # a directory's size field is ignored, as tar readers do
            elif kind in _LINK_TYPES:
                yield _Member("link", name)
            elif kind in _FILE_TYPES and not sparse:
                if size > MAX_FILE_BYTES:
                    raise BadRequest(f"{ARCHIVE}file {name} is larger than the 1 MiB per-file limit")
                content = self._read(size)
                self._padding(size)
                yield _Member("file", name, content)
            else:
                yield _Member("other", name)  # devices, fifos, GNU sparse files
        if pending:
            raise BadRequest(f"{ARCHIVE}not a readable .tar.gz (an extended header at the end names no member)")


def _number(field: bytes, offset: int) -> int:
    """A header's numeric field: octal digits (NUL or space terminated) or GNU base-256."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field[:1] and field[0] & 0x80:
        raise BadRequest(f"{ARCHIVE}not a readable .tar.gz (negative number in the header at byte {offset - BLOCK})")
    text = field.replace(b"\0", b" ").strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise BadRequest(f"{ARCHIVE}not a readable .tar.gz (bad number {text[:16]!r} in the header at byte "
                         f"{offset - BLOCK})") from None


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{ARCHIVE}a member name is not UTF-8 ({raw[:64]!r})") from None


def _pax_records(payload: bytes) -> dict[bytes, bytes]:
    """`<length> <key>=<value>\\n` records (POSIX pax), the length counting the whole record. Values stay
    bytes: only `path` and `size` are read (as UTF-8 and decimal), others (xattrs) may be binary."""
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(payload) and payload[pos:].strip(b"\0"):
        space = payload.find(b" ", pos, pos + 12)
        digits = payload[pos:space] if space > pos else b""
        length = int(digits) if digits.isdigit() else 0
        fits = len(digits) + 1 < length <= len(payload) - pos
        record = payload[space + 1:pos + length] if fits else b""
        if not record.endswith(b"\n") or b"=" not in record:
            raise BadRequest(f"{ARCHIVE}not a readable .tar.gz (bad pax record at byte {pos} of an extended header)")
        key, value = record[:-1].split(b"=", 1)
        records[key] = value
        pos += length
    return records


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
