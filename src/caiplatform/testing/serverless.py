"""Test helpers for the serverless area: a recording echo app for the in-memory runtime, and the
default project's member, admin and stranger."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("caiplatform.testing.serverless.echo")


@dataclass
class Received:
    """Every request the echo app answered (all instances, all revisions)."""

    requests: list[dict[str, Any]] = field(default_factory=list)


def echo_app_factory(received: Received):
    """An app factory for the in-memory runtime: any image starts an app that answers `/healthz`,
    records every other request and echoes it back with its revision and env."""

    def factory(image: Any, env: Mapping[str, str]) -> Any:
        env = dict(env)
        if env.get("ECHO_FAIL_START"):
            raise RuntimeError("ECHO_FAIL_START is set")

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while True:
                    message = await receive()
                    kind = message["type"].removeprefix("lifespan.")
                    await send({"type": f"lifespan.{kind}.complete"})
                    if kind == "shutdown":
                        return
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if scope["path"] == "/healthz":
                payload: dict[str, Any] = {"status": "ok"}
            else:
                headers = {k.decode(): v.decode() for k, v in scope["headers"]}
                payload = {"path": scope["path"], "method": scope["method"], "body": body.decode(),
                           "headers": headers, "revision": env.get("K_REVISION", ""), "env": env,
                           "image": image.reference}
                received.requests.append(payload)
                log.warning("handled %s %s", scope["method"], scope["path"])
            data = json.dumps(payload).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})

        return app

    return factory


TEST_IMAGE_PREFIX = "registry.local/cai-test-"


def test_images(builder: Any):
    """An image resolver that knows the builder's images and, as stand-ins for built ones, every
    `registry.local/cai-test-...` reference (the echo app runs for them)."""
    from caiplatform.ports.builder import Image

    async def resolve(reference: str) -> Any:
        found = await builder.resolve(reference)
        if found is None and reference.startswith(TEST_IMAGE_PREFIX):
            found = Image(reference=reference, digest=reference.rpartition("@")[2], framework="container")
        return found

    return resolve
