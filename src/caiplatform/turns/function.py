"""`framework=function`, Python: `main.py` defines `handle(event, context)`, sync or async.

`event` is the JSON request body (for a chat-style invoke, `{message, session_id, user_id}` plus
whatever else the caller sent). The return value must be JSON-serialisable; it is kept as
`TurnResult.value` (what a function's invoke answers) and rendered as the turn's `output` (a string
as is, anything else as JSON). A handler may also return a (sync or async) iterator of strings: each
item is one `output` delta.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from caiplatform.turns.base import StreamLine, TurnContext, TurnError, TurnRunner
from caiplatform.turns.loader import load_entry


@dataclass
class FunctionContext:
    """The `context` argument of `handle`."""

    agent: str
    session_id: str
    user_id: str
    invocation_id: str
    history: list[dict[str, Any]] = field(default_factory=list)


def render(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TurnError(f"handle returned a value that is not JSON-serialisable: {exc}") from None


class FunctionRunner(TurnRunner):
    framework = "function"

    def __init__(self, handle: Callable[..., Any], **kwargs: Any):
        super().__init__(**kwargs)
        self.handle = handle

    @classmethod
    def from_dir(cls, code_dir: str | Path, **kwargs: Any) -> FunctionRunner:
        return cls(load_entry(code_dir, "function").handle, **kwargs)

    async def _turn(self, ctx: TurnContext) -> AsyncIterator[StreamLine]:
        event = ctx.body if ctx.body is not None else {
            "message": ctx.message, "session_id": ctx.session_id, "user_id": ctx.user_id}
        context = FunctionContext(self.agent, ctx.session_id, ctx.user_id, ctx.invocation_id, ctx.history)
        if inspect.iscoroutinefunction(self.handle) or inspect.isasyncgenfunction(self.handle):
            value = self.handle(event, context)
            if inspect.isawaitable(value):
                value = await value
        else:
            value = await anyio.to_thread.run_sync(self.handle, event, context)
        if hasattr(value, "__aiter__"):
            pieces: list[str] = []
            async for item in value:
                pieces.append(render(item))
                for line in ctx.output(pieces[-1]):
                    yield line
            ctx.value = "".join(pieces)
            return
        if inspect.isgenerator(value) or (hasattr(value, "__next__") and not isinstance(value, (str, bytes, dict, list))):
            pieces = []
            iterator = iter(value)
            sentinel = object()
            while (item := await anyio.to_thread.run_sync(next, iterator, sentinel)) is not sentinel:
                pieces.append(render(item))
                for line in ctx.output(pieces[-1]):
                    yield line
            ctx.value = "".join(pieces)
            return
        ctx.value = value
        text = render(value) if value is not None else ""
        for line in ctx.output(text):
            yield line
