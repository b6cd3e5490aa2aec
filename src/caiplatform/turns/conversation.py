"""A runner plus a session store: what the harness server calls for each invoke.

`Conversation.invoke()` / `.stream()` take already-resolved ids (see
`caiplatform.services.invoke_ids`), read the session's transcript as the turn's history, run the turn,
and append the turn's transcript events to the store (unless the framework writes them itself, as ADK
does through its session service). A failed turn still records what happened before the failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from caiplatform.ports.sessions import SessionStore
from caiplatform.turns.base import StreamLine, TurnResult, TurnRunner


class Conversation:
    def __init__(self, runner: TurnRunner, store: SessionStore, *, agent: str | None = None):
        self.runner = runner
        self.store = store
        self.agent = agent or runner.agent

    async def _history(self, session_id: str, user_id: str) -> list[dict[str, Any]]:
        session = await self.store.ensure(self.agent, user_id, session_id)
        return session.events

    async def _record(self, ctx) -> None:
        if not self.runner.persists_transcript and ctx.events:
            await self.store.append(self.agent, ctx.user_id, ctx.session_id, ctx.events)

    def _context(self, message: str, session_id: str, user_id: str, history: list[dict[str, Any]],
                 body: dict[str, Any] | None, preamble: str):
        ctx = self.runner.new_context(message, session_id, user_id, history, body=body)
        if preamble:
            # The model reads the preamble (e.g. recalled memories); the transcript keeps what the user said.
            ctx.message = preamble + message
            ctx.preamble = preamble
        return ctx

    async def invoke(self, message: str, session_id: str, user_id: str, *, body: dict[str, Any] | None = None,
                     preamble: str = "") -> TurnResult:
        history = await self._history(session_id, user_id)
        ctx = self._context(message, session_id, user_id, history, body, preamble)
        try:
            return await self.runner.run(message, session_id, user_id, history, body=body, context=ctx)
        finally:
            await self._record(ctx)

    async def stream(self, message: str, session_id: str, user_id: str, *,
                     body: dict[str, Any] | None = None, preamble: str = "") -> AsyncIterator[StreamLine]:
        history = await self._history(session_id, user_id)
        ctx = self._context(message, session_id, user_id, history, body, preamble)
        try:
            async for line in self.runner.stream(message, session_id, user_id, history, body=body, context=ctx):
                if line["type"] in ("done", "error"):
                    await self._record(ctx)
                    ctx.events = []
                yield line
        finally:
            await self._record(ctx)
