"""End to end: `caiplatform serve` with its embedded OpenBao keeps secrets across a restart."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import httpx
import pytest

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.serve import ServeProcess

pytestmark = pytest.mark.e2e

ARGS = ("--api", "core", "--log-level", "warning")
# The platform must pick its own OpenBao and database, whatever the environment running the tests says.
UNSET = ("CAI_BAO_ADDR", "BAO_ADDR", "VAULT_ADDR", "CAI_BAO_TOKEN", "BAO_TOKEN", "VAULT_TOKEN",
         "CAI_DATABASE_URL", "DATABASE_URL")


def _bao_pid(data_dir: Path) -> int | None:
    import json

    for record in (data_dir / "run").glob("*.json"):
        data = json.loads(record.read_text())
        if "bao" in " ".join(data.get("argv", [])):
            return int(data["pid"])
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_secret_survives_a_restart_of_serve(tmp_path):
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir, *ARGS, unset=UNSET)
    base = server.base_url
    server.start()
    try:
        token = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()
        headers = {"Authorization": f"Bearer {token['token']}"}
        with sqlite3.connect(data_dir / "platform.db") as db:
            (project_id,) = db.execute("SELECT id FROM projects WHERE slug = 'default'").fetchone()
        url = f"{base}/v1/projects/{project_id}/secrets"
        r = httpx.post(url, json={"name": "durable", "value": "written-before-restart"}, headers=headers)
        assert r.status_code == 201, r.text
        listed = httpx.get(url, headers=headers).json()
        assert listed["path_prefix"].startswith("secret/data/")
        bao_pid = _bao_pid(data_dir)
        assert bao_pid is not None and _alive(bao_pid)
        init = data_dir / "openbao" / "init.json"
        assert init.exists() and (init.stat().st_mode & 0o777) == 0o600
    finally:
        server.stop()
    assert not _alive(bao_pid), "the embedded OpenBao outlived caiplatform serve"

    server.start()
    try:
        token = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()
        headers = {"Authorization": f"Bearer {token['token']}"}
        r = httpx.post(f"{url}/durable:reveal", headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["value"] == "written-before-restart" and r.json()["version"] == 1
        r = httpx.post(url, json={"name": "durable", "value": "after"}, headers=headers)
        assert r.status_code == 200 and r.json()["version"] == 2
    finally:
        server.stop()
    assert "written-before-restart" not in server.log_path.read_text()


def test_serve_with_an_external_openbao(tmp_path, openbao):
    """CAI_BAO_ADDR/CAI_BAO_TOKEN: the platform uses that server and starts no OpenBao of its own."""
    data_dir = tmp_path / "data"
    extra = {"CAI_BAO_ADDR": openbao.addr, "CAI_BAO_TOKEN": openbao.root_token}
    server = ServeProcess(data_dir, *ARGS, env=extra, unset=UNSET)
    base = server.base_url
    for round_ in (1, 2):
        server.start()
        try:
            token = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
            headers = {"Authorization": f"Bearer {token.json()['token']}"}
            with sqlite3.connect(data_dir / "platform.db") as db:
                (project_id,) = db.execute("SELECT id FROM projects WHERE slug = 'default'").fetchone()
            url = f"{base}/v1/projects/{project_id}/secrets"
            if round_ == 1:
                r = httpx.post(url, json={"name": "ext", "value": "kept-outside"}, headers=headers)
                assert r.status_code == 201, r.text
                assert not (data_dir / "openbao").exists()
            else:
                r = httpx.post(f"{url}/ext:reveal", headers=headers)
                assert r.status_code == 200 and r.json()["value"] == "kept-outside"
                tok = httpx.post(f"{url}/ext:issue-token", headers=headers).json()
                # read.addr is the platform API's relay to that store (workloads reach no engine, issue 34)
                assert tok["read"]["addr"] == f"{base}/v1/secret-store"
                for addr in (tok["read"]["addr"], openbao.addr):
                    read = httpx.get(f"{addr}/v1/{tok['read']['path']}", headers={"X-Vault-Token": tok["token"]})
                    assert read.json()["data"]["data"]["value"] == "kept-outside", (addr, read.text)
                relay = tok["read"]["addr"]
                assert httpx.get(f"{relay}/v1/{tok['read']['path']}").status_code == 401  # no token
                assert httpx.get(f"{relay}/v1/sys/mounts", headers={"X-Vault-Token": tok["token"]}).status_code == 404
                assert httpx.get(f"{relay}/v1/secret/data/../../sys/mounts",
                                 headers={"X-Vault-Token": tok["token"]}).status_code == 404
                assert httpx.delete(f"{relay}/v1/{tok['read']['path']}",
                                    headers={"X-Vault-Token": tok["token"]}).status_code == 405
        finally:
            server.stop()
