"""Issue 34: `X-Forwarded-For` is believed only from the proxies the operator names
(`CAI_FORWARDED_ALLOW_IPS`, default none). A workload connects from loopback; before the fix uvicorn
believed any loopback caller's header, so a workload reset the per-IP sign-in throttle at will (a new
address per attempt) or locked another address out. On a real `caiplatform serve`."""

from __future__ import annotations

import httpx
import pytest

from caiplatform.testing.serve import ServeProcess

pytestmark = pytest.mark.e2e


def _fail(base: str, attempt: int, forwarded: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/auth/login", headers={"X-Forwarded-For": forwarded},
                      json={"email": f"nobody-{attempt}@example.com", "password": "wrong-password-1"}, timeout=60)


def test_a_loopback_caller_cannot_pick_its_address(tmp_path):
    with ServeProcess(tmp_path / "data", unset=("FORWARDED_ALLOW_IPS", "CAI_FORWARDED_ALLOW_IPS")) as server:
        answers = [_fail(server.base_url, i, f"198.51.100.{i + 1}").status_code for i in range(10)]
        assert answers == [401] * 10, answers
        refused = _fail(server.base_url, 10, "198.51.100.99")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"].startswith("too many sign-in attempts; try again in ")
        assert refused.headers.get("Retry-After")


def test_uvicorns_own_variable_does_not_make_loopback_trusted(tmp_path):
    with ServeProcess(tmp_path / "data", env={"FORWARDED_ALLOW_IPS": "*"}, unset=("CAI_FORWARDED_ALLOW_IPS",)) as server:
        assert [_fail(server.base_url, i, f"198.51.100.{i + 1}").status_code for i in range(10)] == [401] * 10
        assert _fail(server.base_url, 10, "198.51.100.99").status_code == 429


def test_a_named_proxy_is_believed(tmp_path):
    with ServeProcess(tmp_path / "data", env={"CAI_FORWARDED_ALLOW_IPS": "127.0.0.1"}) as server:
        assert [_fail(server.base_url, i, "203.0.113.7").status_code for i in range(10)] == [401] * 10
        assert _fail(server.base_url, 10, "203.0.113.7").status_code == 429  # that address is throttled
        assert _fail(server.base_url, 11, "203.0.113.8").status_code == 401  # another one is not
