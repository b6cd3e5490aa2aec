"""What `caiplatform serve` says when it starts, and the scripted model it can start for newcomers.

Start-up is quiet by default: the root log level is `warning`, so the libraries' INFO lines (Alembic's
migrations, the embedded OpenBao's HTTP calls, uvicorn's banner) stay out of sight; the
`caiplatform.startup` logger still says one line per engine started and where the server listens.
`--log-level info` (or `debug`) shows everything again; `--log-level error` silences the start-up lines too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STARTUP_LOGGER = "caiplatform.startup"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "warning"
SCRIPTED_MODEL_KEY = "scripted-model"

startup_log = logging.getLogger(STARTUP_LOGGER)


def configure_logging(level: str) -> None:
    logging.basicConfig(format=LOG_FORMAT)  # a no-op where a handler exists already (an embedding program)
    logging.getLogger().setLevel(level.upper())
    # A logger with its own level passes its records to the root's handlers whatever the root's level.
    startup_log.setLevel(logging.ERROR if level == "error" else logging.INFO)


def announce_engines(platform: Any) -> None:
    """One line per engine a started platform runs (or connects to); nothing for `Platform.in_memory()`."""
    if platform.mode == "memory":
        return
    settings = platform.settings
    url = platform.db.engine.url
    if url.get_backend_name() == "sqlite":
        startup_log.info("database: SQLite at %s", url.database)
    else:
        startup_log.info("database: %s", url.render_as_string(hide_password=True))
    startup_log.info("secret store: %s", f"OpenBao at {settings.bao_addr}" if settings.bao_addr
                     else f"embedded OpenBao, storing in {platform.data_dir / 'openbao'}")
    startup_log.info("messaging: %s", f"NATS JetStream at {settings.nats_url}" if settings.nats_url
                     else f"embedded NATS JetStream, storing in {platform.data_dir / 'nats'}")
    startup_log.info("memory stores: a Valkey server per instance, each on its own loopback address and port 6379")
    if settings.qdrant_url:
        vector = f"Qdrant at {settings.qdrant_url}"
    else:
        vector = f"embedded engine ({settings.vector_engine}), storing in {platform.data_dir}"
    startup_log.info("vector indexes: %s", vector)
    startup_log.info("workloads: the %s runtime (agents, functions, services, MCP servers)", platform.runtime.name)
    if settings.model_base_url:
        startup_log.info("agents' model: %s (%s)", settings.model_base_url, settings.model_name or "default model")
    else:
        startup_log.warning(
            "agents' model: no MODEL_BASE_URL is set, so agents cannot answer; "
            "`caiplatform serve --scripted-model` starts a scripted model to try them"
        )


@contextmanager
def scripted_model() -> Iterator[dict[str, str]]:
    """The project's scripted OpenAI-compatible model on a free loopback port, for the server's lifetime.

    Yields the settings that point agents at it (`MODEL_BASE_URL`, `MODEL_API_KEY`, `MODEL_NAME`). It echoes
    `you said: <message>`, so an agent answers without a model account; it is a test double, not a model."""
    from caiplatform.scripted_model import ScriptedModel, model_env

    with ScriptedModel().serve() as base_url:
        yield model_env(base_url, api_key=SCRIPTED_MODEL_KEY)
