"""`caiplatform serve` refuses a bad bootstrap setting with the rule, not a traceback."""

from __future__ import annotations

from caiplatform.cli import main


def test_serve_refuses_a_short_bootstrap_password(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAI_ADMIN_EMAIL", "admin@example.com")
    monkeypatch.setenv("CAI_ADMIN_PASSWORD", "short")
    assert main(["serve", "--port", "0", "--data-dir", str(tmp_path / "data")]) == 2
    assert capsys.readouterr().err.strip() == "caiplatform serve: password must be at least 12 characters"


def test_start_up_is_quiet_by_default_and_log_level_shows_more(monkeypatch):
    import logging

    import caiplatform.cli.serve_command as command
    from caiplatform.startup import configure_logging, startup_log

    seen = []
    monkeypatch.setattr(command, "serve", lambda args: seen.append(args) or 0)
    assert main(["serve"]) == 0 and main(["serve", "--scripted-model", "--api", "core"]) == 0
    args = seen[0]
    assert args.log_level == "warning" and args.scripted_model is False and args.apis is None
    assert seen[1].scripted_model is True and seen[1].apis == ["core"]
    assert main(["serve", "--api", "nope"]) == 2
    root = logging.getLogger()
    before = (root.level, startup_log.level)
    try:
        configure_logging(args.log_level)
        # Migrations and the embedded OpenBao's HTTP calls are INFO lines of libraries: hidden by default ...
        assert not logging.getLogger("alembic.runtime.migration").isEnabledFor(logging.INFO)
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert startup_log.isEnabledFor(logging.INFO)  # ... one line per engine is not
        configure_logging("info")
        assert logging.getLogger("alembic.runtime.migration").isEnabledFor(logging.INFO)
        configure_logging("error")
        assert not startup_log.isEnabledFor(logging.INFO)
    finally:
        root.setLevel(before[0])
        startup_log.setLevel(before[1])
