"""`caiplatform serve`: the platform's HTTP APIs on one port, on the engines it starts itself."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

APIS = ("core", "serverless", "pubsub", "memorystore", "vectordb")


def serve(args: argparse.Namespace) -> int:
    from caiplatform import logjson
    from caiplatform.startup import configure_logging, scripted_model

    configure_logging(args.log_level)
    logjson.configure(getattr(args, "log_format", "text"))
    with contextlib.ExitStack() as stack:
        model = stack.enter_context(scripted_model()) if args.scripted_model else None
        return _serve(args, model)


def _serve(args: argparse.Namespace, model: dict[str, str] | None) -> int:
    import uvicorn

    from caiplatform import logjson, tracing
    from caiplatform.errors import PlatformError
    from caiplatform.platform import Platform
    from caiplatform.settings import Settings
    from caiplatform.startup import startup_log
    from caiplatform.web import serving
    from caiplatform_server.app import create_app

    os.umask(0o077)  # the server's own files (database, keys, engine state, logs) are owner-only
    settings = Settings()
    updates: dict[str, object] = {}
    if args.data_dir:
        updates["data_dir"] = Path(args.data_dir)
    updates["bind_host"] = args.host  # who may read /metrics anonymously (docs/observability.md)
    if not settings.base_url:
        updates["base_url"] = f"http://{args.host}:{args.port}"
    if model is not None:
        updates.update(model_base_url=model["MODEL_BASE_URL"], model_api_key=model["MODEL_API_KEY"],
                       model_name=model["MODEL_NAME"])
        startup_log.info("scripted model: %s (it echoes `you said: <message>`; agents use it)", model["MODEL_BASE_URL"])
    settings = settings.model_copy(update=updates)
    # Traces when OTEL_EXPORTER_OTLP_ENDPOINT (or the traces one) is set; nothing of the SDK otherwise.
    traced = tracing.setup()
    try:
        platform = Platform.from_settings(settings)
    except PlatformError as exc:  # e.g. a bootstrap password under 12 characters: say so, no traceback
        print(f"caiplatform serve: {exc.message}", file=sys.stderr)
        return 2
    if traced:
        tracing.instrument_engine(platform.db.engine)
        startup_log.info("tracing: OTLP/HTTP to %s", tracing.traces_endpoint(os.environ))
    refusal = sandbox_refusal(platform)
    if refusal:
        print(f"caiplatform serve: {refusal}", file=sys.stderr)
        return 2
    apis = args.apis or APIS
    app = create_app(platform, apis=apis)
    log_config = logjson.uvicorn_log_config(args.log_level)  # JSON lines: uvicorn's through the root's handler
    config = serving.uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level,
                                    forwarded_allow_ips=settings.cai_forwarded_allow_ips,
                                    **({"log_config": log_config} if log_config else {}))

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
            await super().startup(sockets)
            if self.started:
                startup_log.info("serving %s on http://%s:%d", ", ".join(apis), args.host, args.port)

    AnnouncingServer(config).run()
    return 0


def sandbox_refusal(platform: object) -> str | None:
    """Deployed code runs only in the sandbox, unless the operator opted out (logged, shown in /healthz)."""
    from caiplatform.startup import startup_log

    status = platform.sandbox_status()  # type: ignore[attr-defined]
    if status["status"] == "off":
        startup_log.warning(
            "CAI_LOCAL_SANDBOX=off: deployed code (agents, functions, services, MCP servers, builds) runs "
            "WITHOUT a sandbox, with this server's rights and files in view")
    elif status["status"] == "unavailable":
        return f"refusing to run workloads: {status['detail']}"
    elif status["status"] == "on":
        startup_log.info("sandbox: deployed code runs confined (%s)", status["detail"])
        if status.get("network") == "host":
            startup_log.warning(
                "CAI_SANDBOX_NETWORK=host: deployed code shares this machine's network and reaches every "
                "port on it (other workloads, the engines)")
    return None
