"""Local Valkey provisioner: what only real processes and a data dir can show (restarts, files, crashes)."""

from __future__ import annotations

import os
import signal
import stat
import time

import anyio
import pytest
import redis

from caiplatform.adapters.local.memorystore import LocalValkeyProvisioner
from caiplatform.domain.memorystore import State, stats_from_info
from caiplatform.models.memorystore import MemoryStoreCreate
from caiplatform.testing.conformance.memorystore import client, password, refused, spec, wait_ready

pytestmark = pytest.mark.anyio


async def test_platform_restart_brings_instance_back_with_data(tmp_path):
    first = LocalValkeyProvisioner(tmp_path)
    await first.start()
    s = spec(persistence_enabled=True)
    pw = password()
    await first.create(s, pw)
    inst = await wait_ready(first, s)
    c = client(inst, pw)
    c.set("survives", "restart")
    c.close()
    await first.close()
    assert refused_or_down(inst, pw)

    second = LocalValkeyProvisioner(tmp_path)
    await second.start()
    try:
        inst = await wait_ready(second, s)
        assert inst.created_at is not None and inst.spec == s
        c = client(inst, pw)
        assert c.get("survives") == b"restart"
        c.close()
    finally:
        await second.close()


async def test_rotation_applies_at_platform_restart(tmp_path):
    first = LocalValkeyProvisioner(tmp_path)
    s = spec()
    old = password()
    await first.create(s, old)
    inst = await wait_ready(first, s)
    new = password()
    await first.rotate_password(s.project_id, s.name, new)
    assert not refused(inst, old) and refused(inst, new)
    await first.close()

    second = LocalValkeyProvisioner(tmp_path)
    await second.start()
    try:
        inst = await wait_ready(second, s)
        assert refused(inst, old)
        assert not refused(inst, new)
    finally:
        await second.close()


async def test_processes_left_by_a_crashed_platform_are_reaped_and_restarted(tmp_path):
    crashed = LocalValkeyProvisioner(tmp_path)
    s = spec(persistence_enabled=True)
    pw = password()
    await crashed.create(s, pw)
    inst = await wait_ready(crashed, s)
    c = client(inst, pw)
    c.set("k", "v")
    c.close()
    old_port = inst.port
    old_pid = crashed.supervisor.get(f"memorystore-{s.project_id}-{s.name}").pid
    # No close(): the platform "crashed" and left its Valkey running, holding the port and files. Its
    # supervisor's watchers die with it (simulated by cancelling them; the process itself keeps running).
    for mp in crashed.supervisor.processes:
        mp._stopping = True
        mp._watcher.cancel()
    successor = LocalValkeyProvisioner(tmp_path)
    await successor.start()
    try:
        inst = await wait_ready(successor, s)
        new_pid = successor.supervisor.get(f"memorystore-{s.project_id}-{s.name}").pid
        assert new_pid != old_pid
        assert inst.port == old_port, "the stale server was reaped, so its port was free again"
        c = client(inst, pw)
        assert c.get("k") == b"v"
        c.close()
    finally:
        await successor.close()


async def test_instance_folder_layout_and_file_modes(tmp_path):
    p = LocalValkeyProvisioner(tmp_path)
    s = spec(persistence_enabled=True)
    pw = password()
    await p.create(s, pw)
    await wait_ready(p, s)
    folder = tmp_path / "memorystores" / s.project_id / s.name
    try:
        for name in ("credential.json", "data/valkey.conf", "instance.json"):
            mode = stat.S_IMODE(os.stat(folder / name).st_mode)
            assert mode == 0o600, (name, oct(mode))
        assert pw not in (folder / "instance.json").read_text()
        assert pw in (folder / "data" / "valkey.conf").read_text()
        assert (folder / "data" / "appendonly").is_dir()
        stats = stats_from_info(s, await p.info(s.project_id, s.name))
        assert stats["maxmemory_bytes"] == 192 * 1024 * 1024
    finally:
        await p.close()


async def test_no_persistence_writes_no_files(tmp_path):
    p = LocalValkeyProvisioner(tmp_path)
    s = spec(persistence_enabled=False)
    pw = password()
    await p.create(s, pw)
    inst = await wait_ready(p, s)
    c = client(inst, pw)
    c.set("k", "v")
    c.close()
    await p.restart(s.project_id, s.name)
    await wait_ready(p, s)
    data = tmp_path / "memorystores" / s.project_id / s.name / "data"
    try:
        assert [f.name for f in data.iterdir()] == ["valkey.conf"]
    finally:
        await p.close()


async def test_deleted_instance_files_are_gone(tmp_path):
    p = LocalValkeyProvisioner(tmp_path)
    s = spec(persistence_enabled=True)
    pw = password()
    await p.create(s, pw)
    inst = await wait_ready(p, s)
    c = client(inst, pw)
    c.set("k", "v")
    c.close()
    folder = tmp_path / "memorystores" / s.project_id / s.name
    assert folder.is_dir()
    await p.delete(s.project_id, s.name)
    assert not folder.exists()
    assert not folder.parent.exists()
    await p.close()
    # A restarted platform does not resurrect it.
    again = LocalValkeyProvisioner(tmp_path)
    await again.start()
    assert await again.get(s.project_id, s.name) is None
    await again.close()


async def test_killed_server_is_restarted_by_the_supervisor(tmp_path):
    p = LocalValkeyProvisioner(tmp_path)
    p.supervisor.backoff_initial = 0.05
    s = spec(persistence_enabled=True)
    pw = password()
    await p.create(s, pw)
    await wait_ready(p, s)
    mp = p.supervisor.get(f"memorystore-{s.project_id}-{s.name}")
    try:
        old_pid = mp.pid
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while mp.pid == old_pid or mp.state != "running":
            assert time.monotonic() < deadline, mp
            await anyio.sleep(0.02)
        inst = await wait_ready(p, s)
        assert inst.state is State.READY
        assert mp.restarts >= 1
        c = client(inst, pw)
        assert c.ping()
        c.close()
    finally:
        await p.close()


async def test_create_answers_before_the_server_is_up(tmp_path):
    p = LocalValkeyProvisioner(tmp_path)
    s = spec()
    created = await p.create(s, password())
    try:
        assert created.state is State.PROVISIONING
        assert created.port > 0
    finally:
        await wait_ready(p, s)
        await p.close()


def refused_or_down(inst, pw) -> bool:
    try:
        return refused(inst, pw)
    except redis.ConnectionError:
        return True


async def test_the_platform_restarts_the_instance_after_a_rotation(tmp_path):
    """Over the service: rotate-credential schedules the restart that puts the new password in force."""
    from caiplatform.platform import Platform
    from caiplatform.services.memorystore import MemoryStoreService
    from caiplatform.settings import Settings
    from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD

    platform = Platform.in_memory(Settings(CAI_ADMIN_EMAIL=ADMIN_EMAIL, CAI_ADMIN_PASSWORD=ADMIN_PASSWORD))
    provisioner = LocalValkeyProvisioner(tmp_path)
    await provisioner.start()
    service = MemoryStoreService(
        platform.db, platform.access, platform.audit, platform.clock, platform.pager, provisioner,
        rotation_restart_delay=0.2,
    )
    admin = await platform.auth.authenticate((await platform.auth.login(ADMIN_EMAIL, ADMIN_PASSWORD, None)).token)
    from sqlalchemy import select

    from caiplatform.db.models import Project

    pid = await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
    try:
        created = await service.create(admin, pid, MemoryStoreCreate.parse({"name": "rot", "persistence": {"enabled": False}}))
        old = created.credential.password
        with anyio.fail_after(30):
            while not (await service.get(admin, pid, "rot")).ready:
                await anyio.sleep(0.1)
        rotated = await service.rotate_credential(admin, pid, "rot")
        instance = await provisioner.get(pid, "rot")
        assert not refused(instance, old)  # still in force until the restart
        await service.wait_restarts()
        instance = await wait_ready(provisioner, instance.spec)
        assert refused(instance, old) and not refused(instance, rotated.password)
    finally:
        await provisioner.close()
        await platform.aclose()


async def test_deleting_a_project_stops_its_servers_and_destroys_their_data(tmp_path, settings, nats_url):
    """On the embedded platform: the project's Valkey processes stop, their folders go; another
    project's instance keeps running."""
    from caiplatform.platform import Platform
    from caiplatform.testing.users import bootstrap_admin, delete_project, new_project

    platform = Platform.embedded(tmp_path, settings.model_copy(update={"nats_url": nats_url}))
    await platform.start()
    try:
        admin = await bootstrap_admin(platform)
        doomed, kept = await new_project(platform, "doomed"), await new_project(platform, "kept")
        provisioner = platform.memorystores.provisioner
        passwords = {}
        for project, name in ((doomed, "cache"), (doomed, "queue"), (kept, "cache")):
            created = await platform.memorystores.create(admin, project.id, MemoryStoreCreate(name=name))
            passwords[project.id, name] = created.credential.password
        running = {key: await wait_ready(provisioner, (await provisioner.get(*key)).spec) for key in passwords}
        assert not any(refused(inst, passwords[key]) for key, inst in running.items())
        assert LocalValkeyProvisioner.records_project(tmp_path, doomed.id)

        await delete_project(platform, doomed.id)

        for name in ("cache", "queue"):
            assert platform.supervisor().get(f"memorystore-{doomed.id}-{name}") is None
            assert refused_or_down(running[doomed.id, name], passwords[doomed.id, name])  # nothing listens
        assert not (tmp_path / "memorystores" / doomed.id).exists()
        assert not LocalValkeyProvisioner.records_project(tmp_path, doomed.id)
        assert await provisioner.list(doomed.id) == []
        assert not refused(running[kept.id, "cache"], passwords[kept.id, "cache"])
        assert await platform.memorystores.purge_project(doomed.id) == 0
    finally:
        await platform.aclose()


async def test_an_instance_keeps_its_address_and_port_6379_across_restarts(tmp_path):
    first = LocalValkeyProvisioner(tmp_path)
    await first.start()
    s = spec()
    await first.create(s, password())
    inst = await wait_ready(first, s)
    await first.close()
    second = LocalValkeyProvisioner(tmp_path)
    await second.start()
    try:
        again = await wait_ready(second, s)
        assert (again.host, again.port) == (inst.host, 6379) and inst.host != "127.0.0.1"
    finally:
        await second.close()


async def test_without_another_loopback_address_an_instance_falls_back_and_says_so(tmp_path, monkeypatch):
    import caiplatform.adapters.local.memorystore as local

    monkeypatch.setattr(local, "loopback_address_for", lambda port, avoid=(): None)  # e.g. macOS, no aliases
    p = LocalValkeyProvisioner(tmp_path)
    await p.start()
    try:
        s = spec()
        pw = password()
        await p.create(s, pw)
        inst = await wait_ready(p, s)
        assert inst.host == "127.0.0.1" and inst.port != 6379
        view = inst.to_json()
        assert view["connection"]["port"] == inst.port and "6379" in view["note"]
        assert client(inst, pw).ping()
    finally:
        await p.close()
