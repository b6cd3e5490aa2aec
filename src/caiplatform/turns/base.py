"""The one interface of every framework's turn runner, and the bookkeeping they share.

A runner implements `_turn(ctx)`, an async generator that reports what happens through the
`TurnContext` (`ctx.thinking(text)`, `ctx.output(text)`, `ctx.tool_call(...)`, `ctx.tool_result(...)`),
each of which returns the stream lines to yield. The base class derives everything else from those
calls, so the buffered answer and the stream can never disagree:

- `stream()` yields the lines, closes open blocks with `block_end`, and ends with `done` (or `error`).
- `run()` drives the same generator and joins the deltas: `output` is the concatenation of the
  `output` deltas, `reasoning` of the `thinking` deltas, `tool_calls` one entry per `tool_call` line.
- `events` are transcript events in the spec's shape, built from the same calls: the user's message,
  then one model event per model response (thought part, text part, `function_call` parts) and one
  event per tool result (`function_response`).

Stream lines carry `seq` (a counter over the lines that have one: `thinking`, `output`, `block_end`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from caiplatform.clock import Clock
from caiplatform.ports.sessions import new_event

StreamLine = dict[str, Any]

SUMMARY_ARGS_CHARS = 500


class TurnError(Exception):
    """The turn failed; the message is what the `error` line and the 502 carry."""


def summary(args: Any) -> str:
    """`called with args={...}` with the arguments as compact JSON (cut when long)."""
    try:
        text = json.dumps(args if args is not None else {}, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(args)
    if len(text) > SUMMARY_ARGS_CHARS:
        text = text[: SUMMARY_ARGS_CHARS - 3] + "..."
    return f"called with args={text}"


def jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [jsonable(v) for v in value]
        return str(value)


@dataclass
class TurnResult:
    output: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    session_id: str = ""
    user_id: str = ""
    value: Any = None  # functions: the handler's own return value

    def to_dict(self) -> dict[str, Any]:
        """The invoke response body."""
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "output": self.output,
            "reasoning": self.reasoning,
            "tool_calls": list(self.tool_calls),
            "events": list(self.events),
        }


class TurnContext:
    """Everything a runner reports during one turn; turns reports into stream lines and events."""

    def __init__(self, *, agent: str, message: str, session_id: str, user_id: str,
                 history: Sequence[dict[str, Any]], clock: Clock | None = None,
                 body: dict[str, Any] | None = None, record_user: bool = True):
        self.agent = agent
        self.message = message
        self.session_id = session_id
        self.user_id = user_id
        self.history = list(history)
        self.body = body
        self.clock = clock or Clock()
        self.invocation_id = f"e-{uuid.uuid4()}"
        self.events: list[dict[str, Any]] = []
        self.seq = 0
        self.block: str | None = None  # "thinking" or "output" while a block is open
        self.output_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.value: Any = None
        self._model_parts: list[dict[str, Any]] = []
        self.replaced_events: list[dict[str, Any]] | None = None
        # Text the model reads before the user's message (recalled memories); `message` then holds both.
        self.preamble = ""
        if record_user:
            self.events.append(self._event("user", [{"text": message}]))

    # -- events ----------------------------------------------------------------------------------
    def _event(self, author: str, parts: list[dict[str, Any]], role: str | None = None) -> dict[str, Any]:
        return new_event(author, parts, invocation_id=self.invocation_id, timestamp=self.clock.now(), role=role)

    def _part(self, key: str, text: str) -> None:
        thought = key == "thinking"
        last = self._model_parts[-1] if self._model_parts else None
        if last is not None and "text" in last and bool(last.get("thought")) == thought:
            last["text"] += text
        else:
            self._model_parts.append({"text": text, "thought": True} if thought else {"text": text})

    def flush_model_event(self) -> None:
        if self._model_parts:
            self.events.append(self._event(self.agent, self._model_parts))
            self._model_parts = []

    # -- lines -----------------------------------------------------------------------------------
    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def close_block(self) -> list[StreamLine]:
        if self.block is None:
            return []
        kind, self.block = self.block, None
        return [{"type": "block_end", "seq": self._next(), "kind": kind}]

    def _delta(self, kind: str, text: str) -> list[StreamLine]:
        if not text:
            return []
        lines = self.close_block() if self.block not in (None, kind) else []
        self.block = kind
        (self.reasoning_parts if kind == "thinking" else self.output_parts).append(text)
        self._part(kind, text)
        lines.append({"type": kind, "seq": self._next(), "text": text})
        return lines

    def thinking(self, text: str) -> list[StreamLine]:
        return self._delta("thinking", text)

    def output(self, text: str) -> list[StreamLine]:
        return self._delta("output", text)

    def tool_call(self, name: str, args: Any, call_id: str | None = None) -> list[StreamLine]:
        lines = self.close_block()
        args = jsonable(args if args is not None else {})
        self.tool_calls.append({"name": name, "summary": summary(args)})
        call: dict[str, Any] = {"name": name, "args": args}
        if call_id:
            call["id"] = call_id
        self._model_parts.append({"function_call": call})
        lines.append({"type": "tool_call", "name": name, "args": args})
        return lines

    def tool_result(self, name: str, result: Any, call_id: str | None = None) -> list[StreamLine]:
        lines = self.close_block()
        self.flush_model_event()
        result = jsonable(result)
        response: dict[str, Any] = {"name": name, "response": result if isinstance(result, dict) else {"result": result}}
        if call_id:
            response["id"] = call_id
        self.events.append(self._event(self.agent, [{"function_response": response}], role="user"))
        lines.append({"type": "tool_result", "name": name, "result": result})
        return lines

    def finish(self) -> list[StreamLine]:
        lines = self.close_block()
        self.flush_model_event()
        return lines

    def result(self) -> TurnResult:
        return TurnResult(
            output="".join(self.output_parts),
            reasoning="".join(self.reasoning_parts),
            tool_calls=list(self.tool_calls),
            events=list(self.replaced_events if self.replaced_events is not None else self.events),
            session_id=self.session_id,
            user_id=self.user_id,
            value=self.value,
        )


def ran_out_of_memory(exc: BaseException) -> bool:
    """A MemoryError, or an error raised while handling one (frameworks wrap what a node raised)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, MemoryError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class TurnRunner:
    """Base of every framework runner. Subclasses implement `_turn`."""

    framework: ClassVar[str] = ""
    # True when the framework writes the transcript itself (ADK's session service); the conversation
    # layer then does not append the turn's events.
    persists_transcript: bool = False
    # An allocation of a turn failed (a MemoryError); under a memory rlimit that is the sandbox's limit,
    # and the harness ends the instance as the kernel ends a container (docs/decisions/sandbox.md).
    out_of_memory: bool = False
    # True when the runner keeps each session's framework state between turns (LangGraph's checkpointer
    # installed by the runner): the conversation layer then hands it the transcript only when that state
    # is not held (`holds_session`) or is behind the transcript, and calls `forget_session` first.
    keeps_session_state: bool = False

    def __init__(self, *, agent: str = "agent", clock: Clock | None = None):
        self.agent = agent
        self.clock = clock or Clock()

    def _context(self, message: str, session_id: str, user_id: str, history: Sequence[dict[str, Any]] | None,
                 body: dict[str, Any] | None) -> TurnContext:
        return TurnContext(agent=self.agent, message=message, session_id=session_id, user_id=user_id,
                           history=history or [], clock=self.clock, body=body)

    def _turn(self, ctx: TurnContext) -> AsyncIterator[StreamLine]:
        raise NotImplementedError

    async def _drive(self, ctx: TurnContext) -> AsyncIterator[StreamLine]:
        try:
            async for line in self._turn(ctx):
                yield line
        except TurnError as exc:
            for line in ctx.finish():
                yield line
            yield {"type": "error", "message": str(exc)}
            return
        except Exception as exc:  # the agent's own code failed
            self.out_of_memory = self.out_of_memory or ran_out_of_memory(exc)
            for line in ctx.finish():
                yield line
            yield {"type": "error", "message": f"{type(exc).__name__}: {exc}"}
            return
        for line in ctx.finish():
            yield line
        yield {"type": "done", "session_id": ctx.session_id, "user_id": ctx.user_id}

    async def stream(self, message: str, session_id: str, user_id: str, history: Sequence[dict[str, Any]] | None = None,
                     *, body: dict[str, Any] | None = None, context: TurnContext | None = None) -> AsyncIterator[StreamLine]:
        ctx = context or self._context(message, session_id, user_id, history, body)
        async for line in self._drive(ctx):
            yield line

    async def run(self, message: str, session_id: str, user_id: str, history: Sequence[dict[str, Any]] | None = None,
                  *, body: dict[str, Any] | None = None, context: TurnContext | None = None) -> TurnResult:
        ctx = context or self._context(message, session_id, user_id, history, body)
        async for line in self._drive(ctx):
            if line["type"] == "error":
                raise TurnError(line["message"])
        return ctx.result()

    def new_context(self, message: str, session_id: str, user_id: str, history: Sequence[dict[str, Any]] | None = None,
                    *, body: dict[str, Any] | None = None) -> TurnContext:
        """A context to pass to `run`/`stream` when the caller wants the turn's events afterwards."""
        return self._context(message, session_id, user_id, history, body)

    def holds_session(self, session_id: str) -> bool:
        """Whether the runner holds the session's framework state (only with `keeps_session_state`)."""
        return False

    def forget_session(self, session_id: str) -> None:
        """Drop the session's framework state; the next turn rebuilds it from the transcript."""
        return None

    async def aclose(self) -> None:
        return None
