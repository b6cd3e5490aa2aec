"""Spans of a turn's model calls and tool calls, in the OpenTelemetry GenAI semantic conventions.

Only while tracing is on (`caiplatform.tracing.tracer()`): a LangChain callback handler that the LangGraph
runner adds to the graph's config, and an ADK plugin that the ADK runner gives its `Runner`. Each chat model call is a `chat {model}` span (`gen_ai.operation.name`
= `chat`, `gen_ai.request.model`, `gen_ai.provider.name`, `gen_ai.usage.input_tokens` / `output_tokens`,
`gen_ai.response.model`, `gen_ai.response.finish_reasons`); each tool call an `execute_tool {name}` span
(`gen_ai.tool.name`, `gen_ai.tool.call.id`). Both are children of the turn's span (the one current when
the handler was made). Contents (`gen_ai.input.messages`, `gen_ai.output.messages`, the tool's arguments
and result) only when the operator opted in (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from caiplatform import tracing

CONTENT_LIMIT = 8192


def _json(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text[:CONTENT_LIMIT]


def _message(message: Any) -> dict[str, Any]:
    role = {"human": "user", "ai": "assistant"}.get(getattr(message, "type", ""), getattr(message, "type", ""))
    return {"role": role, "content": getattr(message, "content", "")}


def langchain_callbacks() -> list[Any]:
    """The callback handlers a LangChain/LangGraph run gets: none when tracing is off."""
    if tracing.tracer() is None:
        return []
    from opentelemetry import context as otel_context

    return [_handler_class()(otel_context.get_current())]


@functools.cache
def _handler_class() -> Any:
    from langchain_core.callbacks import BaseCallbackHandler

    class GenAISpans(BaseCallbackHandler):
        run_inline = True  # on the loop's thread, in order, no executor hop
        raise_error = False

        def __init__(self, parent: Any):
            self.parent = parent
            self.spans: dict[Any, Any] = {}

        # -- model calls ------------------------------------------------------------------------
        def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[Any]], *, run_id: Any,
                                metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
            meta = metadata or {}
            params = kwargs.get("invocation_params") or {}
            model = meta.get("ls_model_name") or params.get("model") or params.get("model_name") or ""
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                "gen_ai.provider.name": meta.get("ls_provider") or "", "gen_ai.system": meta.get("ls_provider") or "",
                "gen_ai.request.temperature": meta.get("ls_temperature"),
                "gen_ai.request.max_tokens": meta.get("ls_max_tokens")}
            if tracing.capture_content():
                attributes["gen_ai.input.messages"] = _json([_message(m) for batch in messages for m in batch])
            self.spans[run_id] = tracing.start(f"chat {model}".strip(), attributes, kind="CLIENT",
                                               parent=self.parent)

        def on_llm_end(self, response: Any, *, run_id: Any, **kwargs: Any) -> None:
            current = self.spans.pop(run_id, None)
            if current is None:
                return
            usage, finish, model, outputs = _usage(response)
            for key, value in (("gen_ai.usage.input_tokens", usage.get("input")),
                               ("gen_ai.usage.output_tokens", usage.get("output")),
                               ("gen_ai.response.model", model)):
                if value is not None and value != "":
                    current.set_attribute(key, value)
            if finish:
                current.set_attribute("gen_ai.response.finish_reasons", tuple(finish))
            if tracing.capture_content() and outputs:
                current.set_attribute("gen_ai.output.messages", _json(outputs))
            tracing.finish(current)

        def on_llm_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
            tracing.finish(self.spans.pop(run_id, None), error)

        # -- tool calls -------------------------------------------------------------------------
        def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: Any,
                          inputs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            name = (serialized or {}).get("name") or kwargs.get("name") or ""
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                "gen_ai.tool.description": ((serialized or {}).get("description") or "")[:512],
                "gen_ai.tool.call.id": kwargs.get("tool_call_id"), "gen_ai.tool.type": "function"}
            if tracing.capture_content():
                attributes["gen_ai.tool.call.arguments"] = _json(inputs if inputs is not None else input_str)
            self.spans[run_id] = tracing.start(f"execute_tool {name}".strip(), attributes, parent=self.parent)

        def on_tool_end(self, output: Any, *, run_id: Any, **kwargs: Any) -> None:
            current = self.spans.pop(run_id, None)
            if current is not None and tracing.capture_content():
                current.set_attribute("gen_ai.tool.call.result", _json(getattr(output, "content", output)))
            tracing.finish(current)

        def on_tool_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
            tracing.finish(self.spans.pop(run_id, None), error)

    return GenAISpans


def _usage(response: Any) -> tuple[dict[str, int], list[str], str, list[dict[str, Any]]]:
    """(tokens in and out, finish reasons, the answering model, output messages) of an LLMResult."""
    usage: dict[str, int] = {}
    finish: list[str] = []
    outputs: list[dict[str, Any]] = []
    model = ""
    for batch in getattr(response, "generations", None) or []:
        for generation in batch:
            message = getattr(generation, "message", None)
            metadata = getattr(message, "usage_metadata", None) or {}
            if metadata:
                usage["input"] = usage.get("input", 0) + int(metadata.get("input_tokens") or 0)
                usage["output"] = usage.get("output", 0) + int(metadata.get("output_tokens") or 0)
            info = {**(getattr(generation, "generation_info", None) or {}),
                    **(getattr(message, "response_metadata", None) or {})}
            if info.get("finish_reason"):
                finish.append(str(info["finish_reason"]))
            model = model or str(info.get("model_name") or info.get("model") or "")
            if message is not None:
                out = _message(message)
                if getattr(message, "tool_calls", None):
                    out["tool_calls"] = [{"name": c.get("name"), "id": c.get("id"), "arguments": c.get("args")}
                                         for c in message.tool_calls]
                outputs.append(out)
    llm_output = getattr(response, "llm_output", None) or {}
    token_usage = llm_output.get("token_usage") or {}
    if not usage and token_usage:
        usage = {"input": int(token_usage.get("prompt_tokens") or 0),
                 "output": int(token_usage.get("completion_tokens") or 0)}
    model = model or str(llm_output.get("model_name") or "")
    return usage, finish, model, outputs


# -- ADK ---------------------------------------------------------------------------------------------


def adk_plugins() -> list[Any]:
    """The plugins an ADK `Runner` gets: none when tracing is off."""
    if tracing.tracer() is None:
        return []
    return [_adk_plugin_class()()]


@functools.cache
def _adk_plugin_class() -> Any:
    from google.adk.plugins.base_plugin import BasePlugin

    class GenAISpans(BasePlugin):
        """`chat {model}` around each model call (a stream's partial answers end it at the last one) and
        `execute_tool {name}` around each tool call; children of the span current at the call (the turn's)."""

        def __init__(self) -> None:
            super().__init__(name="caiplatform_genai_spans")
            self.models: dict[str, list[Any]] = {}  # invocation id -> open chat spans
            self.tools: dict[Any, Any] = {}

        async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> None:
            model = str(getattr(llm_request, "model", "") or "")
            attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                          "gen_ai.agent.name": getattr(callback_context, "agent_name", None)}
            if tracing.capture_content():
                attributes["gen_ai.input.messages"] = _json(
                    [c.model_dump(exclude_none=True, mode="json") for c in getattr(llm_request, "contents", None) or []])
            opened = tracing.start(f"chat {model}".strip(), attributes, kind="CLIENT")
            self.models.setdefault(callback_context.invocation_id, []).append(opened)
            return None

        async def after_model_callback(self, *, callback_context: Any, llm_response: Any) -> None:
            if getattr(llm_response, "partial", False):
                return None  # a stream's fragment: the call goes on
            opened = self.models.get(callback_context.invocation_id) or []
            if not opened:
                return None
            current = opened.pop()
            usage = getattr(llm_response, "usage_metadata", None)
            for key, value in (("gen_ai.usage.input_tokens", getattr(usage, "prompt_token_count", None)),
                               ("gen_ai.usage.output_tokens", getattr(usage, "candidates_token_count", None)),
                               ("gen_ai.response.model", getattr(llm_response, "model_version", None))):
                if value is not None:
                    current.set_attribute(key, value)
            finish = getattr(llm_response, "finish_reason", None)
            if finish is not None:
                current.set_attribute("gen_ai.response.finish_reasons", (str(getattr(finish, "value", finish)).lower(),))
            content = getattr(llm_response, "content", None)
            if tracing.capture_content() and content is not None:
                current.set_attribute("gen_ai.output.messages", _json(content.model_dump(exclude_none=True, mode="json")))
            tracing.finish(current)
            return None

        async def on_model_error_callback(self, *, callback_context: Any, llm_request: Any, error: Exception) -> None:
            opened = self.models.get(callback_context.invocation_id) or []
            if opened:
                tracing.finish(opened.pop(), error)
            return None

        async def before_tool_callback(self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any) -> None:
            name = str(getattr(tool, "name", "") or "")
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                "gen_ai.tool.description": (getattr(tool, "description", "") or "")[:512],
                "gen_ai.tool.call.id": getattr(tool_context, "function_call_id", None), "gen_ai.tool.type": "function"}
            if tracing.capture_content():
                attributes["gen_ai.tool.call.arguments"] = _json(tool_args)
            self.tools[id(tool_context)] = tracing.start(f"execute_tool {name}".strip(), attributes)
            return None

        async def after_tool_callback(self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any,
                                      result: Any) -> None:
            current = self.tools.pop(id(tool_context), None)
            if current is not None and tracing.capture_content():
                current.set_attribute("gen_ai.tool.call.result", _json(result))
            tracing.finish(current)
            return None

        async def on_tool_error_callback(self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any,
                                         error: Exception) -> None:
            tracing.finish(self.tools.pop(id(tool_context), None), error)
            return None

        async def after_run_callback(self, *, invocation_context: Any) -> None:
            for current in self.models.pop(getattr(invocation_context, "invocation_id", ""), []):
                tracing.finish(current)  # a call whose last answer never came
            return None

    return GenAISpans
