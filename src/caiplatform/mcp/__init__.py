"""The helper module that hosted MCP tool handlers import.

A tool handler is a complete Python module, stored as `tools/<name>.py`:

    from caiplatform.mcp import tool, secret

    @tool(credential_keys=["WEATHER_API_KEY"])
    def forecast(city: str, days: int = 1) -> str:
        '''Forecast the weather for a city.'''
        key = secret("WEATHER_API_KEY")
        ...

`secret(name)` (`await asecret(name)` in an async tool) reads a project secret at call time through the workload helper; the name must be one
the built version declared in its credential keys, otherwise the read raises.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])

TOOL_MARK = "__cai_mcp_tool__"
CREDENTIAL_KEYS_ENV = "CAI_MCP_CREDENTIAL_KEYS"


class UndeclaredCredentialError(PermissionError):
    """A tool read a secret its server version did not declare."""


@overload
def tool(fn: F) -> F: ...
@overload
def tool(*, credential_keys: Iterable[str] = (), description: str | None = None) -> Callable[[F], F]: ...


def tool(fn: Any = None, *, credential_keys: Iterable[str] = (), description: str | None = None) -> Any:
    """Mark a function as the module's MCP tool, optionally declaring the secrets it reads."""

    def mark(func: F) -> F:
        setattr(func, TOOL_MARK, {"credential_keys": list(credential_keys), "description": description})
        return func

    return mark(fn) if fn is not None else mark


def declared_credential_keys() -> set[str]:
    raw = os.environ.get(CREDENTIAL_KEYS_ENV, "[]")
    try:
        keys = json.loads(raw)
    except ValueError:
        return set()
    return {str(k) for k in keys} if isinstance(keys, list) else set()


def _require_declared(name: str) -> None:
    if name not in declared_credential_keys():
        raise UndeclaredCredentialError(
            f"secret {name!r} is not declared in this MCP server version's credential keys; "
            "declare it with @tool(credential_keys=[...]) and publish again"
        )


def secret(name: str) -> str:
    """A project secret's current value, for a name declared in the version's credential keys."""
    _require_declared(name)
    from caiplatform import workload

    return workload.get_secret(name)


async def asecret(name: str) -> str:
    """`secret` for `async def` tools: the read does not block the server's event loop."""
    _require_declared(name)
    from caiplatform import workload

    return await workload.aget_secret(name)
