"""`/healthz` and `/livez`: what the platform says of itself."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from caiplatform.models.base import OpenResponseModel, ResponseModel


class PlatformHealth(OpenResponseModel):
    """Serving several APIs: `{status, apis: {<api>: its health}, sandbox}`; serving one: that API's own
    health answer (its fields are documented by the API)."""

    status: str = Field(description="`ok` when every served API and its dependencies are healthy, else `degraded`; "
                        "`starting` (503) while the server brings its engines up")
    apis: dict[str, dict[str, Any]] | None = None
    sandbox: dict[str, Any] | None = Field(None, description="whether deployed code runs confined, and how")


class Liveness(ResponseModel):
    status: Literal["ok"]
