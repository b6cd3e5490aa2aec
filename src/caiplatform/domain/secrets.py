"""The project secret store's rules with the specification's messages (document 2, "Project secrets"):
names, values, read-token TTLs, binding pins, body caps and verbs. The request models run them
(`models/secrets.py`); the service orchestrates."""

from __future__ import annotations

from typing import Any

from caiplatform.errors import BadRequest, NotFound
from caiplatform.ports.secrets import clamp_ttl
from caiplatform.validation import SECRET_NAME

MAX_VALUE_BYTES = 65536
CREATE_BODY_LIMIT = 128 * 1024
BINDING_BODY_LIMIT = 8 * 1024

#: The cloud credential is kept by the platform-cloud routes, never through the secret routes.
RESERVED_SECRET_NAMES = ("crusoe-cloud-credential", "platform-cloud-credential")
SECRET_VERBS = ("reveal", "issue-token")
PROJECT_SECRET_VERBS = ("issue-token",)
SECRET_MAP_VERBS = ("apply",)

NAME_MESSAGE = (
    "missing or invalid 'name' (1 to 63 characters: letters, digits, '_' and '-', starting with a letter "
    "or digit; must match ^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$)"
)
VALUE_MISSING_MESSAGE = "missing or empty 'value' (a non-empty string is required)"
VALUE_TOO_LARGE_MESSAGE = f"'value' is too large: at most {MAX_VALUE_BYTES} bytes"
REVEAL_NOT_AUDITED_MESSAGE = (
    "the reveal could not be written to the audit log, so no value was returned; try again later"
)
SECRET_NAME_REQUIRED_MESSAGE = "'secret_name' is required (the name of a secret of this project)"
PIN_MESSAGE = "version must be a positive integer, or null to track the newest version"
TTL_MESSAGE = "ttl_seconds must be a number of seconds"


def reserved_name_message(name: str) -> str:
    return (
        f"{name} is a reserved platform name (platform-cloud-credential): the project's cloud credential is "
        "managed with the cloud-credential routes GET, PUT and DELETE /v1/projects/{projectID}/platform-cloud"
    )


def unknown_verb_message(verb: str, supported: tuple[str, ...]) -> str:
    listed = ", ".join(f":{v}" for v in supported)
    return f"unknown action ':{verb}'; supported verbs here: {listed}"


def check_value(value: Any) -> str:
    """A secret's value: a non-empty string of at most 65536 bytes."""
    if not isinstance(value, str) or value == "":
        raise BadRequest(VALUE_MISSING_MESSAGE)
    if len(value.encode("utf-8")) > MAX_VALUE_BYTES:
        raise BadRequest(VALUE_TOO_LARGE_MESSAGE)
    return value


def check_name(raw: Any) -> str:
    """A secret name (400 with the spec's pattern); the reserved cloud credential is a 404."""
    if not isinstance(raw, str) or not SECRET_NAME.match(raw):
        raise BadRequest(NAME_MESSAGE)
    if raw in RESERVED_SECRET_NAMES:
        raise NotFound(reserved_name_message(raw))
    return raw


def ttl_of(raw: Any) -> int:
    """A requested TTL: absent is 300, more than 3600 is 3600 (silently); not a number is a 400."""
    if raw is None:
        return clamp_ttl(None)
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise BadRequest(TTL_MESSAGE)
    return clamp_ttl(int(raw))


def pin_of(raw: Any) -> int | None:
    """A binding's pinned version: null, absent or "latest" track the newest; a digit string is a number."""
    if raw is None:
        return None
    if isinstance(raw, str) and raw.strip().lower() == "latest":
        return None
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise BadRequest(PIN_MESSAGE)
    return raw
