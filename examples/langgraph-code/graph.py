"""A LangGraph agent that runs the Python its model writes in the platform's code sandbox.

`code_tool()` is the `run_code` tool: each call runs one snippet in a fresh sandbox (no network, no view of
this agent's files or environment, 1 CPU, 512 MiB) and answers stdout, stderr, the exit code and, when the
snippet was stopped, why (docs/codesandbox.md).
"""

from langgraph.prebuilt import create_react_agent

from caiplatform.turns.code_tool import code_tool
from caiplatform.turns.models import chat_model

graph = create_react_agent(
    chat_model(),
    [code_tool()],
    prompt="When a question needs computing, write Python and run it with run_code; answer from its output.",
)
