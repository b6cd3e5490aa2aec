"""Sessions of sandboxed processes: a supervised workload still gets the supervisor's graceful SIGTERM (it runs
in the session the supervisor made for it, which has no controlling terminal), and any other sandboxed run
(a build step, the code sandbox) gets a session of its own inside (`--new-session`)."""

from __future__ import annotations

import fcntl
import os
import pty
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from caiplatform.sandbox import Confinement, Sandbox
from caiplatform.supervisor import ProcessSpec, ProcessSupervisor

pytestmark = pytest.mark.process

# Opens the controlling terminal: possible only where the process still has one.
OPEN_TTY = """
import errno, os
try:
    os.close(os.open("/dev/tty", os.O_RDWR))
    print("terminal")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def _sandbox() -> Sandbox:
    sandbox = Sandbox()
    sandbox.check()
    return sandbox


def _run_on_a_terminal(argv: list[str], pass_fds: tuple[int, ...], env: dict[str, str]) -> str:
    """Run `argv` with a terminal of the test's own as its controlling terminal (as a server started from a
    shell has one); what it printed."""
    master, slave = pty.openpty()

    def take_terminal() -> None:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    try:
        done = subprocess.run(argv, pass_fds=pass_fds, env=env, capture_output=True, text=True, timeout=60,
                              check=False, preexec_fn=take_terminal)
    finally:
        os.close(master)
        os.close(slave)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_sandboxed_run_has_no_controlling_terminal():
    argv = [sys.executable, "-I", "-c", OPEN_TTY]
    assert _run_on_a_terminal(argv, (), {"PATH": os.defpath}) == "terminal"  # the check works: unconfined, it has one
    launch = _sandbox().wrap(argv, Confinement(label="session-test"), cwd=Path("/tmp"), env={"PATH": os.defpath})
    try:
        assert _run_on_a_terminal(launch.argv, launch.pass_fds, launch.env) == "ENXIO"
    finally:
        launch.close()


def _process_group_of(marker: str) -> int | None:
    """The process group (as the host sees it) of the workload whose command line contains `marker`: the one
    running as the sandbox's unprivileged uid (bubblewrap's own command line names the program too)."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() not in (entry / "cmdline").read_bytes():
                continue
            uid = next(int(line.split()[1]) for line in (entry / "status").read_text().splitlines()
                       if line.startswith("Uid:"))
            stat = (entry / "stat").read_text()
        except (OSError, StopIteration, ValueError):
            continue
        if uid != os.geteuid() or os.geteuid() != 0:  # as root, the workload runs as CAI_SANDBOX_UID
            return int(stat[stat.rfind(")") + 2:].split()[2])
    return None


async def test_a_supervised_workload_is_in_the_process_group_the_supervisor_signals(tmp_path):
    """The supervisor stops a process by signalling its process group (SIGTERM, then SIGKILL): the workload
    inside the sandbox must be in that group, not in a session bubblewrap made for it."""
    marker = f"cai-session-test-{os.getpid()}"
    async with ProcessSupervisor(tmp_path / "run") as supervisor:
        process = await supervisor.start(ProcessSpec(
            name="grouped", argv=["/bin/sh", "-c", f"while true; do sleep 1; done # {marker}"],
            env={"PATH": os.defpath}, inherit_env=False, restart=False, sandbox=_sandbox(),
            confinement=Confinement(label="grouped"), health=lambda: _running(marker)))
        assert _process_group_of(marker) == process.pid
        await supervisor.stop("grouped")
    assert _process_group_of(marker) is None


async def _running(marker: str) -> bool:
    return _process_group_of(marker) is not None


async def test_a_supervised_workload_gets_its_graceful_sigterm(tmp_path):
    """On stop the workload gets SIGTERM and its grace period: its handler runs to the end (bubblewrap, the
    group's leader, is not signalled first: dying, it would SIGKILL the sandbox, `--die-with-parent`)."""
    sandbox = _sandbox()
    state = tmp_path / "state"
    sandbox.hand_over([state])
    script = (f"trap 'sleep 0.5; echo stopped-gracefully > {state}/out; exit 0' TERM; echo started > {state}/out; "
              "while true; do sleep 0.05; done")
    async with ProcessSupervisor(tmp_path / "run") as supervisor:
        await supervisor.start(ProcessSpec(
            name="graceful", argv=["/bin/sh", "-c", script], env={"PATH": os.defpath}, inherit_env=False,
            restart=False, sandbox=sandbox, confinement=Confinement(writable=(state,), label="graceful"),
            health=lambda: _exists(state / "out"), stop_timeout=30))
        await supervisor.stop("graceful")
    assert (state / "out").read_text().strip() == "stopped-gracefully"


async def _exists(path: Path) -> bool:
    return path.exists()
