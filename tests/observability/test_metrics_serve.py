"""`caiplatform serve` tells the platform its bind: anonymous /metrics on loopback only."""

from __future__ import annotations

import httpx
import pytest

from caiplatform.testing.serve import ServeProcess

pytestmark = pytest.mark.e2e

TOKEN = "automation-token-for-metrics"


@pytest.mark.parametrize(("host", "anonymous"), [("127.0.0.1", 200), ("0.0.0.0", 401)])
def test_anonymous_scrape_follows_the_bind(tmp_path, host, anonymous):
    env = {"CAI_LOCAL_SANDBOX": "off", "CAI_AUTOMATION_TOKEN": TOKEN}
    with ServeProcess(tmp_path / "data", "--host", host, "--api", "core", env=env) as server:
        assert httpx.get(f"{server.base_url}/metrics").status_code == anonymous
        r = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "cai_http_requests_total" in r.text
