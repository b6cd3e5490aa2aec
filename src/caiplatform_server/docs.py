"""`/docs`: Swagger UI over the served `/openapi.json`, from files in a package, so it renders offline.

FastAPI's own page loads Swagger UI from a CDN; a platform on a private network, or a laptop on a plane,
could not show it. `fastapi-offline` ships Swagger UI 5 (which reads OpenAPI 3.1); its files are served
here under `/docs/assets/`.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def mount_docs(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
        )
