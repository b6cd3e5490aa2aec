"""How a failed turn reads to the caller (document 1: "upstream detail errors are normalized into the
envelope"): one line, no server paths, and the missing setting named when an agent could not reach a
model because its environment names none. The harness applies it (it knows the agent's environment);
the control plane's 502 then keeps that line (`redaction.one_line`)."""

from __future__ import annotations

import re

from caiplatform.redaction import one_line

# The one wording of "agents have no model": the 502 of a turn that could not reach one, and the deploy's
# note and the agent view's message (services/agents/).
NO_MODEL_ENDPOINT = (
    "no model endpoint is configured: set MODEL_BASE_URL (an OpenAI-compatible endpoint, with MODEL_API_KEY "
    "and MODEL_NAME) on the server, or MODEL_BASE_URL in the agent's env; to try agents without a model "
    "account, start the server with `caiplatform serve --scripted-model`"
)
_CONNECTION_FAILURE = re.compile(r"(?i)connection ?error|connecterror|connection refused")


def upstream_reason(detail: str, *, agent: bool, model_base_url: str | None) -> str:
    """The caller's one line for `detail` (an upstream message, traceback or not)."""
    reason = one_line(detail) or "the agent failed without a message"
    if agent and not model_base_url and _CONNECTION_FAILURE.search(reason) and NO_MODEL_ENDPOINT not in reason:
        reason = f"{reason} ({NO_MODEL_ENDPOINT})"
    return reason
