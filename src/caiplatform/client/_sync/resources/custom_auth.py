# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.
"""Sign-in: the generated routes, and a login that the client then uses for every later call."""

from __future__ import annotations

from typing import Any

from caiplatform.client._sync.resources.auth import AuthResource as GeneratedAuth
from caiplatform.client._base import NOT_GIVEN, NotGiven, body_of
from caiplatform.models.auth import LoginRequest, SignIn


class AuthResource(GeneratedAuth):
    def login(self, body: LoginRequest | None = None, /, *, timeout: float | None | NotGiven = NOT_GIVEN,
                    **fields: Any) -> SignIn:
        """Sign in with e-mail and password; the session token answers every later call of this client."""
        model = body if body is not None else LoginRequest.parse(fields)
        signed_in = self._client.request("POST", "/v1/auth/login", SignIn, timeout=timeout, json=body_of(model))
        self._client.with_token(signed_in.token)
        return signed_in
