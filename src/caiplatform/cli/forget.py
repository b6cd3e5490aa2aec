"""`caiplatform forget USER_ID --project P`: erase a user id from the project's agents, with a receipt
(`--everywhere`: from every project, platform admin)."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import typer

from caiplatform.cli import commands, output
from caiplatform.cli.app import app
from caiplatform.cli.commands import JSON, field, run
from caiplatform.errors import BadRequest, NotFound


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
    project: str | None = typer.Option(None, "--project", "-p", help="The project: its id, slug or short name."),
    everywhere: bool = typer.Option(False, "--everywhere", help="Every project instead (platform admin)."),
    agent: list[str] | None = typer.Option(None, "--agent", "-a", help="Only this agent (repeatable); default every agent of the project (project admin)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the erasure is done and print its receipt."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for the erasure."),
    as_json: bool = JSON,
) -> int:
    """Erase USER_ID (the user id of invoke) from every store of the project's agents: sessions, memories,
    log history. Prints the receipt: what each store removed, counted."""
    interactive = sys.stderr.isatty() and not as_json

    def act() -> None:
        if (project is None) == (not everywhere) or (everywhere and agent):
            raise BadRequest("name one --project (optionally with --agent), or --everywhere")
        with commands.client() as c:
            if everywhere:
                started = [(field(e, "project_id"), e) for e in field(c.erasures.forget_everywhere(user_id=user_id), "erasures")]
            else:
                pid = project_id_of(c, project or "")
                started = [(pid, c.erasures.forget(pid, user_id=user_id, **({"agents": agent} if agent else {})))]
            finished = [_follow(c, pid, erasure, timeout, interactive) if wait else erasure for pid, erasure in started]
        if as_json:
            output.emit_json(finished if everywhere else finished[0])
            return
        for erasure in finished:
            _show(erasure, user_id)

    return run(act)


def _follow(c: Any, pid: str, erasure: Any, timeout: float, interactive: bool) -> Any:
    """Poll the erasure until it is done, printing each new stage on standard error (a terminal only)."""
    seen = {"stage": ""}

    def fetch() -> Any:
        value = c.erasures.get(pid, field(erasure, "erasure_id"))
        stage = _stage(value)
        if interactive and stage != seen["stage"]:
            seen["stage"] = stage
            output.errors_console.print(f"erasure {field(value, 'erasure_id')}: {stage}", highlight=False)
        return value

    return c.poll(fetch, lambda value: field(value, "state") == "done", timeout=timeout, interval=0.5)


def _show(erasure: Any, user_id: str) -> None:
    output.console.print(f"erasure {field(erasure, 'erasure_id')} of {user_id} in project "
                         f"{field(erasure, 'project_id')}: {_stage(erasure)}", highlight=False)
    rows = [{"agent": field(r, "agent"), "store": field(r, "store"),
             "removed": ", ".join(f"{k} {v}" for k, v in (field(r, "removed") or {}).items()) or "nothing"}
            for r in field(erasure, "receipts") or []]
    if rows:
        output.table(rows, ["agent", "store", "removed"])
