from agents_support import deploy, wait_settled


async def test_deploy_to_ready(client, world):
    r = await deploy(client, world.member, "hello")
    assert r.status_code == 202, r.text
    body = await wait_settled(client, world.member, "hello")
    assert body["state"] == "ready", body.get("message")
