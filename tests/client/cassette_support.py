"""Recorded exchanges of the client with a live `caiplatform serve` (vcrpy), and how two recordings are
compared: same requests in the same order, same statuses, same shape of every JSON answer. Values that
differ from run to run (ids, tokens, timestamps, request ids, ports) are normalized first."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import vcr
import yaml

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD

CASSETTE = Path(__file__).parent / "cassettes" / "scenario.yaml"
RECORDED_BASE = "http://caiplatform.test"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _rebase(request: Any) -> Any:
    request.uri = re.sub(r"^http://127\.0\.0\.1:\d+", RECORDED_BASE, request.uri)
    if request.body and b"password" in (request.body if isinstance(request.body, bytes) else request.body.encode()):
        request.body = json.dumps({"email": ADMIN_EMAIL, "password": "<password>"}).encode()
    return request


def _scrub(response: dict[str, Any]) -> dict[str, Any]:
    body = response["body"].get("string", b"")
    text = body.decode() if isinstance(body, bytes) else body
    text = re.sub(r'"token": ?"[^"]*"', '"token": "<token>"', text)
    response["body"]["string"] = text.encode()
    response["headers"] = {k: v for k, v in response["headers"].items()
                           if k.lower() not in ("date", "server", "x-request-id")}
    return response


def recorder(path: Path, mode: str) -> vcr.VCR:
    return vcr.VCR(cassette_library_dir=str(path.parent), record_mode=mode,
                   match_on=("method", "path", "query"), filter_headers=["authorization"],
                   before_record_request=_rebase, before_record_response=_scrub, decode_compressed_response=True)


def scenario(client: Any) -> dict[str, Any]:
    """What a user does first: health, sign in, find the default project, an index's whole life."""
    seen: dict[str, Any] = {"live": client.health.live()}  # (/healthz depends on the machine's engines)
    signed_in = client.auth.login(email=ADMIN_EMAIL, password=ADMIN_PASSWORD)
    client.with_token(signed_in.token)
    seen["me"] = client.auth.me()
    project = next(p for p in client.projects.list() if p.slug == "default")
    seen["created"] = client.indexes.create(project.id, name="recorded", dimensions=3)
    seen["listed"] = [i.name for i in client.indexes.list(project.id)]
    seen["credential"] = client.indexes.credentials(project.id)
    client.indexes.delete(project.id, "recorded")
    try:
        client.indexes.get(project.id, "recorded")
    except Exception as exc:  # noqa: BLE001 - the answer is what is recorded and compared
        seen["after_delete"] = type(exc).__name__
    return seen


def _shape(value: Any) -> Any:
    """A JSON value's structure: keys and types, not values."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def summary(path: Path) -> list[tuple[str, str, int, Any]]:
    """(method, path with ids normalized, status, shape of the JSON answer) per recorded exchange."""
    data = yaml.safe_load(path.read_text())
    out = []
    for exchange in data["interactions"]:
        request, response = exchange["request"], exchange["response"]
        uri = UUID.sub("<id>", request["uri"].replace(RECORDED_BASE, ""))
        body = response["body"].get("string", b"")
        try:
            shape = _shape(json.loads(body)) if body else None
        except (ValueError, TypeError):
            shape = "text"
        out.append((request["method"], uri, response["status"]["code"], shape))
    return out
