"""How commands answer: a table or text for people, JSON for scripts, and exit codes by failure kind."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from caiplatform import errors

#: exit codes: 0 success, 1 unexpected, 2 usage, and one per kind of refusal
EXIT_CODES = {
    "bad_request": 3,  # 400, 409, 413: the request itself is wrong or conflicts
    "unauthenticated": 4,  # 401, 403: sign in (`caiplatform login`) or ask for the role
    "not_found": 5,
    "unavailable": 6,  # 429, 503, connection refused, timeout: retry later
    "build_failed": 7,  # a deploy whose build failed
    "server_error": 8,  # any other 5xx
}

console = Console()
errors_console = Console(stderr=True)


def plain(value: Any) -> Any:
    """A model or a list of models as JSON-ready data."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(plain(value), indent=2, sort_keys=False) + "\n")


def table(rows: Iterable[Any], columns: Sequence[str], *, title: str | None = None) -> None:
    grid = Table(title=title)
    for column in columns:
        grid.add_column(column)
    for row in rows:
        data = plain(row)
        grid.add_row(*[_cell(data.get(column) if isinstance(data, dict) else None) for column in columns])
    console.print(grid)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def show(value: Any, as_json: bool) -> None:
    """One object: JSON, or its fields one per line."""
    if as_json:
        emit_json(value)
        return
    data = plain(value)
    if isinstance(data, dict):
        width = max((len(k) for k in data), default=0)
        for key, item in data.items():
            console.print(f"[bold]{key.ljust(width)}[/bold]  {_cell(item)}", highlight=False)
    else:
        console.print(_cell(data), highlight=False)


def exit_code_for(error: BaseException) -> int:
    from caiplatform.client import APIConnectionError

    if isinstance(error, APIConnectionError | errors.Unavailable | errors.RateLimited):
        return EXIT_CODES["unavailable"]
    if isinstance(error, errors.Unauthenticated | errors.Forbidden):
        return EXIT_CODES["unauthenticated"]
    if isinstance(error, errors.NotFound):
        return EXIT_CODES["not_found"]
    if isinstance(error, errors.FailedDependency):
        return EXIT_CODES["build_failed"]
    if isinstance(error, errors.PlatformError) and error.status_code < 500:
        return EXIT_CODES["bad_request"]
    return EXIT_CODES["server_error"]


def fail(error: BaseException) -> int:
    message = getattr(error, "message", None) or str(error)
    request_id = getattr(error, "request_id", None)
    errors_console.print(f"[red]error:[/red] {message}" + (f" [dim](request {request_id})[/dim]" if request_id else ""),
                         highlight=False)
    return exit_code_for(error)
