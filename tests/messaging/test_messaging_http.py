"""The messaging API over HTTP, in-process on the in-memory broker: every route, rule and message."""

from __future__ import annotations

import base64
import uuid

GiB = 1024**3


async def _topic(api, name: str = "orders", **body) -> dict:
    r = await api.client.post(api.topics, headers=api.admin, json={"name": name, **body})
    assert r.status_code == 201, r.text
    return r.json()


async def _sub(api, topic: str, name: str = "s1", **body) -> dict:
    r = await api.client.post(api.subs(topic), headers=api.admin, json={"name": name, **body})
    assert r.status_code == 201, r.text
    return r.json()


async def _publish(api, topic: str, *messages: dict):
    return await api.client.post(api.topic(topic) + ":publish", headers=api.member, json={"messages": list(messages)})


async def test_topic_lifecycle(api):
    c = api.client
    created = await _topic(api, "orders", display_name="Orders", max_bytes="32Mi", max_age="1h30m", discard="new")
    assert created["state"]["phase"] == "Pending" and created["state"]["ready"] is False
    assert created["path"] == f"projects/{api.short}/topics/orders"
    assert created["max_bytes"] == "32Mi" and created["max_age"] == "1h30m" and created["discard"] == "new"
    assert created["created_at"].endswith("Z") and created["address"]
    got = (await c.get(api.topic("orders"), headers=api.member)).json()
    assert got["state"]["phase"] == "Ready" and got["state"]["ready"] is True and "message" not in got["state"]
    for key in ("published", "delivered", "published_bytes", "delivered_bytes", "storage_bytes", "backlog_bytes",
                "subscriptions", "producers"):
        assert got["state"][key] == 0
    r = await c.patch(api.topic("orders"), headers=api.admin, json={"max_age": "", "display_name": "O"})
    assert r.status_code == 200 and "max_age" not in r.json() and r.json()["display_name"] == "O"
    assert r.json()["max_bytes"] == "32Mi" and r.json()["discard"] == "new"
    r = await c.patch(api.topic("orders"), headers=api.admin, json={"name": "other"})
    assert r.status_code == 400
    plain = await _topic(api, "plain")
    assert plain["max_bytes"] == "16Mi" and plain["discard"] == "old" and "max_age" not in plain
    assert "display_name" not in plain
    await _sub(api, "orders", "s1")
    r = await c.delete(api.topic("orders"), headers=api.admin)
    assert r.status_code == 202 and r.json() == {"name": "orders", "status": "deleting"}
    assert (await c.get(api.topic("orders"), headers=api.member)).status_code == 404
    assert (await c.get(api.subs("orders"), headers=api.member)).status_code == 404
    await _topic(api, "orders")  # the name is free again, with no old subscription
    assert (await c.get(api.subs("orders"), headers=api.member)).json() == {"subscriptions": []}


TOPIC_CASES = [
        ({}, "topic name is required"),
        ({"name": ""}, "topic name is required"),
        ({"name": "a" * 64}, "topic name must be 63 characters or fewer"),
        ({"name": "Bad_Name"}, None),
        ({"name": "ok", "max_bytes": "lots"}, 'max_bytes "lots" is not a valid quantity'),
        ({"name": "ok", "max_age": "forever"}, 'max_age "forever" is not a valid duration'),
        ({"name": "ok", "discard": "middle"}, 'discard must be old or new (got "middle")'),
]


async def test_topic_validation(api):
    for body, message in TOPIC_CASES:
        r = await api.client.post(api.topics, headers=api.admin, json=body)
        assert r.status_code == 400
        assert r.json()["error"] == (message or 'invalid topic name "Bad_Name": use lowercase letters, digits and '
                                     "hyphens, starting with a letter and ending with a letter or digit")
    assert (await api.client.get(api.topics, headers=api.member)).json()["topics"] == []


async def test_duplicate_topic_and_list_paging(api):
    c = api.client
    for name in ("a-topic", "b-topic", "c-topic"):
        await _topic(api, name)
    r = await c.post(api.topics, headers=api.admin, json={"name": "a-topic"})
    assert r.status_code == 409
    first = (await c.get(api.topics, headers=api.member, params={"page_size": 2})).json()
    assert [t["name"] for t in first["topics"]] == ["a-topic", "b-topic"]
    second = (await c.get(api.topics, headers=api.member,
                          params={"page_size": 2, "page_token": first["next_page_token"]})).json()
    assert [t["name"] for t in second["topics"]] == ["c-topic"] and "next_page_token" not in second
    for bad in ("0", "201", "x"):
        assert (await c.get(api.topics, headers=api.member, params={"page_size": bad})).status_code == 400
    r = await c.get(api.topics, headers=api.member, params={"page_token": "forged"})
    assert r.status_code == 400
    assert r.json()["error"] == "page_token is invalid or was issued for a different list; start from the first page"
    assert (await c.get(api.topics, headers=api.member, params={"limit": 1})).json()["topics"][0]["name"] == "a-topic"


async def test_storage_budget_by_claim(api):
    c = api.client
    await _topic(api, "big", max_bytes="1000Mi")
    r = await c.post(api.topics, headers=api.admin, json={"name": "more", "max_bytes": "100Mi"})
    assert r.status_code == 409
    error = r.json()["error"]
    assert "1.0GiB" in error and "1000.0MiB" in error and "does not fit" in error
    assert "delete a topic" in error and "lower a max_bytes" in error and "operator" in error
    assert (await c.get(api.topic("more"), headers=api.member)).status_code == 404
    await _topic(api, "small", max_bytes="24Mi")
    r = await c.patch(api.topic("small"), headers=api.admin, json={"max_bytes": "25Mi"})
    assert r.status_code == 409  # raising re-checks the delta
    assert (await c.get(api.topic("small"), headers=api.member)).json()["max_bytes"] == "24Mi"
    assert (await c.patch(api.topic("big"), headers=api.admin, json={"max_bytes": "900Mi"})).status_code == 200
    quota = (await c.get(f"/v1/projects/{api.pid}/pubsub/quota", headers=api.member)).json()
    assert quota["limit_bytes"] == GiB and quota["allocated_bytes"] == (900 + 24) * 1024**2
    assert quota["available_bytes"] == GiB - quota["allocated_bytes"] and quota["topics"] == 2
    assert quota["provisioned"] is True and "1.0GiB" in quota["human"]
    assert {"backlog_bytes", "storage_bytes"} <= set(quota)


async def test_quota_before_any_topic(api):
    quota = (await api.client.get(f"/v1/projects/{api.pid}/pubsub/quota", headers=api.member)).json()
    assert quota["provisioned"] is False and quota["allocated_bytes"] == 0 and quota["topics"] == 0


async def test_publish_pull_ack_flow(api):
    c = api.client
    await _topic(api, "orders")
    await _sub(api, "orders", "s1", ack_deadline_seconds=10)
    data = base64.b64encode(b"\x00\x01binary").decode()
    r = await _publish(api, "orders", {"text": "hello", "attributes": {"kind": "greeting"}, "key": "k1"},
                       {"data": data}, {})
    assert r.status_code == 200
    ids = r.json()["message_ids"]
    assert len(ids) == 3 and all(i.count(":") == 1 and all(p.isdigit() for p in i.split(":")) for i in ids)
    r = await c.post(api.sub("orders", "s1") + ":pull", headers=api.member, json={"max_messages": 10, "timeout_ms": 100})
    assert r.status_code == 200
    messages = r.json()["messages"]
    assert [m["id"] for m in messages] == ids
    first = messages[0]
    assert base64.b64decode(first["data"]) == b"hello" and first["attributes"] == {"kind": "greeting"}
    assert first["key"] == "k1" and first["delivery_attempt"] == 1 and first["publish_time"].endswith("Z")
    assert base64.b64decode(messages[1]["data"]) == b"\x00\x01binary" and messages[2]["data"] == ""
    sub = (await c.get(api.sub("orders", "s1"), headers=api.member)).json()
    assert sub["state"]["unacknowledged"] == 3 and sub["state"]["ready"] is True
    r = await c.post(api.sub("orders", "s1") + ":acknowledge", headers=api.member,
                     json={"ack_ids": [m["ack_id"] for m in messages[:2]]})
    assert r.status_code == 200 and r.json() == {"acknowledged": 2}
    r = await c.post(api.sub("orders", "s1") + ":ack", headers=api.member, json={"ack_ids": [messages[2]["ack_id"]]})
    assert r.json() == {"acknowledged": 1}
    r = await c.post(api.sub("orders", "s1") + ":pull", headers=api.member, json={"timeout_ms": 0})
    assert r.json() == {"messages": []}
    usage = (await c.get(f"/v1/projects/{api.pid}/pubsub/usage", headers=api.member)).json()
    assert usage["project"] == api.pid and usage["topics"][0]["name"] == "orders"
    assert usage["topics"][0]["published"] == 3 and usage["topics"][0]["delivered"] == 3
    assert usage["totals"]["published"] == 3 and usage["caveat"]


async def test_pull_without_body_and_auto_ack(api):
    c = api.client
    await _topic(api, "t")
    await _sub(api, "t", "s")
    await _publish(api, "t", {"text": "1"}, {"text": "2"})
    r = await c.post(api.sub("t", "s") + ":pull", headers=api.member, json={"auto_ack": True, "timeout_ms": 100})
    body = r.json()
    assert r.status_code == 200 and body["acknowledged"] == 2
    assert all("ack_id" not in m for m in body["messages"]) and len(body["messages"]) == 2
    await _publish(api, "t", {"text": "3"})
    r = await c.post(api.sub("t", "s") + ":pull", headers=api.member)  # no body at all
    assert r.status_code == 200 and len(r.json()["messages"]) == 1


async def test_pull_caps_and_redelivery_counts(api, clock):
    c = api.client
    await _topic(api, "t")
    await _sub(api, "t", "s", ack_deadline_seconds=5)
    await _publish(api, "t", *[{"text": str(i)} for i in range(100)])
    await _publish(api, "t", *[{"text": str(i)} for i in range(100, 105)])
    r = await c.post(api.sub("t", "s") + ":pull", headers=api.member, json={"max_messages": 500, "timeout_ms": 100})
    assert len(r.json()["messages"]) == 100  # silently capped
    clock.advance(6)
    r = await c.post(api.sub("t", "s") + ":pull", headers=api.member, json={"max_messages": 1, "timeout_ms": 100})
    assert r.json()["messages"][0]["delivery_attempt"] == 2


PUBLISH_CASES = [
        ([], "messages must contain at least one message"),
        (None, "messages must contain at least one message"),
        ([{}] * 101, "a publish carries at most 100 messages (got 101)"),
        ([{}, {"text": "a", "data": "YQ=="}], "messages[1]: set either data (base64) or text, not both"),
        ([{"data": "***"}], "messages[0]: data is not valid base64"),
        ([{"attributes": {"": "x"}}], "messages[0]: attribute names must be non-empty and single-line"),
        ([{"attributes": {"a\nb": "x"}}], "messages[0]: attribute names must be non-empty and single-line"),
]


async def test_publish_validation(api):
    await _topic(api, "t")
    await _sub(api, "t", "s")
    for messages, error in PUBLISH_CASES:
        body = {} if messages is None else {"messages": messages}
        r = await api.client.post(api.topic("t") + ":publish", headers=api.member, json=body)
        assert r.status_code == 400 and r.json()["error"] == error
    r = await api.client.post(api.sub("t", "s") + ":pull", headers=api.member, json={"timeout_ms": 0})
    assert r.json()["messages"] == []  # nothing of a refused publish was stored


async def test_full_discard_new_topic_refuses_and_reports_partial(api):
    await _topic(api, "tiny", max_bytes="4Ki", discard="new")
    await _sub(api, "tiny", "s")
    blob = {"text": "x" * 1500}
    r = await _publish(api, "tiny", blob, blob, blob, blob)
    assert r.status_code == 207
    body = r.json()
    assert body["requested"] == 4 and 1 <= body["published"] < 4 and len(body["message_ids"]) == body["published"]
    assert body["error"]
    r = await _publish(api, "tiny", blob)
    assert r.status_code == 409


async def test_bare_post_and_unknown_verbs(api):
    c = api.client
    await _topic(api, "t")
    await _sub(api, "t", "s")
    r = await c.post(api.topic("t"), headers=api.member, json={})
    assert r.status_code == 405
    assert r.json()["error"] == "POST to a topic requires a method suffix, e.g. .../topics/<name>:publish"
    r = await c.post(api.topic("t") + ":frobnicate", headers=api.member, json={})
    assert r.status_code == 404 and r.json()["error"] == "unknown method :frobnicate"
    r = await c.post(api.sub("t", "s") + ":frob", headers=api.member, json={})
    assert r.status_code == 404 and r.json()["error"] == "unknown method :frob"
    assert (await c.put(api.topic("t"), headers=api.member, json={})).status_code == 405
    assert (await c.get(f"/v1/projects/{api.pid}/nothing", headers=api.member)).status_code == 404
    assert (await c.post(api.topic("missing") + ":publish", headers=api.member,
                         json={"messages": [{}]})).status_code == 404


async def test_roles_and_the_404_rule(api):
    c = api.client
    r = await c.post(api.topics, headers=api.member, json={"name": "t"})
    assert r.status_code == 403
    await _topic(api, "t")
    await _sub(api, "t", "s")
    for method, path, body in [
        ("PATCH", api.topic("t"), {"display_name": "x"}),
        ("DELETE", api.topic("t"), None),
        ("POST", api.subs("t"), {"name": "s2"}),
        ("PATCH", api.sub("t", "s"), {"display_name": "x"}),
        ("DELETE", api.sub("t", "s"), None),
        ("GET", f"/v1/projects/{api.pid}/pubsub/credentials", None),
    ]:
        r = await c.request(method, path, headers=api.member, json=body)
        assert r.status_code == 403, (method, path)
    for path in (api.topics, api.topic("t"), f"/v1/projects/{api.pid}/pubsub/quota"):
        assert (await c.get(path, headers=api.stranger)).status_code == 404
    assert (await c.get(api.topics)).status_code == 401
    other = str(uuid.uuid4())
    assert (await c.get(f"/v1/projects/{other}/topics", headers=api.admin)).status_code == 404
    assert (await c.get("/v1/projects/not-a-uuid/topics", headers=api.admin)).status_code == 404
    # a subscription read through a different topic is 404
    await _topic(api, "u")
    assert (await c.get(api.sub("u", "s"), headers=api.member)).status_code == 404


SUBSCRIPTION_CASES = [
        ({"name": ""}, "subscription name is required"),
        ({"name": "s", "type": "fanout"}, None),
        ({"name": "s", "ack_deadline_seconds": 0}, "ack_deadline_seconds must be between 1 and 600"),
        ({"name": "s", "ack_deadline_seconds": 601}, "ack_deadline_seconds must be between 1 and 600"),
        ({"name": "s", "max_deliver": -1}, "max_deliver must not be negative"),
        ({"name": "s", "start_from": "middle"}, 'start_from must be all or new (got "middle")'),
        ({"name": "s", "deliver": {"mode": "carrier"}}, 'deliver.mode must be "pull" or "push" (got "carrier")'),
        ({"name": "s", "deliver": {"push": {"url": "http://svc.x"}}}, 'deliver.push is set but deliver.mode is "pull"'),
        ({"name": "s", "deliver": {"mode": "push"}}, 'deliver.mode is "push" but deliver.push.url is missing'),
        ({"name": "s", "deliver": {"mode": "push", "push": {"url": "https://svc.NS"}}}, None),
        ({"name": "s", "dead_letter": {"topic": "nope"}}, 'dead_letter.topic "nope" does not exist in this project; create it first'),
        ({"name": "s", "dead_letter": {"topic": "t"}}, None),
        ({"name": "s", "type": "exclusive"}, "an exclusive subscription cannot be read through the pull API (use push or a direct client)"),
]


async def test_subscription_validation(api):
    await _topic(api, "t")
    for body, error in SUBSCRIPTION_CASES:
        r = await api.client.post(api.subs("t"), headers=api.admin, json=body)
        assert r.status_code == 400, r.text
        if error:
            assert r.json()["error"] == error
        if body.get("type") == "fanout":
            assert r.json()["error"] == 'type must be one of "shared", "key-shared", "exclusive" or "failover" (got "fanout")'
    assert (await api.client.get(api.subs("t"), headers=api.member)).json()["subscriptions"] == []


async def test_push_url_allowlist(api):
    await _topic(api, "t")
    ns = f"cai-p-{api.short}"
    ok = [f"http://svc.{ns}/hook", f"http://svc.{ns}.svc", f"http://svc.{ns}.svc.cluster.local:8080/x"]
    bad = [f"https://svc.{ns}/", f"http://user:pw@svc.{ns}/", "http://svc.cai-p-other/", f"http://a.b.{ns}/",
           "http://127.0.0.1:9/", f"http://svc.{ns}.svc.cluster.remote/"]
    for i, url in enumerate(ok):
        body = {"name": f"ok{i}", "deliver": {"mode": "push", "push": {"url": url, "content_mode": "cloudevents-binary"}}}
        r = await api.client.post(api.subs("t"), headers=api.admin, json=body)
        assert r.status_code == 201, (url, r.text)
        assert r.json()["deliver"] == {"mode": "push", "push": {"url": url, "content_mode": "cloudevents-binary"}}
    for url in bad:
        r = await api.client.post(api.subs("t"), headers=api.admin,
                                  json={"name": "bad", "deliver": {"mode": "push", "push": {"url": url}}})
        assert r.status_code == 400 and r.json()["error"].startswith("deliver.push.url is not allowed: "), url
    r = await api.client.post(api.subs("t"), headers=api.admin, json={
        "name": "cm", "deliver": {"mode": "push", "push": {"url": ok[0], "content_mode": "xml"}}})
    assert r.json()["error"] == 'deliver.push.content_mode must be "cloudevents-structured" or "cloudevents-binary"'
    r = await api.client.patch(api.sub("t", "ok0"), headers=api.admin,
                               json={"deliver": {"mode": "push", "push": {"url": "http://evil.example.com/"}}})
    assert r.status_code == 400


async def test_subscription_update_and_pull_conflicts(api):
    c = api.client
    await _topic(api, "t")
    await _topic(api, "dlq")
    ns = f"cai-p-{api.short}"
    created = await _sub(api, "t", "s", dead_letter={"topic": "dlq", "after_attempts": 3})
    assert created["dead_letter"] == {"topic": "dlq", "after_attempts": 3}
    assert created["type"] == "shared" and created["ack_deadline_seconds"] == 30 and created["max_ack_pending"] == 1000
    for key, value in (("type", "failover"), ("start_from", "new"), ("topic", "dlq")):
        r = await c.patch(api.sub("t", "s"), headers=api.admin, json={key: value})
        assert r.status_code == 400 and "immutable" in r.json()["error"]
    r = await c.patch(api.sub("t", "s"), headers=api.admin, json={"dead_letter": {"topic": "t"}})
    assert r.status_code == 400 and r.json()["error"] == "dead_letter.topic must differ from the subscription's own topic"
    r = await c.patch(api.sub("t", "s"), headers=api.admin,
                      json={"ack_deadline_seconds": 60, "max_deliver": 4, "max_ack_pending": 7, "display_name": "S",
                            "dead_letter": {"topic": ""}})
    assert r.status_code == 200
    body = r.json()
    assert body["ack_deadline_seconds"] == 60 and body["max_deliver"] == 4 and body["max_ack_pending"] == 7
    assert "dead_letter" not in body and body["display_name"] == "S"
    r = await c.patch(api.sub("t", "s"), headers=api.admin,
                      json={"deliver": {"mode": "push", "push": {"url": f"http://hook.{ns}/"}}})
    assert r.status_code == 200 and r.json()["deliver"]["push"]["content_mode"] == "cloudevents-structured"
    r = await c.patch(api.sub("t", "s"), headers=api.admin, json={"deliver": {"push": {"content_mode": "cloudevents-binary"}}})
    assert r.json()["deliver"] == {"mode": "push", "push": {"url": f"http://hook.{ns}/", "content_mode": "cloudevents-binary"}}
    r = await c.post(api.sub("t", "s") + ":pull", headers=api.member, json={})
    assert r.status_code == 409 and "push subscription" in r.json()["error"]
    await _sub(api, "t", "fo", type="failover")
    r = await c.post(api.sub("t", "fo") + ":pull", headers=api.member, json={})
    assert r.status_code == 409 and "use push or a direct client" in r.json()["error"]
    ks = await _sub(api, "t", "ks", type="key-shared")
    assert ks["state"]["active_type"] == "key-shared"
    r = await c.post(api.subs("t"), headers=api.admin, json={"name": "ks"})
    assert r.status_code == 409
    listed = (await c.get(api.subs("t"), headers=api.member, params={"page_size": 2})).json()
    assert [s["name"] for s in listed["subscriptions"]] == ["fo", "ks"] and listed["next_page_token"]
    r = await c.delete(api.sub("t", "ks"), headers=api.admin)
    assert r.status_code == 202 and r.json() == {"name": "ks", "status": "deleting"}
    assert (await c.get(api.sub("t", "ks"), headers=api.member)).status_code == 404


async def test_key_shared_delivers_in_order_per_key(api):
    c = api.client
    await _topic(api, "t")
    await _sub(api, "t", "ks", type="key-shared")
    await _publish(api, "t", *[{"text": f"{k}{i}", "key": k} for i in range(3) for k in ("a", "b")])
    seen = []
    for _ in range(6):
        r = await c.post(api.sub("t", "ks") + ":pull", headers=api.member, json={"max_messages": 10, "timeout_ms": 100})
        messages = r.json()["messages"]
        assert len(messages) == 1
        seen.append(base64.b64decode(messages[0]["data"]).decode())
        await c.post(api.sub("t", "ks") + ":ack", headers=api.member, json={"ack_ids": [messages[0]["ack_id"]]})
    assert [s for s in seen if s[0] == "a"] == ["a0", "a1", "a2"] and [s for s in seen if s[0] == "b"] == ["b0", "b1", "b2"]


async def test_acknowledge_validation(api):
    c = api.client
    await _topic(api, "t")
    await _sub(api, "t", "s")
    await _sub(api, "t", "other")
    await _publish(api, "t", {"text": "x"})
    pulled = (await c.post(api.sub("t", "other") + ":pull", headers=api.member, json={"timeout_ms": 100})).json()
    foreign = pulled["messages"][0]["ack_id"]
    cases = [
        ({}, "ack_ids must contain at least one id"),
        ({"ack_ids": []}, "ack_ids must contain at least one id"),
        ({"ack_ids": ["x"] * 1001}, "at most 1000 acknowledgement ids per request"),
        ({"ack_ids": ["garbage!"]}, "one or more acknowledgement ids are not valid for this subscription"),
        ({"ack_ids": [foreign]}, "one or more acknowledgement ids are not valid for this subscription"),
    ]
    for body, error in cases:
        r = await c.post(api.sub("t", "s") + ":acknowledge", headers=api.member, json=body)
        assert r.status_code == 400 and r.json()["error"] == error


async def test_body_limits_and_json_errors(api):
    c = api.client
    await _topic(api, "t")
    r = await c.post(api.topics, headers={**api.admin, "content-type": "application/json"}, content=b"{nope")
    assert r.status_code == 400 and r.json()["error"].startswith("invalid JSON body: ")
    big = b'{"name": "x", "display_name": "' + b"a" * (1024 * 1024) + b'"}'
    assert (await c.post(api.topics, headers=api.admin, content=big)).status_code == 413
    payload = base64.b64encode(b"z" * (3 * 1024 * 1024)).decode()  # ~4 MiB of base64: over the limit
    r = await c.post(api.topic("t") + ":publish", headers=api.member, json={"messages": [{"data": payload}]})
    assert r.status_code == 413


async def test_health_body(client):
    r = await client.get("/healthz")
    body = r.json()["apis"]["pubsub"]
    assert body["status"] == "ok"
    assert set(body["dependencies"]) == {"kubernetes", "database", "broker", "session-key"}
    assert body["dependencies"]["broker"] == {"status": "ok", "critical": True}
    assert body["dependencies"]["kubernetes"]["status"] == "not configured"


async def test_credentials_wait_for_the_first_topic(api):
    c = api.client
    path = f"/v1/projects/{api.pid}/pubsub/credentials"
    r = await c.get(path, headers=api.admin)
    assert r.status_code == 503 and "first topic" in r.json()["error"]
    await _topic(api, "t")
    cred = (await c.get(path, headers=api.admin)).json()
    assert cred["topic_prefix"] == f"cai.{api.short}." and cred["token"].startswith(f"p-{api.short}:")
    assert cred["service_url"] and cred["note"]
    assert (await c.get(path, headers=api.admin)).json()["token"] == cred["token"]  # stable, never expires


async def test_operator_budget_setting(settings, clock, api_for):
    from caiplatform.platform import Platform
    from caiplatform.testing.http import asgi_client

    small = settings.model_copy(update={"pubsub_budget_bytes": 32 * 1024 * 1024})
    async with Platform.in_memory(small, clock=clock) as platform, asgi_client(platform) as client:
        api = await api_for(platform, client)
        await _topic(api, "a", max_bytes="16Mi")
        await _topic(api, "b", max_bytes="16Mi")
        r = await client.post(api.topics, headers=api.admin, json={"name": "c", "max_bytes": "1Ki"})
        assert r.status_code == 409 and "32.0MiB" in r.json()["error"]
