"""`docs/quickstart.md` as written: every `bash` block, in order, in one shell against a live
`caiplatform serve --scripted-model`, so no documented example goes stale. The server's start-up output
is checked too: quiet by default, one line per engine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from caiplatform.testing.serve import ServeProcess

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
# What the blocks' own comments promise, as the shell prints it.
EXPECTED = [
    "you said: weather in Paris?",  # the LangGraph example answered through the scripted model
    "s3cr3t",  # the revealed secret
    "order 42",  # the pulled message's base64 data, decoded
    '"acknowledged":1',
    "{'host': '127.",  # the memory store's own loopback address ...
    "'port': 6379",  # ... and the documented port
    "b'hello'",
    "{'title': 'cats'}",
]
ENGINE_LINES = ("database:", "secret store:", "messaging:", "memory stores:", "vector indexes:", "workloads:",
                "agents' model:", "scripted model:", "serving ")


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", markdown, flags=re.S | re.M)


def test_the_quickstart_has_a_block_per_area():
    text = QUICKSTART.read_text()
    blocks = bash_blocks(text)
    for marker in ("/v1/agents", "/secrets", ":publish", ":acknowledge", "/memorystores", "/indexes", "/mcpservers"):
        assert any(marker in block for block in blocks), f"no runnable example uses {marker}"


def test_every_quickstart_example_runs_as_written(tmp_path):
    script = "\n".join(bash_blocks(QUICKSTART.read_text()))
    # The only addition: an HTTP error fails the run (the examples use plain `curl -s`, as a person would).
    prelude = "set -euo pipefail\ncurl() { command curl --fail-with-body --max-time 60 \"$@\"; }\n"
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    admin = {"CAI_ADMIN_EMAIL": "admin@example.com", "CAI_ADMIN_PASSWORD": "change-me-please"}
    server = ServeProcess(tmp_path / "data", "--scripted-model", env=admin, startup_timeout=120,
                          unset=("CAI_DATABASE_URL", "DATABASE_URL", "CAI_BASE_URL", "MODEL_BASE_URL"))
    with server:
        env = {**os.environ, "CAI": server.base_url,
               "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))}
        try:
            run = subprocess.run(["bash", "-c", prelude + script], cwd=work, env=env, capture_output=True,
                                 text=True, timeout=280)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"the quickstart did not finish: {exc.stdout}\n{exc.stderr}\n{server.log_tail()}")
        log = server.log_path.read_text(errors="replace")
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}\nserver:\n{log[-3000:]}"
    for expected in EXPECTED:
        assert expected in run.stdout, f"{expected!r} not in:\n{run.stdout}"

    # Quiet start-up: one line per engine and where it serves, nothing from the libraries.
    startup = log[: log.index("serving ")]
    lines = [line for line in log.splitlines() if line.strip()]
    for marker in ENGINE_LINES:
        assert sum(marker in line for line in lines) == 1, f"{marker!r} not said exactly once:\n{log[:3000]}"
    for noise in ("alembic", "httpx", "Uvicorn running", "Running upgrade"):
        assert noise not in startup, f"{noise!r} shows at start-up:\n{startup}"


def test_the_readme_installs_what_its_examples_need():
    """The README's LangGraph and ADK examples need the `agents` extra; its install command brings it."""
    readme = (ROOT / "README.md").read_text()
    installs = re.findall(r"pip install '\.\[([a-z,]+)\]'", readme)
    assert installs, "the README shows no install command"
    assert {"all", "agents"} <= set(installs[0].split(",")), installs[0]
    assert "langgraph" in readme and "--scripted-model" in readme
    assert f"pip install '.[{installs[0]}]'" in QUICKSTART.read_text()  # both pages install the same
