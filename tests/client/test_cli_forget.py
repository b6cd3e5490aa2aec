"""`caiplatform forget USER_ID --project P` in process: the erasure runs and its receipt is printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from caiplatform.cli import main
from caiplatform.client import Client
from caiplatform.client.source import tar_directory

ROOT = Path(__file__).resolve().parents[2]
AUTOMATION = "automation-token-for-tests"
SESSION = "cli-forget-session-000000000001"


class _Kept:
    """The one in-process client, lent to each command without being closed by it."""

    def __init__(self, client: Client):
        self.client = client

    def __enter__(self) -> Client:
        return self.client

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def shared_client(settings, monkeypatch):
    from caiplatform.cli import commands
    from caiplatform.platform import Platform

    client = Client.in_process(Platform.in_memory(settings), token=AUTOMATION)
    monkeypatch.setattr(commands, "client", lambda: _Kept(client))
    yield client
    client.close()


def test_forget_prints_the_receipt(shared_client, capsys):
    shared_client.agents.deploy_source(tar_directory(ROOT / "examples" / "python-function"), name="fn",
                                       framework="function", project="default")
    shared_client.poll(lambda: shared_client.agents.get("fn"), lambda view: view.ready, timeout=60)
    shared_client.agents.invoke("fn", message="hello there", session_id=SESSION, user_id="carol-1")

    assert main(["forget", "carol-1", "--project", "default"]) == 0
    out = capsys.readouterr().out
    assert "of carol-1 in project " in out and ": done: 3/3 stores" in out, out
    assert "sessions 1, events 2" in out, out

    assert main(["forget", "carol-1", "--project", "default", "--agent", "fn", "--json"]) == 0
    receipt = json.loads(capsys.readouterr().out)
    assert receipt["state"] == "done" and receipt["agents"] == ["fn"]
    assert {r["store"]: r["removed"] for r in receipt["receipts"]}["sessions"] == {"sessions": 0, "events": 0}
    assert main(["forget", "carol-1", "--project", "nowhere"]) == 5  # not found

    assert main(["forget", "carol-1"]) == 3  # a project, or --everywhere
    assert main(["forget", "carol-1", "--everywhere", "--json"]) == 0
    everywhere = json.loads(capsys.readouterr().out)
    assert [e["state"] for e in everywhere] == ["done"] and everywhere[0]["agents"] == ["fn"]
