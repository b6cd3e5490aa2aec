"""`caiplatform serve` as a person runs it: a real process on a loopback port, restarted on its data dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from caiplatform.testing.engines import free_port
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD

pytestmark = pytest.mark.e2e


@contextmanager
def serve(data_dir: Path, *extra: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "CAI_ADMIN_EMAIL": ADMIN_EMAIL, "CAI_ADMIN_PASSWORD": ADMIN_PASSWORD}
    log = open(data_dir.parent / f"serve-{port}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "caiplatform", "serve", "--port", str(port), "--data-dir", str(data_dir), *extra],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited early:\n{Path(log.name).read_text()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"serve did not answer in 60 s:\n{Path(log.name).read_text()}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_serve_answers_and_keeps_state_across_restart(tmp_path):
    data_dir = tmp_path / "data"
    with serve(data_dir) as base:
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
    with serve(data_dir) as base:
        # Same data dir: the account and the signing key survived, so the old token still works too.
        assert httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).status_code == 200
        assert httpx.get(f"{base}/v1/auth/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_serve_a_single_api(tmp_path):
    with serve(tmp_path / "data", "--api", "memorystore") as base:
        body = httpx.get(f"{base}/healthz").json()
        assert "apis" not in body
        assert httpx.get(f"{base}/livez").json() == {"status": "ok"}
