"""`/docs`: Swagger UI over the served `/openapi.json`, from files in a package, so it renders offline.

FastAPI's own page loads Swagger UI from a CDN; a platform on a private network, or a laptop on a plane,
could not show it. `fastapi-offline` ships Swagger UI 5 (which reads OpenAPI 3.1); its files are served
here under `/docs/assets/`.
"""

from __future__ import annotations

import functools
from importlib.resources import files

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.staticfiles import StaticFiles

ASSETS = "/docs/assets"


# One router for every app: FastAPI analyses a route's handler when the route is made, so routes made
# inside `create_app` would cost that again for each app.
router = APIRouter()


@router.get("/docs", include_in_schema=False)
async def docs(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title=f"{request.app.title} API",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon.png",
    )


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


def mount_docs(app: FastAPI) -> None:
    """`/openapi.json`, `/docs` and the files of `/docs` (the app is made with `openapi_url=None`)."""
    app.mount(ASSETS, _assets(), name="docs-assets")
    app.include_router(router)


@functools.cache
def _assets() -> StaticFiles:
    return StaticFiles(directory=str(files("fastapi_offline") / "static"))
