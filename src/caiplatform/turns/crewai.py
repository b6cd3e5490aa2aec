"""CrewAI: `crew.py` holds a module-level `crew` (a `Crew`, or a zero-argument function returning one).

Each turn kicks off a fresh crew (the factory's result, or a copy of the module-level crew) with inputs
`{message}` and `{history}` (the prior conversation as `user: ...` / `<agent>: ...` lines) in a worker
thread, and turns CrewAI's event bus into stream lines:

- `LLMStreamChunkEvent` text chunks of the crew's last task are `output` deltas (token-sized when the
  LLM streams); chunks of earlier tasks are that task's work and go out as `thinking`;
  `LLMThinkingChunkEvent` chunks (models whose provider surfaces reasoning) are `thinking` too.
- `ToolUsageStartedEvent` / `ToolUsageFinishedEvent` are `tool_call` / `tool_result`.
- When nothing of the last task streamed, the crew's final `raw` answer is the single `output` delta.

CrewAI delivers tool events from a thread pool but stream chunks synchronously; at the first chunk of
each new LLM response the handler flushes the bus, so tool lines always precede the answer they led to.
Events are routed to the right turn by task id, so concurrent turns on one instance do not mix.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from caiplatform.turns.base import StreamLine, TurnContext, TurnRunner
from caiplatform.turns.loader import load_entry

try:
    from crewai import Crew
    from crewai.events import (
        LLMStreamChunkEvent,
        ToolUsageErrorEvent,
        ToolUsageFinishedEvent,
        ToolUsageStartedEvent,
        crewai_event_bus,
    )
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    _IMPORT_ERROR: ModuleNotFoundError | None = exc
else:
    _IMPORT_ERROR = None

try:  # not in every CrewAI version
    from crewai.events import LLMThinkingChunkEvent
except Exception:  # pragma: no cover
    LLMThinkingChunkEvent = None  # type: ignore[assignment,misc]


def _require() -> None:
    if _IMPORT_ERROR is not None:
        raise ModuleNotFoundError(
            f"the crewai runner needs {_IMPORT_ERROR.name!r}; install it with: pip install crewai "
            "(it pins pydantic<2.13 and mcp<2, so it lives in the agent's own environment, not the platform's)"
        ) from _IMPORT_ERROR


# The turn whose crew runs in this thread (asyncio.to_thread copies the context into the worker).
_current_sink: contextvars.ContextVar[_TurnSink | None] = contextvars.ContextVar("cai_crewai_sink", default=None)


class _ReasoningCompletions:
    """Wraps `client.chat.completions` to pass `reasoning_content` to the running turn as thinking."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def create(self, *args: Any, **kwargs: Any) -> Any:
        sink = _current_sink.get()
        if sink is not None:
            crewai_event_bus.flush(timeout=5)  # the previous step's tool events reach the turn first
        result = self._inner.create(*args, **kwargs)
        if sink is None:
            return result
        if not kwargs.get("stream"):
            for choice in getattr(result, "choices", None) or []:
                text = (getattr(choice.message, "model_extra", None) or {}).get("reasoning_content")
                if text:
                    sink.put(("thinking", text))
            return result
        return _ReasoningStream(result, sink)


class _ReasoningStream:
    def __init__(self, inner: Any, sink: _TurnSink):
        self._inner = inner
        self._sink = sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __iter__(self):
        for chunk in self._inner:
            for choice in getattr(chunk, "choices", None) or []:
                text = (getattr(choice.delta, "model_extra", None) or {}).get("reasoning_content")
                if text:
                    self._sink.put(("thinking", text))
            yield chunk

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        close = getattr(self._inner, "close", None)
        if close:
            close()


class _ReasoningChat:
    def __init__(self, inner: Any):
        self._inner = inner
        self.completions = _ReasoningCompletions(inner.completions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ReasoningClient:
    def __init__(self, inner: Any):
        self._inner = inner
        self.chat = _ReasoningChat(inner.chat)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def surface_reasoning(llm: Any) -> Any:
    """Make a CrewAI OpenAI-provider LLM report `reasoning_content` (DeepSeek / vLLM style) as thinking.

    CrewAI's OpenAI provider drops that field; this wraps the LLM's OpenAI client so a running turn sees
    it, in order with the answer's chunks. LLMs of other providers are returned unchanged.
    """
    get_client = getattr(llm, "_get_sync_client", None)
    if get_client is None or not hasattr(llm, "_client"):
        return llm
    client = get_client()
    if not isinstance(client, _ReasoningClient):
        llm._client = _ReasoningClient(client)
    return llm


def history_text(events: Sequence[dict[str, Any]], agent: str) -> str:
    lines = []
    for event in events:
        text = "".join(p.get("text", "") for p in (event.get("content") or {}).get("parts") or []
                       if isinstance(p, dict) and "text" in p and not p.get("thought"))
        if text:
            lines.append(f"{'user' if event.get('author') == 'user' else agent}: {text}")
    return "\n".join(lines)


class _Router:
    """One set of event-bus handlers per process; events go to the turn that owns their task id."""

    _instance: _Router | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.turns: dict[str, _TurnSink] = {}
        crewai_event_bus.on(LLMStreamChunkEvent)(self._chunk)
        crewai_event_bus.on(ToolUsageStartedEvent)(self._tool_started)
        crewai_event_bus.on(ToolUsageFinishedEvent)(self._tool_finished)
        crewai_event_bus.on(ToolUsageErrorEvent)(self._tool_error)
        if LLMThinkingChunkEvent is not None:
            crewai_event_bus.on(LLMThinkingChunkEvent)(self._thinking)

    @classmethod
    def get(cls) -> _Router:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _sink(self, event: Any) -> _TurnSink | None:
        task_id = getattr(event, "task_id", None)
        return self.turns.get(str(task_id)) if task_id else None

    def _chunk(self, source: Any, event: Any) -> None:
        sink = self._sink(event)
        if sink is None or getattr(event, "call_type", None) is not None and "TOOL" in str(event.call_type):
            return
        response = getattr(event, "response_id", None) or getattr(event, "call_id", None)
        if response != sink.response:
            sink.response = response
            crewai_event_bus.flush(timeout=5)  # tool events of the previous step first
        kind = "output" if str(event.task_id) == sink.last_task else "thinking"
        sink.put((kind, event.chunk))

    def _thinking(self, source: Any, event: Any) -> None:
        sink = self._sink(event)
        if sink is not None:
            sink.put(("thinking", event.chunk))

    def _tool_started(self, source: Any, event: Any) -> None:
        sink = self._sink(event)
        if sink is not None:
            args = event.tool_args
            if isinstance(args, str):
                import json

                try:
                    args = json.loads(args)
                except ValueError:
                    args = {"input": args}
            sink.put(("tool_call", (event.tool_name, args)))

    def _tool_finished(self, source: Any, event: Any) -> None:
        sink = self._sink(event)
        if sink is not None:
            sink.put(("tool_result", (event.tool_name, event.output)))

    def _tool_error(self, source: Any, event: Any) -> None:
        sink = self._sink(event)
        if sink is not None:
            sink.put(("tool_result", (event.tool_name, {"error": str(getattr(event, "error", ""))})))


class _TurnSink:
    def __init__(self, loop: asyncio.AbstractEventLoop, last_task: str):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.last_task = last_task
        self.response: Any = None

    def put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class CrewAIRunner(TurnRunner):
    framework = "crewai"

    def __init__(self, crew: Any, **kwargs: Any):
        _require()
        super().__init__(**kwargs)
        self.crew = crew
        # Called on each turn's fresh crew before it runs (`TOOL_SANDBOX`: its tools go to the tool sandbox).
        self.prepare_crew: Callable[[Any], object] | None = None

    @classmethod
    def from_dir(cls, code_dir: str | Path, **kwargs: Any) -> CrewAIRunner:
        _require()
        return cls(load_entry(code_dir, "crewai").crew, **kwargs)

    def fresh_crew(self) -> Any:
        """The crew of one turn: the factory's result, or a copy of the module-level crew."""
        if isinstance(self.crew, Crew):
            crew = self.crew.copy()
        elif callable(self.crew):
            crew = self.crew()
            if not isinstance(crew, Crew):
                raise TypeError("crew() must return a crewai.Crew")
        else:
            raise TypeError("`crew` must be a crewai.Crew or a zero-argument function returning one")
        if self.prepare_crew is not None:
            self.prepare_crew(crew)
        return crew

    async def _turn(self, ctx: TurnContext) -> AsyncIterator[StreamLine]:
        router = _Router.get()
        crew = self.fresh_crew()
        task_ids = [str(t.id) for t in crew.tasks]
        sink = _TurnSink(asyncio.get_running_loop(), task_ids[-1] if task_ids else "")
        for task_id in task_ids:
            router.turns[task_id] = sink
        inputs = {"message": ctx.message, "history": history_text(ctx.history, self.agent)}
        done = object()

        def kickoff() -> Any:
            _current_sink.set(sink)
            try:
                return crew.kickoff(inputs=inputs)
            finally:
                crewai_event_bus.flush(timeout=10)
                sink.put(("end", done))

        job = asyncio.ensure_future(asyncio.to_thread(kickoff))
        streamed_output = False
        try:
            while True:
                kind, value = await sink.queue.get()
                if kind == "end":
                    break
                if kind == "output":
                    streamed_output = streamed_output or bool(value)
                    lines = ctx.output(value)
                elif kind == "thinking":
                    lines = ctx.thinking(value)
                elif kind == "tool_call":
                    lines = ctx.tool_call(value[0], value[1])
                else:
                    lines = ctx.tool_result(value[0], value[1])
                for line in lines:
                    yield line
            result = await job
        finally:
            for task_id in task_ids:
                router.turns.pop(task_id, None)
        if not streamed_output:
            for line in ctx.output(str(getattr(result, "raw", result) or "")):
                yield line
