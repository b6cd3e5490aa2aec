"""The example agents and functions of `examples/`, as the tests upload them."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from caiplatform.testing.sources import directory_tarball

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example_tarball(name: str) -> bytes:
    return directory_tarball(EXAMPLES / name)


def wait_ready(http: httpx.Client, name: str, timeout: float = 240) -> dict:
    """Poll `GET /v1/agents/{name}` until it has settled; it must be ready."""
    deadline = time.monotonic() + timeout
    while True:
        view = http.get(f"/v1/agents/{name}").json()
        if view.get("state") not in ("building", "deploying"):
            assert view["ready"], view
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.5)
