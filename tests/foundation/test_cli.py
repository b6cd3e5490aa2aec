"""`caiplatform serve` refuses a bad bootstrap setting with the rule, not a traceback."""

from __future__ import annotations

from caiplatform.cli import main


def test_serve_refuses_a_short_bootstrap_password(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAI_ADMIN_EMAIL", "admin@example.com")
    monkeypatch.setenv("CAI_ADMIN_PASSWORD", "short")
    assert main(["serve", "--port", "0", "--data-dir", str(tmp_path / "data")]) == 2
    assert capsys.readouterr().err.strip() == "caiplatform serve: password must be at least 12 characters"
