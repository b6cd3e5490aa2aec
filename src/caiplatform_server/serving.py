"""How uvicorn runs an app lives in `caiplatform.web.serving` (the harness and MCP servers use it too);
these are its names, for callers of the server package."""

from caiplatform.web.serving import EnvelopeH11Protocol, run, server, uvicorn_config

__all__ = ["EnvelopeH11Protocol", "run", "server", "uvicorn_config"]
