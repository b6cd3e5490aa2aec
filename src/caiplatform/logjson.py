"""Structured logs (docs/observability.md "Logs"): `caiplatform serve --log-format json` (or
`CAI_LOG_FORMAT=json`) writes one JSON object per line, for the server and for the harness of every
workload it runs, each carrying the request's `request_id` and, while tracing is on, the current span's
`trace_id` and `span_id` (the ids a collector shows for the same request).

The request id is a context variable the platform's and the harness's middleware set (`request_id`), so any
log line written while serving a request, uvicorn's access line included, carries it. The local runtime
hands the format to its workloads (`workload_env`), after the tenant's variables like the tracing ones.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from caiplatform import tracing

FORMATS = ("text", "json")
ENV = "CAI_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

request_id: ContextVar[str] = ContextVar("caiplatform_request_id", default="")
_format = "text"


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", "request_id", "trace_id", "span_id"[, "exception"]}`."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = request_id.get()
        if rid:
            line["request_id"] = rid
        ids = tracing.current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def chosen(value: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The format named by the option, else by `CAI_LOG_FORMAT`, else text; ValueError for another name."""
    name = (value or (os.environ if env is None else env).get(ENV) or "text").strip().lower()
    if name not in FORMATS:
        raise ValueError(f"unknown log format {name!r}: choose from {', '.join(FORMATS)}")
    return name


def configure(fmt: str, level: str | int | None = None) -> None:
    """Format the root logger's lines as `fmt` (a handler of its own where none exists yet)."""
    global _format
    _format = fmt
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format=TEXT_FORMAT)
    if fmt == "json":
        for handler in root.handlers:
            handler.setFormatter(JsonFormatter())
    if level is not None:
        root.setLevel(level.upper() if isinstance(level, str) else level)


def current() -> str:
    return _format


def uvicorn_log_config(level: str) -> dict[str, Any] | None:
    """uvicorn's loggers through the root's handler (so its lines are JSON too), or None for its own."""
    if _format != "json":
        return None
    loggers = {name: {"level": level.upper(), "handlers": [], "propagate": True}
               for name in ("uvicorn", "uvicorn.error", "uvicorn.access")}
    return {"version": 1, "disable_existing_loggers": False, "loggers": loggers}


def workload_env() -> dict[str, str]:
    """What the local runtime sets in every instance (after the tenant's variables)."""
    return {ENV: _format}
