"""Sign-in and session models (document 2, "Authentication and session"), and the core API's health.

The rules with the specification's messages run before pydantic's own checks, so a caller sees
`email and password are required` and never pydantic's wording.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from caiplatform.errors import BadRequest
from caiplatform.models.base import RequestModel, ResponseModel

PlatformRole = Literal["admin", "user"]

# ------------------------------------------------------------------------------------------ requests


class LoginRequest(RequestModel):
    """`POST /v1/auth/login`: both fields required."""

    email: str
    password: str

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, dict):
            email, password = data.get("email"), data.get("password")
            if not isinstance(email, str) or not email.strip() or not isinstance(password, str) or not password:
                raise BadRequest("email and password are required")
        return data


class PasswordChange(RequestModel):
    """`POST /v1/auth/change-password`. The new password's rules run after the current one is checked."""

    current_password: str
    new_password: str

    @model_validator(mode="before")
    @classmethod
    def _spec_rules(cls, data: Any) -> Any:
        if isinstance(data, dict) and (
            not isinstance(data.get("current_password"), str) or not isinstance(data.get("new_password"), str)
        ):
            raise BadRequest("current_password and new_password are required")
        return data


# ------------------------------------------------------------------------------------------ views


class SignIn(ResponseModel):
    """A fresh session token (login and password change)."""

    token: str
    email: str
    role: PlatformRole
    must_change_password: bool
    expires_at: int = Field(description="Unix seconds")


class Me(ResponseModel):
    """`GET /v1/auth/me`: the live effective role; `expires_at` is null for credentials that do not expire."""

    email: str
    role: PlatformRole
    must_change_password: bool
    expires_at: int | None


class CoreHealth(ResponseModel):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "unreachable"]
    database_detail: str | None = None

