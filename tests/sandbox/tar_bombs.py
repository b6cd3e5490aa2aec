"""Hostile `.tar.gz` uploads, written block by block so that a bomb costs kilobytes to build and send:
a pax header, a GNU long name and a global pax header each hundreds of MiB long, a gzip bomb, and many
tiny members. Shared by the reader's unit tests and the memory test on `caiplatform serve`."""

from __future__ import annotations

import gzip
import io

BLOCK = 512
MiB = 1024 * 1024


def header(name: str, size: int, kind: bytes = b"0") -> bytes:
    """One ustar header block with a correct checksum."""
    block = bytearray(BLOCK)
    block[0:len(name)] = name.encode()
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"00000000000\0"
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _gzip(write) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as archive:
        write(archive)
    return out.getvalue()


def _stream(archive, length: int, fill: bytes = b"a") -> None:
    chunk = fill * MiB
    while length > 0:
        archive.write(chunk[:min(length, len(chunk))])
        length -= len(chunk)


def extended_bomb(kind: bytes = b"x", mib: int = 300) -> bytes:
    """One extended header (`x` pax, `g` global pax, `L` GNU long name) of `mib` MiB, then a real file."""
    def write(archive):
        value = mib * MiB
        if kind in (b"x", b"g"):
            body = len(b" path=") + value + 1
            length = body + len(str(body))
            length = body + len(str(length))
            archive.write(header("././@PaxHeader", length, kind))
            archive.write(b"%d path=" % length)
            _stream(archive, value)
            archive.write(b"\n")
            total = length
        else:
            archive.write(header("././@LongLink", value, kind))
            _stream(archive, value)
            total = value
        archive.write(b"\0" * (-total % BLOCK))
        archive.write(header("main.py", 0))
        archive.write(b"\0" * 2 * BLOCK)
    return _gzip(write)


def gzip_bomb(mib: int = 1024) -> bytes:
    """A file member whose header claims 1 KiB, followed by `mib` MiB of zeros (no end-of-archive needed)."""
    def write(archive):
        archive.write(header("main.py", 1024))
        _stream(archive, mib * MiB, b"\1")
    return _gzip(write)


def many_members(count: int = 200_000) -> bytes:
    """`count` empty directories (a few hundred KiB compressed), then one file."""
    def write(archive):
        for i in range(count):
            archive.write(header(f"d{i}/", 0, b"5"))
        archive.write(header("main.py", 0))
        archive.write(b"\0" * 2 * BLOCK)
    return _gzip(write)


def many_headers(count: int, size: int = 60 * 1024, per_member: int = 4) -> bytes:
    """`count` pax headers of `size` bytes (ignored `comment` records), `per_member` of them before each of
    a run of directories, then one empty file."""
    def write(archive):
        for i in range(count):
            body = len(b" comment=") + (size - 16) + 1
            length = body + len(str(body))
            length = body + len(str(length))
            archive.write(header("././@PaxHeader", length, b"x"))
            archive.write(b"%d comment=" % length + b"c" * (size - 16) + b"\n")
            archive.write(b"\0" * (-length % BLOCK))
            if i % per_member == per_member - 1:
                archive.write(header(f"d{i}/", 0, b"5"))
        archive.write(header("main.py", 0))
        archive.write(b"\0" * 2 * BLOCK)
    return _gzip(write)
