"""The client and the command line against a live `caiplatform serve --scripted-model` (issue 20):
the README's three lines of Python and its commands as written, the command line through its entry point
(progress in a pseudo-terminal, `--json` parsed, exit codes by failure kind, the stored login)."""

from __future__ import annotations

import json
import os
import pty
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from caiplatform.testing.serve import ServeProcess

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ADMIN = {"CAI_ADMIN_EMAIL": "admin@example.com", "CAI_ADMIN_PASSWORD": "change-me-please"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    data = tmp_path_factory.mktemp("cli")
    server = ServeProcess(data / "data", "--scripted-model", env={**ADMIN, "RATELIMIT_RPS": "1000",
                                                                   "RATELIMIT_BURST": "1000"},
                          startup_timeout=120, unset=("CAI_BASE_URL", "CAI_TOKEN", "CAI_API_KEY", "MODEL_BASE_URL"))
    with server:
        config = data / "config"
        yield server, config


def cli(served, *args: str, stdin: str | None = None, token: str | None = None) -> subprocess.CompletedProcess[str]:
    server, config = served
    env = {**os.environ, "XDG_CONFIG_HOME": str(config), "CAI_BASE_URL": server.base_url}
    env.pop("CAI_TOKEN", None)
    if token:
        env["CAI_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "caiplatform", *args], env=env, input=stdin, text=True,
                          capture_output=True, timeout=600, cwd=ROOT)


def readme_block(language: str, marker: str) -> str:
    blocks = re.findall(rf"^```{language}\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    return next(block for block in blocks if marker in block)


def test_login_stores_the_token_for_the_owner_only(served):
    result = cli(served, "login", "--email", ADMIN["CAI_ADMIN_EMAIL"], "--password", ADMIN["CAI_ADMIN_PASSWORD"])
    assert result.returncode == 0, result.stderr
    stored = served[1] / "caiplatform" / "credentials.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600 and stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    assert json.loads(stored.read_text())["base_url"] == served[0].base_url


def test_the_readme_commands_deploy_and_invoke(served):
    cli(served, "login", "--email", ADMIN["CAI_ADMIN_EMAIL"], "--password", ADMIN["CAI_ADMIN_PASSWORD"])
    commands = [line for line in readme_block("bash", "caiplatform deploy").splitlines()
                if line.startswith("caiplatform ") and "login" not in line]
    assert [c.split()[1] for c in commands] == ["deploy", "invoke"], commands
    for command in commands:
        result = cli(served, *_words(command)[1:])
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert "you said: weather in Paris?" in result.stdout


def test_the_readme_python_deploys_and_invokes(served, tmp_path):
    server, config = served
    code = readme_block("python", "from caiplatform.client import Client")
    env = {**os.environ, "CAI_BASE_URL": server.base_url, "XDG_CONFIG_HOME": str(config)}
    cli(served, "login", "--email", ADMIN["CAI_ADMIN_EMAIL"], "--password", ADMIN["CAI_ADMIN_PASSWORD"])
    result = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True, timeout=600,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "you said: weather in Paris?" in result.stdout


def test_json_output_and_exit_codes(served):
    login = cli(served, "login", "--email", ADMIN["CAI_ADMIN_EMAIL"], "--password", ADMIN["CAI_ADMIN_PASSWORD"])
    assert login.returncode == 0
    deployed = cli(served, "deploy", "examples/python-function", "--name", "fn-json", "--json")
    assert deployed.returncode == 0, deployed.stderr
    assert json.loads(deployed.stdout)["ready"] is True
    listed = json.loads(cli(served, "agents", "list", "--json").stdout)
    assert "fn-json" in [a["name"] for a in listed]
    missing = cli(served, "agents", "get", "no-such-agent")
    assert missing.returncode == 5 and "error:" in missing.stderr
    refused = cli(served, "agents", "list", token="cai_not_a_key")
    assert refused.returncode == 4, refused.stderr
    bad = cli(served, "deploy", "examples/python-function", "--name", "Bad_Name")
    assert bad.returncode == 3, bad.stderr


def test_deploy_shows_progress_on_a_terminal_only(served):
    cli(served, "login", "--email", ADMIN["CAI_ADMIN_EMAIL"], "--password", ADMIN["CAI_ADMIN_PASSWORD"])
    server, config = served
    env = {**os.environ, "XDG_CONFIG_HOME": str(config), "CAI_BASE_URL": server.base_url, "COLUMNS": "120"}
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "caiplatform", "deploy", "examples/chat-function",
                                "--name", "chat-tty"], env=env, stdin=follower, stdout=follower, stderr=follower,
                               cwd=ROOT)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    assert process.wait(timeout=600) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "uploading chat-tty (function)" in text and "chat-tty is ready" in text
    piped = cli(served, "deploy", "examples/chat-function", "--name", "chat-pipe")
    assert piped.returncode == 0 and "uploading" not in piped.stderr


def _words(command: str) -> list[str]:
    import shlex

    return shlex.split(command)


def test_the_clients_streamed_deltas_add_up_to_the_buffered_reply(served):
    from caiplatform.client import Client
    from caiplatform.models.invoke import InvokeResponse, OutputDelta, TurnDone

    server, _ = served
    with Client(server.base_url) as client:
        client.auth.login(email=ADMIN["CAI_ADMIN_EMAIL"], password=ADMIN["CAI_ADMIN_PASSWORD"])
        client.agents.deploy_source(ROOT / "examples" / "langgraph-weather", name="streamer")
        client.agents.wait_ready("streamer")
        buffered = client.agents.invoke("streamer", message="weather in Oslo?")
        events = list(client.agents.invoke_stream("streamer", message="weather in Oslo?"))
    assert isinstance(buffered, InvokeResponse) and buffered.output == "you said: weather in Oslo?"
    assert "".join(e.text for e in events if isinstance(e, OutputDelta)) == buffered.output
    assert isinstance(events[-1], TurnDone)


def test_a_failed_build_exits_7_with_the_builds_message(served, tmp_path):
    cli(served, "login", "--email", ADMIN["CAI_ADMIN_EMAIL"], "--password", ADMIN["CAI_ADMIN_PASSWORD"])
    source = tmp_path / "broken"
    source.mkdir()
    (source / "graph.py").write_text("answer = 42  # no module-level `graph`\n")
    result = cli(served, "deploy", str(source), "--name", "broken-graph")
    assert result.returncode == 7, (result.stdout, result.stderr)
    assert "error:" in result.stderr and "graph" in result.stderr
