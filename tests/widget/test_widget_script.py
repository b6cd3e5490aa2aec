"""The widget's script as the platform serves it: anonymous, one stable address that redirects to a
versioned address whose content never changes."""

from __future__ import annotations

from caiplatform_server.apis import core_widget


async def test_the_stable_address_redirects_to_the_current_version_for_minutes(client):
    response = await client.get("/v1/embed/widget.js")
    assert response.status_code == 302
    assert response.headers["location"] == f"widget-{core_widget.VERSION}.js"  # relative: proxies may add a prefix
    assert response.headers["cache-control"] == "public, max-age=300"


async def test_the_versioned_address_is_immutable_javascript_any_page_may_load(client):
    response = await client.get(f"/v1/embed/widget-{core_widget.VERSION}.js")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/javascript; charset=utf-8"
    assert response.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cross-origin-resource-policy"] == "cross-origin"
    assert response.content == core_widget.SCRIPT and b"attachShadow" in response.content
    again = await client.get(f"/v1/embed/widget-{core_widget.VERSION}.js",
                             headers={"If-None-Match": response.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


async def test_an_old_or_unknown_version_redirects_to_the_current_one(client):
    response = await client.get("/v1/embed/widget-0123456789abcdef.js")
    assert response.status_code == 302 and response.headers["location"] == f"widget-{core_widget.VERSION}.js"
    assert "immutable" not in response.headers["cache-control"]


async def test_the_script_names_no_other_host():
    """No CDN, no framework fetched at run time: every address it uses starts from its own `src`."""
    code = core_widget.SCRIPT.decode()
    body = code[code.index("(function () {"):]  # after the header comment's example tag
    assert "http://" not in body and "https://" not in body and "import(" not in body
