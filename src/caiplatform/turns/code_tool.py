"""The code-execution tool: an agent runs the code its model writes in the platform's code sandbox.

Every revision gets `SANDBOX_URL` (the platform's `/v1/projects/<id>/sandbox`) and its workload key
`CAI_PROJECT_KEY`; an agent asks for the tool by adding it in its framework's own way:

    # LangGraph (graph.py)
    from caiplatform.turns.code_tool import code_tool
    graph = create_react_agent(chat_model(), [code_tool()])

    # ADK (agent.py): a tool, or a code executor for models that write ```python blocks
    from caiplatform.turns.code_tool import adk_code_executor, run_code
    root_agent = LlmAgent(..., tools=[run_code])             # or code_executor=adk_code_executor()

    # CrewAI (crew.py)
    from caiplatform.turns.code_tool import crewai_code_tool
    Agent(..., tools=[crewai_code_tool()])

The snippet runs in a fresh sandbox with no network, no view of the agent's files or environment,
1 CPU and 512 MiB (docs/codesandbox.md).
"""

from __future__ import annotations

from typing import Any

import httpx

from caiplatform.turns.models import current_env

TOOL_NAME = "run_code"
TOOL_DESCRIPTION = (
    "Run a code snippet in a fresh, isolated sandbox and get its stdout, stderr and exit code. "
    "language: python (default), shell or nodejs. Files written to $OUTPUT_DIR are returned. "
    "timeout_s: 1 to 60 seconds (default 20). The sandbox has no network and 512 MiB of memory."
)
HTTP_SLACK_SECONDS = 40.0  # past timeout_s: the wait for a warm sandbox (30 s) and the platform's own grace


class CodeSandboxUnavailable(RuntimeError):
    """The agent has no code sandbox (no `SANDBOX_URL` or no workload key in its environment)."""


def _endpoint() -> tuple[str, dict[str, str]]:
    env = current_env()
    url, key = env.get("SANDBOX_URL"), env.get("CAI_PROJECT_KEY")
    if not url or not key:
        missing = "SANDBOX_URL" if not url else "CAI_PROJECT_KEY"
        raise CodeSandboxUnavailable(f"the code sandbox is not available to this agent: {missing} is not set")
    return url.rstrip("/") + "/execute", {"Authorization": f"Bearer {key}"}


def _body(code: str, language: str, timeout_s: int | None, files: dict[str, str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "language": language}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if files:
        body["files"] = [{"path": path, "content": content} for path, content in files.items()]
    return body


def for_model(response: httpx.Response) -> dict[str, Any]:
    """What the model sees: the result without file contents, or the platform's error."""
    try:
        data = response.json()
    except ValueError:
        data = {"error": response.text[:1000]}
    if response.status_code != 200:
        return {"error": data.get("error", f"status {response.status_code}"), "status": response.status_code}
    data["files"] = [{"path": f["path"], "size": f["size"]} for f in data.get("files") or []]
    return data


def run_code(code: str, language: str = "python", timeout_s: int | None = None,
             files: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a code snippet in a fresh, isolated sandbox; answers stdout, stderr, exit_code and killed.

    Args:
        code: the snippet to run.
        language: python (default), shell or nodejs.
        timeout_s: seconds it may run, 1 to 60 (default 20).
        files: input files (relative path -> text content) written next to the snippet.
    """
    return for_model(_post(code, language, timeout_s, files))


def _post(code: str, language: str = "python", timeout_s: int | None = None,
          files: dict[str, str] | None = None) -> httpx.Response:
    url, headers = _endpoint()
    return httpx.post(url, json=_body(code, language, timeout_s, files), headers=headers,
                      timeout=(timeout_s or 60) + HTTP_SLACK_SECONDS)


async def arun_code(code: str, language: str = "python", timeout_s: int | None = None,
                    files: dict[str, str] | None = None) -> dict[str, Any]:
    """`run_code` for an event loop."""
    url, headers = _endpoint()
    async with httpx.AsyncClient(timeout=(timeout_s or 60) + HTTP_SLACK_SECONDS) as client:
        response = await client.post(url, json=_body(code, language, timeout_s, files), headers=headers)
    return for_model(response)


def code_tool() -> Any:
    """The code-execution tool for LangGraph / LangChain (a `StructuredTool` named `run_code`)."""
    from langchain_core.tools import StructuredTool

    return StructuredTool.from_function(func=run_code, coroutine=arun_code, name=TOOL_NAME,
                                        description=TOOL_DESCRIPTION)


def crewai_code_tool() -> Any:
    """The code-execution tool for CrewAI (a `BaseTool` named `run_code`)."""
    from crewai.tools import BaseTool

    class RunCode(BaseTool):  # type: ignore[misc]
        name: str = TOOL_NAME
        description: str = TOOL_DESCRIPTION

        def _run(self, code: str, language: str = "python", timeout_s: int | None = None) -> str:
            import json

            return json.dumps(run_code(code, language, timeout_s))

    return RunCode()


def adk_code_executor() -> Any:
    """An ADK code executor that runs the model's code blocks in the code sandbox (`code_executor=`)."""
    import mimetypes

    from google.adk.code_executors import BaseCodeExecutor
    from google.adk.code_executors.code_execution_utils import CodeExecutionResult, File

    class SandboxCodeExecutor(BaseCodeExecutor):  # type: ignore[misc]
        """Each code block the model writes runs in a fresh sandbox of the platform's code sandbox; the files
        it writes to $OUTPUT_DIR become the turn's artifacts."""

        def execute_code(self, invocation_context: Any, code_execution_input: Any) -> Any:
            response = _post(code_execution_input.code, timeout_s=self.timeout_seconds)
            result = for_model(response)
            if "error" in result:
                return CodeExecutionResult(stdout="", stderr=str(result["error"]))
            stderr = result.get("stderr", "")
            if result.get("message"):
                stderr = f"{stderr}\n{result['message']}".strip()
            written = [File(name=f["path"], content=f["content_base64"],
                            mime_type=mimetypes.guess_type(f["path"])[0] or "application/octet-stream")
                       for f in response.json().get("files") or []]
            return CodeExecutionResult(stdout=result.get("stdout", ""), stderr=stderr, output_files=written)

    return SandboxCodeExecutor()
