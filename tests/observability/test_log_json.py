"""`--log-format json`: one JSON object a line with the request's id and, while tracing, the span's ids."""

from __future__ import annotations

import json
import logging

import pytest

from caiplatform import logjson, tracing

pytestmark = pytest.mark.unit


def _record(message: str = "hello %s", args: tuple = ("world",), exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("caiplatform.test", logging.WARNING, __file__, 1, message, args, exc_info)


def test_the_format_comes_from_the_option_then_the_variable():
    assert logjson.chosen(None, {}) == "text"
    assert logjson.chosen(None, {"CAI_LOG_FORMAT": "JSON"}) == "json"
    assert logjson.chosen("text", {"CAI_LOG_FORMAT": "json"}) == "text"
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        logjson.chosen("xml", {})


def test_a_line_carries_the_request_id_and_outside_a_request_none():
    formatter = logjson.JsonFormatter()
    line = json.loads(formatter.format(_record()))
    assert line["message"] == "hello world" and line["level"] == "warning" and line["logger"] == "caiplatform.test"
    assert "request_id" not in line and "trace_id" not in line
    token = logjson.request_id.set("req_abc")
    try:
        line = json.loads(formatter.format(_record()))
    finally:
        logjson.request_id.reset(token)
    assert line["request_id"] == "req_abc" and line["time"].endswith("Z")


def test_a_line_carries_the_current_spans_ids_while_tracing():
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    tracing.activate(provider)
    try:
        with tracing.span("request") as current:
            line = json.loads(logjson.JsonFormatter().format(_record()))
    finally:
        tracing.deactivate()
    context = current.get_span_context()
    assert (line["trace_id"], line["span_id"]) == (f"{context.trace_id:032x}", f"{context.span_id:016x}")


def test_an_exception_stays_inside_its_line():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        text = logjson.JsonFormatter().format(_record("failed", (), exc_info=sys.exc_info()))
    assert "\n" not in text and "RuntimeError: boom" in json.loads(text)["exception"]


def test_uvicorn_lines_go_through_the_root_handler_only_in_json(monkeypatch):
    monkeypatch.setattr(logjson, "_format", "text")
    assert logjson.uvicorn_log_config("info") is None
    assert logjson.workload_env() == {"CAI_LOG_FORMAT": "text"}
    monkeypatch.setattr(logjson, "_format", "json")
    config = logjson.uvicorn_log_config("info")
    assert config is not None and config["loggers"]["uvicorn.access"] == {"level": "INFO", "handlers": [], "propagate": True}
    assert logjson.workload_env() == {"CAI_LOG_FORMAT": "json"}


def test_serve_takes_the_option_or_the_variable(monkeypatch):
    import caiplatform.cli.serve_command as command
    from caiplatform.cli import main

    seen = []
    monkeypatch.setattr(command, "serve", lambda args: seen.append(args) or 0)
    monkeypatch.delenv("CAI_LOG_FORMAT", raising=False)
    assert main(["serve"]) == 0 and main(["serve", "--log-format", "json"]) == 0
    monkeypatch.setenv("CAI_LOG_FORMAT", "json")
    assert main(["serve"]) == 0 and main(["serve", "--log-format", "text"]) == 0
    assert [args.log_format for args in seen] == ["text", "json", "json", "text"]
    assert main(["serve", "--log-format", "xml"]) == 2
