"""`caiplatform forget USER_ID --project P`: erase a user id from the project's agents, with a receipt."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import typer

from caiplatform.cli import commands, output
from caiplatform.cli.app import app
from caiplatform.cli.commands import JSON, field, run
from caiplatform.errors import NotFound


def project_id_of(c: Any, project: str) -> str:
    """A project id from its id, slug or short name (the erasure routes take the id)."""
    try:
        return str(uuid.UUID(project))
    except ValueError:
        pass
    for item in c.projects.list():
        if project in (field(item, "slug"), field(item, "short"), field(item, "id")):
            return str(field(item, "id"))
    raise NotFound(f"project {project} not found")


def _stage(erasure: Any) -> str:
    return f"{field(erasure, 'state')}: {field(erasure, 'steps_done')}/{field(erasure, 'steps_total')} stores"


@app.command()
def forget(
    user_id: str,
    project: str = typer.Option(..., "--project", "-p", help="The project: its id, slug or short name."),
    agent: list[str] | None = typer.Option(None, "--agent", "-a", help="Only this agent (repeatable); default every agent of the project (project admin)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the erasure is done and print its receipt."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for the erasure."),
    as_json: bool = JSON,
) -> int:
    """Erase USER_ID (the user id of invoke) from every store of the project's agents: sessions, memories,
    log history. Prints the receipt: what each store removed, counted."""
    interactive = sys.stderr.isatty() and not as_json

    def act() -> None:
        with commands.client() as c:
            pid = project_id_of(c, project)
            erasure = c.erasures.forget(pid, user_id=user_id, **({"agents": agent} if agent else {}))
            if wait:
                seen = {"stage": ""}

                def fetch() -> Any:
                    value = c.erasures.get(pid, field(erasure, "erasure_id"))
                    stage = _stage(value)
                    if interactive and stage != seen["stage"]:
                        seen["stage"] = stage
                        output.errors_console.print(f"erasure {field(value, 'erasure_id')}: {stage}", highlight=False)
                    return value

                erasure = c.poll(fetch, lambda value: field(value, "state") == "done", timeout=timeout, interval=0.5)
        if as_json:
            output.emit_json(erasure)
            return
        output.console.print(f"erasure {field(erasure, 'erasure_id')} of {user_id}: {_stage(erasure)}", highlight=False)
        rows = [{"agent": field(r, "agent"), "store": field(r, "store"),
                 "removed": ", ".join(f"{k} {v}" for k, v in (field(r, "removed") or {}).items()) or "nothing"}
                for r in field(erasure, "receipts") or []]
        if rows:
            output.table(rows, ["agent", "store", "removed"])

    return run(act)
