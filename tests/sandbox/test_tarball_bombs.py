"""Issue 34: a tarball bomb costs the server no memory. Each bomb (a 300 MiB pax header, GNU long name and
global pax header, a gzip bomb, 150 000 tiny members) is uploaded to a real `caiplatform serve`, refused
with the archive's 400, and the server's peak resident memory (`VmHWM`) grows by less than 50 MiB over
all of them (before the fix, the pax header alone took it to 900 MiB)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from caiplatform.testing.serve import ServeProcess

from . import tar_bombs

pytestmark = pytest.mark.e2e
TOKEN = "tarball-bomb-automation-token"
MiB = 1024 * 1024


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


BOMBS = {
    "pax header": lambda: tar_bombs.extended_bomb(b"x", mib=300),
    "global pax header": lambda: tar_bombs.extended_bomb(b"g", mib=300),
    "GNU long name": lambda: tar_bombs.extended_bomb(b"L", mib=300),
    "gzip bomb": lambda: tar_bombs.gzip_bomb(1024),
    "many members": lambda: tar_bombs.many_members(150_000),
    "header budget": lambda: tar_bombs.many_headers(1200),
}


def test_tarball_bombs_are_400_and_the_server_memory_stays_flat(tmp_path):
    bombs = {name: make() for name, make in BOMBS.items()}
    assert all(len(data) < 5 * MiB for data in bombs.values()), {k: len(v) for k, v in bombs.items()}
    with ServeProcess(tmp_path / "data", env={"CAI_AUTOMATION_TOKEN": TOKEN}) as server, httpx.Client(
            base_url=server.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as http:
        assert server.proc is not None

        def upload(data: bytes) -> httpx.Response:
            return http.post("/v1/agents", params={"project": "default"}, data={"name": "bomb", "framework": "function"},
                             files={"code": ("code.tar.gz", data, "application/gzip")})

        warm = upload(b"not a gzip stream")  # the route's code is loaded before the baseline is taken
        assert warm.status_code == 400, warm.text
        before = peak_rss(server.proc.pid)
        answers = {name: upload(data) for name, data in bombs.items()}
        after = peak_rss(server.proc.pid)
    for name, response in answers.items():
        assert response.status_code == 400, (name, response.status_code, response.text[:300])
        assert response.json()["error"].startswith("invalid 'code' archive: "), (name, response.text[:300])
    assert after - before < 50 * MiB, f"peak RSS grew by {(after - before) / MiB:.0f} MiB ({before / MiB:.0f} -> {after / MiB:.0f})"
