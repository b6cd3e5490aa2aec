"""Wiring of messaging onto NATS: the embedded server with per-project users, or an external URL.

`attach_embedded_nats(platform)` starts the platform's own JetStream server (data in the data dir) with
the authorization block of `caiplatform.adapters.nats.auth`, connects the JetStream broker as the
`platform` user, re-grants project users whenever topics change, and issues project credentials.
`credential_issuer(...)` serves the other cases (external NATS, in-memory broker).
"""

from __future__ import annotations

import asyncio
from typing import Any

from caiplatform.adapters.nats.auth import PLATFORM_USER, NatsProjectAuth, inbox_prefix, rewrite_and_reload
from caiplatform.domain.projects import ProjectRef
from caiplatform.ports.broker import BrokerCredential, CredentialIssuer

EMBEDDED_NOTE = (
    "a NATS user for this project: connect with nats://<token>@<host:port> (the token is user:password) "
    "and inbox_prefix {inbox}; it may publish to and read the subjects under topic_prefix, look up this "
    "project's streams and read and acknowledge its subscriptions, nothing else. Exclusive and failover "
    "subscriptions serve one pinned reader: pull from them in priority group \"cai\". It never expires; "
    "revoking it means rotating the platform signing key, which revokes every project's token."
)
EXTERNAL_NOTE = (
    "the token is user:password of this project's NATS user; on a NATS server the platform did not "
    "start, it authenticates only once the operator loads the platform's authorization block "
    "(caiplatform.adapters.nats.auth) into that server's configuration. Only connect and topic lookup "
    "are proven externally by default."
)


def credential_issuer(auth: NatsProjectAuth, service_url: str, note: str) -> CredentialIssuer:
    async def issue(project: ProjectRef) -> BrokerCredential:
        return BrokerCredential(token=auth.token(project.short), service_url=service_url,
                                note=note.format(inbox=inbox_prefix(project.short)))

    return issue


async def attach_embedded_nats(platform: Any) -> None:
    from caiplatform.supervisor.engines import NATS_NAME, start_nats

    topics = platform.topics
    auth = NatsProjectAuth(platform.session_key)
    supervisor = platform.supervisor()
    url = await start_nats(supervisor, platform.data_dir, extra_config=auth.config(await topics.broker_layout()))
    await topics.broker.close()
    broker = platform.registry.load("broker", "nats")(url, user=PLATFORM_USER, password=auth.platform_password)
    await broker.wait_ready()
    topics.set_broker(broker)
    config_path = platform.data_dir / "nats" / "nats-server.conf"

    async def regrant() -> None:
        block = auth.config(await topics.broker_layout())
        process = supervisor.get(NATS_NAME)
        await asyncio.to_thread(rewrite_and_reload, config_path, block, process.pid if process else None)

    topics.on_topics_changed.append(regrant)
    topics.credentials_issuer = credential_issuer(auth, url, EMBEDDED_NOTE)
