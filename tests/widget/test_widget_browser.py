"""The chat widget in a real browser: Debian's Chromium (Playwright) loads a static page from a loopback
origin with the one-tag snippet, against a real `caiplatform serve` whose deployed chat function streams
the scripted model's answer token by token. One browser and one server for the module."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import httpx
import pytest

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.model_server import ChatRequest, ScriptedModel, Step
from caiplatform.testing.serve import ServeProcess

from ..examples_support import example_tarball, wait_ready
from .browser_support import OUTPUT_DIR, chromium, page_origin

pytestmark = pytest.mark.e2e

AGENT = "concierge"
ACCENT = "#0f766e"  # rgb(15, 118, 110)
EMBED = {"enabled": True, "title": "Acme help", "subtitle": "Replies in seconds", "greeting": "Hi! How can I help?",
         "accent_color": ACCENT, "launcher_text": "Ask Acme", "position": "right"}
WIDGET_PREFIX = "caiplatform widget:"  # every console message of the widget
ANSWER = "Your parcel arrives on Tuesday between nine and noon."


@dataclass
class Site:
    server: ServeProcess
    model: ScriptedModel
    admin: httpx.Client
    allowed: str  # an origin on the allowlist
    other: str  # an origin that is not
    hold: threading.Event = field(default_factory=threading.Event)

    def key(self) -> str:
        return self.admin.get(f"/v1/agents/{AGENT}/embed").json()["embed_key"]

    def page(self, origin: str | None = None, theme: str = "light", key: str | None = None) -> str:
        return f"{origin or self.allowed}/?theme={theme}&key={key or self.key()}"

    def answer(self, text: str, *, hold: bool = False) -> None:
        """The model answers `text` (streamed word by word); with `hold`, it stops after the first word
        until `self.hold` is set."""
        self.hold.clear()
        self.model.set_script(lambda request: Step(content=text, hold=self.hold if hold else None))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    model = ScriptedModel()
    with model.serve() as model_url:
        env = {"MODEL_BASE_URL": model_url, "MODEL_API_KEY": "test-key", "MODEL_NAME": "scripted",
               "CAI_INTERNAL_TOKEN": "internal-widget", "RATELIMIT_RPS": "10000", "RATELIMIT_BURST": "10000"}
        with ServeProcess(tmp_path_factory.mktemp("widget") / "data", env=env) as server:
            script_url = f"{server.base_url}/v1/embed/widget.js"
            with page_origin(script_url) as allowed, page_origin(script_url) as other:
                token = httpx.post(f"{server.base_url}/v1/auth/login",
                                   json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
                with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=120) as admin:
                    deployed = admin.post("/v1/agents", params={"project": "default"},
                                          data={"name": AGENT, "framework": "function"},
                                          files={"code": ("code.tar.gz", example_tarball("chat-function"))})
                    assert deployed.status_code == 202, deployed.text
                    wait_ready(admin, AGENT)
                    embed = admin.put(f"/v1/agents/{AGENT}/embed", json={**EMBED, "allowed_origins": [allowed]})
                    assert embed.status_code == 200, embed.text
                    site = Site(server, model, admin, allowed, other)
                    try:
                        yield site
                    finally:
                        site.hold.set()


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


@dataclass
class Tab:
    page: object
    console: list[str]

    def widget_messages(self) -> list[str]:
        return [text for text in self.console if text.startswith(WIDGET_PREFIX)]


@pytest.fixture
def tab(browser):
    """A fresh browser context (its own sessionStorage, as a new tab) and its console."""
    context = browser.new_context(viewport={"width": 900, "height": 680})
    context.set_default_timeout(20_000)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    yield Tab(page, console)
    context.close()


def _from_widget(message) -> bool:
    return message.text.startswith(WIDGET_PREFIX)


def _open(page) -> None:
    page.locator(".launcher").click()
    page.locator("input").wait_for(state="visible")


def _send(page, text: str) -> None:
    page.locator("input").fill(text)
    page.locator(".send").click()


def _last_reply(page):
    return page.locator(".msg.agent").last


def _wait_reply_done(page, expected: str) -> None:
    page.wait_for_function("(text) => { const host = document.querySelector('caiplatform-chat');"
                           " const replies = host.shadowRoot.querySelectorAll('.msg.agent');"
                           " const last = replies[replies.length - 1];"
                           " return last && !last.classList.contains('pending') && last.textContent === text; }",
                           arg=expected)


def _session_of(page, key: str) -> dict:
    return page.evaluate("(key) => JSON.parse(sessionStorage.getItem('caiplatform-widget:' + key))", key)


def test_an_allowed_origin_shows_the_configured_launcher_untouched_by_the_page_styles(site, tab):
    page = tab.page
    page.goto(site.page())
    launcher = page.locator(".launcher")
    launcher.wait_for(state="visible")
    assert launcher.inner_text() == "Ask Acme"
    style = launcher.evaluate("(el) => { const s = getComputedStyle(el);"
                              " return {bg: s.backgroundColor, fg: s.color, border: s.borderTopStyle, font: s.fontFamily}; }")
    # The page paints every button hot pink with a dashed border in Georgia: none of it reaches the widget.
    assert style == {"bg": "rgb(15, 118, 110)", "fg": "rgb(255, 255, 255)", "border": "none",
                     "font": style["font"]} and "Georgia" not in style["font"]
    box = launcher.bounding_box()
    assert box["x"] + box["width"] > 900 - 40  # position: right
    assert launcher.get_attribute("aria-expanded") == "false"
    assert not tab.widget_messages()

    _open(page)
    assert page.locator(".title").inner_text() == "Acme help"
    assert page.locator(".subtitle").inner_text() == "Replies in seconds"
    assert page.locator(".msg.agent").first.inner_text() == "Hi! How can I help?"
    assert page.locator("[role=dialog]").get_attribute("aria-labelledby")
    assert page.locator("[role=log]").get_attribute("aria-live") == "polite"
    assert launcher.get_attribute("aria-expanded") == "true"


@pytest.fixture
def embed_change(site):
    """Change the embed config for one test; the module's config comes back afterwards."""
    changes = []

    def change(**fields) -> None:
        changes.append(fields)
        assert site.admin.put(f"/v1/agents/{AGENT}/embed", json=fields).status_code == 200

    yield change
    if changes:
        assert site.admin.put(f"/v1/agents/{AGENT}/embed", json=EMBED).status_code == 200


def _launcher_style(page) -> dict:
    launcher = page.locator(".launcher")
    launcher.wait_for(state="visible")
    style = launcher.evaluate("(el) => { const s = getComputedStyle(el);"
                              " return {bg: s.backgroundColor, fg: s.color}; }")
    box = launcher.bounding_box()
    return {**style, "side": "left" if box["x"] < 100 else "right", "text": launcher.inner_text()}


def test_any_accent_gets_readable_text_and_position_left_is_honoured(site, tab, embed_change):
    page = tab.page
    embed_change(accent_color="#fde047", position="left", launcher_text="")  # a light yellow
    page.goto(site.page())
    # Dark text on a light accent; with no launcher text the title names the button.
    assert _launcher_style(page) == {"bg": "rgb(253, 224, 71)", "fg": "rgb(17, 24, 39)", "side": "left",
                                     "text": "Acme help"}
    embed_change(accent_color="url(javascript:alert(1))")  # not a colour: the default accent instead
    page.reload()
    assert _launcher_style(page)["bg"] == "rgb(37, 99, 235)"


def test_a_disabled_config_shows_nothing_and_says_so_once(site, tab, embed_change):
    page = tab.page
    embed_change(enabled=False)
    with page.expect_console_message(_from_widget):
        page.goto(site.page())
    assert page.locator("caiplatform-chat").count() == 0
    assert len(tab.widget_messages()) == 1 and "embed key may be unknown, rotated or disabled" in tab.widget_messages()[0]


def test_a_reply_streams_in_and_equals_the_buffered_reply_and_the_tab_keeps_its_session(site, tab):
    page = tab.page
    key = site.key()
    page.goto(site.page(key=key))
    _open(page)
    site.answer(ANSWER, hold=True)
    _send(page, "When does my parcel arrive?")
    # The model has sent its first word and waits: the reply shows part of the answer while in flight.
    page.wait_for_function("() => { const r = document.querySelector('caiplatform-chat').shadowRoot"
                           ".querySelectorAll('.msg.agent'); return r.length === 2 && r[1].textContent.length > 0; }")
    partial = _last_reply(page).text_content()
    assert partial and partial != ANSWER and ANSWER.startswith(partial)
    assert page.locator("input").is_disabled() and page.locator(".send").is_disabled()
    assert page.locator("[role=log]").get_attribute("aria-busy") == "true"
    site.hold.set()
    _wait_reply_done(page, ANSWER)
    assert page.locator("input").is_enabled()
    assert page.locator("[role=log]").get_attribute("aria-busy") == "false"

    site.answer(ANSWER)
    buffered = httpx.post(f"{site.server.base_url}/v1/embed/{key}/invoke", headers={"Origin": site.allowed},
                          json={"message": "When does my parcel arrive?"}, timeout=60)
    assert buffered.status_code == 200, buffered.text
    assert buffered.json() == _last_reply(page).text_content()

    first = _session_of(page, key)["session_id"]
    assert len(first) >= 24
    seen: list[ChatRequest] = []
    site.model.set_script(lambda request: seen.append(request) or Step(content="Yes, Tuesday."))
    page.reload()  # the next page of the site, in the same tab: the conversation is still there
    _open(page)
    assert page.locator(".msg").all_text_contents() == ["Hi! How can I help?", "When does my parcel arrive?", ANSWER]
    _send(page, "Tuesday, you said?")
    _wait_reply_done(page, "Yes, Tuesday.")
    assert _session_of(page, key)["session_id"] == first
    # The agent got the first exchange as the session's history ...
    assert [m["content"] for m in seen[-1].messages[1:]] == ["When does my parcel arrive?", ANSWER, "Tuesday, you said?"]
    # ... and the platform holds both turns in that one session.
    transcript = site.admin.get(f"/v1/agents/{AGENT}/sessions/{first}")
    assert transcript.status_code == 200, transcript.text
    authors = [event["author"] for event in transcript.json()["events"]]
    assert authors.count("user") == 2 and len(authors) == 4

    other_tab = page.context.new_page()  # same browser profile, another tab: a conversation of its own
    other_tab.goto(site.page(key=key))
    _open(other_tab)
    assert other_tab.locator(".msg").all_text_contents() == ["Hi! How can I help?"]
    assert other_tab.evaluate("(key) => sessionStorage.getItem('caiplatform-widget:' + key)", key) is None


def test_an_error_shows_a_short_message_and_retry_sends_again(site, tab):
    page = tab.page
    page.goto(site.page())
    _open(page)
    calls = []

    def flaky(request: ChatRequest) -> Step:
        calls.append(request)
        if len(calls) == 1:
            raise RuntimeError("the model is down for a moment")
        return Step(content="Back again.")

    site.model.set_script(flaky)
    _send(page, "Hello?")
    alert = page.locator("[role=alert]")
    alert.wait_for(state="visible")
    assert alert.inner_text().startswith("The assistant could not answer right now.")
    assert page.locator("input").is_enabled()
    page.locator(".retry").click()
    _wait_reply_done(page, "Back again.")
    assert alert.count() == 0 and len(calls) == 2


@pytest.mark.parametrize(("failure", "shown"), [
    (429, "Too many messages right now."),
    (503, "The assistant could not answer right now."),
    (404, "This chat is no longer available."),
    ("network", "The chat service could not be reached."),
])
def test_each_failure_has_its_short_message_and_retry_recovers(site, tab, failure, shown):
    page = tab.page
    page.goto(site.page())
    _open(page)
    site.answer("Recovered.")

    def fail_once(route) -> None:
        if failure == "network":
            route.abort("internetdisconnected")
        else:  # the answer as the platform would send it to an allowed origin
            route.fulfill(status=failure, json={"error": "refused", "request_id": "req_test"},
                          headers={"Access-Control-Allow-Origin": site.allowed})

    page.route("**/invoke", fail_once, times=1)
    _send(page, "Anyone?")
    alert = page.locator("[role=alert]")
    alert.wait_for(state="visible")
    assert alert.inner_text().startswith(shown)
    assert page.locator(".msg.agent").count() == 1  # the greeting; no half reply is left behind
    page.keyboard.press("Enter")  # the Retry button has the focus
    _wait_reply_done(page, "Recovered.")
    assert alert.count() == 0


def test_keyboard_only_open_type_send_and_escape(site, tab):
    page = tab.page
    page.goto(site.page())
    page.locator(".launcher").wait_for(state="visible")
    focused = "() => { const host = document.querySelector('caiplatform-chat'); const el = host.shadowRoot.activeElement;" \
              " return document.activeElement === host && el ? el.className || el.tagName : ''; }"
    for _ in range(4):  # past the page's own link to the launcher
        page.keyboard.press("Tab")
        if page.evaluate(focused) == "launcher":
            break
    assert page.evaluate(focused) == "launcher"
    page.keyboard.press("Enter")
    page.locator("input").wait_for(state="visible")
    assert page.evaluate(focused) == "INPUT"
    site.answer("Typed and sent.")
    page.keyboard.type("Only keys")
    page.keyboard.press("Enter")
    _wait_reply_done(page, "Typed and sent.")
    assert page.evaluate(focused) == "INPUT"  # back in the input for the next message
    page.keyboard.press("Escape")
    assert page.locator("[role=dialog]").is_hidden()
    assert page.evaluate(focused) == "launcher"
    assert page.locator(".launcher").get_attribute("aria-expanded") == "false"


def test_a_disallowed_origin_gets_no_widget_and_no_reply(site, tab):
    page = tab.page
    key = site.key()
    with page.expect_console_message(_from_widget):
        page.goto(site.page(site.other, key=key))
    assert page.locator("caiplatform-chat").count() == 0
    assert len(tab.widget_messages()) == 1 and site.other in tab.widget_messages()[0]
    before = len(site.model.requests)
    refused = page.evaluate("(url) => fetch(url, {method: 'POST', headers: {'Content-Type': 'application/json'},"
                            " body: JSON.stringify({message: 'hi'})}).then(() => 'answered', () => 'refused')",
                            f"{site.server.base_url}/v1/embed/{key}/invoke")
    assert refused == "refused" and len(site.model.requests) == before
    direct = httpx.post(f"{site.server.base_url}/v1/embed/{key}/invoke", headers={"Origin": site.other},
                        json={"message": "hi"})
    assert direct.status_code == 403 and direct.json()["error"] == f"origin {site.other} is not allowed to use this embed"


def test_a_rotated_key_stops_the_old_snippet(site, tab):
    page = tab.page
    old = site.key()
    page.goto(site.page(key=old))
    _open(page)
    rotated = site.admin.post(f"/v1/agents/{AGENT}/embed/rotate-key")
    assert rotated.status_code == 200 and rotated.json()["embed_key"] != old
    before = len(site.model.requests)
    _send(page, "Still there?")  # a page loaded before the rotation
    page.locator("[role=alert]").wait_for(state="visible")
    assert len(site.model.requests) == before
    with page.expect_console_message(_from_widget):
        page.reload()
    assert page.locator("caiplatform-chat").count() == 0 and tab.widget_messages()
    page.goto(site.page())  # the new key's snippet works
    page.locator(".launcher").wait_for(state="visible")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_screenshots_of_the_open_widget(site, tab, theme):
    page = tab.page
    page.goto(site.page(theme=theme))
    _open(page)
    site.answer(ANSWER)
    _send(page, "When does my parcel arrive?")
    _wait_reply_done(page, ANSWER)
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUTPUT_DIR / f"widget-{theme}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000
