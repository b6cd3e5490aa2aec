"""The typer application and the options every remote command shares."""

from __future__ import annotations

from dataclasses import dataclass

import typer

app = typer.Typer(name="caiplatform", no_args_is_help=True, add_completion=False,
                  help="caiplatform: an agent platform. `serve` runs it; the other commands drive a running one.")


@dataclass
class Target:
    base_url: str | None = None
    token: str | None = None


TARGET = Target()


@app.callback()
def connection(
    base_url: str | None = typer.Option(None, "--base-url", envvar="CAI_BASE_URL",
                                        help="The platform's address (default: the stored login's, else http://127.0.0.1:8080)."),
    token: str | None = typer.Option(None, "--token", envvar="CAI_TOKEN", help="A session token or an API key."),
) -> None:
    TARGET.base_url, TARGET.token = base_url, token


def client():  # type: ignore[no-untyped-def]
    from caiplatform.client import Client

    return Client(TARGET.base_url, token=TARGET.token)
