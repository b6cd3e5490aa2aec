"""LangGraph: `graph.py` holds a compiled `graph` whose state is the messages state.

The turn sends `{"messages": [HumanMessage(message)]}` with `thread_id` = session id, so the graph's
checkpointer carries the conversation. A graph compiled without a checkpointer gets the runner's own
`SessionSaver` (`caiplatform.turns.session_saver`: the latest state of at most `CAI_LIVE_SESSIONS`
sessions, kept by reference, least recently used out); the conversation layer then hands the runner the
transcript only when that state is missing or behind the transcript (a fresh instance after scale to
zero, an evicted session, another replica that served a turn), so a turn's cost does not grow with the
session and a session continues anywhere. A graph compiled with its own checkpointer keeps it: the
transcript is read each turn and seeds the conversation when that checkpointer has nothing for it.

Streaming uses `stream_mode=["messages", "updates"]`: text and reasoning deltas come from the
`messages` stream (token-sized when the model streams, a whole message otherwise), tool calls and tool
results from the `updates` stream. Reasoning is read from `additional_kwargs["reasoning_content"]`
(see `caiplatform.turns.models.chat_model`) and from `reasoning`/`thinking` content blocks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from caiplatform.turns import telemetry
from caiplatform.turns.base import StreamLine, TurnContext, TurnRunner
from caiplatform.turns.loader import load_entry

try:
    from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    _IMPORT_ERROR: ModuleNotFoundError | None = exc
else:
    _IMPORT_ERROR = None


def _require() -> None:
    if _IMPORT_ERROR is not None:
        raise ModuleNotFoundError(
            f"the langgraph runner needs {_IMPORT_ERROR.name!r}; install it with: pip install 'caiplatform[agents]' "
            "(langgraph, langchain-openai)"
        ) from _IMPORT_ERROR


def _text_and_reasoning(message: Any) -> tuple[str, str]:
    content = getattr(message, "content", "")
    texts: list[str] = []
    thoughts: list[str] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                texts.append(block)
            elif isinstance(block, dict):
                kind = block.get("type")
                if kind == "text":
                    texts.append(str(block.get("text", "")))
                elif kind in ("reasoning", "thinking", "reasoning_content"):
                    thoughts.append(str(block.get("reasoning") or block.get("thinking") or block.get("text") or ""))
    extra = (getattr(message, "additional_kwargs", None) or {}).get("reasoning_content")
    if isinstance(extra, str):
        thoughts.insert(0, extra)
    return "".join(texts), "".join(thoughts)


def _tool_result(message: Any) -> Any:
    content = message.content
    if isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


def history_messages(events: Sequence[dict[str, Any]]) -> list[Any]:
    """Transcript events back into LangChain messages."""
    _require()
    out: list[Any] = []
    for event in events:
        parts = (event.get("content") or {}).get("parts") or []
        if event.get("author") == "user":
            text = "".join(p.get("text", "") for p in parts if "text" in p and not p.get("thought"))
            out.append(HumanMessage(text))
            continue
        text = "".join(p.get("text", "") for p in parts if "text" in p and not p.get("thought"))
        calls = [p["function_call"] for p in parts if "function_call" in p]
        responses = [p["function_response"] for p in parts if "function_response" in p]
        if text or calls:
            out.append(AIMessage(text, tool_calls=[
                {"name": c.get("name", ""), "args": c.get("args") or {}, "id": c.get("id") or f"call_{i}", "type": "tool_call"}
                for i, c in enumerate(calls)
            ]))
        for i, r in enumerate(responses):
            response = r.get("response")
            if isinstance(response, dict) and set(response) == {"result"}:
                response = response["result"]
            out.append(ToolMessage(response if isinstance(response, str) else json.dumps(response),
                                   tool_call_id=r.get("id") or f"call_{i}", name=r.get("name")))
    return out


class LangGraphRunner(TurnRunner):
    framework = "langgraph"

    def __init__(self, graph: Any, *, live_sessions: int | None = None, **kwargs: Any):
        _require()
        super().__init__(**kwargs)
        self.saver: Any = None
        if getattr(graph, "checkpointer", None) in (None, False):
            from caiplatform.turns.session_saver import SessionSaver, max_live_sessions

            self.saver = SessionSaver(live_sessions or max_live_sessions())
            graph.checkpointer = self.saver
            self.keeps_session_state = True
        self.graph = graph

    def holds_session(self, session_id: str) -> bool:
        return self.saver is not None and self.saver.holds(session_id)

    def forget_session(self, session_id: str) -> None:
        if self.saver is not None:
            self.saver.delete_thread(session_id)

    @classmethod
    def from_dir(cls, code_dir: str | Path, **kwargs: Any) -> LangGraphRunner:
        _require()
        return cls(load_entry(code_dir, "langgraph").graph, **kwargs)

    async def _turn(self, ctx: TurnContext) -> AsyncIterator[StreamLine]:
        config: dict[str, Any] = {"configurable": {"thread_id": ctx.session_id, "user_id": ctx.user_id}}
        callbacks = telemetry.langchain_callbacks()  # model and tool spans while tracing is on
        if callbacks:
            config["callbacks"] = callbacks
        messages: list[Any] = [HumanMessage(ctx.message)]
        if ctx.history:
            state = await self.graph.aget_state(config)
            if not (state.values or {}).get("messages"):
                messages = history_messages(ctx.history) + messages
        streamed: set[str] = set()  # ids of AI messages whose text came through the messages stream
        async for mode, payload in self.graph.astream({"messages": messages}, config, stream_mode=["messages", "updates"]):
            if mode == "messages":
                message, _meta = payload
                if not isinstance(message, (AIMessageChunk, AIMessage)):
                    continue
                text, reasoning = _text_and_reasoning(message)
                if (text or reasoning) and message.id:
                    streamed.add(message.id)
                for line in ctx.thinking(reasoning):
                    yield line
                for line in ctx.output(text):
                    yield line
                continue
            for _node, update in (payload or {}).items():
                if not isinstance(update, dict):
                    continue
                new = update.get("messages") or []
                if isinstance(new, BaseMessage):
                    new = [new]
                for message in new:
                    if isinstance(message, AIMessage):
                        if message.id not in streamed:
                            text, reasoning = _text_and_reasoning(message)
                            for line in ctx.thinking(reasoning):
                                yield line
                            for line in ctx.output(text):
                                yield line
                        for call in message.tool_calls or []:
                            for line in ctx.tool_call(call["name"], call.get("args") or {}, call.get("id")):
                                yield line
                        ctx.flush_model_event()
                    elif isinstance(message, ToolMessage):
                        for line in ctx.tool_result(message.name or "", _tool_result(message), message.tool_call_id):
                            yield line
