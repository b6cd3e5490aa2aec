"""A tiny HTTP workload for the runtime conformance suite (no harness, no framework).

The same ASGI app runs in-process (`create_app(env)`, the in-memory runtime's `app_factory`) and as a
process (`python -m caiplatform.testing.tiny_app`, served by uvicorn on `$CAI_HARNESS_SOCKET` where the
runtime gives one, the local runtime's Unix socket, else on `$PORT`), so one suite checks both runtimes
with identical behaviour. Like the harness, it answers only callers presenting `$CAI_HARNESS_TOKEN` in
`X-CAI-Harness-Token` where it is given one (401 otherwise):

- `GET /healthz`: 200 `{status: ok}`; 503 when `TINY_UNHEALTHY` is set.
- `GET /whoami`: `{revision, greeting, pid, instance}` (`K_REVISION`, `GREETING`, the process id and
  an id unique to this app object).
- `GET /env/{name}`: `{name, value}` from the app's environment.
- `GET /sleep?seconds=S`: answers after S seconds (to hold a concurrency slot).
- `GET /say?text=T`: logs T (stdout as a process, `logging` in-process) and answers `{said: T}`.

`TINY_FAIL_START` makes the app fail while starting (an exception in-process, exit code 3 as a process).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

log = logging.getLogger("caiplatform.testing.tiny_app")


class TinyStartError(RuntimeError):
    pass


def create_app(env: Mapping[str, str], *, as_process: bool = False) -> Any:
    env = dict(env)
    if env.get("TINY_FAIL_START"):
        raise TinyStartError("TINY_FAIL_START is set: refusing to start")
    instance = secrets.token_hex(6)

    def say(text: str) -> None:
        if as_process:
            print(text, flush=True)
        else:
            log.warning(text)  # the root logger passes WARNING by default

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        token = env.get("CAI_HARNESS_TOKEN")
        if token and dict(scope.get("headers", [])).get(b"x-cai-harness-token", b"").decode("latin-1") != token:
            data = b'{"error": "the per-instance secret is missing or wrong"}'
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})
            return
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        status, body = 200, dict[str, Any]()
        if path == "/healthz":
            status, body = (503, {"status": "unhealthy"}) if env.get("TINY_UNHEALTHY") else (200, {"status": "ok"})
        elif path == "/whoami":
            body = {"revision": env.get("K_REVISION", ""), "greeting": env.get("GREETING", ""),
                    "pid": os.getpid(), "instance": instance}
        elif path.startswith("/env/"):
            name = path.removeprefix("/env/")
            body = {"name": name, "value": env.get(name)}
        elif path == "/sleep":
            await asyncio.sleep(float(query.get("seconds", "0.2")))
            body = {"slept": float(query.get("seconds", "0.2")), "instance": instance}
        elif path == "/say":
            say(query.get("text", ""))
            body = {"said": query.get("text", "")}
        else:
            status, body = 404, {"error": "not found"}
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    return app


def main() -> None:
    import uvicorn

    try:
        app = create_app(os.environ, as_process=True)
    except TinyStartError as exc:
        print(f"tiny_app: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)
    socket = os.environ.get("CAI_HARNESS_SOCKET") or None
    print(f"tiny_app starting on {'its socket' if socket else 'port ' + os.environ['PORT']}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), uds=socket, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
