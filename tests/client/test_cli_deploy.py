"""`caiplatform deploy` in process (a platform on its own loop behind the sync client): what it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from caiplatform.cli import main
from caiplatform.client import Client

ROOT = Path(__file__).resolve().parents[2]
AUTOMATION = "automation-token-for-tests"


@pytest.fixture
def in_process(settings, monkeypatch):
    """The CLI's client is an in-process one of an in-memory platform (its base URL the CLI's target)."""
    from caiplatform.cli import commands
    from caiplatform.platform import Platform

    platform = Platform.in_memory(settings)
    made: list[Client] = []

    def client() -> Client:
        made.append(Client.in_process(platform, token=AUTOMATION))
        return made[-1]

    monkeypatch.setattr(commands, "client", client)
    return made


def test_deploy_prints_the_invoke_route_not_the_cluster_address(in_process, capsys):
    assert main(["deploy", str(ROOT / "examples" / "python-function"), "--name", "weather"]) == 0
    out = capsys.readouterr().out
    base = in_process[0].base_url.rstrip("/")
    assert f"weather is ready: POST {base}/v1/agents/weather/invoke" in out, out
    assert "svc.cluster.local" not in out  # the cluster's own name for it answers nothing here


def test_a_published_agent_shows_its_public_address_first():
    from caiplatform.cli.commands import callable_address

    view = {"url": "http://weather.cai-p-x.svc.cluster.local", "external_url": "https://weather.example.com"}
    assert callable_address("http://127.0.0.1:8080/", "weather", "team a", view) == (
        "https://weather.example.com (published), or POST http://127.0.0.1:8080/v1/agents/weather/invoke?project=team%20a")


def test_deploy_streams_the_build_log_lines(in_process, capsys):
    """The build's own lines reach the person deploying (standard error), before the ready line."""
    assert main(["deploy", str(ROOT / "examples" / "python-function"), "--name", "logged"]) == 0
    captured = capsys.readouterr()
    assert "checked function source; copying it into image sha256:" in captured.err, captured.err
    assert "logged is ready" in captured.out and "copying" not in captured.out  # stdout: the answer only


def test_deploy_json_prints_only_the_view(in_process, capsys):
    import json

    assert main(["deploy", str(ROOT / "examples" / "python-function"), "--name", "quiet", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ready"] is True and "copying" not in captured.err
