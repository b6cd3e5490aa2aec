"""Push delivery against a real local HTTP receiver, reached through the platform's push resolver.

The in-memory broker reads the platform's manual clock, so the backoff schedule (1 s, 2 s, ...) is
checked by moving the clock, not by sleeping; "nothing more was delivered" is checked once the broker has
been asked again after the clock moved and had nothing due (`BrokerWatch`), not after a fixed sleep.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json

import pytest
import uvicorn
from cloudevents.v1.http import from_http
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from caiplatform.domain.messaging import backoff_delay
from caiplatform.supervisor.process import free_port
from caiplatform.testing.polling import eventually


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.status = 200
        self.location = ""
        self.redirect_hits = 0
        self.gate: asyncio.Event | None = None  # when set, each answer waits for it
        self.port = free_port()

        async def hook(request: Request) -> Response:
            self.requests.append(({k.lower(): v for k, v in request.headers.items()}, await request.body()))
            if self.gate is not None:
                await self.gate.wait()
            headers = {"location": self.location} if self.location else None
            return Response(b"y" * 200_000 if self.status == 200 else b"no", status_code=self.status, headers=headers)

        async def elsewhere(request: Request) -> Response:
            self.redirect_hits += 1
            return Response(b"ok")

        app = Starlette(routes=[Route("/hook", hook, methods=["POST"]), Route("/elsewhere", elsewhere, methods=["POST", "GET"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_for(self, count: int, timeout: float = 5.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.requests) < count:
            assert loop.time() < deadline, f"expected {count} push requests, got {len(self.requests)}"
            await asyncio.sleep(0.02)


class BrokerWatch:
    """Records what the push worker did with the in-memory broker: settlements (ack, nak, term) and
    each look at a consumer (how many messages were due)."""

    def __init__(self, broker, monkeypatch) -> None:
        self.settled = {"ack": 0, "nak": 0, "term": 0, "in_progress": 0}
        self.looks: list[int] = []  # how many messages each look at a consumer took
        take = broker._take

        def counted_take(stream, consumer, limit):
            taken = take(stream, consumer, limit)
            self.looks.append(len(taken))
            return taken

        monkeypatch.setattr(broker, "_take", counted_take)
        for verb in self.settled:
            monkeypatch.setattr(broker, verb, self._counting(verb, getattr(broker, verb)))

    def _counting(self, verb, real):
        async def settle(*args, **kwargs):
            result = await real(*args, **kwargs)
            self.settled[verb] += 1
            return result

        return settle

    async def until(self, verb: str, count: int) -> None:
        await eventually(lambda: self.settled[verb] >= count, f"{count} {verb}(s)")

    async def nothing_due(self) -> None:
        """Waits for the next look at the broker and fails unless it found nothing to deliver."""
        seen = len(self.looks)
        await eventually(lambda: len(self.looks) > seen, "the push worker to look at the broker again")
        assert self.looks[seen] == 0, "the broker had a message due"


@pytest.fixture
def watch(platform, monkeypatch) -> BrokerWatch:
    return BrokerWatch(platform.topics.broker, monkeypatch)


@pytest.fixture
async def receiver(platform, api):
    rec = Receiver()
    task = asyncio.create_task(rec.server.serve())
    while not rec.server.started:
        await asyncio.sleep(0.01)
    platform.push_targets.register("hooks", f"cai-p-{api.short}", rec.base_url)
    yield rec
    rec.server.should_exit = True
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 5)


async def _setup(api, mode: str, **sub_extra) -> None:
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "events"})).status_code == 201
    url = f"http://hooks.cai-p-{api.short}.svc.cluster.local/hook"
    body = {"name": "push", "deliver": {"mode": "push", "push": {"url": url, "content_mode": mode}},
            "ack_deadline_seconds": 5, **sub_extra}
    r = await c.post(api.subs("events"), headers=api.admin, json=body)
    assert r.status_code == 201, r.text


async def _publish(api, *messages) -> list[str]:
    r = await api.client.post(api.topic("events") + ":publish", headers=api.member, json={"messages": list(messages)})
    assert r.status_code == 200, r.text
    return r.json()["message_ids"]


async def test_structured_mode(api, receiver, watch):
    await _setup(api, "cloudevents-structured")
    ids = await _publish(api, {"text": '{"order": 7}', "attributes": {"color": "blue"}, "key": "k"})
    await receiver.wait_for(1)
    headers, body = receiver.requests[0]
    assert headers["content-type"].startswith("application/cloudevents+json")
    event = from_http(headers, body)
    assert event["type"] == "ai.platform.pubsub.message.v1" and event["id"] == ids[0]
    assert event["subscription"] == "push" and event["deliveryattempt"] == "1"
    assert event.data == {"order": 7}
    assert json.loads(body)["attributes"] == {"color": "blue"}
    await watch.until("ack", 1)
    sub = (await api.client.get(api.sub("events", "push"), headers=api.member)).json()
    assert sub["state"]["unacknowledged"] == 0 and sub["state"]["backlog"] == 0


async def test_binary_mode(api, receiver):
    await _setup(api, "cloudevents-binary")
    raw = b"\x00\xffraw bytes"
    ids = await _publish(api, {"data": base64.b64encode(raw).decode(), "attributes": {"color": "red", "size": "xl"}})
    await receiver.wait_for(1)
    headers, body = receiver.requests[0]
    assert body == raw
    assert headers["ce-type"] == "ai.platform.pubsub.message.v1" and headers["ce-id"] == ids[0]
    for name in ("ce-source", "ce-subject", "ce-specversion"):
        assert headers[name]
    assert headers["ce-subscription"] == "push" and headers["ce-deliveryattempt"] == "1"
    assert headers["ce-attr-color"] == "red" and headers["ce-attr-size"] == "xl"
    event = from_http(headers, body)
    assert event["id"] == ids[0] and event.data == raw


async def test_a_slow_answer_keeps_its_message_from_other_readers(api, platform, receiver, clock, watch):
    """While a POST runs, the worker restarts the message's ack deadline every half deadline: another
    reader of the subscription (another replica) gets nothing, and the late 2xx is the one delivery."""
    await _setup(api, "cloudevents-binary", ack_deadline_seconds=2)
    receiver.gate = asyncio.Event()
    await _publish(api, {"text": "slow"})
    await receiver.wait_for(1)  # the POST is in flight and held
    clock.advance(1.2)  # broker time since the pull: within its 2 s deadline
    await watch.until("in_progress", 1)  # half the deadline of real time: restarted at broker time 1.2
    clock.advance(1.0)  # 2.2 s since the pull: past the first deadline, within the restarted one
    [(stream, consumer)] = platform.components["push_worker"]._subs
    assert await platform.topics.broker.pull(stream, consumer, 10, 0.1) == []  # another reader's pull
    receiver.gate.set()
    await watch.until("ack", 1)
    assert len(receiver.requests) == 1


async def test_backoff_then_dead_letter(api, receiver, clock, watch):
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "parked"})).status_code == 201
    assert (await c.post(api.subs("parked"), headers=api.admin, json={"name": "inspect"})).status_code == 201
    await _setup(api, "cloudevents-binary", dead_letter={"topic": "parked", "after_attempts": 3})
    receiver.status = 500
    ids = await _publish(api, {"text": "doomed", "attributes": {"a": "1"}})
    await receiver.wait_for(1)
    assert [backoff_delay(n) for n in (1, 2, 3, 6, 7, 10)] == [1, 2, 4, 32, 60, 60]
    await watch.until("nak", 1)
    clock.advance(0.9)
    await watch.nothing_due()
    assert len(receiver.requests) == 1, "retried before the 1 s backoff"
    clock.advance(0.2)
    await receiver.wait_for(2)
    assert receiver.requests[1][0]["ce-deliveryattempt"] == "2"
    await watch.until("nak", 2)
    clock.advance(1.5)
    await watch.nothing_due()
    assert len(receiver.requests) == 2, "retried before the 2 s backoff"
    clock.advance(0.6)
    await receiver.wait_for(3)
    parked = []
    for _ in range(50):
        r = await c.post(api.sub("parked", "inspect") + ":pull", headers=api.member, json={"timeout_ms": 100})
        parked = r.json()["messages"]
        if parked:
            break
    assert len(parked) == 1
    attributes = parked[0]["attributes"]
    assert base64.b64decode(parked[0]["data"]) == b"doomed" and attributes["a"] == "1"
    assert attributes["cai-dead-letter-attempts"] == "3" and attributes["cai-dead-letter-subscription"] == "push"
    assert attributes["cai-dead-letter-message-id"] == ids[0] and "500" in attributes["cai-dead-letter-reason"]
    await watch.until("term", 1)
    clock.advance(120)
    await watch.nothing_due()
    assert len(receiver.requests) == 3, "a parked message is not delivered again"
    # /metrics: each attempt by outcome; the parked copy counts as published to the dead-letter topic
    scrape = (await c.get("/metrics", headers={"Authorization": "Bearer automation-token-for-tests"})).text
    counts = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(scrape) for s in family.samples}
    for labels, expected in [({"topic": "events", "outcome": "retry"}, 2),
                             ({"topic": "events", "outcome": "dead_lettered"}, 1)]:
        key = ("cai_push_deliveries_total", tuple(sorted({"project": api.short, **labels}.items())))
        assert counts.get(key) == expected, labels
    for topic in ("events", "parked"):
        key = ("cai_messages_published_total", tuple(sorted({"project": api.short, "topic": topic}.items())))
        assert counts.get(key) == 1, topic


async def test_redirect_is_not_followed_and_drop_without_dead_letter(api, receiver, clock, watch):
    await _setup(api, "cloudevents-structured", dead_letter={"after_attempts": 2})
    receiver.status = 302
    receiver.location = f"{receiver.base_url}/elsewhere"
    await _publish(api, {"text": "x"})
    await receiver.wait_for(1)
    await watch.until("nak", 1)  # the backoff runs from the nak: moving the clock before it would not count
    clock.advance(1.1)
    await receiver.wait_for(2)
    await watch.until("term", 1)
    clock.advance(120)
    await watch.nothing_due()
    assert len(receiver.requests) == 2 and receiver.redirect_hits == 0
    sub = (await api.client.get(api.sub("events", "push"), headers=api.member)).json()
    assert sub["state"]["backlog"] == 0  # dropped


async def test_large_response_still_acknowledges(api, receiver, watch):
    await _setup(api, "cloudevents-structured")
    await _publish(api, {"text": "a"}, {"text": "b"})
    await receiver.wait_for(2)
    await watch.until("ack", 2)
    usage = (await api.client.get(f"/v1/projects/{api.pid}/pubsub/usage", headers=api.member)).json()
    assert usage["topics"][0]["delivered"] == 2


async def test_two_workers_share_without_duplicates(platform, api, receiver, watch):
    from caiplatform.services.messaging_push import PushWorker

    second = PushWorker(platform.topics, platform.push_targets, platform.clock, refresh_interval=None)
    await second.start()  # another replica's worker on the same subscriptions
    try:
        await _setup(api, "cloudevents-binary")
        ids = await _publish(api, *[{"text": str(i)} for i in range(30)])
        await receiver.wait_for(30)
        await watch.until("ack", 30)
        await watch.nothing_due()
        delivered = [headers["ce-id"] for headers, _ in receiver.requests]
        assert sorted(delivered) == sorted(ids) and len(delivered) == 30
    finally:
        await second.close()


async def test_binary_mode_percent_encodes_a_key_beyond_ascii(api, receiver):
    """A message key is any text; in binary mode it travels in `ce-partitionkey`, percent-encoded as the
    CloudEvents HTTP binding says. Unencoded it could not be sent, and the push loop failed on it."""
    await _setup(api, "cloudevents-binary")
    await _publish(api, {"text": "first", "key": "ключ 100%"})
    await _publish(api, {"text": "second", "key": "plain", "attributes": {"note": 'say "hi"'}})
    await receiver.wait_for(2)
    keys = {body: headers["ce-partitionkey"] for headers, body in receiver.requests}
    assert keys == {b"first": "%D0%BA%D0%BB%D1%8E%D1%87%20100%25", b"second": "plain"}
    notes = [headers.get("ce-attr-note") for headers, body in receiver.requests if body == b"second"]
    assert notes == ["say%20%22hi%22"]
