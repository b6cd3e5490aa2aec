"""A scripted OpenAI-compatible model server, so real agent frameworks are tested without the internet.

Routes: `POST /v1/chat/completions` (buffered JSON, or Server-Sent Events when `stream: true`, ending
with `data: [DONE]`), `POST /v1/embeddings` (the deterministic local embedder), `GET /v1/models`.

What the model answers is a *script*:

- `None` (default): echo, `you said: <last user text>`.
- a list of steps: each step is a `Step`, a plain string (the answer), or a dict with the `Step`
  fields. By default (`mode="conversation"`) the step used for a request is the number of assistant
  messages already in that request, so a step that demands a tool call is followed, on the request that
  carries the tool result, by the next step; a second turn of the same session continues the script.
  `mode="sequential"` instead hands out one step per request in arrival order. Past the end of the
  script the server echoes.
- a rule: a callable taking the `ChatRequest` and returning a step (or `None` to echo).

Reasoning text goes out as `reasoning_content` (the DeepSeek / vLLM field) before the answer; streamed
answers are cut into word-sized deltas; usage counts words. Every request is recorded in `requests`.

Run in-process (`server.app` is an ASGI app) or on a loopback port (`with server.serve() as base_url:`,
`base_url` ending in `/v1`, ready for `MODEL_BASE_URL`).

A test double, not a model: the tests use it (through `caiplatform.testing.model_server`), and so does
`caiplatform serve --scripted-model`, to try agents without a model account.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from caiplatform.embeddings import DEFAULT_DIMS, local_embed

MODEL_NAME = "scripted"
_TOKEN = re.compile(r"\s*\S+|\s+")


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass
class Step:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    # Streamed answers only: after the first content token, wait (up to 30 s) until this is set, so a
    # test can look at what reached the client while the model is still streaming.
    hold: threading.Event | None = None

    @classmethod
    def of(cls, value: Any) -> Step:
        if isinstance(value, Step):
            return value
        if isinstance(value, str):
            return cls(content=value)
        if isinstance(value, dict):
            calls = []
            for raw in value.get("tool_calls") or []:
                if isinstance(raw, ToolCall):
                    calls.append(raw)
                else:
                    calls.append(ToolCall(raw["name"], dict(raw.get("arguments") or raw.get("args") or {}), raw.get("id", "")))
            if "tool" in value:  # shorthand {"tool": name, "args": {...}}
                calls.append(ToolCall(value["tool"], dict(value.get("args") or {})))
            return cls(content=value.get("content", ""), reasoning=value.get("reasoning", ""), tool_calls=calls)
        raise TypeError(f"a script step must be a Step, str or dict, not {type(value).__name__}")


def tool_step(name: str, reasoning: str = "", **arguments: Any) -> Step:
    """A step that asks the agent to call tool `name` with `arguments`."""
    return Step(reasoning=reasoning, tool_calls=[ToolCall(name, arguments)])


@dataclass
class ChatRequest:
    body: dict[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def tools(self) -> list[str]:
        return [t.get("function", {}).get("name", "") for t in self.body.get("tools") or []]

    @property
    def assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    def last_text(self, role: str = "user") -> str:
        for message in reversed(self.messages):
            if message.get("role") == role:
                return message_text(message)
        return ""

    @property
    def tool_results(self) -> list[str]:
        """Tool results after the last assistant message (the ones this request answers)."""
        out: list[str] = []
        for message in reversed(self.messages):
            if message.get("role") == "tool":
                out.append(message_text(message))
            elif message.get("role") == "assistant":
                break
        return list(reversed(out))


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        elif isinstance(part, str):
            parts.append(part)
    return "".join(parts)


def echo(request: ChatRequest) -> Step:
    return Step(content=f"you said: {request.last_text('user')}")


Script = list[Any] | Callable[[ChatRequest], Any] | None


def tokens(text: str) -> list[str]:
    """Word-sized pieces whose concatenation is exactly `text`."""
    return _TOKEN.findall(text) or ([text] if text else [])


class ScriptedModel:
    def __init__(self, script: Script = None, *, mode: str = "conversation", model: str = MODEL_NAME,
                 embed_dims: int = DEFAULT_DIMS):
        if mode not in ("conversation", "sequential"):
            raise ValueError("mode is 'conversation' or 'sequential'")
        self.script = script
        self.mode = mode
        self.model = model
        self.embed_dims = embed_dims
        self.requests: list[ChatRequest] = []
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            Route("/embeddings", self._embeddings, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])

    # -- choosing the answer -------------------------------------------------------------------
    def set_script(self, script: Script, *, mode: str | None = None) -> None:
        with self._lock:
            self.script = script
            if mode:
                self.mode = mode
            self._counter = itertools.count()

    def step_for(self, request: ChatRequest) -> Step:
        with self._lock:
            script = self.script
            index = next(self._counter) if self.mode == "sequential" else request.assistant_turns
        if script is None:
            return echo(request)
        if callable(script):
            chosen = script(request)
            return echo(request) if chosen is None else Step.of(chosen)
        if index < len(script):
            return Step.of(script[index])
        return echo(request)

    # -- routes --------------------------------------------------------------------------------
    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "caiplatform"}]})

    async def _embeddings(self, request: Request) -> JSONResponse:
        body = await request.json()
        texts = body.get("input", [])
        if isinstance(texts, str):
            texts = [texts]
        dims = int(body.get("dimensions") or self.embed_dims)
        vectors = local_embed([str(t) for t in texts], dims)
        used = sum(len(str(t).split()) for t in texts)
        return JSONResponse({
            "object": "list",
            "model": body.get("model") or self.model,
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": used, "total_tokens": used},
        })

    async def _chat(self, request: Request):
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "invalid JSON body", "type": "invalid_request_error"}}, status_code=400)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return JSONResponse({"error": {"message": "messages is required", "type": "invalid_request_error"}}, status_code=400)
        chat = ChatRequest(body)
        with self._lock:
            self.requests.append(chat)
        step = self.step_for(chat)
        calls = [ToolCall(c.name, c.arguments, c.id or f"call_{uuid.uuid4().hex[:24]}") for c in step.tool_calls]
        prompt_tokens = sum(len(message_text(m).split()) for m in chat.messages)
        completion_tokens = len(tokens(step.content)) + len(tokens(step.reasoning))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": len(tokens(step.reasoning))},
        }
        finish = "tool_calls" if calls else "stop"
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        model = body.get("model") or self.model
        if not chat.stream:
            message: dict[str, Any] = {"role": "assistant", "content": step.content if (step.content or not calls) else None}
            if step.reasoning:
                message["reasoning_content"] = step.reasoning
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in calls
                ]
            return JSONResponse({
                "id": completion_id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            })
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
            payload = {
                "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra,
            }
            return f"data: {json.dumps(payload)}\n\n"

        def events() -> Iterator[str]:
            yield chunk({"role": "assistant", "content": ""})
            for piece in tokens(step.reasoning):
                yield chunk({"reasoning_content": piece})
            for i, piece in enumerate(tokens(step.content)):
                yield chunk({"content": piece})
                if i == 0 and step.hold is not None:
                    step.hold.wait(30)
            for i, c in enumerate(calls):
                yield chunk({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                                             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}]})
            yield chunk({}, finish)
            if include_usage:
                yield f"data: {json.dumps({'id': completion_id, 'object': 'chat.completion.chunk', 'created': created, 'model': model, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # -- serving on a loopback port ------------------------------------------------------------
    @contextmanager
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Serve on a free loopback port in a background thread; yields the base URL (`.../v1`)."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        bound = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the scripted model server did not start")
            time.sleep(0.01)
        try:
            yield f"http://{host}:{bound}/v1"
        finally:
            server.should_exit = True
            thread.join(timeout=5)
            sock.close()


def model_env(base_url: str, *, api_key: str = "test-key", model: str = MODEL_NAME) -> dict[str, str]:
    """The environment an agent needs to reach the scripted model."""
    return {"MODEL_BASE_URL": base_url, "MODEL_API_KEY": api_key, "MODEL_NAME": model}
