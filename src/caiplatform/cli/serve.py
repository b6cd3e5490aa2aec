"""`caiplatform serve`: the platform's HTTP APIs on one port, on the engines it starts itself."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

APIS = ("core", "serverless", "pubsub", "memorystore", "vectordb")


def serve(args: argparse.Namespace) -> int:
    probe = probe_sandbox_early()
    from caiplatform import logjson
    from caiplatform.startup import configure_logging, scripted_model

    configure_logging(args.log_level)
    logjson.configure(getattr(args, "log_format", "text"))
    try:
        with contextlib.ExitStack() as stack:
            model = stack.enter_context(scripted_model()) if args.scripted_model else None
            return _serve(args, model)
    finally:
        probe.join(PROBE_JOIN_SECONDS)  # never left half done (its probe network is closed by it)


PROBE_JOIN_SECONDS = 30.0


def probe_sandbox_early() -> threading.Thread:
    """The sandbox's probe (a sandboxed `true`, a probe network: child processes, about 1.7 s on a loaded
    2-core machine) in a thread from the first moment, while the server imports its modules and opens its
    database; `sandbox_refusal` reads its outcome later, in order (the probe is made once per process and
    waited for under its lock), and nothing runs in the sandbox before (docs/performance.md, "Restart")."""

    def probe() -> None:
        try:
            from caiplatform.sandbox import shared_sandbox
            from caiplatform.settings import Settings

            shared_sandbox(Settings()).describe()  # type: ignore[call-arg]  # (from the environment)
        except Exception:  # noqa: BLE001 - the same probe runs again where its answer is used, and says why
            return

    thread = threading.Thread(target=probe, name="cai-sandbox-probe", daemon=True)
    thread.start()
    return thread


def _serve(args: argparse.Namespace, model: dict[str, str] | None) -> int:
    import uvicorn

    from caiplatform import logjson, tracing
    from caiplatform.errors import PlatformError
    from caiplatform.platform import Platform
    from caiplatform.settings import Settings
    from caiplatform.startup import startup_log
    from caiplatform.web import serving

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
    failed: list[BaseException] = []

    def start_failed(exc: BaseException) -> None:  # the engines did not come up: stop serving
        failed.append(exc)
        server.should_exit = True

    # The app is set below, once built (`config.load()` reads it when the server starts).
    log_config = logjson.uvicorn_log_config(args.log_level)  # JSON lines: uvicorn's through the root's handler
    config = serving.uvicorn_config(None, host=args.host, port=args.port, log_level=args.log_level,
                                    forwarded_allow_ips=settings.cai_forwarded_allow_ips,
                                    **({"log_config": log_config} if log_config else {}))

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
            await super().startup(sockets)
            if self.started:
                startup_log.info("serving %s on http://%s:%d", ", ".join(apis), args.host, args.port)

    server = AnnouncingServer(config)

    def build_app() -> Any:
        from caiplatform_server.app import create_app

        return create_app(platform, apis=apis, answer_while_starting=True, on_start_failed=start_failed)

    async def run() -> None:
        # The platform starts first (docs/performance.md, "Restart"): the instances that ran at the stop
        # import their frameworks in their own processes while this one builds its app in a worker thread;
        # the app then answers at once, each request waiting for the engines its route needs.
        # Until uvicorn takes the signals over, a stop asked for meanwhile stops what has started (the engines'
        # processes) rather than leaving them behind.
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        signals = (signal.SIGINT, signal.SIGTERM)
        for signum in signals:
            loop.add_signal_handler(signum, stop.set)
        starting = platform.start_soon()
        building = asyncio.ensure_future(asyncio.to_thread(build_app))
        try:
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait((building, stopped), return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if stop.is_set():
                raise asyncio.CancelledError
            config.app = building.result()
        except BaseException:
            starting.cancel()
            await asyncio.gather(starting, building, return_exceptions=True)
            await platform.aclose()
            if stop.is_set():
                return
            raise
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
        await server.serve()

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(run())
    if failed:
        print(f"caiplatform serve: the platform could not start: {failed[0]}", file=sys.stderr)
        return 3
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
