"""Issue 25, point 5: invoke errors carry one line in the envelope, never a traceback or a server path
(document 1: "upstream detail errors are normalized into the envelope"); and an agent without a model
endpoint is told which setting is missing."""

from __future__ import annotations

import json
import re
import sys
import textwrap

from caiplatform.services.invoke_errors import NO_MODEL_ENDPOINT
from caiplatform.testing.example_agents import LANGGRAPH_WEATHER
from tests.agents.agents_support import deploy, wait_settled

# Graphs that pass the build's checks and fail when the instance imports them.
FAILS_ON_IMPORT = {
    "graph.py": "from langgraph.graph import MessagesState, StateGraph\nimport nosuch_module_xyz\n\n"
                "graph = StateGraph(MessagesState).compile()\n",
}
OPENS_A_MISSING_FILE = {
    "graph.py": "from langgraph.graph import MessagesState, StateGraph\nopen('/nonexistent/dir/file.txt')\n\n"
                "graph = StateGraph(MessagesState).compile()\n",
}
RAISES_WITH_A_PATH = {"main.py": "def handle(event, context):\n"
                                 "    raise OSError('cannot read /srv/data/secret/key.json\\nsecond line')\n"}
ABSOLUTE_PATH = re.compile(r"(?<![\w.])/[\w.-]+/[\w./-]+")


def assert_leaks_nothing(text: str) -> None:
    for fragment in ("Traceback", "\n", 'File "', "site-packages", sys.prefix, "/tmp/", "/nonexistent/"):
        assert fragment not in text, (fragment, text)
    assert not ABSOLUTE_PATH.search(text), text


async def test_an_agent_that_fails_to_import_answers_one_line_without_paths(client, admin_headers):
    await deploy(client, admin_headers, "broken", FAILS_ON_IMPORT, framework="langgraph")
    view = await wait_settled(client, admin_headers, "broken")
    r = await client.post("/v1/agents/broken/invoke", json={"message": "hi"}, headers=admin_headers)
    assert r.status_code == 502
    error = r.json()["error"]
    assert error.startswith("invoke agent broken: ") and error.endswith("ModuleNotFoundError: No module named 'nosuch_module_xyz'")
    assert_leaks_nothing(error)
    r = await client.post("/v1/agents/broken/invoke/stream", json={"message": "hi"}, headers=admin_headers)
    assert r.status_code == 502 and r.json()["error"] == error
    # the agent's view and its live object say the same, in one line
    view = (await client.get("/v1/agents/broken", headers=admin_headers)).json()
    assert view["state"] == "failed" and "ModuleNotFoundError" in view["message"]
    assert_leaks_nothing(view["message"])
    spec = (await client.get("/v1/agents/broken/spec", headers=admin_headers)).json()
    assert "ModuleNotFoundError" in spec["yaml"] and "Traceback" not in spec["yaml"] and sys.prefix not in spec["yaml"]


async def test_paths_in_the_agents_own_error_are_cut_to_their_last_segment(client, admin_headers):
    await deploy(client, admin_headers, "opener", OPENS_A_MISSING_FILE, framework="langgraph")
    await wait_settled(client, admin_headers, "opener")
    r = await client.post("/v1/agents/opener/invoke", json={"message": "hi"}, headers=admin_headers)
    assert r.status_code == 502
    assert r.json()["error"].endswith("FileNotFoundError: [Errno 2] No such file or directory: '.../file.txt'")
    assert_leaks_nothing(r.json()["error"])


async def test_a_turn_that_raises_with_a_path_is_one_line_in_the_502_and_the_stream(client, admin_headers):
    await deploy(client, admin_headers, "pathfn", RAISES_WITH_A_PATH, framework="function")
    await wait_settled(client, admin_headers, "pathfn")
    r = await client.post("/v1/agents/pathfn/invoke", json={"message": "hi"}, headers=admin_headers)
    assert (r.status_code, r.json()["error"]) == (502, "invoke agent pathfn: OSError: cannot read .../key.json")
    r = await client.post("/v1/agents/pathfn/invoke/stream", json={"message": "hi"}, headers=admin_headers)
    last = json.loads(r.text.strip().splitlines()[-1])
    assert last == {"type": "error", "message": "OSError: cannot read .../key.json"}


async def test_without_a_model_endpoint_the_502_names_the_setting(client, admin_headers, platform):
    assert platform.settings.model_base_url is None
    files = {name: textwrap.dedent(text) for name, text in LANGGRAPH_WEATHER.items()}
    await deploy(client, admin_headers, "weather", files, framework="langgraph")
    assert (await wait_settled(client, admin_headers, "weather"))["ready"] is True
    r = await client.post("/v1/agents/weather/invoke", json={"message": "hi"}, headers=admin_headers)
    assert r.status_code == 502
    error = r.json()["error"]
    assert error.startswith("invoke agent weather: ") and error.count(NO_MODEL_ENDPOINT) == 1
    assert "MODEL_BASE_URL" in error


async def test_the_spec_shows_no_server_path(client, admin_headers, platform, tmp_path, monkeypatch):
    """Issue 26: the embedded platform's session store is a file in the data directory."""
    store = tmp_path / "data" / "sessions" / "p-fn.sqlite3"
    monkeypatch.setattr(platform.agents, "_session_store", lambda record: f"sqlite:///{store}")
    await deploy(client, admin_headers, "fn", {"main.py": "def handle(event, context):\n    return 1\n"},
                 framework="function")
    await wait_settled(client, admin_headers, "fn")
    text = (await client.get("/v1/agents/fn/spec", headers=admin_headers)).json()["yaml"]
    assert "CAI_SESSION_STORE" in text and "sqlite:.../p-fn.sqlite3" in text
    assert str(tmp_path) not in text and not ABSOLUTE_PATH.search(text), text


async def test_the_published_address_answers_a_failed_turn_in_one_line(client, admin_headers, platform):
    await deploy(client, admin_headers, "public", RAISES_WITH_A_PATH, framework="function")
    await wait_settled(client, admin_headers, "public")
    r = await client.patch("/v1/agents/public/env", headers=admin_headers,
                           json={"set": {"CAI_EXPOSE_EXTERNAL": "none", "CAI_EXPOSE_RATE_LIMIT": "100/minute"}})
    assert r.status_code < 300, r.text
    view = await wait_settled(client, admin_headers, "public")
    assert view["ready"], view
    host = view["external_url"].split("//", 1)[1].split(":", 1)[0]
    r = await client.post("/invoke", json={"message": "hi"}, headers={"host": host})
    assert r.status_code >= 500 and r.json()["error"] == "OSError: cannot read .../key.json", r.text
    r = await client.post("/invoke/stream", json={"message": "hi"}, headers={"host": host})
    assert json.loads(r.text.strip().splitlines()[-1]) == {"type": "error", "message": "OSError: cannot read .../key.json"}
