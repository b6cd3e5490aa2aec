"""Erasure of a user (`POST /v1/projects/{projectID}/forget`, `GET .../erasures/{erasureID}`): the request
and the receipt the service returns (rules: `caiplatform.domain.erasure`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from caiplatform.domain import erasure
from caiplatform.models.base import RequestModel, ResponseModel


class ForgetRequest(RequestModel):
    user_id: str = Field(description="the agent-side user id to erase (the `user_id` of invoke)")
    agents: list[str] | None = Field(
        None, description="only these agents of the project (their owner or a project admin); "
                          "omitted: every agent and function of the project (project admin)")

    @field_validator("user_id", mode="before")
    @classmethod
    def _user(cls, value: Any) -> str:
        return erasure.check_user_id(value)

    @field_validator("agents", mode="before")
    @classmethod
    def _agents(cls, value: Any) -> list[str] | None:
        return erasure.check_agents(value)


class ForgetEverywhere(RequestModel):
    user_id: str = Field(description="the agent-side user id to erase from every agent of every project")

    @field_validator("user_id", mode="before")
    @classmethod
    def _user(cls, value: Any) -> str:
        return erasure.check_user_id(value)


class StoreReceipt(ResponseModel):
    agent: str
    store: str = Field(description="log_history, memory or sessions")
    removed: dict[str, int] = Field(description="what was found and removed, counted (never the contents)")
    started_at: str
    finished_at: str


class Erasure(ResponseModel):
    erasure_id: str
    state: str = Field(description="pending, running or done")
    project_id: str
    user_id: str
    agents: list[str] = Field(description="the agents the erasure reaches")
    requested_by: str = Field(description="who asked (account e-mail, automation-token, ...)")
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    steps_done: int
    steps_total: int
    receipts: list[StoreReceipt] = Field(description="one per finished step, in the order they ran")
    notes: dict[str, str] = Field(description="stores that keep nothing of the user beyond the steps' reach, and why")


class ErasureList(ResponseModel):
    erasures: list[Erasure] = Field(description="one per project, each with its own progress and receipt")
