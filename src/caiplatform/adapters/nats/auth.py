"""Direct broker credentials on the platform's own NATS server: one user per project.

The embedded server's configuration lists a `platform` user (everything) and, for each project that
has topics, a user `p-<short>` whose permissions name exactly that project's subjects and streams:

- publish: `cai.<short>.>` (produce), `$JS.API.INFO`, and per stream `S` of the project
  `$JS.API.STREAM.INFO.S`, `$JS.API.CONSUMER.INFO.S.*`, `$JS.API.CONSUMER.MSG.NEXT.S.*`, `$JS.ACK.S.>`
  (look a topic up, read from its subscriptions, acknowledge);
- subscribe: `cai.<short>.>` and the project's own reply inbox `_INBOX_<short>.>` (the client sets
  `inbox_prefix`), never the shared `_INBOX.>`, so one project cannot read another's replies.

Passwords are HMACs of the platform signing key: stable across restarts, never expiring, and revoked
all at once by rotating that key, as the specification describes. The configuration is rewritten and
the server reloaded (SIGHUP) whenever a project's set of topics changes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path

MARKER = "# caiplatform messaging authorization (rewritten when topics change)\n"
PLATFORM_USER = "platform"


def inbox_prefix(short: str) -> str:
    return f"_INBOX_{short}"


class NatsProjectAuth:
    def __init__(self, key: bytes):
        self._key = key

    def _derive(self, purpose: str) -> str:
        mac = hmac.new(self._key, f"caiplatform/nats/{purpose}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    @property
    def platform_password(self) -> str:
        return self._derive("platform")

    @staticmethod
    def project_user(short: str) -> str:
        return f"p-{short}"

    def project_password(self, short: str) -> str:
        return self._derive(f"project/{short}")

    def token(self, short: str) -> str:
        """`<user>:<password>`, the userinfo of a `nats://` URL."""
        return f"{self.project_user(short)}:{self.project_password(short)}"

    def config(self, projects: Mapping[str, list[str]]) -> str:
        """The `authorization` block for `{project short: [its stream names]}`."""
        users = [f"    {{user: {json.dumps(PLATFORM_USER)}, password: {json.dumps(self.platform_password)}}}"]
        for short, streams in sorted(projects.items()):
            publish = [f"cai.{short}.>", "$JS.API.INFO"]
            for stream in sorted(streams):
                publish += [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.CONSUMER.INFO.{stream}.*",
                            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*", f"$JS.ACK.{stream}.>"]
            subscribe = [f"cai.{short}.>", f"{inbox_prefix(short)}.>"]
            users.append(
                f"    {{user: {json.dumps(self.project_user(short))}, "
                f"password: {json.dumps(self.project_password(short))}, permissions: {{"
                f"publish: {{allow: {json.dumps(publish)}}}, subscribe: {{allow: {json.dumps(subscribe)}}}}}}}"
            )
        return MARKER + "authorization {\n  users = [\n" + "\n".join(users) + "\n  ]\n}\n"


def rewrite_and_reload(config_path: Path, block: str, pid: int | None) -> None:
    """Replace the authorization block of a running server's configuration and make it re-read it."""
    text = config_path.read_text()
    head = text.split(MARKER, 1)[0]
    config_path.write_text(head + block)
    if pid:
        os.kill(pid, signal.SIGHUP)
