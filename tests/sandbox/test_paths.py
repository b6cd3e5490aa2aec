"""`sandbox/paths.py`: which host paths a workload sees where, and how what it is handed is rewritten."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from caiplatform.sandbox import paths
from caiplatform.sandbox.paths import PathMap


def test_a_host_path_is_rewritten_only_where_it_is_a_whole_path():
    inside = PathMap([(Path("/d/images/ab/src"), paths.CODE), (Path("/d/home/k"), paths.HOME),
                      (Path("/d/sessions/x"), paths.STATE), (Path("/d/envs/e"), paths.VENV)])
    assert inside.text("/d/images/ab/src") == "/app/code"
    assert inside.text("/d/images/ab/src/main.py") == "/app/code/main.py"
    assert inside.text("sqlite:////d/sessions/x/sessions.sqlite3") == "sqlite:////var/lib/cai/state/sessions.sqlite3"
    assert inside.text("/d/envs/e/bin:/usr/bin") == "/app/venv/bin:/usr/bin"
    assert inside.argv(["--home=/d/home/k/a", "/d/envs/e/bin/python"]) == ["--home=/home/app/a", "/app/venv/bin/python"]
    # Not part of a longer name on either side.
    assert inside.text("/d/images/ab/srcx") == "/d/images/ab/srcx"
    assert inside.text("/d/envs/e.partial/bin") == "/d/envs/e.partial/bin"
    assert inside.text("/mnt/d/home/k") == "/mnt/d/home/k"
    assert inside.env({"HOME": "/d/home/k", "LANG": "C.UTF-8"}) == {"HOME": "/home/app", "LANG": "C.UTF-8"}


def test_the_longest_host_path_wins():
    inside = PathMap([(Path("/d/images/ab"), "/app"), (Path("/d/images/ab/bin"), paths.BIN)])
    assert inside.text("/d/images/ab/bin/function") == "/app/bin/function"
    assert inside.text("/d/images/ab/image.json") == "/app/image.json"


def test_an_image_is_seen_as_its_code_its_program_and_its_environment(tmp_path):
    environment = tmp_path / "envs" / "e"
    (environment / "bin").mkdir(parents=True)
    (environment / "pyvenv.cfg").write_text("home = /usr/bin\n")
    image_env = {"CAI_CODE_DIR": str(tmp_path / "img" / "src"), "CAI_FUNCTION_BINARY": str(tmp_path / "img" / "bin" / "function")}
    assert paths.image_places(image_env, [str(environment / "bin" / "python"), "-m", "caiplatform.harness"]) == (
        (tmp_path / "img" / "src", "/app/code"), (tmp_path / "img" / "bin", "/app/bin"), (environment, "/app/venv"))
    # A command that is not a venv's interpreter brings no environment.
    assert paths.image_places({}, ["python3", "-m", "x"]) == ()
    assert paths.state_places([tmp_path / "a", tmp_path / "b"]) == (
        (tmp_path / "a", "/var/lib/cai/state"), (tmp_path / "b", "/var/lib/cai/state-2"))


def test_the_servers_interpreter_is_named_without_a_way_up_through_its_working_directory(monkeypatch, tmp_path):
    """`cd app && ../.venv/bin/python -m caiplatform serve`: Python keeps the `..`, the sandbox has no `app`."""
    real = os.path.abspath(sys.executable)
    (tmp_path / "app").mkdir()
    monkeypatch.setattr(sys, "executable", f"{tmp_path}/app/{os.path.relpath(real, tmp_path / 'app')}")
    assert "/../" in sys.executable
    assert paths.python() == real
