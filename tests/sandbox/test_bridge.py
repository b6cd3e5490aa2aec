"""The platform's bridges into runs' network namespaces (caiplatform.sandbox.bridge): a group's published
host endpoints, opened and closed live in every run of that group and in no other run."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from caiplatform.sandbox.network import Netns, Network

PROBE = ("import socket, sys\n"
         "for address in sys.argv[1:]:\n"
         "    host, port = address.rsplit(':', 1)\n"
         "    try:\n"
         "        with socket.create_connection((host, int(port)), timeout=3) as s: print(s.recv(16).decode() or 'empty')\n"
         "    except OSError as exc: print(type(exc).__name__)\n")


def _greeter(host: str, greeting: str) -> tuple[socket.socket, tuple[str, int]]:
    """A host service that greets every connection (what a store's address leads to on the host)."""
    server = socket.socket()
    server.bind((host, 0))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(greeting.encode())
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()


def _reach(netns: Netns, *endpoints: tuple[str, int]) -> list[str]:
    done = subprocess.run([*netns.enter_argv(), sys.executable, "-c", PROBE, *(f"{h}:{p}" for h, p in endpoints)],
                          pass_fds=(netns.fd,), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.process
def test_a_groups_endpoints_open_live_in_its_runs_alone_and_close_with_them():
    network = Network()
    if network.problem():
        pytest.fail(network.problem())
    own_server, own = _greeter("127.0.0.1", "own")
    other_server, other = _greeter("127.0.0.3", "other")  # the whole of 127/8 is this machine's
    mine = network.create(network.policy(), group="project-a")
    theirs = network.create(network.policy(), group="project-b")
    try:
        assert _reach(mine, own, other) == ["ConnectionRefusedError", "ConnectionRefusedError"]
        network.bridges.publish("project-a", [own]).result(30)  # a store created while the run runs
        network.bridges.publish("project-b", [other]).result(30)
        assert _reach(mine, own, other) == ["own", "ConnectionRefusedError"]
        assert _reach(theirs, own, other) == ["ConnectionRefusedError", "other"]
        later = network.create(network.policy(), group="project-a")  # a run started after: it has them at once
        try:
            assert _reach(later, own, other) == ["own", "ConnectionRefusedError"]
        finally:
            later.close()
        network.bridges.publish("project-a", []).result(30)  # the store was deleted
        assert _reach(mine, own) == ["ConnectionRefusedError"]
    finally:
        mine.close()
        theirs.close()
        own_server.close()
        other_server.close()
    assert network.bridges.groups() == set()
