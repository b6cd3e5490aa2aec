"""`--data-dir ./x` (relative) must name the same place for the platform and its child processes."""

from __future__ import annotations

from caiplatform.platform import Platform


def test_a_relative_data_dir_is_made_absolute(tmp_path, monkeypatch, settings):
    monkeypatch.chdir(tmp_path)
    platform = Platform.embedded("relative-data", settings)
    try:
        assert platform.data_dir == tmp_path / "relative-data"
        assert platform.settings.data_dir.is_absolute() and (tmp_path / "relative-data" / "platform.db").exists()
    finally:
        platform.db.dispose()
