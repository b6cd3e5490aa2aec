"""Core API, the chat widget's script (document 1, "Embed"): the file a site owner includes with one tag.

`GET /v1/embed/widget.js` is the stable address of the snippet; it redirects (cached for minutes) to
`/v1/embed/widget-<version>.js`, whose version is a digest of the file, so that address never changes
content and is cached for a year. Both are anonymous and the same for every embed key: the key travels
in the tag's `data-embed-key`, and the public config and invoke routes gate it by the Origin allowlist.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from caiplatform_server.contract import ANONYMOUS, operation

router = APIRouter(tags=["invoke"])

SCRIPT = resources.files("caiplatform_server").joinpath("static/widget.js").read_bytes()
VERSION = hashlib.sha256(SCRIPT).hexdigest()[:16]
ETAG = f'"{VERSION}"'
STABLE_MAX_AGE = 300
SCRIPT_HEADERS = {
    "Cache-Control": "public, max-age=31536000, immutable",
    "ETag": ETAG,
    "X-Content-Type-Options": "nosniff",
    # Any page may load it, also one that isolates itself (COEP) or pins it with integrity="...".
    "Cross-Origin-Resource-Policy": "cross-origin",
    "Access-Control-Allow-Origin": "*",
}


JS = "text/javascript"
SCRIPT_ANSWER: dict[str, Any] = {"description": "The script", "content": {JS: {"schema": {"type": "string"}}}}
REDIRECT: dict[str, Any] = {"description": "Redirect to the current version (Location: widget-<version>.js)",
            "headers": {"Location": {"schema": {"type": "string"}}}}


def _script_operation(*answers: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    kwargs = operation(security=ANONYMOUS, content_type=JS)
    kwargs["responses"].update(dict(answers))
    return kwargs


def _to_current() -> Response:
    # Relative, so the redirect also holds behind a proxy that mounts the platform under a prefix.
    return RedirectResponse(f"widget-{VERSION}.js", status_code=302,
                            headers={"Cache-Control": f"public, max-age={STABLE_MAX_AGE}"})


@router.get("/v1/embed/widget.js", summary="The chat widget's script (redirects to the current version)",
            **_script_operation((302, REDIRECT), (200, SCRIPT_ANSWER)))
async def widget_stable() -> Response:
    return _to_current()


@router.get("/v1/embed/widget-{version}.js", summary="The chat widget's script, one version",
            **_script_operation((200, SCRIPT_ANSWER), (302, REDIRECT), (304, {"description": "Not modified"})))
async def widget_versioned(version: str, request: Request) -> Response:
    if version != VERSION:  # an older (or unknown) version: never other bytes under an immutable address
        return _to_current()
    if request.headers.get("if-none-match") == ETAG:
        return Response(status_code=304, headers=SCRIPT_HEADERS)
    return Response(SCRIPT, media_type="text/javascript; charset=utf-8", headers=SCRIPT_HEADERS)
