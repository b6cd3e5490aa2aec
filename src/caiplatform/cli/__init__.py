"""`caiplatform`: serve the platform, or drive a running one (`login`, `deploy`, `invoke`, `logs`, ...).

Commands that talk to a platform use `caiplatform.client.Client` with `--base-url`/`--token` or
`CAI_BASE_URL`/`CAI_TOKEN`/`CAI_API_KEY` or the login stored by `caiplatform login`. Tables for people,
`--json` for scripts; exit codes tell failure kinds apart (`caiplatform.cli.output.EXIT_CODES`).
"""

from __future__ import annotations

import sys

import typer

from caiplatform.cli import commands, forget, serve_command
from caiplatform.cli.app import app

__all__ = ["app", "main"]
_registered = (commands, forget, serve_command)  # the modules register their commands on import


def main(argv: list[str] | None = None) -> int:
    try:
        result = app(args=argv, prog_name="caiplatform", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except typer.TyperException as exc:  # a usage error: its message, exit code 2
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            print(f"error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
