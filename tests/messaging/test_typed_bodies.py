"""Typed request bodies (issue 19): a field an operation does not know is a 400 naming it, and nothing is
written; the spec's own messages still win over pydantic's; the library takes the same models."""

from __future__ import annotations

import pytest

from caiplatform.errors import BadRequest
from caiplatform.models.messaging import (
    AcknowledgeRequest,
    PublishRequest,
    PullRequest,
    SubscriptionCreate,
    SubscriptionPatch,
    TopicCreate,
    TopicPatch,
)


async def test_an_unknown_topic_field_is_refused_and_nothing_is_created(api):
    c = api.client
    r = await c.post(api.topics, headers=api.admin, json={"name": "typo", "max_byte": "1Mi"})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "max_byte"'
    assert (await c.get(api.topic("typo"), headers=api.member)).status_code == 404
    assert (await c.get(api.topics, headers=api.member)).json()["topics"] == []


async def test_unknown_fields_of_subscriptions_and_verbs_are_refused(api):
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "events"})).status_code == 201
    r = await c.post(api.subs("events"), headers=api.admin, json={"name": "s", "ack_deadline": 10})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "ack_deadline"'
    assert (await c.get(api.subs("events"), headers=api.member)).json()["subscriptions"] == []
    r = await c.post(api.subs("events"), headers=api.admin, json={"name": "s", "deliver": {"mod": "push"}})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "deliver.mod"'
    assert (await c.post(api.subs("events"), headers=api.admin, json={"name": "s"})).status_code == 201
    r = await c.patch(api.sub("events", "s"), headers=api.admin, json={"max_delivers": 3})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "max_delivers"'
    assert (await c.get(api.sub("events", "s"), headers=api.member)).json()["max_deliver"] == 0
    r = await c.post(api.topic("events") + ":publish", headers=api.member,
                     json={"messages": [{"text": "x", "attribute": {"a": "b"}}]})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "messages.0.attribute"'
    r = await c.post(api.sub("events", "s") + ":pull", headers=api.member, json={"max_message": 1})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "max_message"'
    r = await c.post(api.sub("events", "s") + ":ack", headers=api.member, json={"ack_ids": ["x"], "all": True})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "all"'


@pytest.mark.parametrize(("model", "body", "message"), [
    (TopicCreate, {}, "topic name is required"),
    (TopicCreate, {"name": "x", "max_bytes": "lots"}, 'max_bytes "lots" is not a valid quantity'),
    (TopicCreate, {"name": "x", "discard": "both"}, 'discard must be old or new (got "both")'),
    (TopicPatch, {"max_age": 5}, 'max_age "5" is not a valid duration'),
    (PublishRequest, {"messages": [{"text": "a", "data": "YQ=="}]},
     "messages[0]: set either data (base64) or text, not both"),
    (PublishRequest, {"messages": [{}] * 101}, "a publish carries at most 100 messages (got 101)"),
    (PublishRequest, {"messages": [{"data": "%%%"}]}, "messages[0]: data is not valid base64"),
    (PublishRequest, {"messages": [{"attributes": {"": "v"}}]},
     "messages[0]: attribute names must be non-empty and single-line"),
    (SubscriptionCreate, {"name": "s", "type": "fanout"},
     'type must be one of "shared", "key-shared", "exclusive" or "failover" (got "fanout")'),
    (SubscriptionCreate, {"name": "s", "ack_deadline_seconds": 601}, "ack_deadline_seconds must be between 1 and 600"),
    (SubscriptionPatch, {"max_deliver": -1}, "max_deliver must not be negative"),
    (SubscriptionPatch, {"deliver": {"mode": "push", "push": {"content_mode": "raw"}}},
     'deliver.push.content_mode must be "cloudevents-structured" or "cloudevents-binary"'),
    (PullRequest, {"timeout_ms": -1}, "timeout_ms must not be negative"),
    (AcknowledgeRequest, {"ack_ids": []}, "ack_ids must contain at least one id"),
    (AcknowledgeRequest, {"ack_ids": ["a"] * 1001}, "at most 1000 acknowledgement ids per request"),
])
def test_the_models_keep_the_spec_messages(model, body, message):
    with pytest.raises(BadRequest) as info:
        model.parse(body)
    assert info.value.message == message


def test_models_normalize_what_the_spec_accepts():
    assert TopicCreate.parse({"name": "t", "max_bytes": 1024, "discard": ""}).max_bytes == "1024"
    assert TopicPatch.parse({"max_age": ""}).max_age_seconds == 0.0
    pull = PullRequest.parse({"max_messages": 500.0, "timeout_ms": 60000})
    assert (pull.batch, pull.timeout_seconds) == (100, 20.0)
    assert PullRequest().batch == 10
    message = PublishRequest.parse({"messages": [{"data": "aGk", "attributes": {"k": "v"}, "key": "o"}]}).outgoing()[0]
    assert (message.data, message.attributes, message.key) == (b"hi", {"k": "v"}, "o")
