"""The commands that drive a running platform through `caiplatform.client.Client`."""

from __future__ import annotations

import getpass
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer

from caiplatform.cli import output
from caiplatform.cli.app import TARGET, app, client
from caiplatform.errors import PlatformError

JSON = typer.Option(False, "--json", help="Print JSON (for scripts) instead of a table.")
PROJECT = typer.Option(None, "--project", "-p", help="The project (its slug for agent routes, its id elsewhere).")


def field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def run(action: Any) -> int:
    """Run a command's body; a platform error prints one line and picks the exit code."""
    try:
        action()
    except PlatformError as exc:
        raise typer.Exit(output.fail(exc)) from None
    return 0


# -- login ---------------------------------------------------------------------------------------------


@app.command()
def login(
    email: str = typer.Option(..., "--email", prompt=True, help="Your account's e-mail."),
    password: str | None = typer.Option(None, "--password", help="Prompted (hidden) when left out."),
) -> int:
    """Sign in and keep the session token in your config directory (owner-only permissions)."""
    from caiplatform.client._base import StoredLogin, write_stored_login

    def act() -> None:
        secret = password if password is not None else getpass.getpass("Password: ")
        with client() as c:
            signed_in = c.auth.login(email=email, password=secret)
            path = write_stored_login(StoredLogin(c.base_url, field(signed_in, "token")))
        output.errors_console.print(f"signed in to {c.base_url} as {email}; token stored in {path}", highlight=False)

    return run(act)


# -- agents --------------------------------------------------------------------------------------------

agents = typer.Typer(help="Agents and functions.", no_args_is_help=True)
app.add_typer(agents, name="agents")


@agents.command("list")
def agents_list(project: str | None = PROJECT, as_json: bool = JSON) -> int:
    """Agents and functions you may manage."""
    def act() -> None:
        with client() as c:
            items = list(c.agents.list(project=project))
        if as_json:
            output.emit_json(items)
        else:
            output.table(items, ["name", "kind", "framework", "state", "ready", "latest_revision"])
    return run(act)


@agents.command("get")
def agents_get(name: str, project: str | None = PROJECT, as_json: bool = JSON) -> int:
    """One agent."""
    def act() -> None:
        with client() as c:
            output.show(c.agents.get(name, project=project), as_json)
    return run(act)


@agents.command("delete")
def agents_delete(name: str, project: str | None = PROJECT, as_json: bool = JSON) -> int:
    """Delete an agent (its sessions stay)."""
    def act() -> None:
        with client() as c:
            answer = c.agents.delete(name, project=project)
        if as_json:
            output.emit_json(answer or {"deleted": name})
        else:
            output.console.print(f"deleted {name}", highlight=False)
    return run(act)


@app.command()
def deploy(
    directory: Path = typer.Argument(..., exists=True, file_okay=True, dir_okay=True, help="The source directory (or a .tar.gz)."),
    name: str | None = typer.Option(None, "--name", help="The agent's name (default: the directory's)."),
    framework: str | None = typer.Option(None, "--framework", help="Default: read off the entry file (crew.py, graph.py, agent.py, main.py, ...)."),
    project: str | None = PROJECT,
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the agent is ready or its build fails."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for ready."),
    as_json: bool = JSON,
) -> int:
    """Deploy DIR: tar it (honouring .caiignore), upload, follow the build; non-zero when the build fails."""
    from caiplatform.client.source import detect_framework, included_files, tar_directory

    agent = name or directory.resolve().name.lower().replace("_", "-")
    interactive = sys.stderr.isatty() and not as_json

    def act() -> None:
        chosen = framework or (detect_framework(directory) if directory.is_dir() else None)
        code = tar_directory(directory) if directory.is_dir() else directory.read_bytes()
        if interactive:
            count = len(included_files(directory)) if directory.is_dir() else 1
            output.errors_console.print(f"uploading {agent} ({chosen or 'adk'}): {count} files, {len(code)} bytes",
                                        highlight=False)
        with client() as c:
            accepted = c.agents.deploy_source(code, name=agent, framework=chosen, project=project)
            if not wait:
                output.show(accepted, as_json)
                return
            ready = _follow(c, agent, project, timeout, interactive, lines=not as_json)
            address = callable_address(c.base_url, agent, project, ready)
        output.show(ready, as_json) if as_json else output.console.print(f"{agent} is ready: {address}",
                                                                          highlight=False)

    return run(act)


def callable_address(base_url: str, agent: str, project: str | None, view: Any) -> str:
    """What the person who deployed can call: the platform's invoke route, and the published address when
    there is one. The view's `url` is the platform's internal name for the agent (a cluster's service
    name, or a loopback port of one machine's runtime): it stays in `agents get`, not here."""
    route = f"POST {base_url.rstrip('/')}/v1/agents/{quote(agent)}/invoke"
    if project:
        route += f"?project={quote(project)}"
    published = field(view, "external_url")
    return f"{published} (published), or {route}" if published else route


def _follow(c: Any, agent: str, project: str | None, timeout: float, interactive: bool, lines: bool = True) -> Any:
    """Follow the build: its log lines as the builder writes them (`lines`: on standard error), then poll
    the agent until it is ready or failed. On a terminal a spinner shows the current step and how long it
    has run."""
    from caiplatform.errors import FailedDependency

    last = {"state": None}

    def fetch() -> Any:
        view = c.agents.get(agent, project=project)
        state = field(view, "state")
        if state != last["state"]:
            last["state"] = state
            progress.step(f"{agent}: {state}")
        return view

    def settled(view: Any) -> bool:
        if field(view, "state") == "failed":
            raise FailedDependency(field(view, "message") or f"the build of {agent} failed")
        return bool(field(view, "ready"))

    with _Progress(f"{agent}: building") if interactive else _null() as progress:
        if lines:
            try:
                for line in c.agents.build_log(agent, project=project, follow=True):
                    progress.line(line)
            except PlatformError as exc:  # a server without the build log: the states alone, as before
                if exc.status_code not in (404, 405):
                    raise
        return c.poll(fetch, settled, timeout=timeout, interval=0.5)


class _Progress:
    """A spinner with the current step and its elapsed time (rich), the build's lines printed above it."""

    def __init__(self, first: str):
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(SpinnerColumn("dots"), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=output.errors_console, transient=True)
        self._task = self._progress.add_task(first, total=None)
        self._agent = first.split(":", 1)[0]

    def __enter__(self) -> _Progress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def step(self, text: str) -> None:
        """A new step: its elapsed time starts again."""
        self._progress.reset(self._task, description=text)

    def line(self, text: str) -> None:
        self._progress.console.print(text, highlight=False, markup=False, soft_wrap=True)
        if text.strip():
            shown = text.strip() if len(text.strip()) <= 60 else text.strip()[:57] + "..."
            self.step(f"{self._agent}: building: {shown}")


class _null:
    def __enter__(self) -> _null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def step(self, *args: object) -> None:
        return None

    def line(self, text: str) -> None:
        output.errors_console.print(text, highlight=False, markup=False, soft_wrap=True)


@app.command()
def invoke(
    name: str,
    message: str,
    stream: bool = typer.Option(False, "--stream", help="Print the reply as it is written."),
    session: str | None = typer.Option(None, "--session", help="Continue this session."),
    user: str | None = typer.Option(None, "--user", help="The user id of the session."),
    project: str | None = PROJECT,
    as_json: bool = JSON,
) -> int:
    """Send MESSAGE to agent NAME and print the reply."""
    fields = {k: v for k, v in {"message": message, "session_id": session, "user_id": user}.items() if v is not None}

    def act() -> None:
        with client() as c:
            if not stream:
                reply = c.agents.invoke(name, project=project, **fields)
                output.emit_json(reply) if as_json else output.console.print(field(reply, "output"), highlight=False)
                return
            for line in c.agents.invoke_stream(name, project=project, **fields):
                event = json.loads(line) if isinstance(line, str) else output.plain(line)
                if as_json:
                    sys.stdout.write(json.dumps(event) + "\n")
                elif event.get("type") == "output":
                    sys.stdout.write(event.get("text", ""))
                    sys.stdout.flush()
                elif event.get("type") == "error":
                    raise PlatformError(event.get("message", "the turn failed"))
                elif event.get("type") == "done":
                    sys.stdout.write("\n")
    return run(act)


@app.command()
def logs(
    name: str,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    project: str | None = PROJECT,
) -> int:
    """Print an agent's logs (the newest instance's; -f follows)."""
    def act() -> None:
        with client() as c:
            for line in c.agents.logs(name, project=project, follow=follow or None):
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
    return run(act)


# -- project secrets ----------------------------------------------------------------------------------

secrets = typer.Typer(help="Project secrets.", no_args_is_help=True)
app.add_typer(secrets, name="secrets")


@secrets.command("set")
def secrets_set(project_id: str, name: str, value: str | None = typer.Option(
        None, "--value", help="Read from standard input when left out."), as_json: bool = JSON) -> int:
    """Create a secret or store a new version of it."""
    def act() -> None:
        secret = value if value is not None else sys.stdin.read().rstrip("\n")
        with client() as c:
            output.show(c.secrets.set(project_id, name=name, value=secret), as_json)
    return run(act)


@secrets.command("list")
def secrets_list(project_id: str, as_json: bool = JSON) -> int:
    """The project's secrets (metadata only)."""
    def act() -> None:
        with client() as c:
            items = list(c.secrets.list(project_id))
        output.emit_json(items) if as_json else output.table(items, ["name", "version", "created_at", "updated_at"])
    return run(act)


@secrets.command("reveal")
def secrets_reveal(project_id: str, name: str, as_json: bool = JSON) -> int:
    """Print a secret's value (project admins)."""
    def act() -> None:
        with client() as c:
            revealed = c.secrets.reveal(project_id, name)
        output.emit_json(revealed) if as_json else output.console.print(field(revealed, "value"), highlight=False)
    return run(act)


# -- messaging, vector, services -------------------------------------------------------------------------

topics = typer.Typer(help="Topics: publish and pull.", no_args_is_help=True)
app.add_typer(topics, name="topics")


@topics.command("publish")
def topics_publish(project_id: str, topic: str, data: list[str] = typer.Argument(..., help="One message per argument."),
                   as_json: bool = JSON) -> int:
    """Publish messages (text) to a topic."""
    def act() -> None:
        with client() as c:
            answer = c.topics.publish(project_id, topic, messages=[{"text": item} for item in data])
        output.show(answer, as_json)
    return run(act)


@topics.command("pull")
def topics_pull(project_id: str, topic: str, subscription: str,
                max_messages: int = typer.Option(10, "--max", help="At most this many messages."),
                ack: bool = typer.Option(False, "--ack", help="Acknowledge what was pulled."), as_json: bool = JSON) -> int:
    """Pull messages from a subscription (and acknowledge them with --ack)."""
    def act() -> None:
        with client() as c:
            pulled = c.subscriptions.pull(project_id, topic, subscription, max_messages=max_messages)
            received = field(pulled, "messages") or []
            if ack and received:
                c.subscriptions.acknowledge(project_id, topic, subscription,
                                            ack_ids=[field(m, "ack_id") for m in received])
        output.emit_json(pulled) if as_json else output.table(received, ["ack_id", "id", "data", "attributes", "delivery_attempt"])
    return run(act)


indexes = typer.Typer(help="Vector indexes.", no_args_is_help=True)
app.add_typer(indexes, name="indexes")


@indexes.command("list")
def indexes_list(project_id: str, as_json: bool = JSON) -> int:
    """The project's vector indexes."""
    def act() -> None:
        with client() as c:
            items = list(c.indexes.list(project_id))
        output.emit_json(items) if as_json else output.table(items, ["name", "dimensions", "distance", "state", "points_count"])
    return run(act)


@indexes.command("query")
def indexes_query(project_id: str, name: str, vector: str = typer.Argument(..., help="A JSON array of numbers."),
                  top_k: int = typer.Option(10, "--top-k"), as_json: bool = JSON) -> int:
    """The nearest points to VECTOR."""
    def act() -> None:
        with client() as c:
            found = c.indexes.query(project_id, name, vector=json.loads(vector), top_k=top_k)
        output.emit_json(found) if as_json else output.table(field(found, "results") or [], ["id", "score", "payload"])
    return run(act)


projects = typer.Typer(help="Projects.", no_args_is_help=True)
app.add_typer(projects, name="projects")


@projects.command("list")
def projects_list(as_json: bool = JSON) -> int:
    """Projects you can see."""
    def act() -> None:
        with client() as c:
            items = list(c.projects.list())
        output.emit_json(items) if as_json else output.table(items, ["id", "slug", "name", "role"])
    return run(act)


services = typer.Typer(help="Serverless services.", no_args_is_help=True)
app.add_typer(services, name="services")


@services.command("list")
def services_list(project_id: str, as_json: bool = JSON) -> int:
    """The project's serverless services."""
    def act() -> None:
        with client() as c:
            items = list(c.services.list(project_id))
        output.emit_json(items) if as_json else output.table(items, ["name", "ready", "url", "latest_revision"])
    return run(act)


_ = TARGET  # the connection options live on the app's callback
