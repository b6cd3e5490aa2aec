"""Forgetting a user: the rules of an erasure, its steps and its receipt (issue 37; `docs/erasure.md`).

Document 1 promises "a per-user erase ... outside this surface (forget by user id)" beside memorize. An
erasure removes one agent-side user id (the `user_id` of invoke) from every store that holds what that
user said, in the scope its caller may manage:

- `agents` named: those agents of the project; the caller must pass each one's owner gate (its owner, or
  a project admin); an agent the caller may not see is 404, like every agent route;
- `agents` omitted: every agent and function of the project; project admin only (a member is 403, a
  caller without any role 404, as for every project route of document 2).

What is erased, per agent, in this order (the last step removes what the earlier ones search with, so a
resumed erasure still finds everything):

1. `log_history`: saved log lines that carry the user's id, one of their session ids, or the text of one of
   their messages (`MIN_TEXT_CHARS` characters or more, so that "hi" does not erase every line saying it);
2. `memory`: the long-term memories `memorize` committed from the user's sessions (every memory's payload
   records the `user_id` and `session_id` that contributed it);
3. `sessions`: every session of the user with its transcript and state, embed-widget sessions included
   (the widget's turns are the agent's sessions), and the user in the browser's user list.

Each step is all or nothing in its store and idempotent, so an erasure interrupted anywhere (a `kill -9`)
runs its unfinished steps again and converges. The receipt holds counts and times, never contents.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from caiplatform import validation
from caiplatform.errors import BadRequest

ACTION = "user.forget"  # the audit log's action for a finished erasure (its receipt is the detail)

PENDING, RUNNING, DONE = "pending", "running", "done"
STATES = (PENDING, RUNNING, DONE)

LOG_HISTORY, MEMORY, SESSIONS = "log_history", "memory", "sessions"
STORES = (LOG_HISTORY, MEMORY, SESSIONS)

#: The stores that keep nothing of a user beyond what the steps above reach, as the receipt states them.
NOTHING_ELSE = {
    "code_sandbox": "keeps no input or output after a run: a snippet and its result live only in the "
                    "session's transcript (erased with the sessions)",
    "embed_widget": "its conversations are the agent's sessions (erased with the sessions); the browser "
                    "keeps only the session id",
    "caches": "an instance's live conversation state follows the transcript's version: a session erased and "
              "begun again under the same id starts empty",
    "adk_artifacts": "files an ADK turn kept (a code-executor snippet's output, a tool's save_artifact) are "
                     "deleted when the turn ends: none outlives it in the instance's memory",
}

MIN_TEXT_CHARS = 12
MAX_AGENTS = 100
#: How long a replica's claim on a running erasure lasts without being renewed.
LEASE_SECONDS = 30.0

USER_ID_REQUIRED = "user_id is required"
AGENTS_SHAPE = "agents must be a list of agent names"


@dataclass(frozen=True)
class Step:
    agent: str
    store: str

    @property
    def key(self) -> str:
        return f"{self.agent}/{self.store}"


def steps_for(agents: Iterable[str]) -> list[Step]:
    return [Step(agent, store) for agent in agents for store in STORES]


def check_user_id(value: Any) -> str:
    if value is None or value == "":
        raise BadRequest(USER_ID_REQUIRED)
    return validation.user_id(value)


def check_agents(value: Any) -> list[str] | None:
    """The named agents, deduplicated in order; None means every agent of the project."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > MAX_AGENTS:
        raise BadRequest(f"{AGENTS_SHAPE} (1 to {MAX_AGENTS})")
    names: list[str] = []
    for name in value:
        if not isinstance(name, str):
            raise BadRequest(AGENTS_SHAPE)
        validation.agent_name(name)
        if name not in names:
            names.append(name)
    return names


def scope_key(agents: Sequence[str] | None) -> str:
    """Two requests with the same user and scope are one erasure while it runs (idempotence)."""
    return "*" if agents is None else ",".join(sorted(agents))


def log_needles(user_id: str, session_ids: Iterable[str], texts: Iterable[str]) -> list[str]:
    """What marks a log line as the user's: their id, a session id, a message text long enough to be theirs."""
    found: list[str] = [user_id, *session_ids]
    for text in texts:
        text = text.strip()
        if len(text) >= MIN_TEXT_CHARS:
            found.append(text)
    return list(dict.fromkeys(n for n in found if n))


def memory_filter(user_id: str) -> dict[str, Any]:
    """The payload filter of the memories one user contributed (`caiplatform.services.invoke_memory`)."""
    return {"must": [{"key": "user_id", "match": {"value": user_id}}]}


def progress(done: int, total: int) -> dict[str, int]:
    return {"steps_done": done, "steps_total": total}
