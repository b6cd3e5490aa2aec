"""Name and id rules of the specification, each with its exact message.

Validators raise `BadRequest` (or the error class given) and return the value they accept, so that
services read as `name = validation.agent_name(raw)`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from caiplatform.errors import BadRequest, MethodNotAllowed, NotFound, PlatformError

AGENT_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
SESSION_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
USER_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$")
MCP_SERVER_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
MCP_TOOL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
SERVICE_ACCOUNT_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1035 label
SERVERLESS_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,50}[a-z0-9])?$")
TOPIC_NAME = re.compile(r"^[a-z]([a-z0-9-]*[a-z0-9])?$")
MEMORYSTORE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
INDEX_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

PASSWORD_MIN_LENGTH = 12


def agent_name(value: Any, message: str = "invalid agent name (must be a lowercase DNS label)") -> str:
    if not isinstance(value, str) or not AGENT_NAME.match(value):
        raise BadRequest(message)
    return value


def session_id(value: Any) -> str:
    if not isinstance(value, str) or not SESSION_ID.match(value):
        raise BadRequest("invalid session id")
    return value


def user_id(value: Any) -> str:
    if not isinstance(value, str) or not USER_ID.match(value):
        raise BadRequest(f"invalid user_id: must match {USER_ID.pattern}")
    return value


def env_name(value: Any, message_prefix: str = "invalid secret key (must be a valid environment variable name): ") -> str:
    if not isinstance(value, str) or not ENV_NAME.match(value):
        raise BadRequest(f"{message_prefix}{value}")
    return value


def email(value: Any) -> str:
    if not isinstance(value, str) or not EMAIL.match(value.strip()):
        raise BadRequest("a valid e-mail address is required")
    return value.strip().lower()


def password(value: Any) -> str:
    if not isinstance(value, str) or len(value) < PASSWORD_MIN_LENGTH:
        raise BadRequest(f"password must be at least {PASSWORD_MIN_LENGTH} characters")
    return value


def project_uuid(value: str, error: type[PlatformError] = BadRequest) -> str:
    """A project id in a path must be a UUID. The core API answers 400; several document-3 APIs 404."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        if error is NotFound:
            raise NotFound("not found") from None
        raise error("malformed project id: must be a UUID") from None


def is_uuid(value: Any) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def resource_segment(segment: str, verbs: tuple[str, ...], unknown_verb: Callable[[str], str]) -> str:
    """The resource name in a path segment read with GET, PATCH or DELETE. APIs whose methods ride on the
    segment (`<name>:<verb>`, always POST) answer such a segment as a method: one of their verbs with
    another HTTP method is 405, any other verb the 404 `unknown_verb(verb)`."""
    name, colon, verb = segment.partition(":")
    if not colon:
        return segment
    if verb in verbs:
        raise MethodNotAllowed(f"':{verb}' is called with POST")
    raise NotFound(unknown_verb(verb))
