"""`python -m caiplatform.harness`: serve the agent described by the environment on the Unix socket
`$CAI_HARNESS_SOCKET` (the local runtime's: only the platform can open it), else on 127.0.0.1:$PORT."""

from __future__ import annotations

import logging
import os
import sys

from caiplatform import logjson, tracing
from caiplatform.harness.app import create_harness_app
from caiplatform.sandbox.limits import OUT_OF_MEMORY_EXIT, memory_rlimit
from caiplatform.web import serving

log = logging.getLogger("caiplatform.harness")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format=logjson.TEXT_FORMAT)
    try:  # the server's format, set by the runtime (CAI_LOG_FORMAT): JSON lines carry the request's ids
        logjson.configure(logjson.chosen(env=os.environ))
    except ValueError:
        pass
    # Spans only when the platform traces and gave this instance its collector (caiplatform.tracing).
    tracing.setup_workload(os.environ)
    app = create_harness_app(dict(os.environ))
    port = int(os.environ.get("PORT") or 8080)
    # Access lines and start-up go to the instance's output, which the runtime keeps as the agent's logs.
    socket = os.environ.get("CAI_HARNESS_SOCKET") or None
    log_config = logjson.uvicorn_log_config("info")
    server = serving.server(app, host=os.environ.get("CAI_HARNESS_HOST", "127.0.0.1"), port=port,
                            log_level="info", access_log=True, uds=socket,
                            **({"log_config": log_config} if log_config else {}))
    limit = memory_rlimit()
    if limit is not None:
        # The sandbox's rlimit fallback: an allocation over the limit fails instead of a kill. The instance
        # ends after the request that ran out (its answer is sent) with the exit code the runtime reports
        # as `OOMKilled` (docs/decisions/sandbox.md).
        def out_of_memory() -> None:
            if not server.should_exit:
                log.error("out of memory (limit %d MiB): the instance stops", limit // 2**20)
            server.should_exit = True

        app.harness.on_out_of_memory = out_of_memory  # type: ignore[attr-defined]
    server.run()
    tracing.shutdown()  # what is still queued goes before the process ends
    if limit is not None and app.harness.out_of_memory:  # type: ignore[attr-defined]
        sys.exit(OUT_OF_MEMORY_EXIT)


if __name__ == "__main__":
    main()
