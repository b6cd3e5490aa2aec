"""`python -m caiplatform.harness` as a real process (what the local runtime runs), with a SQLite
session store so a session survives a restart of the process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx

from caiplatform.supervisor import ProcessSpec, ProcessSupervisor, free_port
from caiplatform.testing.example_agents import PYTHON_FUNCTION
from caiplatform.testing.http import healthz_probe

TOKEN = "internal-token-for-process-test"


def _spec(env: dict[str, str], port: int, name: str) -> ProcessSpec:
    src = str(Path(__file__).resolve().parents[2] / "src")
    process_env = {**env, "PORT": str(port), "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"),
                   "PYTHONPATH": src}
    return ProcessSpec(name=name, argv=[sys.executable, "-m", "caiplatform.harness"], env=process_env,
                       health=healthz_probe(port), startup_timeout=60, restart=False, inherit_env=False)


async def test_harness_process_serves_a_function_and_keeps_sessions_across_restarts(harness_env, tmp_path):
    env = harness_env("function", PYTHON_FUNCTION, CAI_INTERNAL_TOKEN=TOKEN,
                      CAI_SESSION_STORE=f"sqlite:///{tmp_path / 'sessions' / 'p-fn.sqlite3'}")
    port = free_port()
    async with ProcessSupervisor(tmp_path / "run") as supervisor:
        await supervisor.start(_spec(env, port, "harness-fn"))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            r = await client.post("/invoke", json={"message": "first"})
            assert r.status_code == 200, r.text
            assert r.json()["echo"] == "first"
            session_id = r.headers["X-CAI-Session-Id"]
            async with client.stream("POST", "/invoke/stream", json={"message": "again", "session_id": session_id}) as s:
                assert s.headers["X-CAI-Session-Id"] == session_id
                lines = [json.loads(line) async for line in s.aiter_lines() if line.strip()]
            assert [line["type"] for line in lines] == ["output", "block_end", "done"]
        await supervisor.stop("harness-fn")

        port = free_port()
        await supervisor.start(_spec(env, port, "harness-fn-2"))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            r = await client.get(f"/internal/sessions/{session_id}", headers={"X-CAI-Internal": TOKEN})
            assert r.status_code == 200
            texts = [p.get("text") for e in r.json()["events"] if e["author"] == "user" for p in e["content"]["parts"]]
            assert texts == ["first", "again"]
            assert (await client.get("/debug/config")).json()["framework"] == "function"
            assert (await client.get("/internal/users")).status_code == 401
