"""What the sync and async clients share and what needs no I/O: settings, headers, retries, pagination."""

from __future__ import annotations

import os
import random
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRY_BUDGET = 30.0  # seconds of waiting between attempts, in all, for one call
RETRY_STATUSES = frozenset({429, 503})
IN_PROCESS_URL = "http://caiplatform.in-process"

M = TypeVar("M", bound=BaseModel)


class NotGiven:
    """A keyword left out (so `timeout=None`, no timeout, stays distinct from the client's default)."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN = NotGiven()


def config_dir() -> Path:
    """Where `caiplatform login` keeps its credential: `$XDG_CONFIG_HOME/caiplatform`."""
    root = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(root) / "caiplatform"


def credentials_file() -> Path:
    return config_dir() / "credentials.json"


@dataclass(frozen=True)
class StoredLogin:
    base_url: str
    token: str


def read_stored_login() -> StoredLogin | None:
    import json

    path = credentials_file()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        return None
    return StoredLogin(str(data.get("base_url") or DEFAULT_BASE_URL), data["token"])


def write_stored_login(login: StoredLogin) -> Path:
    """Owner-only: the directory 0700, the file 0600, written without a moment of wider permissions."""
    import json

    path = credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(stat.S_IRWXU)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"base_url": login.base_url, "token": login.token}, handle)
    path.chmod(0o600)
    return path


def resolve(base_url: str | None, token: str | None, api_key: str | None) -> tuple[str, str | None]:
    """The base URL and credential: explicit arguments, then `CAI_BASE_URL`/`CAI_TOKEN`/`CAI_API_KEY`,
    then the login stored by `caiplatform login`."""
    stored = read_stored_login() if not (token or api_key or os.environ.get("CAI_TOKEN")
                                         or os.environ.get("CAI_API_KEY")) else None
    url = base_url or os.environ.get("CAI_BASE_URL") or (stored.base_url if stored else DEFAULT_BASE_URL)
    credential = token or api_key or os.environ.get("CAI_TOKEN") or os.environ.get("CAI_API_KEY") or (
        stored.token if stored else None)
    return url.rstrip("/"), credential


def retry_delay(response: httpx.Response | None, attempt: int) -> float:
    """How long to wait before attempt `attempt + 1`: the server's Retry-After when it says, else
    exponential backoff with jitter (0.5 s, 1 s, 2 s, … capped at 8 s)."""
    if response is not None:
        header = response.headers.get("retry-after", "")
        try:
            return max(0.0, float(header))
        except ValueError:
            pass
    return min(8.0, 0.5 * 2**attempt) * (0.75 + random.random() / 2)


def should_retry(response: httpx.Response) -> bool:
    return response.status_code in RETRY_STATUSES


def timeout_of(value: float | None | NotGiven, default: float | None) -> httpx.Timeout:
    seconds = default if isinstance(value, NotGiven) else value
    return httpx.Timeout(seconds)


def query(params: dict[str, Any] | None) -> dict[str, Any] | None:
    """Query parameters without the ones left out (None), booleans as the API spells them."""
    if not params:
        return None
    return {k: ("true" if v is True else "false" if v is False else v) for k, v in params.items() if v is not None}


def body_of(model: BaseModel | None) -> Any:
    """A request model as the JSON the API reads: the fields the caller set, none of the defaults."""
    if model is None:
        return None
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


def multipart(model: BaseModel) -> dict[str, Any]:
    """A form model as httpx `files`: bytes fields as file parts, the rest as text parts."""
    parts: dict[str, Any] = {}
    for name, value in model.model_dump(by_alias=True, exclude_unset=True).items():
        if isinstance(value, bytes):
            parts[name] = (f"{name}.tar.gz", value, "application/gzip")
        elif value is not None:
            parts[name] = (None, str(value).lower() if isinstance(value, bool) else str(value))
    return parts
