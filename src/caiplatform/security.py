"""Credential material: password hashing, session tokens, API keys.

Passwords use argon2id. Session tokens are HS256 JWTs signed with the platform session key: stateless
and not revocable, as the specification says. API keys are `cai_<keyid>_<secret>`; only a SHA-256 of
the secret is stored (the secret carries 256 bits, so a slow hash adds nothing but latency).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jwt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

SESSION_TTL_SECONDS = 12 * 3600
_hasher = PasswordHasher()

API_KEY_RE = re.compile(r"^cai_(?P<key_id>[a-z0-9]{12})_(?P<secret>[A-Za-z0-9_-]{20,})$")
WORKLOAD_KEY_RE = re.compile(r"^cai_wl_(?P<key_id>[a-z0-9]{12})_(?P<secret>[A-Za-z0-9_-]{20,})$")


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


@functools.cache
def dummy_password_hash() -> str:
    """A hash to verify against when the account does not exist, so that an unknown e-mail costs the same.
    Made on first use: at import it cost every process that imports this module (a workload's harness
    among them) a full argon2 hash."""
    return hash_password(secrets.token_urlsafe(16))


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(stored_hash: str, secret: str) -> bool:
    return hmac.compare_digest(stored_hash, hash_secret(secret))


def generate_password() -> str:
    return secrets.token_urlsafe(18)


@dataclass(frozen=True)
class MintedKey:
    key_id: str
    secret: str  # the whole credential, shown once
    secret_hash: str


def _key_id() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(12))


def mint_api_key() -> MintedKey:
    key_id, raw = _key_id(), secrets.token_urlsafe(32)
    return MintedKey(key_id, f"cai_{key_id}_{raw}", hash_secret(raw))


def mint_workload_key() -> MintedKey:
    key_id, raw = _key_id(), secrets.token_urlsafe(32)
    return MintedKey(key_id, f"cai_wl_{key_id}_{raw}", hash_secret(raw))


class SessionTokens:
    """Issues and verifies 12-hour session tokens."""

    # Tokens whose signature checked out, so a client sending the same token on every request pays the
    # JWT decode once. Safe because a token is immutable and not revocable (its expiry is still checked
    # on every call, and the account it names is read anew by every request); only valid tokens are
    # kept, so made-up ones cannot fill it.
    VERIFIED_MAX = 4096

    def __init__(self, key: bytes, ttl_seconds: int = SESSION_TTL_SECONDS):
        self._key = key
        self.ttl = ttl_seconds
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def issue(self, user_id: str, now: float) -> tuple[str, int]:
        expires_at = int(now) + self.ttl
        token = jwt.encode({"sub": user_id, "iat": int(now), "exp": expires_at, "typ": "session"}, self._key, "HS256")
        return token, expires_at

    def verify(self, token: str, now: float) -> dict[str, Any] | None:
        claims = self._verified.get(token)
        if claims is None:
            try:
                claims = jwt.decode(
                    token, self._key, algorithms=["HS256"], options={"verify_exp": False, "require": ["sub", "exp"]}
                )
            except jwt.PyJWTError:
                return None
            if claims.get("typ") != "session":
                return None
            self._verified[token] = claims
            if len(self._verified) > self.VERIFIED_MAX:
                self._verified.popitem(last=False)
        if int(claims["exp"]) <= now:
            self._verified.pop(token, None)
            return None
        return dict(claims)
