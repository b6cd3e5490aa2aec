"""End to end on a real `caiplatform serve`: the Node.js, Go and Ruby example functions are built by the
local builder (Go compiled there), run by the local runtime, and answer buffered and streamed; an env
change reaches the function's process."""

from __future__ import annotations

import json

import httpx
import pytest

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.serve import ServeProcess

from ..examples_support import example_tarball, wait_ready

pytestmark = pytest.mark.e2e

RUNTIMES = {"node-greeter": ("node-function", "nodejs"), "go-greeter": ("go-function", "go"),
            "ruby-greeter": ("ruby-function", "ruby")}
SESSION = "session-for-the-function-e2e-test"


def test_functions_in_other_languages_on_a_real_server(tmp_path):
    with ServeProcess(tmp_path / "data", env={"CAI_INTERNAL_TOKEN": "internal-e2e"}) as server:
        base = server.base_url
        token = httpx.post(f"{base}/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
        admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        anonymous = httpx.Client(base_url=base, timeout=120)
        for name, (example, runtime) in RUNTIMES.items():
            r = admin.post("/v1/agents", params={"project": "default"},
                           data={"name": name, "framework": "function", "runtime": runtime},
                           files={"code": ("code.tar.gz", example_tarball(example), "application/gzip")})
            assert r.status_code == 202, r.text
        for name, (_, runtime) in RUNTIMES.items():
            view = wait_ready(admin, name)
            assert (view["kind"], view["framework"], view["runtime"]) == ("function", f"function-{runtime}", runtime)

            r = anonymous.post(f"/v1/agents/{name}/invoke", json={"message": "hi", "session_id": SESSION})
            assert r.status_code == 200, r.text
            expected = {"greeting": "hello", "echo": "hi", "keys": ["message", "session_id"], "session_id": SESSION}
            assert r.json() == expected

            with anonymous.stream("POST", f"/v1/agents/{name}/invoke/stream",
                                  json={"message": "hi", "session_id": SESSION}) as s:
                assert s.status_code == 200 and s.headers["X-CAI-Session-Id"] == SESSION
                lines = [json.loads(line) for line in s.iter_lines() if line.strip()]
            assert lines[-1]["type"] == "done", lines
            assert json.loads("".join(line["text"] for line in lines if line["type"] == "output")) == expected

        r = admin.patch("/v1/agents/go-greeter/env", json={"set": {"GREETING": "bonjour"}})
        assert r.status_code == 200, r.text
        assert wait_ready(admin, "go-greeter")["latest_revision"] == "go-greeter-00002"
        r = anonymous.post("/v1/agents/go-greeter/invoke", json={"message": "hi"})
        assert r.status_code == 200 and r.json()["greeting"] == "bonjour", r.text
