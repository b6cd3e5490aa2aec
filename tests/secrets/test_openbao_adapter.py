"""OpenBao-specific behaviour beyond the shared conformance suite."""

from __future__ import annotations

import secrets
import uuid

import hvac
import pytest

from caiplatform.adapters.openbao.secrets import OpenBaoSecretBackend, parse_time
from caiplatform.ports.secrets import MintingUnsupported, StoreHealth, StoreUnconfigured
from caiplatform.testing import engines

pytestmark = pytest.mark.anyio


def _backend(server: engines.OpenBaoDev, **kwargs) -> OpenBaoSecretBackend:
    return OpenBaoSecretBackend(
        server.addr, server.root_token, prefix=f"caiplatform-test-{secrets.token_hex(6)}/projects", **kwargs
    )


async def test_without_address_the_store_is_unconfigured() -> None:
    backend = OpenBaoSecretBackend(None, None)
    assert await backend.health() is StoreHealth.UNCONFIGURED
    with pytest.raises(StoreUnconfigured):
        await backend.list(str(uuid.uuid4()))
    with pytest.raises(StoreUnconfigured):
        await backend.read_with_token("t", "secret/data/x")


async def test_from_handle(openbao: engines.OpenBaoDev) -> None:
    class Handle:
        addr = openbao.addr
        token = openbao.root_token

    backend = OpenBaoSecretBackend.from_handle(Handle(), prefix=f"t-{secrets.token_hex(4)}")
    assert await backend.health() is StoreHealth.OK
    p = str(uuid.uuid4())
    assert await backend.write(p, "x", "v") == 1


async def test_missing_kv_mount_is_enabled(openbao: engines.OpenBaoDev) -> None:
    mount = f"kv-{secrets.token_hex(4)}"
    backend = _backend(openbao, mount=mount)
    p = str(uuid.uuid4())
    assert await backend.write(p, "s", "v") == 1
    assert backend.path_prefix(p).startswith(f"{mount}/data/")
    token = await backend.mint_read_token(p, "s", 60)
    assert (await backend.read_with_token(token.token, token.path)).value == "v"


async def test_read_token_cannot_write_or_list(openbao: engines.OpenBaoDev) -> None:
    backend = _backend(openbao)
    p = str(uuid.uuid4())
    await backend.write(p, "s", "v")
    token = await backend.mint_read_token(p, None, 60)
    client = hvac.Client(url=token.addr, token=token.token, timeout=5)
    with pytest.raises(hvac.exceptions.Forbidden):
        client.adapter.post(f"/v1/{token.path}s", json={"data": {"value": "changed"}})
    with pytest.raises(hvac.exceptions.Forbidden):
        client.adapter.list(f"/v1/{backend.mount}/metadata/{backend.prefix}/{p}")
    assert (await backend.read(p, "s")).value == "v"
    # the token reads over plain HTTP exactly as a workload does
    resp = client.adapter.get(f"/v1/{token.path}s")
    assert resp["data"]["data"]["value"] == "v"


async def test_token_ttl_is_what_the_store_granted(openbao: engines.OpenBaoDev) -> None:
    backend = _backend(openbao)
    p = str(uuid.uuid4())
    await backend.write(p, "s", "v")
    token = await backend.mint_read_token(p, "s", 9999)
    assert token.ttl_seconds == 3600
    looked = hvac.Client(url=openbao.addr, token=openbao.root_token).auth.token.lookup(token.token)
    assert 3590 <= looked["data"]["ttl"] <= 3600
    (policy,) = looked["data"]["policies"]
    assert policy.startswith(f"caiplatform-read-{p}-")


async def test_store_that_cannot_mint_answers_501(openbao: engines.OpenBaoDev) -> None:
    root = hvac.Client(url=openbao.addr, token=openbao.root_token)
    prefix = f"caiplatform-test-{secrets.token_hex(6)}/projects"
    policy = f"kv-only-{secrets.token_hex(4)}"
    root.sys.create_or_update_policy(
        policy,
        f'path "secret/data/{prefix}/*" {{ capabilities = ["create", "read", "update"] }}\n'
        f'path "secret/metadata/{prefix}/*" {{ capabilities = ["read", "list", "update", "delete"] }}\n',
    )
    limited = root.auth.token.create(policies=[policy], ttl="10m")["auth"]["client_token"]
    backend = OpenBaoSecretBackend(openbao.addr, limited, prefix=prefix)
    p = str(uuid.uuid4())
    assert await backend.write(p, "s", "v") == 1
    with pytest.raises(MintingUnsupported) as info:
        await backend.mint_read_token(p, "s", 60)
    assert info.value.status == 501


def test_parse_time_keeps_utc() -> None:
    moment = parse_time("2026-11-22T04:20:27.492909355Z")
    assert moment is not None and moment.tzinfo is not None
    assert moment.isoformat() == "2026-11-22T04:20:27.492909+00:00"
    assert parse_time("") is None


PLATFORM_POLICY = """
path "secret/data/{prefix}/*"     {{ capabilities = ["create", "read", "update"] }}
path "secret/metadata/{prefix}/*" {{ capabilities = ["create", "read", "update", "list", "delete"] }}
path "secret/destroy/{prefix}/*"  {{ capabilities = ["update"] }}
path "sys/policies/acl/caiplatform-read-*" {{ capabilities = ["create", "read", "update"] }}
path "auth/token/create" {{ capabilities = ["create", "update", "sudo"] }}
"""


async def test_the_documented_platform_policy_is_enough(openbao: engines.OpenBaoDev) -> None:
    """docs/secrets.md gives this policy for the platform's token: everything works with it, nothing more."""
    prefix = f"caiplatform-test-{secrets.token_hex(6)}/projects"
    root = hvac.Client(url=openbao.addr, token=openbao.root_token)
    name = f"caiplatform-{secrets.token_hex(4)}"
    root.sys.create_or_update_policy(name, PLATFORM_POLICY.format(prefix=prefix))
    token = root.auth.token.create(policies=[name], ttl="1h")["auth"]["client_token"]
    backend = OpenBaoSecretBackend(openbao.addr, token, prefix=prefix)
    p = str(uuid.uuid4())
    assert await backend.write(p, "a", "1") == 1
    assert await backend.write(p, "a", "2") == 2
    await backend.write(p, "b", "x")
    assert [m.name for m in await backend.list(p)] == ["a", "b"]
    assert (await backend.read(p, "a", 1)).value == "1"
    await backend.destroy_versions(p, "a", [1])
    assert [v.destroyed for v in (await backend.metadata(p, "a")).versions] == [True, False]
    one = await backend.mint_read_token(p, "a", 60)
    assert (await backend.read_with_token(one.token, one.path)).value == "2"
    everything = await backend.mint_read_token(p, None, 60)
    assert (await backend.read_with_token(everything.token, everything.path + "b")).value == "x"
    assert await backend.destroy(p, "b") is True
    # ... and the platform token reaches nothing outside its prefix
    with pytest.raises(hvac.exceptions.Forbidden):
        hvac.Client(url=openbao.addr, token=token).secrets.kv.v2.read_secret_version(
            "elsewhere/x", raise_on_deleted_version=True
        )
