"""A runner plus a session store: what the harness server calls for each invoke.

`Conversation.invoke()` / `.stream()` take already-resolved ids (see
`caiplatform.services.invoke_ids`), claim the session (its row, not its events), run the turn, and
append the turn's transcript events to the store (unless the framework writes them itself, as ADK does
through its session service). A failed turn still records what happened before the failure.

A runner that keeps each session's framework state (LangGraph without a checkpointer of its own) is
handed the transcript only when it does not hold that session's state or the transcript moved on
without it (another replica answered a turn; the session was deleted and created again): the
conversation remembers the transcript's version (`SessionHead.version`) after each turn it recorded,
for as many sessions as the runner keeps. Other runners get the transcript each turn, as their
framework's input.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from caiplatform.ports.sessions import SessionHead, SessionStore
from caiplatform.turns.base import StreamLine, TurnResult, TurnRunner


class Conversation:
    def __init__(self, runner: TurnRunner, store: SessionStore, *, agent: str | None = None):
        self.runner = runner
        self.store = store
        self.agent = agent or runner.agent
        # session id -> the transcript's version the runner's state matches, least recently used first;
        # bounded like the runner's own state (an entry is a few dozen bytes)
        self._synced: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.sync_limit = 4096

    async def _history(self, session_id: str, user_id: str) -> tuple[list[dict[str, Any]], SessionHead | None]:
        if self.runner.persists_transcript:  # the framework reads its own session (ADK)
            return (await self.store.ensure(self.agent, user_id, session_id)).events, None
        head = await self.store.claim(self.agent, user_id, session_id)
        if self.runner.keeps_session_state:
            if self._synced.get(session_id) == head.version and self.runner.holds_session(session_id):
                self._synced.move_to_end(session_id)
                return [], head  # the runner's own state is the conversation so far
            self._synced.pop(session_id, None)
            self.runner.forget_session(session_id)  # behind the transcript, or not held: rebuilt from it
        if head.event_count == 0:
            return [], head
        session = await self.store.get(self.agent, session_id)
        return (session.events if session is not None else []), head

    async def _record(self, ctx, head: SessionHead | None) -> None:
        if self.runner.persists_transcript or not ctx.events:
            return
        events = list(ctx.events)
        after = await self.store.extend(self.agent, ctx.user_id, ctx.session_id, events)
        if not self.runner.keeps_session_state or head is None:
            return
        # The runner's state matches the transcript when nobody else wrote in between.
        if after.created == head.created and after.event_count == head.event_count + len(events):
            self._synced[ctx.session_id] = after.version
            self._synced.move_to_end(ctx.session_id)
            while len(self._synced) > self.sync_limit:
                self._synced.popitem(last=False)
        else:
            self._synced.pop(ctx.session_id, None)

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
        history, head = await self._history(session_id, user_id)
        ctx = self._context(message, session_id, user_id, history, body, preamble)
        try:
            return await self.runner.run(message, session_id, user_id, history, body=body, context=ctx)
        finally:
            await self._record(ctx, head)

    async def stream(self, message: str, session_id: str, user_id: str, *,
                     body: dict[str, Any] | None = None, preamble: str = "") -> AsyncIterator[StreamLine]:
        history, head = await self._history(session_id, user_id)
        ctx = self._context(message, session_id, user_id, history, body, preamble)
        try:
            async for line in self.runner.stream(message, session_id, user_id, history, body=body, context=ctx):
                if line["type"] in ("done", "error"):
                    await self._record(ctx, head)
                    ctx.events = []
                yield line
        finally:
            await self._record(ctx, head)
