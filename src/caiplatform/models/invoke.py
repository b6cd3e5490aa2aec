"""The invoke API's models (document 1, Invoke, Users and sessions browser, Embed): the invoke request,
its buffered answer, the stream's lines, the session browser's pages and the public widget config.

An agent's answer and stream lines come from its harness; the platform passes them through, so these
views accept fields a newer harness adds (`OpenResponseModel`). A function's invoke answer is the
function's own JSON value and has no model.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, TypeAdapter

from caiplatform.models.base import ListPage, OpenResponseModel, RequestModel, ResponseModel


class InvokeRequest(RequestModel):
    """`POST /v1/agents/{name}/invoke` (and `/invoke/stream`). Other fields are ignored by an agent; a
    function takes any JSON event instead (its `message` is optional)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    message: str = Field(description="blank or missing is 400 message is required")
    session_id: str | None = Field(None, description="reuse to continue a conversation; anonymous callers "
                                   "choosing their own need at least 24 characters")
    user_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:@-]{1,128}$",
                                description="derived from the session id when omitted")
    memorize: bool = Field(False, description="also commit the session to the memory bank (authenticated only)")


class EmbedInvokeRequest(RequestModel):
    """`POST /v1/embed/{key}/invoke`: memorize is unavailable (400)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    message: str
    session_id: str | None = None
    user_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:@-]{1,128}$")


class ToolCallSummary(OpenResponseModel):
    name: str
    summary: str = Field(description="reads like: called with args={...}")


class InvokeResponse(OpenResponseModel):
    """An agent's answer to one message."""

    session_id: str
    user_id: str
    output: str
    reasoning: str = Field(description="thinking text when the model produced any, else empty")
    tool_calls: list[ToolCallSummary]
    events: list[dict[str, Any]] = Field(description="raw framework events for the turn (verbose)")


# -- stream lines (application/x-ndjson) -----------------------------------------------------------


class ThinkingDelta(OpenResponseModel):
    type: Literal["thinking"]
    seq: int
    text: str


class OutputDelta(OpenResponseModel):
    type: Literal["output"]
    seq: int
    text: str


class BlockEnd(OpenResponseModel):
    type: Literal["block_end"]
    seq: int
    kind: Literal["thinking", "output"]


class ToolCallEvent(OpenResponseModel):
    type: Literal["tool_call"]
    name: str
    args: Any = None


class ToolResultEvent(OpenResponseModel):
    type: Literal["tool_result"]
    name: str
    result: Any = None


class TurnDone(OpenResponseModel):
    type: Literal["done"]
    session_id: str
    user_id: str


class TurnError(OpenResponseModel):
    type: Literal["error"]
    message: str


StreamEvent = Annotated[
    ThinkingDelta | OutputDelta | BlockEnd | ToolCallEvent | ToolResultEvent | TurnDone | TurnError,
    Field(discriminator="type"),
]
STREAM_EVENT: TypeAdapter[StreamEvent] = TypeAdapter(StreamEvent)


# -- users and sessions browser --------------------------------------------------------------------


class UserSummary(ResponseModel):
    user_id: str
    first_seen: str
    last_seen: str
    session_count: int


class UserList(ListPage):
    items_field: ClassVar[str] = "users"
    users: list[UserSummary]


class SessionSummary(ResponseModel):
    session_id: str
    created: str
    last_update: str
    event_count: int
    preview: str


class SessionList(ListPage):
    items_field: ClassVar[str] = "sessions"
    sessions: list[SessionSummary]


class Transcript(OpenResponseModel):
    """A session's transcript: its events in order (`author`, `timestamp`, `invocation_id`, `content.parts`)."""

    session_id: str
    user_id: str
    agent: str
    created: str
    last_update: str
    event_count: int
    events: list[dict[str, Any]]


class MemorizeResult(ResponseModel):
    status: Literal["ok"]


class PublicEmbedConfig(ResponseModel):
    """`GET /v1/embed/{key}/config`: what the widget shows."""

    agent: str
    title: str
    subtitle: str
    greeting: str
    accent_color: str
    launcher_text: str
    position: Literal["left", "right"]
    streaming: bool
