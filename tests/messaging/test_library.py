"""The same rules through the library: `platform.topics` takes the calling principal first."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from caiplatform.db.models import Project
from caiplatform.errors import BadRequest, Conflict, NotFound, Unauthenticated
from caiplatform.models.messaging import (
    AcknowledgeRequest,
    PublishRequest,
    PubsubDeletion,
    PullRequest,
    PullResult,
    SubscriptionCreate,
    Topic,
    TopicCreate,
)
from caiplatform.principal import Principal


async def test_library_roundtrip(platform):
    who = Principal.automation()
    pid, short = await platform.db.run(
        lambda s: tuple(s.execute(select(Project.id, Project.short).where(Project.slug == "default")).one())
    )
    topics = platform.topics
    topic = await topics.create_topic(who, pid, TopicCreate(name="jobs", max_bytes="1Mi"))
    assert isinstance(topic, Topic) and topic.max_bytes == "1Mi" and topic.discard == "old"
    sub = await topics.create_subscription(who, pid, "jobs", SubscriptionCreate(name="workers", type="key-shared"))
    assert sub.type == "key-shared" and sub.deliver.mode == "pull" and sub.state.ready
    status, body = await topics.publish(who, pid, "jobs", PublishRequest.parse({"messages": [{"text": "a", "key": "k"}]}))
    assert status == 200 and len(body.message_ids) == 1
    status, pulled = await topics.pull(who, pid, "jobs", "workers", PullRequest(timeout_ms=100))
    assert status == 200 and isinstance(pulled, PullResult) and pulled.messages[0].key == "k"
    ack_id = pulled.messages[0].ack_id
    assert ack_id is not None
    acked = await topics.acknowledge(who, pid, "jobs", "workers", AcknowledgeRequest(ack_ids=[ack_id]))
    assert acked.acknowledged == 1
    with pytest.raises(Conflict):
        await topics.create_topic(who, pid, TopicCreate(name="jobs"))
    with pytest.raises(BadRequest, match="^messages must contain at least one message$"):
        PublishRequest.parse({"messages": []})
    with pytest.raises(NotFound):
        await topics.get_topic(who, pid, "nope")
    with pytest.raises(Unauthenticated):
        await topics.list_topics(Principal.anonymous(None), pid)
    assert (await topics.delete_topic(who, pid, "jobs")) == PubsubDeletion(name="jobs", status="deleting")
    assert await platform.topics.broker.stream_stats(f"cai-{short}-jobs") is None  # the stream went with it


async def test_a_topic_or_subscription_the_broker_refuses_is_not_kept(platform, monkeypatch):
    """The row inserted before the broker's stream or consumer goes again when the broker refuses (500)."""
    from caiplatform.errors import InternalError
    from caiplatform.ports.broker import BrokerError

    who = Principal.automation()
    pid = await platform.db.run(lambda s: s.execute(select(Project.id).where(Project.slug == "default")).scalar_one())
    topics = platform.topics

    async def refuse(*args, **kwargs):
        raise BrokerError("refused by the test")

    with monkeypatch.context() as patched:
        patched.setattr(topics.broker, "create_stream", refuse)
        with pytest.raises(InternalError, match="^could not create the topic on the broker: refused by the test$"):
            await topics.create_topic(who, pid, TopicCreate(name="jobs"))
    with pytest.raises(NotFound):
        await topics.get_topic(who, pid, "jobs")
    await topics.create_topic(who, pid, TopicCreate(name="jobs"))  # answered as it was before the broker's part
    assert (await topics.get_topic(who, pid, "jobs")).state.ready

    with monkeypatch.context() as patched:
        patched.setattr(topics.broker, "create_consumer", refuse)
        with pytest.raises(InternalError,
                           match="^could not create the subscription on the broker: refused by the test$"):
            await topics.create_subscription(who, pid, "jobs", SubscriptionCreate(name="workers"))
    with pytest.raises(NotFound):
        await topics.get_subscription(who, pid, "jobs", "workers")
    await topics.create_subscription(who, pid, "jobs", SubscriptionCreate(name="workers"))
    assert (await topics.get_subscription(who, pid, "jobs", "workers")).state.ready
