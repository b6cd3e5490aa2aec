"""ProcessSupervisor against real child processes (small Python servers)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from caiplatform.supervisor.process import (
    ProcessSpec,
    ProcessStartError,
    ProcessSupervisor,
    free_port,
    restart_delay,
    tcp_ready,
)

# A TCP server that accepts connections until killed; optionally ignores SIGTERM.
SERVER = textwrap.dedent(
    """
    import os, signal, socket, sys, time
    if os.environ.get("IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
    print("listening", flush=True)
    while True:
        c, _ = s.accept(); c.close()
    """
)


def server_spec(name: str, port: int, **kw) -> ProcessSpec:
    return ProcessSpec(name=name, argv=[sys.executable, "-c", SERVER, str(port)], ports=[port], **kw)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


# Every wait below ends when what it waits for happens; the ceiling only bounds a failure, and is generous so
# that a loaded machine (four test runs on two cores) does not fail a test that would pass.
CEILING = 60.0


async def wait_for(predicate, timeout: float = CEILING) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@pytest.fixture
async def sup(tmp_path: Path):
    supervisor = ProcessSupervisor(tmp_path / "state", backoff_initial=0.05, backoff_max=0.5)
    yield supervisor
    await supervisor.stop_all()


async def test_start_waits_for_health_records_and_stops(sup: ProcessSupervisor):
    port = free_port()
    mp = await sup.start(server_spec("echo", port))
    assert mp.running and mp.pid and mp.state == "running"
    assert await tcp_ready(port)  # healthy means the port answers
    record = json.loads((sup.state_dir / "echo.json").read_text())
    assert record["pid"] == mp.pid and record["ports"] == [port]
    assert record["argv"][0] == sys.executable
    assert sup.get("echo") is mp
    assert "listening" in mp.log_tail() or mp.log_path.exists()

    pid = mp.pid
    await sup.stop("echo")
    assert not alive(pid)
    assert not mp.running and mp.state == "stopped"
    assert not (sup.state_dir / "echo.json").exists()
    assert sup.get("echo") is None
    assert not await tcp_ready(port)


async def test_custom_health_probe_is_awaited(sup: ProcessSupervisor):
    calls = 0

    async def probe() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 3

    mp = await sup.start(ProcessSpec(name="sleeper", argv=["sleep", "30"], health=probe))
    assert calls == 3 and mp.running


async def test_start_fails_with_log_tail_when_process_exits(sup: ProcessSupervisor):
    spec = ProcessSpec(
        name="crasher",
        argv=[sys.executable, "-c", "import sys; print('boom: bad config', flush=True); sys.exit(3)"],
        ports=[free_port()],
    )
    with pytest.raises(ProcessStartError, match=r"exited with code 3(.|\n)*boom: bad config"):
        await sup.start(spec)
    assert sup.get("crasher") is None
    assert not (sup.state_dir / "crasher.json").exists()


async def test_start_times_out_and_kills_the_process(sup: ProcessSupervisor):
    async def never() -> bool:
        return False

    spec = ProcessSpec(name="slow", argv=["sleep", "30"], health=never, startup_timeout=0.3)
    with pytest.raises(ProcessStartError, match="did not become healthy within 0.3 s"):
        await sup.start(spec)
    assert sup.get("slow") is None
    assert not (sup.state_dir / "slow.json").exists()


async def test_missing_executable(sup: ProcessSupervisor):
    with pytest.raises(ProcessStartError, match="not found on PATH"):
        await sup.start(ProcessSpec(name="ghost", argv=["no-such-binary-cai"]))


async def test_duplicate_name_is_refused(sup: ProcessSupervisor):
    await sup.start(ProcessSpec(name="one", argv=["sleep", "30"]))
    with pytest.raises(ValueError, match="already supervised"):
        await sup.start(ProcessSpec(name="one", argv=["sleep", "30"]))


async def test_restart_after_kill_9_reruns_health_and_on_ready(sup: ProcessSupervisor):
    port = free_port()
    ready_pids: list[int] = []

    async def on_ready(mp) -> None:
        ready_pids.append(mp.pid)

    mp = await sup.start(server_spec("phoenix", port, on_ready=on_ready))
    first = mp.pid
    os.kill(first, signal.SIGKILL)
    await wait_for(lambda: mp.pid != first and mp.state == "running")
    assert mp.restarts == 1 and mp.running
    assert await tcp_ready(port)
    assert ready_pids == [first, mp.pid]
    record = json.loads((sup.state_dir / "phoenix.json").read_text())
    assert record["pid"] == mp.pid
    assert not alive(first)


async def test_no_restart_when_disabled(sup: ProcessSupervisor):
    mp = await sup.start(ProcessSpec(name="once", argv=["sleep", "30"], restart=False))
    os.kill(mp.pid, signal.SIGKILL)
    # The supervisor is done with it: its watcher returns instead of waiting a backoff to restart it.
    await wait_for(lambda: mp._watcher is not None and mp._watcher.done())
    assert mp.state == "exited" and mp.restarts == 0 and not mp.running and mp.returncode == -signal.SIGKILL
    assert not (sup.state_dir / "once.json").exists()


async def test_failed_restarts_back_off_and_recover(tmp_path: Path):
    sup = ProcessSupervisor(tmp_path / "state", backoff_initial=0.05, backoff_max=0.2)
    port = free_port()
    flag = tmp_path / "healthy"
    flag.write_text("")

    async def probe() -> bool:
        return flag.exists()

    try:
        mp = await sup.start(
            # a startup timeout each failed restart waits out: short, so three of them come quickly, but long
            # enough that the healthy first start and the recovery are not refused on a loaded machine
            ProcessSpec(name="flaky", argv=["sleep", "30"], health=probe, startup_timeout=1.0, ports=[port])
        )
        flag.unlink()
        first = mp.pid
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: mp.restarts >= 3)  # restarts keep failing health
        assert mp.state != "running"
        flag.write_text("")
        await wait_for(lambda: mp.state == "running")
        assert mp.running and mp.pid != first
    finally:
        await sup.stop_all()


async def test_stop_kills_after_grace_when_sigterm_is_ignored(sup: ProcessSupervisor):
    port = free_port()
    mp = await sup.start(server_spec("stubborn", port, env={"IGNORE_TERM": "1"}, stop_timeout=0.3))
    pid = mp.pid
    started = time.monotonic()
    await sup.stop("stubborn")
    assert time.monotonic() - started >= 0.25
    assert not alive(pid)


async def test_stop_kills_the_whole_process_group(sup: ProcessSupervisor, tmp_path: Path):
    pidfile = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pidfile}; wait"
    mp = await sup.start(
        ProcessSpec(name="shell", argv=["sh", "-c", script], health=lambda: _exists(pidfile))
    )
    child = int(pidfile.read_text())
    assert alive(child) and child != mp.pid
    await sup.stop("shell")
    await wait_for(lambda: not alive(child))


async def _exists(path: Path) -> bool:
    return path.exists() and path.read_text().strip() != ""


async def test_env_is_isolated_when_not_inherited(sup: ProcessSupervisor, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("CAI_SECRET_FOR_TEST", "leak")
    out = tmp_path / "env.txt"
    code = f"import os; open({str(out)!r}, 'w').write(repr(sorted(os.environ))); import time; time.sleep(30)"
    await sup.start(
        ProcessSpec(name="isolated", argv=[sys.executable, "-c", code], env={"ONLY": "1"}, inherit_env=False,
                    health=lambda: _exists(out))
    )
    names = eval(out.read_text())  # noqa: S307 - our own repr of a list of names
    assert "ONLY" in names and "CAI_SECRET_FOR_TEST" not in names


async def test_stop_all_stops_everything(sup: ProcessSupervisor):
    a = await sup.start(ProcessSpec(name="a", argv=["sleep", "30"]))
    b = await sup.start(ProcessSpec(name="b", argv=["sleep", "30"]))
    await sup.stop_all()
    assert not alive(a.pid) and not alive(b.pid)
    assert sup.processes == []
    assert list(sup.state_dir.glob("*.json")) == []


CRASHING_RUN = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from caiplatform.supervisor.process import ProcessSpec, ProcessSupervisor

    async def main():
        sup = ProcessSupervisor(Path(sys.argv[1]))
        mp = await sup.start(ProcessSpec(name="leftover", argv=["sleep", "120"]))
        print(mp.pid, flush=True)
        await asyncio.sleep(120)

    asyncio.run(main())
    """
)


async def test_reap_stale_kills_what_a_crashed_run_left(tmp_path: Path):
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.Popen([sys.executable, "-c", CRASHING_RUN, str(state)], stdout=subprocess.PIPE,
                           env=env, text=True)
    try:
        child = int(run.stdout.readline())
        run.kill()  # the supervisor crashes; its child lives on in its own session
        run.wait()
        assert alive(child)

        sup = ProcessSupervisor(state)
        assert [r["name"] for r in sup.records()] == ["leftover"]
        assert sup.reap_stale() == [child]
        assert not alive(child)
        assert sup.records() == []
        assert sup.reap_stale() == []
    finally:
        run.kill()
        run.stdout.close()


async def test_reap_stale_leaves_a_reused_pid_alone(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        # Same pid, different program: the pid was reused by something else.
        (state / "old.json").write_text(json.dumps({"name": "old", "pid": bystander.pid, "argv": ["nats-server"],
                                                    "owner_pid": 999999999}))
        # Same pid and program, but a different start time: also a reuse.
        stat = Path(f"/proc/{bystander.pid}/stat").read_text()
        start = int(stat[stat.rfind(")") + 2 :].split()[19])
        (state / "older.json").write_text(json.dumps({"name": "older", "pid": bystander.pid, "argv": ["sleep", "30"],
                                                      "start_time": start - 1, "owner_pid": 999999999}))
        sup = ProcessSupervisor(state)
        assert sup.reap_stale() == []
        assert bystander.poll() is None
        assert sup.records() == []  # the stale records are cleared
    finally:
        bystander.kill()
        bystander.wait()


async def test_start_reaps_a_leftover_of_the_same_name(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    leftover = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        stat = Path(f"/proc/{leftover.pid}/stat").read_text()
        start = int(stat[stat.rfind(")") + 2 :].split()[19])
        (state / "svc.json").write_text(json.dumps({"name": "svc", "pid": leftover.pid, "argv": ["sleep", "30"],
                                                    "start_time": start, "owner_pid": 999999999}))
        sup = ProcessSupervisor(state)
        mp = await sup.start(ProcessSpec(name="svc", argv=["sleep", "30"]))
        await wait_for(lambda: leftover.poll() is not None)  # reaped (its exit collected here), however slow
        assert mp.pid != leftover.pid and mp.running
        await sup.stop_all()
    finally:
        leftover.kill()
        leftover.wait()


def test_restart_delay_doubles_and_caps():
    assert [restart_delay(i, 0.5, 30) for i in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert restart_delay(1000, 0.5, 30) == 30


def test_loopback_address_for_avoids_127_0_and_addresses_in_use(monkeypatch):
    import random
    import socket

    from caiplatform.supervisor import loopback_address_for

    host = loopback_address_for(6379)
    assert host is not None and host.startswith("127.") and not host.startswith("127.0.")
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 6379))
        listener.listen()
        octets = [int(o) for o in host.split(".")[1:]]
        draws = iter(octets * 8)
        monkeypatch.setattr(random, "randint", lambda a, b: next(draws))  # only ever draws the busy address
        assert loopback_address_for(6379, attempts=8) is None
