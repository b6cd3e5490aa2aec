"""The tar reader of `domain/agent_source.py`: every archive a real tool writes still reads the same, and
every bomb (header data, many members, gzip) is refused before it is inflated or buffered."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import time

import pytest

from caiplatform.domain import agent_source
from caiplatform.errors import BadRequest

from ..sandbox import tar_bombs

LONG = "deep/" + "/".join(["segment-of-a-long-path"] * 8) + "/module.py"
FILES = {"main.py": b"print('hi')\n", LONG: b"x = 1\n", "caf\u00e9/\u00fcber.txt": "\u00e9t\u00e9".encode(),
         "data/blob.bin": bytes(range(256)) * 9}


def _tarfile(fmt: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=fmt) as archive:
        directory = tarfile.TarInfo("data")
        directory.type = tarfile.DIRTYPE
        archive.addfile(directory)
        for path, content in FILES.items():
            info = tarfile.TarInfo(path)
            info.size = len(content)
            if fmt == tarfile.PAX_FORMAT:
                info.pax_headers = {"SCHILY.xattr.user.x": "\udcff".encode("utf-8", "surrogateescape").decode("latin-1")}
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tarfile_formats_read_the_same(fmt):
    files = FILES if fmt != tarfile.USTAR_FORMAT else {k: v for k, v in FILES.items() if len(k) < 100}
    if fmt == tarfile.USTAR_FORMAT:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", format=fmt) as archive:
            for path, content in files.items():
                info = tarfile.TarInfo(path)
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
        data = buffer.getvalue()
    else:
        data = _tarfile(fmt)
    assert agent_source.extract_tarball(data) == files


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar on this machine")
@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar"])
def test_tar_command_archives_read_the_same(tmp_path, fmt):
    root = tmp_path / "agent"
    for path, content in FILES.items():
        if fmt == "ustar" and path == LONG:
            continue
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)
    subprocess.run(["tar", f"--format={fmt}", "-czf", str(tmp_path / "a.tgz"), "-C", str(tmp_path), "agent"],
                   check=True)
    expected = {k: v for k, v in FILES.items() if fmt != "ustar" or k != LONG}
    assert agent_source.extract_tarball((tmp_path / "a.tgz").read_bytes()) == expected


@pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine")
def test_git_archive_with_its_global_header_reads(tmp_path):
    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (tmp_path / "main.py").write_text("print(1)\n")
    run("add", "main.py")
    run("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    data = subprocess.run(["git", "-C", str(tmp_path), "archive", "--format=tar.gz", "HEAD"], check=True,
                          capture_output=True).stdout
    assert agent_source.extract_tarball(data) == {"main.py": b"print(1)\n"}


def _refused(data: bytes) -> str:
    started = time.monotonic()
    with pytest.raises(BadRequest) as caught:
        agent_source.extract_tarball(data)
    assert time.monotonic() - started < 5
    message = str(caught.value.detail if hasattr(caught.value, "detail") else caught.value)
    assert "invalid 'code' archive: " in message, message
    return message


@pytest.mark.parametrize("kind", [b"x", b"g", b"L", b"K"])
def test_huge_extended_headers_are_refused_before_they_are_read(kind):
    assert "larger than the 64 KiB limit" in _refused(tar_bombs.extended_bomb(kind, mib=200))


def test_extended_header_bytes_count_against_the_64_mib_budget():
    # 1200 pax headers of 60 KiB (four before each of 300 directories): 70 MiB of headers, one empty file
    assert "expands to more than the 64 MiB limit" in _refused(tar_bombs.many_headers(1200))
    assert agent_source.extract_tarball(tar_bombs.many_headers(100)) == {"main.py": b""}


def test_many_tiny_members_are_refused():
    assert "more than 2000 entries" in _refused(tar_bombs.many_members(200_000))


def test_a_gzip_bomb_is_not_inflated():
    _refused(tar_bombs.gzip_bomb(2048))


def test_bad_checksum_and_bad_pax_records_are_400():
    block = bytearray(tar_bombs.header("main.py", 0))
    block[0:1] = b"n"
    import gzip
    assert "bad header checksum" in _refused(gzip.compress(bytes(block) + bytes(1024)))
    pax = tar_bombs.header("././@PaxHeader", 12, b"x") + b"99 path=x\n\0\0".ljust(512, b"\0")
    assert "bad pax record" in _refused(gzip.compress(pax + tar_bombs.header("main.py", 0) + bytes(1024)))
