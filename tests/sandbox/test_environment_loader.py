"""The in-sandbox loader of a workload's variables (`caiplatform.sandbox.environment`): the program gets exactly
the variables it was given, whatever their values and names; the launcher gets none, and no value is on any
command line while it runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from caiplatform.sandbox import Confinement, Sandbox
from caiplatform.sandbox.environment import LAUNCHER_ENV, loader, shell_safe

pytestmark = pytest.mark.process

TRICKY = "a 'quoted' \"value\" with $HOME, `id`, $(id), \\ and\na newline; \u00e9"
PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def _run(env: dict[str, str]) -> dict[str, str]:
    sandbox = Sandbox()
    sandbox.check()
    launch = sandbox.wrap([sys.executable, "-I", "-c", PRINT_ENV], Confinement(label="loader-test"), cwd=Path("/tmp"),
                          env=env)
    assert launch.env == LAUNCHER_ENV
    try:
        done = subprocess.run(launch.argv, pass_fds=launch.pass_fds, env=launch.env, capture_output=True, text=True,
                              timeout=60, check=False)
    finally:
        launch.close()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    seen.pop("LC_CTYPE", None)  # Python's own locale coercion (PEP 538) when LANG is unset
    seen.pop("PWD", None)  # bubblewrap's, after --chdir
    return seen


def _command_lines() -> dict[str, bytes]:
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            found[entry.name] = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
    return found


@pytest.mark.parametrize("env", [
    {"PATH": "/usr/bin:/bin", "TRICKY": TRICKY, "EMPTY": "", "IFS_LIKE": " \t\n"},
    {"PATH": "/usr/bin:/bin", "a.b": TRICKY, "with-dash": "x", "LINENO": "7", "UID": "5", "BASH_ENV": "/nowhere"},
], ids=["shell", "python"])
def test_the_program_gets_exactly_its_variables(env):
    assert shell_safe(env) is (env.get("a.b") is None)
    assert _run(env) == env


def test_no_value_is_on_a_command_line():
    secret = "never-on-a-command-line-7d1e"
    argv, data = loader({"SECRET": secret})
    assert secret.encode() in data and not any(secret in part for part in argv)
    sandbox = Sandbox()
    sandbox.check()
    launch = sandbox.wrap(["sleep", "30"], Confinement(label="loader-test"), cwd=Path("/tmp"),
                          env={"PATH": "/usr/bin:/bin", "SECRET": secret})
    assert not any(secret in part for part in launch.argv)
    process = subprocess.Popen(launch.argv, pass_fds=launch.pass_fds, env=launch.env)
    launch.started()
    try:
        deadline = time.monotonic() + 30
        while True:  # until the program runs (its command line is `sleep 30`)
            commands = _command_lines()
            if any(c == b"sleep\x0030\x00" for c in commands.values()):
                break
            assert time.monotonic() < deadline, "the sandboxed sleep did not start"
            time.sleep(0.05)
        assert not any(secret.encode() in c for c in commands.values())
    finally:
        process.kill()
        process.wait()
        launch.close()
