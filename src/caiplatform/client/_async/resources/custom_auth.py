"""Sign-in: the generated routes, and a login that the client then uses for every later call."""

from __future__ import annotations

from typing import Any

from caiplatform.client._async.resources.auth import AsyncAuthResource as GeneratedAuth


class AsyncAuthResource(GeneratedAuth):
    async def login(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Sign in with e-mail and password; the session token answers every later call of this client."""
        signed_in = await super().login(*args, **kwargs)
        token = signed_in.get("token") if isinstance(signed_in, dict) else getattr(signed_in, "token", None)
        if token:
            self._client.with_token(token)
        return signed_in
