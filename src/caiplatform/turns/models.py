"""The model an agent talks to: an OpenAI-compatible endpoint from the environment.

`MODEL_BASE_URL` and `MODEL_API_KEY` (a per-agent secret overrides the platform's key), and the model
name in `MODEL_NAME` (default `default`). Each helper builds that model in one framework's own terms;
agent code may also build its own client from the same variables.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

DEFAULT_MODEL = "default"


@dataclass(frozen=True)
class ModelSettings:
    base_url: str | None
    api_key: str | None
    model: str

    @property
    def key_present(self) -> bool:
        return bool(self.api_key)


# The environment of the agent being served. A harness process serves one agent from `os.environ`; the
# in-memory runtime serves several agents in one process, each with its own mapping, so the harness sets
# this around loading the agent and around every request (threads started from there inherit it).
_agent_env: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("cai_agent_env", default=None)


@contextmanager
def agent_env(env: Mapping[str, str]) -> Iterator[None]:
    """Model helpers called inside this block read `env` instead of `os.environ`."""
    token = _agent_env.set(env)
    try:
        yield
    finally:
        _agent_env.reset(token)


def current_env() -> Mapping[str, str]:
    """The served agent's environment: the harness's mapping when one is set, else `os.environ`."""
    env = _agent_env.get()
    return os.environ if env is None else env


def model_settings(env: Mapping[str, str] | None = None) -> ModelSettings:
    env = current_env() if env is None else env
    return ModelSettings(
        base_url=env.get("MODEL_BASE_URL") or None,
        api_key=env.get("MODEL_API_KEY") or None,
        model=env.get("MODEL_NAME") or DEFAULT_MODEL,
    )


def _reasoning_chat_openai():
    from langchain_openai import ChatOpenAI

    class ReasoningChatOpenAI(ChatOpenAI):
        """ChatOpenAI that keeps `reasoning_content` (DeepSeek / vLLM style) in `additional_kwargs`."""

        def _convert_chunk_to_generation_chunk(self, chunk, default_chunk_class, base_generation_info):
            generation = super()._convert_chunk_to_generation_chunk(chunk, default_chunk_class, base_generation_info)
            if generation is None:
                return None
            choices = chunk.get("choices") or (chunk.get("chunk") or {}).get("choices") or []
            if choices:
                reasoning = (choices[0].get("delta") or {}).get("reasoning_content")
                if reasoning:
                    generation.message.additional_kwargs["reasoning_content"] = reasoning
            return generation

        def _create_chat_result(self, response, generation_info=None):
            result = super()._create_chat_result(response, generation_info)
            data = response if isinstance(response, dict) else response.model_dump()
            for generation, choice in zip(result.generations, data.get("choices") or [], strict=False):
                reasoning = (choice.get("message") or {}).get("reasoning_content")
                if reasoning:
                    generation.message.additional_kwargs["reasoning_content"] = reasoning
            return result

    return ReasoningChatOpenAI


def chat_model(**kwargs: Any):
    """A LangChain chat model on the configured endpoint (streams, surfaces reasoning)."""
    s = model_settings()
    cls = _reasoning_chat_openai()
    params: dict[str, Any] = {"model": s.model, "api_key": s.api_key or "unset", "streaming": True,
                              "stream_usage": True}
    if s.base_url:
        params["base_url"] = s.base_url
    params.update(kwargs)
    if "http_async_client" not in params:
        # langchain-openai shares one cached async HTTP client per process; an instance of our own keeps
        # a model usable from the event loop that uses it (tests run one loop per test).
        import httpx

        params["http_async_client"] = httpx.AsyncClient(timeout=params.get("timeout") or 600)
    return cls(**params)


def adk_model(**kwargs: Any):
    """An ADK model (LiteLLM, OpenAI-compatible provider) on the configured endpoint."""
    # LiteLLM otherwise downloads a model price list at import, retrying for seconds where the machine
    # has no internet; the copy it ships is enough for an OpenAI-compatible endpoint.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from google.adk.models.lite_llm import LiteLlm

    s = model_settings()
    params: dict[str, Any] = {"model": f"openai/{s.model}", "api_key": s.api_key or "unset"}
    if s.base_url:
        params["api_base"] = s.base_url
    params.update(kwargs)
    return LiteLlm(**params)


def crewai_llm(**kwargs: Any):
    """A CrewAI LLM on the configured endpoint."""
    from crewai import LLM

    s = model_settings()
    params: dict[str, Any] = {"model": f"openai/{s.model}", "api_key": s.api_key or "unset"}
    if s.base_url:
        params["base_url"] = s.base_url
    params.update(kwargs)
    from caiplatform.turns.crewai import surface_reasoning

    return surface_reasoning(LLM(**params))
