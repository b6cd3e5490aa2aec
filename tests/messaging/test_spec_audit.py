"""Spec-fidelity audit of the messaging API (document 3) over HTTP, in-process on the in-memory broker:
the cases an earlier pass missed."""

from __future__ import annotations


async def test_max_bytes_takes_any_resource_quantity(api):
    """`max_bytes` is "a resource quantity": fractions, decimal suffixes and exponents are quantities too,
    claimed against the budget by their byte value, rounded up to a whole byte as Kubernetes does."""
    c = api.client
    for name, quantity in (("fraction", "0.5Gi"), ("decimal", "100M"), ("exponent", "1e6"), ("leading-dot", ".5Ki")):
        r = await c.post(api.topics, headers=api.admin, json={"name": name, "max_bytes": quantity})
        assert r.status_code == 201, r.text
        assert r.json()["max_bytes"] == quantity
    quota = (await c.get(f"/v1/projects/{api.pid}/pubsub/quota", headers=api.member)).json()
    assert quota["allocated_bytes"] == 512 * 1024**2 + 100_000_000 + 1_000_000 + 512
    r = await c.patch(api.topic("fraction"), headers=api.admin, json={"max_bytes": "1.5Gi"})
    assert r.status_code == 409 and "does not fit" in r.json()["error"]
    for quantity in ("0", "0.0Mi", "-1Mi", "1m", "1.5 Gi", "Gi", "1e"):
        r = await c.post(api.topics, headers=api.admin, json={"name": "bad", "max_bytes": quantity})
        assert r.status_code == 400 and r.json()["error"] == f'max_bytes "{quantity}" is not a valid quantity'


async def test_dead_letter_attempts_read_back_without_a_topic(api):
    """`dead_letter.after_attempts` bounds a push message even when no dead-letter topic is set (it is
    dropped then): a value the caller set is part of the subscription and reads back."""
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "events"})).status_code == 201
    assert (await c.post(api.topics, headers=api.admin, json={"name": "parked"})).status_code == 201
    push = {"mode": "push", "push": {"url": f"http://worker.cai-p-{api.short}"}}
    r = await c.post(api.subs("events"), headers=api.admin,
                     json={"name": "push", "deliver": push, "dead_letter": {"after_attempts": 3}})
    assert r.status_code == 201, r.text
    assert r.json()["dead_letter"] == {"after_attempts": 3}
    assert (await c.get(api.sub("events", "push"), headers=api.member)).json()["dead_letter"] == {"after_attempts": 3}
    r = await c.patch(api.sub("events", "push"), headers=api.admin, json={"dead_letter": {"topic": "parked"}})
    assert r.json()["dead_letter"] == {"topic": "parked", "after_attempts": 3}
    r = await c.patch(api.sub("events", "push"), headers=api.admin,
                      json={"dead_letter": {"topic": "", "after_attempts": 4}})
    assert r.json()["dead_letter"] == {"after_attempts": 4}
    r = await c.patch(api.sub("events", "push"), headers=api.admin, json={"dead_letter": {"topic": ""}})
    assert "dead_letter" not in r.json()  # `{topic: ''}` clears the block
    plain = await c.post(api.subs("events"), headers=api.admin, json={"name": "plain"})
    assert "dead_letter" not in plain.json()


async def test_a_method_path_with_another_http_method_is_405(api):
    """Methods ride on the last segment and take POST: `GET .../topics/t:publish` is a wrong method (405),
    not a topic named `t:publish`; an unknown verb stays the 404 `unknown method :<verb>`."""
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "t"})).status_code == 201
    assert (await c.post(api.subs("t"), headers=api.admin, json={"name": "s"})).status_code == 201
    for path, verb in ((api.topic("t") + ":publish", "publish"), (api.sub("t", "s") + ":pull", "pull"),
                       (api.sub("t", "s") + ":acknowledge", "acknowledge"), (api.sub("t", "s") + ":ack", "ack")):
        for method in ("GET", "PATCH", "DELETE"):
            r = await c.request(method, path, headers=api.admin, json={} if method == "PATCH" else None)
            assert r.status_code == 405, (method, path, r.text)
            assert r.json()["error"] == f"':{verb}' is called with POST"
    for path in (api.topic("t") + ":frob", api.sub("t", "s") + ":frob"):
        r = await c.get(path, headers=api.member)
        assert r.status_code == 404 and r.json()["error"] == "unknown method :frob"
    assert (await c.get(api.sub("t", "s"), headers=api.member)).status_code == 200  # nothing was deleted


async def test_huge_counts_are_refused_not_a_500(api):
    """No body of any shape produces a 5xx: a count past what the broker and database hold is a 400, and
    nothing is created or changed."""
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "t"})).status_code == 201
    assert (await c.post(api.topics, headers=api.admin, json={"name": "dlq"})).status_code == 201
    assert (await c.post(api.subs("t"), headers=api.admin, json={"name": "s"})).status_code == 201
    huge = 2**70
    for body, field in (({"max_deliver": huge}, "max_deliver"), ({"max_ack_pending": huge}, "max_ack_pending"),
                        ({"dead_letter": {"topic": "dlq", "after_attempts": huge}}, "dead_letter.after_attempts")):
        r = await c.post(api.subs("t"), headers=api.admin, json={"name": "big", **body})
        assert r.status_code == 400 and r.json()["error"] == f"{field} must be at most 2147483647", r.text
        r = await c.patch(api.sub("t", "s"), headers=api.admin, json=body)
        assert r.status_code == 400 and r.json()["error"] == f"{field} must be at most 2147483647", r.text
    assert (await c.post(api.subs("t"), headers=api.admin, json={"name": "ok", "max_deliver": 2**31 - 1})).status_code == 201
    names = [s["name"] for s in (await c.get(api.subs("t"), headers=api.member)).json()["subscriptions"]]
    assert names == ["ok", "s"]
    r = await c.post(api.sub("t", "s") + ":pull", headers=api.member, json={"max_messages": huge, "timeout_ms": 0})
    assert r.status_code == 200  # silently capped, as the document says
    r = await c.post(api.subs("t"), headers=api.admin, json={"name": "slow", "ack_deadline_seconds": huge})
    assert r.status_code == 400 and r.json()["error"] == "ack_deadline_seconds must be between 1 and 600"


async def test_messaging_is_not_rate_limited(settings, api_for):
    """Document 3 gives the messaging API no rate limit (no 429 in its error table or limits): a signed-in
    caller publishes past the bucket that meters the other APIs; anonymous callers stay metered."""
    from caiplatform.platform import Platform
    from caiplatform.testing.http import asgi_client

    platform = Platform.in_memory(settings.model_copy(update={"ratelimit_rps": 0.001, "ratelimit_burst": 3}))
    await platform.start()
    try:
        async with asgi_client(platform) as client:
            api = await api_for(platform, client)
            assert (await client.post(api.topics, headers=api.admin, json={"name": "t"})).status_code == 201
            for _ in range(10):
                r = await client.post(api.topic("t") + ":publish", headers=api.member, json={"messages": [{}]})
                assert r.status_code == 200, r.text
            assert (await client.get(f"/v1/projects/{api.pid}/pubsub/usage", headers=api.member)).status_code == 200
            statuses = [(await client.get(f"/v1/projects/{api.pid}/services", headers=api.member)).status_code
                        for _ in range(5)]
            assert 429 in statuses  # the same caller is metered on the serverless API
            statuses = [(await client.get(api.topics)).status_code for _ in range(5)]
            assert statuses[:3] == [401] * 3 and 429 in statuses
    finally:
        await platform.aclose()


async def test_a_refused_value_is_quoted_as_json(api):
    """The quoted value in `max_bytes "X" is not a valid quantity` (and its siblings) is what the caller
    sent, as JSON text: never a Python representation."""
    c = api.client
    cases = [({"max_bytes": ["1Mi"]}, 'max_bytes "["1Mi"]" is not a valid quantity'),
             ({"max_bytes": True}, 'max_bytes "true" is not a valid quantity'),
             ({"max_age": None, "discard": False}, 'discard must be old or new (got "false")'),
             ({"max_age": {"h": 1}}, 'max_age "{"h": 1}" is not a valid duration')]
    for body, message in cases:
        r = await c.post(api.topics, headers=api.admin, json={"name": "t", **body})
        assert r.status_code == 400 and r.json()["error"] == message
    assert (await c.post(api.topics, headers=api.admin, json={"name": "t"})).status_code == 201
    cases = [({"type": None, "start_from": True}, 'start_from must be all or new (got "true")'),
             ({"deliver": {"mode": ["push"]}}, 'deliver.mode must be "pull" or "push" (got "["push"]")')]
    for body, message in cases:
        r = await c.post(api.subs("t"), headers=api.admin, json={"name": "s", **body})
        assert r.status_code == 400 and r.json()["error"] == message


async def test_concurrent_creates_of_one_name_are_one_201_and_409s(settings, api_for, tmp_path):
    """Creates racing for one name (on a file database, where requests really overlap: the in-memory one takes turns): one wins, the
    others get the document's 409, never a 500 from the unique constraint."""
    import asyncio

    from caiplatform.db import Database
    from caiplatform.platform import Platform
    from caiplatform.testing.http import asgi_client

    platform = Platform(settings, db=Database.sqlite_file(tmp_path / "race.db"), mode="memory")
    platform._prepare()
    await platform.start()
    try:
        async with asgi_client(platform) as client:
            api = await api_for(platform, client)
            for _ in range(3):
                name = f"race-{_}"
                results = await asyncio.gather(*(client.post(api.topics, headers=api.admin, json={"name": name})
                                                 for _ in range(6)))
                assert sorted(r.status_code for r in results) == [201] + [409] * 5, [r.text for r in results]
                results = await asyncio.gather(*(client.post(api.subs(name), headers=api.admin, json={"name": "s"})
                                                 for _ in range(6)))
                assert sorted(r.status_code for r in results) == [201] + [409] * 5, [r.text for r in results]
    finally:
        await platform.aclose()
