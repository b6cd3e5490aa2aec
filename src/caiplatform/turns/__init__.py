"""Turn runners: one interface over ADK, LangGraph, CrewAI and Python functions.

    runner = load_runner("langgraph", code_dir, agent="my-agent")
    result = await runner.run(message, session_id, user_id, history)      # TurnResult
    async for line in runner.stream(message, session_id, user_id, history):  # stream lines
        ...

`Conversation(runner, store)` adds the session store (history in, transcript out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from caiplatform.turns.base import StreamLine, TurnContext, TurnError, TurnResult, TurnRunner, summary
from caiplatform.turns.config import debug_config, open_session_store
from caiplatform.turns.conversation import Conversation

FRAMEWORKS = ("adk", "langgraph", "crewai", "function")

__all__ = [
    "FRAMEWORKS", "Conversation", "StreamLine", "TurnContext", "TurnError", "TurnResult", "TurnRunner",
    "debug_config", "load_runner", "open_session_store", "summary",
]


def load_runner(framework: str, code_dir: str | Path, *, sessions: Any = None, **kwargs: Any) -> TurnRunner:
    """Import the code directory's entry file and wrap it in its framework's runner.

    kwargs: `agent` (name, the transcript author), `clock`. `sessions` (a SessionStore) is the store ADK's
    session service writes to; give the same store to `Conversation`. Other frameworks ignore it.
    """
    if framework == "function":
        from caiplatform.turns.function import FunctionRunner

        return FunctionRunner.from_dir(code_dir, **kwargs)
    if framework == "langgraph":
        from caiplatform.turns.langgraph import LangGraphRunner

        return LangGraphRunner.from_dir(code_dir, **kwargs)
    if framework == "adk":
        from caiplatform.turns.adk import AdkRunner

        return AdkRunner.from_dir(code_dir, sessions=sessions, **kwargs)
    if framework == "crewai":
        from caiplatform.turns.crewai import CrewAIRunner

        return CrewAIRunner.from_dir(code_dir, **kwargs)
    raise TurnError(f"unsupported framework: {framework} (supported: {', '.join(FRAMEWORKS)})")
