"""Issue 27: the code sandbox over HTTP on one real `caiplatform serve`.

A LangGraph agent from `examples/langgraph-code` answers from the scripted model, which calls its `run_code`
tool; a Python function (`caller`) sends what a test asks to its `SANDBOX_URL` with its own workload key, so
every limit is checked on the path a deployed agent takes. The wait for a warm sandbox is 2 s here
(`CAI_CODE_SANDBOX_WAIT_SECONDS`; 30 s by default) to keep the pool-exhaustion test short.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import uuid
from pathlib import Path

import httpx
import pytest

from caiplatform.codesandbox import NO_WARM_SANDBOX
from caiplatform.testing.model_server import ScriptedModel, Step, tool_step
from caiplatform.testing.serve import ServeProcess

from ..agents.agents_support import tarball
from ..examples_support import example_tarball, wait_ready

pytestmark = pytest.mark.e2e
TOKEN = "codesandbox-e2e-automation-token"
# The pool's wait, shortened for the test: the fourth snippet of four waits 1.5 s for a sandbox to come
# free plus the replacement's start, which took more than the 0.5 s a 2 s wait left on a loaded machine.
WAIT_SECONDS = 4

# Forwards `body` to the sandbox with its own key (or none, or to another project's sandbox), after putting
# its own key and code directory where the snippet says {KEY} and {CODE_DIR} (the isolation test looks for them).
CALLER = {"main.py": '''
import json, os, urllib.error, urllib.request

def handle(event, context):
    url = os.environ["SANDBOX_URL"]
    if event.get("project"):
        url = url.split("/v1/projects/")[0] + "/v1/projects/" + event["project"] + "/sandbox"
    body = dict(event["body"])
    if "code" in body:
        body["code"] = body["code"].replace("{KEY}", os.environ["CAI_PROJECT_KEY"]).replace(
            "{CODE_DIR}", os.environ.get("CAI_CODE_DIR", ""))
    headers = {"Content-Type": "application/json"}
    if event.get("auth", True):
        headers["Authorization"] = "Bearer " + os.environ["CAI_PROJECT_KEY"]
    request = urllib.request.Request(url + "/" + event.get("route", "execute"), data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return {"status": response.status, "body": json.loads(response.read())}
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": json.loads(error.read())}


# Tools of its own, for the tool-call limits.
def sleepy(seconds):
    import time
    time.sleep(seconds)
    return "woke"


def big(size):
    return "x" * size


def hog():
    blocks = []
    while True:
        blocks.append(bytearray(64 * 1024 * 1024))
'''}


# An agent whose own tool says where it runs: with TOOL_SANDBOX set, not in the agent's process (which holds
# its workload key) but in a sandbox of the tool-call limits.
TOOLIE = {
    "tools.py": '''
import os

def where(city: str) -> str:
    """Where this tool runs."""
    inside = "agent process" if "CAI_PROJECT_KEY" in os.environ else "tool sandbox"
    return f"{city} from the {inside}, CHOICE={os.environ.get('CHOICE')}"
''',
    "graph.py": '''
from langgraph.prebuilt import create_react_agent
from caiplatform.turns.models import chat_model
from tools import where

graph = create_react_agent(chat_model(), [where])
''',
}


# An ADK agent that asks for the code tool its way (`run_code` among its function tools), and has a tool of
# its own; with TOOL_SANDBOX set the latter runs in the tool sandbox, `run_code` (the platform's) stays.
ADK_CODER = {"agent.py": '''
import os
from google.adk.agents import LlmAgent
from caiplatform.turns.code_tool import run_code
from caiplatform.turns.models import adk_model

def where(city: str) -> str:
    """Where this tool runs."""
    return city + (" from the agent process" if "CAI_PROJECT_KEY" in os.environ else " from the tool sandbox")

root_agent = LlmAgent(name="coder", model=adk_model(), instruction="Compute with run_code.", tools=[run_code, where])
'''}


# An ADK agent with the code sandbox as its code executor: the ```python blocks its model writes run there.
ADK_EXECUTOR = {"agent.py": '''
from google.adk.agents import LlmAgent
from caiplatform.turns.code_tool import adk_code_executor
from caiplatform.turns.models import adk_model

root_agent = LlmAgent(name="executor", model=adk_model(), instruction="Compute by writing Python.",
                      code_executor=adk_code_executor())
'''}


class Server:
    def __init__(self, root: Path, model_url: str):
        self.data_dir = root / "data"
        env = {"CAI_AUTOMATION_TOKEN": TOKEN, "CAI_CODE_SANDBOX_WAIT_SECONDS": str(WAIT_SECONDS),
               "MODEL_BASE_URL": model_url, "MODEL_API_KEY": "test-key", "MODEL_NAME": "scripted"}
        self.server = ServeProcess(self.data_dir, env=env).start()
        self.base = self.server.base_url
        self.http = httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
        for name, framework, code in (("coder", "langgraph", example_tarball("langgraph-code")),
                                      ("caller", "function", tarball(CALLER)), ("toolie", "langgraph", tarball(TOOLIE)),
                                      ("adkcoder", "adk", tarball(ADK_CODER)),
                                      ("adkexec", "adk", tarball(ADK_EXECUTOR))):
            response = self.http.post("/v1/agents", params={"project": "default"},
                                      data={"name": name, "framework": framework},
                                      files={"code": ("code.tar.gz", code, "application/gzip")})
            assert response.status_code == 202, response.text
        self.caller = wait_ready(self.http, "caller")
        self.coder = wait_ready(self.http, "coder")
        wait_ready(self.http, "adkexec")
        for name in ("toolie", "adkcoder"):
            wait_ready(self.http, name)
            patched = self.http.patch(f"/v1/agents/{name}/env", json={"set": {"TOOL_SANDBOX": "1", "CHOICE": "blue"}})
            assert patched.status_code == 200, patched.text
        for name in ("toolie", "adkcoder"):
            assert wait_ready(self.http, name)["latest_revision"] == f"{name}-00002"

    def run(self, body: dict, **event) -> tuple[int, dict]:
        """What the sandbox answered the `caller` function."""
        response = httpx.post(f"{self.base}/v1/agents/caller/invoke", json={"body": body, **event}, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["status"], response.json()["body"]

    def close(self) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def model():
    scripted = ScriptedModel()
    with scripted.serve() as url:
        scripted.url = url
        yield scripted


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    running = Server(tmp_path_factory.mktemp("codesandbox"), model.url)
    yield running
    running.close()


def tool_results(server, model, agent: str, script: list) -> tuple[dict, list]:
    """Invoke `agent` with the model following `script`; its answer and the tool results of the turn."""
    model.set_script(script)
    answer = httpx.post(f"{server.base}/v1/agents/{agent}/invoke", json={"message": "go"}, timeout=120)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return body, [p["function_response"]["response"] for e in body["events"] for p in e["content"]["parts"]
                  if "function_response" in p]


def test_the_model_calls_the_code_tool_and_gets_the_output(server, model):
    body, results = tool_results(server, model, "coder", [
        tool_step("run_code", code="import math\nprint(math.factorial(20))"), Step(content="20! is 2432902008176640000.")])
    assert body["output"] == "20! is 2432902008176640000."
    assert results[0]["exit_code"] == 0 and results[0]["stdout"] == "2432902008176640000\n", results


def test_an_adk_agent_calls_the_code_tool(server, model):
    _, results = tool_results(server, model, "adkcoder", [
        tool_step("run_code", code="print(sum(range(101)))"), Step(content="5050")])
    assert results[0]["stdout"] == "5050\n" and results[0]["exit_code"] == 0, results


def test_an_adk_code_executor_runs_the_models_code_blocks_in_the_sandbox(server, model):
    model.set_script([Step(content="Let me compute.\n```python\nimport os, math\nprint(math.factorial(20), "
                                   "'CAI_PROJECT_KEY' in os.environ)\n"
                                   "open(os.path.join(os.environ['OUTPUT_DIR'], 'f.txt'), 'w').write('x')\n```"),
                      Step(content="20! is 2432902008176640000.")])
    answer = httpx.post(f"{server.base}/v1/agents/adkexec/invoke", json={"message": "what is 20!?"}, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"].endswith("20! is 2432902008176640000."), answer.json()
    # The model's next request carries the sandbox's output (no agent key in the snippet's environment); the
    # file it wrote became an artifact of the turn (ADK names it in the result it shows the model).
    seen = json.dumps(model.requests[-1].body["messages"])
    assert "2432902008176640000 False" in seen and "Saved artifacts:" in seen and "`f.txt`" in seen, seen


def test_with_tool_sandbox_set_the_agents_own_tool_runs_in_a_sandbox(server, model):
    _, results = tool_results(server, model, "toolie", [tool_step("where", city="Paris"), Step(content="done")])
    assert results == [{"result": "Paris from the tool sandbox, CHOICE=blue"}], results
    _, results = tool_results(server, model, "adkcoder", [tool_step("where", city="Rome"), Step(content="done")])
    assert results == [{"result": "Rome from the tool sandbox"}], results


def test_a_tool_call_out_of_range_timeout_is_400(server):
    status, body = server.run({"module_path": "main.py", "function": "handle", "timeout_s": 121}, route="tool-calls")
    assert (status, body["error"]) == (400, "timeout_s must be between 1 and 120")


def test_the_tool_call_limits(server):
    def call(function: str, timeout_s: int = 30, **args) -> dict:
        status, body = server.run({"module_path": "main.py", "function": function, "args": args,
                                   "timeout_s": timeout_s}, route="tool-calls")
        assert status == 200, body
        return body

    assert call("big", size=10)["result"] == "x" * 10
    slow = call("sleepy", timeout_s=1, seconds=30)
    assert slow["killed"] == "timeout" and slow["message"] == "the tool call was killed: it ran longer than timeout_s (1 s)"
    assert "capped at 8 MiB" in call("big", size=8 * 1024 * 1024)["message"]
    assert call("big", size=7 * 1024 * 1024)["result"] == "x" * (7 * 1024 * 1024)
    assert call("hog")["killed"] == "memory"
    status, body = server.run({"module_path": "main.py", "function": "big", "args": {"size": "y" * 1024 * 1024}},
                              route="tool-calls")
    assert status == 413, body


def test_a_snippet_answers_output_files_and_languages(server):
    status, body = server.run({"code": "import os\nprint(open('data.txt').read().upper())\n"
                                       "open(os.path.join(os.environ['OUTPUT_DIR'], 'out.txt'), 'w').write('done')\n"
                                       "raise SystemExit(3)",
                               "files": [{"path": "data.txt", "content": "hello"}]})
    assert status == 200, body
    assert body["exit_code"] == 3 and body["stdout"] == "HELLO\n" and body["killed"] is None
    assert body["files"] == [{"path": "out.txt", "size": 4, "content_base64": "ZG9uZQ=="}]
    assert body["duration_ms"] >= 0 and body["timeout_s"] == 20
    status, body = server.run({"code": "print('x' * 3_000_000)"})
    assert status == 200 and body["stdout_truncated"] is True and len(body["stdout"]) == 1024 * 1024
    status, body = server.run({"code": "echo from shell >&2", "language": "shell"})
    assert status == 200 and body["stderr"] == "from shell\n", body
    status, body = server.run({"code": "console.log(6 * 7)", "language": "nodejs"})
    assert status == 200 and body["stdout"] == "42\n", body


@pytest.mark.parametrize("timeout_s", [0, 61, -1, "20", 2.5, True])
def test_an_out_of_range_timeout_is_400(server, timeout_s):
    status, body = server.run({"code": "print(1)", "timeout_s": timeout_s})
    assert (status, body["error"]) == (400, "timeout_s must be between 1 and 60")


def test_a_snippet_that_loops_forever_is_stopped_at_timeout_s(server):
    status, body = server.run({"code": "print('started', flush=True)\nwhile True:\n    pass", "timeout_s": 2})
    assert status == 200, body
    assert body["killed"] == "timeout" and body["stdout"] == "started\n"
    assert body["message"] == "the snippet was killed: it ran longer than timeout_s (2 s)"
    assert 2000 <= body["duration_ms"] < 6000


def rlimited(server) -> bool:
    """Whether the server's sandboxes are bounded by rlimits (a server that could not make cgroups): an
    allocation then fails at the limit (the snippet's runtime ends with its error) instead of a kernel kill."""
    return "limits by rlimits" in server.http.get("/healthz").json()["sandbox"]["detail"]


def test_a_memory_hog_is_stopped_at_512_mib(server):
    status, body = server.run({"code": "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n"
                                       "    print(len(blocks) * 16, flush=True)"})
    assert status == 200, body
    assert body["killed"] == "memory", body
    if rlimited(server):
        assert body["exit_code"] == 1 and "MemoryError" in body["stderr"], body
    else:
        assert body["exit_code"] == -9, body
    assert "memory limit (512Mi)" in body["message"]
    reached = int(body["stdout"].split()[-1])
    assert 256 <= reached <= 512  # MiB it held before the kernel stopped it at the limit


def test_four_snippets_with_a_pool_of_three_make_the_fourth_wait_then_503(server):
    def run(seconds: float) -> tuple[int, dict]:
        return server.run({"code": f"import time\ntime.sleep({seconds})", "timeout_s": 10})

    poll_warm(server)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        started = time.monotonic()
        answers = list(pool.map(run, [1.5] * 4))
        elapsed = time.monotonic() - started
    assert all(status == 200 and body["exit_code"] == 0 for status, body in answers), answers
    waited = sorted(body["waited_ms"] for _, body in answers)
    assert waited[-1] >= 1000 and waited[0] < 1000, waited  # the fourth waited for a sandbox to come free
    assert elapsed >= 3

    poll_warm(server)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        busy = [pool.submit(run, WAIT_SECONDS + 2) for _ in range(3)]
        poll_running(server, 3)  # every sandbox of the pool is taken
        started = time.monotonic()
        status, body = run(1)
        refused_after = time.monotonic() - started
        assert all(f.result()[0] == 200 for f in busy)
    assert (status, body["error"]) == (503, NO_WARM_SANDBOX)
    assert WAIT_SECONDS - 0.5 <= refused_after < WAIT_SECONDS + 3
    health = server.http.get("/healthz").json()["sandbox"]["code_pool"]
    assert health["size"] == 3 and health["refused"] >= 1 and health["network"] == "none"


def poll_running(server, count: int) -> None:
    deadline = time.monotonic() + 30
    while server.http.get("/healthz").json()["sandbox"]["code_pool"]["running"] < count:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def poll_warm(server, count: int = 3) -> None:
    deadline = time.monotonic() + 30
    while server.http.get("/healthz").json()["sandbox"]["code_pool"]["warm"] < count:
        assert time.monotonic() < deadline
        time.sleep(0.1)


ISOLATION_PROBE = r'''
import glob, os, socket
found = []
key = "{KEY}"
if any(key in v for v in os.environ.values()):
    found.append("own env")
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    try:
        if key.encode() in open(path, "rb").read():
            found.append(path)
    except OSError:
        pass
for path in ["{CODE_DIR}/main.py", "DATA/platform.db", "DATA/session.key", "DATA"]:
    if os.path.exists(path):
        found.append(path)
for path in glob.glob("/tmp/**", recursive=True):
    if "left-by-the-first" in path:
        found.append(path)
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2)
    found.append("the platform's port")
except OSError:
    pass
open("/tmp/left-by-the-first-snippet", "w").write("x")
print("found:", found)
'''


def test_a_snippet_cannot_read_the_agents_environment_or_files_the_platforms_or_another_snippets(server):
    probe = ISOLATION_PROBE.replace("DATA", str(server.data_dir)).replace("PORT", str(server.server.port))
    for _ in range(2):  # the second finds nothing the first left
        poll_warm(server, 1)  # the pool-exhaustion test before may have left none warm yet (its wait is short)
        status, body = server.run({"code": probe})
        assert status == 200 and body["exit_code"] == 0, body
        assert body["stdout"] == "found: []\n", body


def test_only_the_projects_own_workload_credential_is_accepted(server):
    status, body = server.run({"code": "print(1)"}, auth=False)
    assert status == 401
    status, body = server.run({"code": "print(1)"}, project=str(uuid.uuid4()))
    assert (status, body["error"]) == (404, "not found")
    # A person's (here the automation) credential is refused, whatever the project.
    refused = server.http.post(f"/v1/projects/{server.caller['project_id']}/sandbox/execute", json={"code": "print(1)"})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == "the code sandbox only accepts an agent's workload credential (CAI_PROJECT_KEY)"


def test_the_route_and_its_schema_are_in_openapi(server):
    spec = httpx.get(f"{server.base}/openapi.json").json()
    operation = spec["paths"]["/v1/projects/{project_id}/sandbox/execute"]["post"]
    request = operation["requestBody"]["content"]["application/json"]["schema"]
    assert {"code", "language", "timeout_s", "files"} <= set(request["properties"])
    assert "200" in operation["responses"] and "503" in operation["responses"]
