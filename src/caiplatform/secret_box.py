"""Agent secrets at rest: AES-256-GCM with a key the server holds and workloads cannot reach.

The key is `CAI_SECRETS_KEY` (any string; every replica on one PostgreSQL needs the same, as with
`CAI_SESSION_KEY`), else `<data-dir>/secrets.key`, created once with mode 0600 (the data directory is
never in a workload's view). A stored value reads `cai-aesgcm1:<key id>:<base64 nonce + ciphertext>`; the
key id (a hash of the key, not the key) lets a server with another key say so instead of failing on
an integrity check. The ciphertext is bound to its purpose (associated data), so a value sealed here
opens nowhere else the platform might use the same key.
"""

from __future__ import annotations

import base64
import hashlib
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from caiplatform.errors import InternalError

PREFIX = "cai-aesgcm1:"
PURPOSE = b"caiplatform agent secret/1"


class SecretKeyMismatch(InternalError):
    """A stored secret was sealed with another key, or changed in the database."""


class SecretBox:
    def __init__(self, material: bytes):
        self._key = hashlib.sha256(b"caiplatform/agent-secrets-key/1\0" + material).digest()
        self.key_id = hashlib.sha256(b"caiplatform/agent-secrets-key-id/1\0" + self._key).hexdigest()[:16]
        self._aead = AESGCM(self._key)

    def seal(self, plaintext: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, plaintext.encode("utf-8"), PURPOSE)
        return f"{PREFIX}{self.key_id}:{base64.b64encode(nonce + sealed).decode('ascii')}"

    def open(self, stored: str) -> str:
        """The plaintext of a stored value. A value without the prefix is returned as it is: it was
        written by a server before encryption (the migration seals every such row at the next start)."""
        if not is_sealed(stored):
            return stored
        key_id, _, body = stored[len(PREFIX):].partition(":")
        if key_id != self.key_id:
            raise SecretKeyMismatch(mismatch_message(key_id, self.key_id))
        try:
            raw = base64.b64decode(body, validate=True)
            return self._aead.decrypt(raw[:12], raw[12:], PURPOSE).decode("utf-8")
        except (InvalidTag, ValueError):
            raise SecretKeyMismatch("an agent secret in the database failed its integrity check (it was changed "
                                    "outside the platform)") from None


def is_sealed(stored: str) -> bool:
    return stored.startswith(PREFIX)


def key_id_of(stored: str) -> str | None:
    return stored[len(PREFIX):].partition(":")[0] if is_sealed(stored) else None


def mismatch_message(stored_id: str, own_id: str) -> str:
    return (f"agent secrets in the database were encrypted with another key (key id {stored_id}; this server's "
            f"is {own_id}): start every replica with the same CAI_SECRETS_KEY, or this one with the data "
            f"directory's secrets.key of the server that stored them (docs/operations.md)")
