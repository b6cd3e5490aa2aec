"""The per-run network (caiplatform.sandbox.network) and the relay in front of a revision's own server.

The rules are checked as text (what the namespace gets), and one real namespace is made and probed from
inside: only loopback traffic (the forwarded port reaches a server on host loopback, another does not).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from caiplatform.sandbox import Confinement, Sandbox
from caiplatform.sandbox.network import Network, Policy, loopback_ports, nft_rules, parse_allow


def test_the_allowlist_reads_cidrs_with_and_without_ports():
    entries = parse_allow("10.1.2.0/24, 192.168.1.5:5432,[fd00::1]:443, 127.0.0.1:8200")
    assert [(str(e.network), e.port) for e in entries] == [
        ("10.1.2.0/24", None), ("192.168.1.5/32", 5432), ("fd00::1/128", 443), ("127.0.0.1/32", 8200)]
    assert [e.loopback_port for e in entries] == [None, None, None, 8200]
    for bad in ("10.0.0.0/33", "host.example:80", "10.0.0.1:0", "10.0.0.1:http"):
        with pytest.raises(ValueError, match="CAI_SANDBOX_ALLOW"):
            parse_allow(bad)


def test_loopback_ports_are_those_of_loopback_urls_only():
    assert loopback_ports(["http://127.0.0.1:8000", "http://localhost:9/v1", "https://api.example.com/v1",
                           "redis://127.0.0.1/0", None, ""]) == (9, 6379, 8000)


def test_the_rules_close_loopback_link_local_private_ranges_and_the_hosts_own_addresses():
    rules = nft_rules(Policy(loopback_ports=(8000,), public=True, allow=parse_allow("10.9.0.0/16:443")))
    assert "policy accept" in rules
    for closed in ("127.0.0.0/8", "169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                   "100.64.0.0/10", "fc00::/7", "fe80::/10", "::/127"):
        assert closed in rules
    # the operator's entry comes before the closing rules
    assert rules.index("ip daddr 10.9.0.0/16 tcp dport 443 accept") < rules.index("ip daddr {")
    assert "policy drop" in nft_rules(Policy(public=False))


def _listener() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    threading.Thread(target=lambda: [server.accept()[0].close() for _ in range(8)], daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.process
def test_a_namespace_reaches_its_forwarded_port_and_no_other_port_of_host_loopback():
    network = Network()
    if network.problem():
        pytest.fail(network.problem())
    allowed, allowed_port = _listener()
    other, other_port = _listener()
    netns = network.create(network.policy([allowed_port]))
    try:
        probe = ("import socket, sys\n"
                 "for port in sys.argv[1:]:\n"
                 "    try:\n"
                 "        socket.create_connection(('127.0.0.1', int(port)), timeout=3).close(); print('open')\n"
                 "    except OSError as exc: print(type(exc).__name__)\n")
        done = subprocess.run([*netns.enter_argv(), sys.executable, "-c", probe, str(allowed_port), str(other_port)],
                              pass_fds=(netns.fd,), capture_output=True, text=True, timeout=30, check=False)
        assert done.stdout.split() == ["open", "ConnectionRefusedError"], done
        listed = subprocess.run([*netns.enter_argv(), "nft", "list", "ruleset"], pass_fds=(netns.fd,),
                                capture_output=True, text=True, timeout=30, check=True).stdout
        assert "table inet cai_sandbox" in listed and "169.254.0.0/16" in listed
        pasta = netns.pasta_pid
        assert pasta is not None and Path(f"/proc/{pasta}").exists()
    finally:
        netns.close()
        allowed.close()
        other.close()
    assert not Path(f"/proc/{pasta}").exists() or Path(f"/proc/{pasta}/status").read_text().find("zombie") >= 0


@pytest.mark.process
def test_a_namespace_given_no_port_reaches_no_port_of_host_loopback():
    """pasta's own default is `-T auto` (every port bound on host loopback): a build step, given no port,
    reached PostgreSQL, Valkey and NATS that way."""
    network = Network()
    if network.problem():
        pytest.fail(network.problem())
    server, port = _listener()
    netns = network.create(network.policy())
    try:
        probe = "import socket, sys\nsocket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)"
        done = subprocess.run([*netns.enter_argv(), sys.executable, "-c", probe, str(port)],
                              pass_fds=(netns.fd,), capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode != 0 and "ConnectionRefusedError" in done.stderr, done
    finally:
        netns.close()
        server.close()


def _answering_and_closing() -> tuple[socket.socket, int]:
    """A server that answers each request with a head, then a body, then closes (as uvicorn does for a
    `Connection: close` request, as urllib sends), maybe before it has read the whole request."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 73\r\nconnection: close\r\n\r\n")
                conn.sendall(b'{"error":"not found","request_id":"req_fdd0cf1d670eb9cf411091822c1cc38a"}')

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


WHOLE_ANSWERS = r"""
import socket, sys
port, rounds, short = int(sys.argv[1]), int(sys.argv[2]), 0
for _ in range(rounds):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n")
        conn.sendall(b"{}")  # in a second write, as urllib sends a body
        got = b""
        while piece := conn.recv(65536):
            got += piece
    short += not got.endswith(b'38a"}')
print(short)
"""


@pytest.mark.process
def test_every_answer_from_a_forwarded_port_arrives_whole():
    """Debian 12's pasta, forwarding a port with `-T`, lost the body of about one answer in three hundred
    whose server closed right after sending it (the code sandbox test's caller saw `IncompleteRead`)."""
    network = Network()
    if network.problem():
        pytest.fail(network.problem())
    server, port = _answering_and_closing()
    netns = network.create(network.policy([port]))
    try:
        done = subprocess.run([*netns.enter_argv(), sys.executable, "-c", WHOLE_ANSWERS, str(port), "3000"],
                              pass_fds=(netns.fd,), capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "0", f"{done.stdout.strip()} of 3000 answers arrived cut short"
    finally:
        netns.close()
        server.close()


@pytest.mark.process
def test_a_sandboxed_run_gets_its_own_namespace_and_it_is_gone_with_the_run(tmp_path):
    sandbox = Sandbox(network=Network())
    sandbox.check()
    launch = sandbox.wrap(["/bin/sh", "-c", "readlink /proc/self/ns/net"], Confinement(label="net-test"), cwd=Path("/"))
    try:
        assert launch.netns is not None
        done = subprocess.run(launch.argv, pass_fds=launch.pass_fds, capture_output=True, text=True, timeout=60,
                              env={"PATH": os.defpath}, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() != os.readlink("/proc/self/ns/net")
    finally:
        pasta = launch.netns.pasta_pid if launch.netns is not None else None
        launch.close()
    assert pasta is None or not Path(f"/proc/{pasta}/cmdline").exists() or not Path(f"/proc/{pasta}/cmdline").read_bytes()


@pytest.mark.process
def test_without_pasta_a_run_is_refused_naming_what_to_install(monkeypatch):
    network = Network()
    network.pasta = None
    sandbox = Sandbox(network=network)
    with pytest.raises(Exception, match="passt"):
        sandbox.check_network()
    assert Sandbox(network=Network(mode="host")).network.problem() == ""


@pytest.mark.process
def test_the_relay_opens_its_socket_once_the_port_answers_and_copies_both_ways(tmp_path):
    from caiplatform.adapters.local.runtime import RELAY

    port = _free_port()
    path = tmp_path / "r.sock"
    server = ("import http.server, os\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
              "        self.wfile.write(b'ok')\n"
              f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    relay = subprocess.Popen([sys.executable, "-I", RELAY, str(path), str(port), "--", sys.executable, "-c", server])
    try:
        import httpx

        deadline = time.monotonic() + 30
        while not path.exists():  # the relay binds once the server accepts
            assert relay.poll() is None and time.monotonic() < deadline, "the relay never listened"
            time.sleep(0.02)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://x", timeout=10) as c:
            assert c.get("/").text == "ok"
    finally:
        relay.terminate()
        assert relay.wait(timeout=30) != 0  # the server was stopped by the signal passed on


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_hosts_resolvers_stay_reachable_on_port_53_even_in_a_private_range(tmp_path):
    from caiplatform.sandbox.network import nameservers

    conf = tmp_path / "resolv.conf"
    conf.write_text("# generated\nnameserver 10.255.255.53\nnameserver 127.0.0.53\nnameserver fd00::53\nsearch x\n")
    assert [str(a) for a in nameservers(str(conf))] == ["10.255.255.53", "fd00::53"]  # loopback: not forwarded
    rules = nft_rules(Policy())
    for resolver in nameservers():
        family = "ip" if resolver.version == 4 else "ip6"
        assert rules.index(f"{family} daddr {resolver} udp dport 53 accept") < rules.index("ip daddr {")
    assert "dport 53" not in nft_rules(Policy(public=False))


@pytest.mark.process
def test_the_hosts_network_is_an_explicit_choice_named_in_the_status():
    status = Sandbox(network=Network(mode="host")).describe()
    assert status["status"] == "on" and status["network"] == "host"
    assert "CAI_SANDBOX_NETWORK=host" in str(status["detail"])
    with pytest.raises(ValueError, match="CAI_SANDBOX_NETWORK"):
        Network(mode="bridge")
    with pytest.raises(ValueError, match="CAI_SANDBOX_EGRESS"):
        Network(egress="some")
