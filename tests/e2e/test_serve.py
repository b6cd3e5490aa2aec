"""`caiplatform serve` as a person runs it: a real process on a loopback port, restarted on its data dir."""

from __future__ import annotations

import httpx
import pytest

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.serve import ServeProcess

pytestmark = pytest.mark.e2e


def test_serve_answers_and_keeps_state_across_restart(tmp_path):
    data_dir = tmp_path / "data"
    with ServeProcess(data_dir) as server:
        base = server.base_url
        health = httpx.get(f"{base}/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        missing = httpx.get(f"{base}/v1/nothing-here")
        assert missing.status_code == 404
        assert missing.json()["request_id"] == missing.headers["x-request-id"]
        wrong = httpx.put(f"{base}/v1/auth/login")
        assert wrong.status_code == 405 and wrong.json()["error"]
        login = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
        assert login.status_code == 200
        token = login.json()["token"]
        me = httpx.get(f"{base}/v1/auth/me", headers={"Authorization": f"Bearer {token}"})
        assert me.status_code == 200 and me.json()["email"] == ADMIN_EMAIL
    with ServeProcess(data_dir) as server:
        base = server.base_url
        # Same data dir: the account and the signing key survived, so the old token still works too.
        assert httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).status_code == 200
        assert httpx.get(f"{base}/v1/auth/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_serve_answers_while_it_starts_and_no_route_answers_early(tmp_path):
    """A restart answers before its engines are up: /healthz says `starting` (503) until they are, and a
    route that needs them waits for them instead of answering without them."""
    data_dir = tmp_path / "data"
    with ServeProcess(data_dir):  # the data dir, the account, the engines' state
        pass
    with ServeProcess(data_dir, answering=True) as server:
        base = server.base_url
        first = httpx.get(f"{base}/healthz")
        assert first.status_code == 200 or (first.status_code == 503 and first.json()["status"] == "starting"), first.text
        login = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}, timeout=90)
        assert login.status_code == 200, login.text
        health = httpx.get(f"{base}/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"


def test_serve_a_single_api(tmp_path):
    with ServeProcess(tmp_path / "data", "--api", "memorystore") as server:
        base = server.base_url
        body = httpx.get(f"{base}/healthz").json()
        assert "apis" not in body
        assert httpx.get(f"{base}/livez").json() == {"status": "ok"}
