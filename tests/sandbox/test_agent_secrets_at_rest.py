"""Issue 34: an agent's secrets are not in plain text in the platform database. Over HTTP on a real
`caiplatform serve`: after `PUT /v1/agents/{name}/secrets` the raw `agent_secrets` rows (and the database
files' bytes) hold no plaintext; the deployed function still reads the value, after a restart too; a
server started with another key refuses to start and says why."""

from __future__ import annotations

import sqlite3
import time

import httpx
import pytest

from caiplatform.testing.serve import ServeFailed, ServeProcess

from ..agents.agents_support import tarball
from ..serverless.test_serve_e2e import poll

pytestmark = pytest.mark.e2e
TOKEN = "secrets-at-rest-automation-token"
CANARY = "canary-agent-secret-" + "7f3a9c1e5b"
FUNCTION = {"main.py": "import os\n\ndef handle(event, context):\n    return {'token': os.environ.get('API_TOKEN')}\n"}


def _client(server: ServeProcess) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)


def _settled(http: httpx.Client) -> dict:
    return poll(lambda: http.get("/v1/agents/keeper").json(),
                lambda v: v.get("state") not in ("building", "deploying"), "keeper did not settle", timeout=240)


def _invoke_token(http: httpx.Client) -> str | None:
    deadline = time.monotonic() + 120
    while True:
        answer = http.post("/v1/agents/keeper/invoke", json={"x": 1})
        if answer.status_code == 200:
            body = answer.json()
            output = body.get("output", body)
            return output.get("token") if isinstance(output, dict) else None
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.5)


def _raw_rows(data_dir) -> list[tuple[str, str]]:
    with sqlite3.connect(data_dir / "platform.db") as db:
        return list(db.execute("SELECT key, value FROM agent_secrets"))


def _database_bytes(data_dir) -> bytes:
    return b"".join(p.read_bytes() for p in data_dir.glob("platform.db*"))


def test_agent_secrets_are_encrypted_at_rest(tmp_path):
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir, env={"CAI_AUTOMATION_TOKEN": TOKEN}, unset=("CAI_SECRETS_KEY",))
    with server, _client(server) as http:
        deployed = http.post("/v1/agents", params={"project": "default"}, data={"name": "keeper", "framework": "function"},
                             files={"code": ("code.tar.gz", tarball(FUNCTION), "application/gzip")})
        assert deployed.status_code == 202, deployed.text
        first = _settled(http)
        assert first["ready"], first
        put = http.put("/v1/agents/keeper/secrets", json={"API_TOKEN": CANARY})
        assert put.status_code == 200, put.text
        assert http.get("/v1/agents/keeper/secrets").json()["keys"] == ["API_TOKEN"]
        poll(lambda: _invoke_token(http), lambda token: token == CANARY, "the new revision never saw the secret",
             timeout=240)
        rows = _raw_rows(data_dir)
        assert [key for key, _ in rows] == ["API_TOKEN"]
        assert all(CANARY not in value for _, value in rows), rows
        assert CANARY.encode() not in _database_bytes(data_dir)
    port = server.port
    again = ServeProcess(data_dir, env={"CAI_AUTOMATION_TOKEN": TOKEN}, unset=("CAI_SECRETS_KEY",), port=port)
    with again, _client(again) as http:
        assert _invoke_token(http) == CANARY  # the restarted server decrypts what it stored
        http.patch("/v1/agents/keeper/secrets", json={"set": {"OTHER": "x"}}).raise_for_status()
        poll(lambda: _invoke_token(http), lambda token: token == CANARY, "the secret was lost", timeout=240)
    wrong = ServeProcess(data_dir, env={"CAI_AUTOMATION_TOKEN": TOKEN, "CAI_SECRETS_KEY": "another-key-entirely-0123456789"},
                         port=port, startup_timeout=60)
    with pytest.raises(ServeFailed) as refused:
        wrong.start()
    wrong.stop()
    assert "CAI_SECRETS_KEY" in str(refused.value) and "another key" in str(refused.value), str(refused.value)[-1500:]
