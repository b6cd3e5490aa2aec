"""Issue 27 for CrewAI, over HTTP on one real `caiplatform serve`: the crew of `examples/crewai-code` (the
code tool, `crewai_code_tool()`) runs the snippet its scripted model writes, and with `TOOL_SANDBOX` set a
crew's own tools (a `@tool` function and a `BaseTool` subclass) run in the tool sandbox instead of the
agent's process.

The deploys go through the platform's local builder (a real build of each agent's source), but the serve
starts from the crewai environment the tests already installed in the checkout's test cache
(`tests/crewai_support.py`, shared with `tests/harness_turns/test_crewai.py`, which tests the install
itself): installing crewai again into the serve's fresh data dir takes minutes on a busy machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from caiplatform.testing.model_server import ScriptedModel, Step, tool_step
from caiplatform.testing.serve import ServeProcess
from caiplatform.testing.turn_checks import write_agent

from ..agents.agents_support import tarball
from ..crewai_support import REQUIREMENTS, build_in_cache, environment_of, seed_environment
from ..examples_support import EXAMPLES, example_tarball, wait_ready

pytestmark = pytest.mark.e2e
TOKEN = "codesandbox-crewai-automation-token"

# Each tool says where it ran: the agent's process holds its workload key, the tool sandbox never does.
CREW = {
    "requirements.txt": REQUIREMENTS,
    "tools.py": '''
import os
from crewai.tools import BaseTool, tool


def _inside() -> str:
    return "agent process" if "CAI_PROJECT_KEY" in os.environ else "tool sandbox"


@tool("where")
def where(city: str) -> str:
    """Where this tool runs."""
    return f"{city} from the {_inside()}, CHOICE={os.environ.get('CHOICE')}"


class Shout(BaseTool):
    name: str = "shout"
    description: str = "Shouts a text, and says where it ran."

    def _run(self, text: str) -> str:
        return f"{text.upper()} from the {_inside()}"
''',
    "crew.py": '''
from crewai import Agent, Crew, Task
from caiplatform.turns.code_tool import crewai_code_tool
from caiplatform.turns.models import crewai_llm
from tools import Shout, where


def crew():
    analyst = Agent(role="analyst", goal="answer by computing", backstory="writes Python",
                    llm=crewai_llm(), tools=[crewai_code_tool(), where, Shout()])
    task = Task(description="{message}", expected_output="an answer", agent=analyst)
    return Crew(agents=[analyst], tasks=[task])
''',
}


@pytest.fixture(scope="module")
def model():
    scripted = ScriptedModel()
    with scripted.serve() as url:
        scripted.url = url
        yield scripted


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    source = write_agent(tmp_path_factory.mktemp("codesandbox-crew-src"), CREW)
    cached = environment_of(build_in_cache(source, "crew"))
    data_dir: Path = tmp_path_factory.mktemp("codesandbox-crewai") / "data"
    env = {"CAI_AUTOMATION_TOKEN": TOKEN, "MODEL_BASE_URL": model.url, "MODEL_API_KEY": "test-key",
           "MODEL_NAME": "scripted", "CREWAI_DISABLE_TELEMETRY": "true"}
    running = ServeProcess(data_dir, env=env).start()
    http = httpx.Client(base_url=running.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    projects = http.get("/v1/projects").json()["projects"]
    default = next(p for p in projects if p["slug"] == "default")
    seeded = seed_environment(cached, data_dir, source, default["id"])
    assert (EXAMPLES / "crewai-code" / "requirements.txt").read_text() == REQUIREMENTS  # the same environment
    for name, code in (("crew", tarball(CREW)), ("coder", example_tarball("crewai-code"))):
        response = http.post("/v1/agents", params={"project": "default"}, data={"name": name, "framework": "crewai"},
                             files={"code": ("code.tar.gz", code, "application/gzip")})
        assert response.status_code == 202, response.text
        wait_ready(http, name, timeout=600)
    # Both agents were built by the serve's builder, into images that run in the seeded environment
    # (no build installed another one).
    images = [json.loads(p.read_text()) for p in (data_dir / "images").glob("*/image.json")]
    assert sorted(i["python"] for i in images) == [str(seeded / "bin" / "python")] * 2, images
    assert [p.name for p in seeded.parent.iterdir()] == [seeded.name]
    yield running, http
    http.close()
    running.stop()


def tool_results(server, model, script: list, agent: str = "crew") -> tuple[dict, list]:
    """Invoke `agent` with the model following `script`: its answer and the tool results of the turn."""
    running, _ = server
    model.set_script(script)
    answer = httpx.post(f"{running.base_url}/v1/agents/{agent}/invoke", json={"message": "go"}, timeout=180)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return body, [p["function_response"]["response"] for e in body["events"] for p in e["content"]["parts"]
                  if "function_response" in p]


def result_text(response: dict) -> str:
    return str(response.get("result", response))


def test_the_crew_calls_the_code_tool_and_gets_the_snippets_output(server, model):
    body, results = tool_results(server, model, [
        tool_step("run_code", code="import math\nprint(math.factorial(20))"), Step(content="20! is 2432902008176640000.")],
        agent="coder")
    assert body["output"] == "20! is 2432902008176640000."
    answer = json.loads(result_text(results[0]))
    assert answer["exit_code"] == 0 and answer["stdout"] == "2432902008176640000\n", results
    assert answer["killed"] is None
    # The snippet's question and the sandbox's answer are what the model saw next.
    assert "2432902008176640000" in json.dumps(model.requests[-1].body["messages"])


def test_with_tool_sandbox_set_the_crews_own_tools_run_out_of_process(server, model):
    _, http = server
    _, before = tool_results(server, model, [tool_step("where", city="Paris"), Step(content="done")])
    assert result_text(before[0]).startswith("Paris from the agent process"), before

    patched = http.patch("/v1/agents/crew/env", json={"set": {"TOOL_SANDBOX": "1", "CHOICE": "blue"}})
    assert patched.status_code == 200, patched.text
    assert wait_ready(http, "crew")["latest_revision"] == "crew-00002"

    for _ in range(2):  # every turn's fresh crew, not only the first
        _, results = tool_results(server, model, [tool_step("where", city="Paris"), Step(content="done")])
        text = result_text(results[0])
        assert text.startswith("Paris from the tool sandbox, CHOICE=blue"), results
    _, results = tool_results(server, model, [tool_step("shout", text="hi"), Step(content="done")])
    assert result_text(results[0]) == "HI from the tool sandbox", results
    # The platform's own code tool stays what it was: a snippet in the code sandbox.
    _, results = tool_results(server, model, [tool_step("run_code", code="print(6 * 7)"), Step(content="42")])
    assert json.loads(result_text(results[0]))["stdout"] == "42\n", results
