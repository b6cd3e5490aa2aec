"""The scripted model server for tests: it lives in `caiplatform.scripted_model`, since `caiplatform serve
--scripted-model` runs it too (a production module imports nothing from `caiplatform.testing`)."""

from caiplatform.scripted_model import (
    MODEL_NAME,
    ChatRequest,
    ScriptedModel,
    Step,
    ToolCall,
    echo,
    message_text,
    model_env,
    tokens,
    tool_step,
)

__all__ = ["MODEL_NAME", "ChatRequest", "ScriptedModel", "Step", "ToolCall", "echo", "message_text", "model_env",
           "tokens", "tool_step"]
