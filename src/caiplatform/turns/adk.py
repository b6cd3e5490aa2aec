"""ADK: `agent.py` holds a module-level `root_agent`, run by ADK's own `Runner`.

The runner's session service is `StoreSessionService`, backed by our session store: ADK reads the
session's history from it and writes every final event of the turn to it, so the transcript is ADK's
own event stream (`persists_transcript`). Stored events keep the spec's shape: `author` is `user` or
the platform agent name (ADK's own author, such as a sub-agent name, is kept as `adk_author`) and
`timestamp` is RFC 3339.

The turn runs with `StreamingMode.SSE`, so text and thought parts arrive as partial events
(token-sized); the final event of each model response then only contributes what did not stream,
plus its function calls. Function responses become `tool_result` lines.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from caiplatform.clock import rfc3339
from caiplatform.errors import Conflict
from caiplatform.ports.sessions import SessionStore
from caiplatform.turns import telemetry
from caiplatform.turns.base import StreamLine, TurnContext, TurnError, TurnRunner
from caiplatform.turns.loader import load_entry

try:
    from google.adk.agents.run_config import RunConfig, StreamingMode
    from google.adk.artifacts import InMemoryArtifactService
    from google.adk.events import Event
    from google.adk.runners import Runner
    from google.adk.sessions import BaseSessionService, Session
    from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse
    from google.genai import types
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    _IMPORT_ERROR: ModuleNotFoundError | None = exc
    BaseSessionService = object  # type: ignore[assignment,misc]
else:
    _IMPORT_ERROR = None

TEMP_PREFIX = "temp:"


def _require() -> None:
    if _IMPORT_ERROR is not None:
        raise ModuleNotFoundError(
            f"the adk runner needs {_IMPORT_ERROR.name!r}; install it with: pip install 'caiplatform[agents]' "
            "(google-adk, litellm)"
        ) from _IMPORT_ERROR


def event_to_transcript(event: Any, agent: str) -> dict[str, Any]:
    """An ADK event as a stored transcript event (JSON-safe, spec-shaped)."""
    body = json.loads(event.model_dump_json(exclude_none=True))
    body["adk_author"] = body.get("author", "")
    body["author"] = "user" if body.get("author") == "user" else agent
    body["timestamp"] = rfc3339(datetime.fromtimestamp(float(event.timestamp), tz=UTC))
    body.setdefault("invocation_id", "")
    body.setdefault("content", {"parts": []})
    body["content"].setdefault("parts", [])
    return body


def transcript_to_event(body: dict[str, Any]) -> Any:
    data = dict(body)
    data["author"] = data.pop("adk_author", None) or data.get("author") or "user"
    ts = data.get("timestamp")
    if isinstance(ts, str):
        data["timestamp"] = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return Event.model_validate_json(json.dumps(data))


class StoreSessionService(BaseSessionService):  # type: ignore[misc,valid-type]
    """ADK's session service over a `SessionStore` for one platform agent."""

    def __init__(self, store: SessionStore, agent: str):
        _require()
        self.store = store
        self.agent = agent
        # Session id -> text the model got before the user's message this turn (recalled memories); the
        # stored transcript keeps only what the user said.
        self.preambles: dict[str, str] = {}

    def _adk_session(self, app_name: str, record: Any, config: Any = None) -> Any:
        events = [transcript_to_event(e) for e in record.events]
        if config is not None:
            if config.after_timestamp is not None:
                events = [e for e in events if e.timestamp >= config.after_timestamp]
            if config.num_recent_events is not None:
                events = events[-config.num_recent_events:] if config.num_recent_events else []
        return Session(id=record.session_id, app_name=app_name, user_id=record.user_id, state=dict(record.state),
                       events=events, last_update_time=record.last_update.timestamp())

    async def create_session(self, *, app_name: str, user_id: str, state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> Any:
        sid = (session_id or "").strip() or str(uuid.uuid4())
        try:
            record = await self.store.create(self.agent, user_id, sid, state=state)
        except Conflict:
            record = await self.store.ensure(self.agent, user_id, sid)
        return self._adk_session(app_name, record)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> Any:
        record = await self.store.get(self.agent, session_id)
        if record is None or record.user_id != user_id:
            return None
        return self._adk_session(app_name, record, config)

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> Any:
        users = [user_id] if user_id else []
        if not user_id:
            offset = 0
            while True:
                user_page = await self.store.list_users(self.agent, offset=offset, limit=200)
                users += [u.user_id for u in user_page.items]
                offset += 200
                if not user_page.more:
                    break
        sessions = []
        for uid in users:
            offset = 0
            while True:
                session_page = await self.store.list_sessions(self.agent, uid, offset=offset, limit=200)
                sessions += [Session(id=s.session_id, app_name=app_name, user_id=uid, state={}, events=[],
                                     last_update_time=s.last_update.timestamp()) for s in session_page.items]
                offset += 200
                if not session_page.more:
                    break
        sessions.sort(key=lambda s: s.last_update_time)
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        record = await self.store.get(self.agent, session_id)
        if record is not None and record.user_id == user_id:
            await self.store.delete(self.agent, session_id)

    async def append_event(self, session: Any, event: Any) -> Any:
        if event.partial:
            return event
        event = await super().append_event(session, event)
        delta = {}
        if event.actions and event.actions.state_delta:
            delta = {k: v for k, v in event.actions.state_delta.items() if not k.startswith(TEMP_PREFIX)}
        body = event_to_transcript(event, self.agent)
        if event.author == "user" and session.id in self.preambles:
            body = without_preamble(body, self.preambles.pop(session.id))
        stored = await self.store.append(self.agent, session.user_id, session.id, [body], state=delta)
        session.last_update_time = stored.last_update.timestamp()
        return event


def without_preamble(body: dict[str, Any], preamble: str) -> dict[str, Any]:
    """The transcript event of the user's message without the text the platform put before it."""
    parts = body.get("content", {}).get("parts") or []
    if preamble and parts and str(parts[0].get("text", "")).startswith(preamble):
        parts[0] = {**parts[0], "text": parts[0]["text"][len(preamble):]}
    return body


def _unwrap(response: Any) -> Any:
    if isinstance(response, dict) and set(response) == {"result"}:
        return response["result"]
    return response


class AdkRunner(TurnRunner):
    framework = "adk"
    persists_transcript = True

    def __init__(self, root_agent: Any, *, sessions: SessionStore | None = None, **kwargs: Any):
        _require()
        super().__init__(**kwargs)
        if sessions is None:
            from caiplatform.adapters.memory.sessions import InMemorySessionStore

            sessions = InMemorySessionStore(clock=self.clock)
        self.sessions = sessions
        self.session_service = StoreSessionService(sessions, self.agent)
        self.root_agent = root_agent
        # ADK's code executors need an artifact service (they keep a snippet's output files there). It is
        # in this process's memory, where the erasure of a user's sessions cannot reach (docs/erasure.md),
        # so a turn's artifacts live as long as the turn that made them (`_forget_artifacts`).
        self.artifacts = InMemoryArtifactService()
        # Model and tool spans while tracing is on; otherwise no plugins argument at all (ADK deprecates it).
        extra: dict[str, Any] = {"plugins": plugins} if (plugins := telemetry.adk_plugins()) else {}
        self.runner = Runner(app_name=self.agent, agent=root_agent, session_service=self.session_service,
                             artifact_service=self.artifacts, auto_create_session=True, **extra)

    @classmethod
    def from_dir(cls, code_dir: str | Path, **kwargs: Any) -> AdkRunner:
        _require()
        return cls(load_entry(code_dir, "adk").root_agent, **kwargs)

    async def _turn(self, ctx: TurnContext) -> AsyncIterator[StreamLine]:
        try:
            async for line in self._adk_turn(ctx):
                yield line
        finally:
            await self._forget_artifacts(ctx.user_id, ctx.session_id)

    async def _forget_artifacts(self, user_id: str, session_id: str) -> None:
        """The files the turn kept (its session's and the user's `user:` ones): gone with the turn."""
        for name in await self.artifacts.list_artifact_keys(app_name=self.agent, user_id=user_id,
                                                            session_id=session_id):
            await self.artifacts.delete_artifact(app_name=self.agent, user_id=user_id, session_id=session_id,
                                                 filename=name)

    async def _adk_turn(self, ctx: TurnContext) -> AsyncIterator[StreamLine]:
        content = types.Content(role="user", parts=[types.Part(text=ctx.message)])
        if ctx.preamble:
            self.session_service.preambles[ctx.session_id] = ctx.preamble
        finals: list[dict[str, Any]] = []
        streamed_text = streamed_thought = False
        async for event in self.runner.run_async(
            user_id=ctx.user_id, session_id=ctx.session_id, new_message=content,
            run_config=RunConfig(streaming_mode=StreamingMode.SSE), yield_user_message=True,
        ):
            if event.error_code or event.error_message:
                raise TurnError(event.error_message or str(event.error_code))
            parts = list(event.content.parts or []) if event.content else []
            if event.partial:
                for part in parts:
                    if part.text:
                        if part.thought:
                            streamed_thought = True
                            lines = ctx.thinking(part.text)
                        else:
                            streamed_text = True
                            lines = ctx.output(part.text)
                        for line in lines:
                            yield line
                continue
            finals.append(without_preamble(event_to_transcript(event, self.agent),
                                           ctx.preamble if event.author == "user" else ""))
            if event.author == "user":
                continue
            for part in parts:
                if part.text and part.thought and not streamed_thought:
                    lines = ctx.thinking(part.text)
                elif part.text and not part.thought and not streamed_text:
                    lines = ctx.output(part.text)
                elif part.function_call:
                    call = part.function_call
                    lines = ctx.tool_call(call.name or "", dict(call.args or {}), call.id)
                elif part.function_response:
                    response = part.function_response
                    lines = ctx.tool_result(response.name or "", _unwrap(response.response), response.id)
                else:
                    lines = []
                for line in lines:
                    yield line
            streamed_text = streamed_thought = False
        ctx.replaced_events = finals
