"""`caiplatform serve`."""

from __future__ import annotations

import argparse

import typer

from caiplatform import logjson
from caiplatform.cli.app import app
from caiplatform.cli.serve import APIS, serve
from caiplatform.startup import DEFAULT_LOG_LEVEL, LOG_LEVELS


@app.command("serve")
def serve_command(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8080, help="Port to listen on."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Durable state (default: $CAI_DATA_DIR or ./.caiplatform)."),
    api: list[str] | None = typer.Option(None, "--api", help=f"Serve only this API (repeatable): {', '.join(APIS)}; default all five."),
    log_level: str = typer.Option(DEFAULT_LOG_LEVEL, "--log-level",
                                  help=f"{'|'.join(LOG_LEVELS)}; default warning: one line per engine; info shows every library's lines."),
    scripted_model: bool = typer.Option(False, "--scripted-model",
                                        help="Start the project's scripted OpenAI-compatible model and point agents at it."),
    log_format: str | None = typer.Option(None, "--log-format",
                                          help="text|json; default $CAI_LOG_FORMAT or text. json: one object a line "
                                               "with request_id, trace_id and span_id (the workloads' lines too)."),
) -> int:
    """Serve the platform's HTTP APIs on one port."""
    unknown = [name for name in api or [] if name not in APIS]
    if unknown:
        raise typer.BadParameter(f"unknown API {unknown[0]!r}; choose from {', '.join(APIS)}", param_hint="--api")
    if log_level not in LOG_LEVELS:
        raise typer.BadParameter(f"choose from {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    try:
        fmt = logjson.chosen(log_format)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-format") from None
    args = argparse.Namespace(host=host, port=port, data_dir=data_dir, apis=api or None, log_level=log_level,
                              scripted_model=scripted_model, log_format=fmt)
    code = serve(args)
    if code:
        raise typer.Exit(code)
    return 0
