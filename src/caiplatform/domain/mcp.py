"""Hosted MCP servers' rules with the specification's messages (document 2, "MCP servers"): the create and
publish bodies, version numbers and verbs. The request models run them (`models/mcp.py`); the service
orchestrates."""

from __future__ import annotations

import re
from typing import Any

from caiplatform.errors import BadRequest
from caiplatform.validation import MCP_SERVER_NAME

NAME_MESSAGE = "missing or invalid 'name' (must be a lowercase DNS label, <=40 chars)"
EXPOSE_MESSAGE = "'expose' must be \"\" (cluster-local) or \"apps\""
TOOL_NAME_MESSAGE = "invalid tool name (must be a lowercase identifier not starting with '_')"
HANDLER_MESSAGE = (
    "missing 'handler': send the complete Python module of the tool "
    "(import caiplatform.mcp and decorate one function with @tool)"
)
VERSION_MESSAGE = "version must be a positive integer"
VERSION_VERBS = ("rollback", "yank", "unyank")


def parse_credential_keys(body: dict[str, Any]) -> list[str]:
    raw = body.get("credential_keys", body.get("credentialKeys"))
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(k, str) and k for k in raw):
        raise BadRequest("'credential_keys' must be a list of secret names")
    return list(dict.fromkeys(raw))


def parse_server_create(body: dict[str, Any]) -> tuple[str, str]:
    """A create body's `(name, expose)`; other fields are ignored silently."""
    name = body.get("name")
    if not isinstance(name, str) or not MCP_SERVER_NAME.match(name):
        raise BadRequest(NAME_MESSAGE)
    expose = body.get("expose", "")
    if expose is None:
        expose = ""
    if expose not in ("", "apps"):
        raise BadRequest(EXPOSE_MESSAGE)
    return name, expose


def parse_tool(body: dict[str, Any]) -> tuple[str, str, dict[str, Any], list[str]]:
    """A publish body's `(handler, description, schema, credential keys)`."""
    handler = body.get("handler")
    if not isinstance(handler, str) or not handler.strip():
        raise BadRequest(HANDLER_MESSAGE)
    description = body.get("description") or ""
    if not isinstance(description, str):
        raise BadRequest("'description' must be a string")
    schema = body.get("schema") or {}
    if not isinstance(schema, dict):
        raise BadRequest("'schema' must be a JSON object")
    return handler, description, schema, parse_credential_keys(body)


def parse_version(raw: str) -> int:
    if not re.fullmatch(r"[0-9]+", raw or "") or int(raw) < 1:
        raise BadRequest(VERSION_MESSAGE)
    return int(raw)
