/* caiplatform chat widget. One tag on any page:
 *   <script src="https://PLATFORM/v1/embed/widget.js" data-embed-key="emb_..." async></script>
 * Plain JavaScript, no dependencies. Everything it draws lives in a shadow root, so the host page's
 * styles do not reach it and its styles do not reach the page. Replies are inserted as text, never as
 * HTML. Docs: docs/decisions/invoke.md ("Chat widget"). */
(function () {
  "use strict";

  var PREFIX = "caiplatform widget: ";
  var DEFAULT_ACCENT = "#2563eb";
  var NDJSON = "application/x-ndjson";
  var MESSAGES = {
    network: "The chat service could not be reached. Check your connection and try again.",
    400: "That message could not be sent.",
    401: "This chat is not available on this site.",
    403: "This chat is not available on this site.",
    404: "This chat is no longer available.",
    413: "That message is too long.",
    429: "Too many messages right now. Please wait a moment and try again.",
    server: "The assistant could not answer right now. Please try again.",
    broken: "The answer was interrupted. Please try again."
  };

  var script = document.currentScript;
  if (!script) {
    console.error(PREFIX + "load the widget with a classic <script src> tag (not as a module)");
    return;
  }
  var key = (script.getAttribute("data-embed-key") || "").trim();
  var src = script.src;
  var base = src.slice(0, src.indexOf("/v1/embed/"));
  if (!key || src.indexOf("/v1/embed/") < 0) {
    console.error(PREFIX + "the script tag needs data-embed-key=\"<embed key>\" and a src ending in /v1/embed/widget.js");
    return;
  }
  var embedUrl = base + "/v1/embed/" + encodeURIComponent(key);
  var storageKey = "caiplatform-widget:" + key;

  // -- per-tab session: the ids and the messages shown, so the next page of the site continues ------
  var MAX_KEPT = 50;
  var memoryStore = {};
  function loadSession() {
    try {
      return JSON.parse(window.sessionStorage.getItem(storageKey) || "{}") || {};
    } catch (e) {  // storage disabled (sandboxed frame, privacy mode): keep it for this page only
      return memoryStore;
    }
  }
  function saveSession(changes) {
    var state = loadSession();
    Object.keys(changes).forEach(function (name) { state[name] = changes[name]; });
    memoryStore = state;
    try { window.sessionStorage.setItem(storageKey, JSON.stringify(state)); } catch (e) { /* page only */ }
  }
  function keepMessage(kind, text) {
    saveSession({ messages: (loadSession().messages || []).concat([[kind, text]]).slice(-MAX_KEPT) });
  }

  // -- colours: any CSS colour the owner configured, with readable text on it --------------------
  function rgbOf(color, probe) {
    probe.style.color = "";
    probe.style.color = color;
    var m = getComputedStyle(probe).color.match(/[\d.]+/g);
    return m ? [Number(m[0]), Number(m[1]), Number(m[2])] : [37, 99, 235];
  }
  function luminance(rgb) {
    var c = rgb.map(function (v) {
      v = v / 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  }
  function contrast(a, b) {
    var la = luminance(a), lb = luminance(b);
    return (Math.max(la, lb) + 0.05) / (Math.min(la, lb) + 0.05);
  }
  // The text colour (white or near-black) that reads best on the accent.
  function textOn(rgb) {
    return contrast(rgb, [255, 255, 255]) >= contrast(rgb, [17, 24, 39]) ? "#ffffff" : "#111827";
  }

  var STYLE = [
    // !important: on the host element itself the page's rules would otherwise win over these.
    ":host{all:initial !important;display:block !important;position:fixed !important;bottom:20px !important;z-index:2147483000 !important;font:15px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif !important;color:#111827 !important}",
    ":host([data-position=right]){right:20px !important}:host([data-position=left]){left:20px !important}",
    "*{box-sizing:border-box}",
    "[hidden]{display:none !important}",
    ".launcher{display:flex;align-items:center;gap:8px;margin-left:auto;border:0;border-radius:999px;padding:12px 20px;font:inherit;font-weight:600;cursor:pointer;background:var(--accent);color:var(--on-accent);box-shadow:0 6px 20px rgba(0,0,0,.25)}",
    ":host([data-position=left]) .launcher{margin-left:0}",
    ".launcher:focus-visible,button:focus-visible,input:focus-visible{outline:3px solid var(--ring);outline-offset:2px}",
    ".panel{display:flex;flex-direction:column;width:min(370px,calc(100vw - 40px));height:min(540px,calc(100vh - 100px));margin-bottom:12px;background:#ffffff;color:#111827;border:1px solid #d1d5db;border-radius:14px;overflow:hidden;box-shadow:0 12px 40px rgba(0,0,0,.3)}",
    ".head{display:flex;align-items:flex-start;gap:8px;padding:14px 16px;background:var(--accent);color:var(--on-accent)}",
    ".head div{flex:1;min-width:0}",
    ".title{margin:0;font-size:16px;font-weight:700}",
    ".subtitle{margin:2px 0 0;font-size:13px;opacity:.9}",
    ".close{border:0;background:transparent;color:inherit;font:inherit;font-size:22px;line-height:1;padding:2px 6px;border-radius:6px;cursor:pointer}",
    ".log{flex:1;overflow-y:auto;padding:14px;display:flex;flex-direction:column;gap:8px;background:#f9fafb}",
    ".msg{max-width:85%;padding:8px 12px;border-radius:12px;white-space:pre-wrap;overflow-wrap:anywhere}",
    ".agent{align-self:flex-start;background:#ffffff;border:1px solid #e5e7eb}",
    ".user{align-self:flex-end;background:var(--accent);color:var(--on-accent)}",
    ".pending::after{content:'\\2026';opacity:.6}",
    ".error{align-self:stretch;background:#fef2f2;color:#991b1b;border:1px solid #fecaca;display:flex;gap:8px;align-items:center;justify-content:space-between}",
    ".retry{flex:none;white-space:nowrap;overflow-wrap:normal;border:1px solid #991b1b;background:#ffffff;color:#991b1b;border-radius:8px;padding:4px 10px;font:inherit;font-size:13px;cursor:pointer}",
    "form{display:flex;gap:8px;padding:10px;border-top:1px solid #e5e7eb;background:#ffffff}",
    "input{flex:1;min-width:0;font:inherit;color:#111827;background:#ffffff;border:1px solid #9ca3af;border-radius:8px;padding:8px 10px}",
    "input:disabled,.send:disabled{opacity:.6;cursor:not-allowed}",
    ".send{border:0;border-radius:8px;padding:8px 14px;font:inherit;font-weight:600;background:var(--accent);color:var(--on-accent);cursor:pointer}",
    ".sr{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}"
  ].join("\n");

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) { node.setAttribute(name, attrs[name]); });
    if (text) node.textContent = text;
    return node;
  }

  function render(config) {
    var host = el("caiplatform-chat", { "data-caiplatform-widget": key, "data-position": config.position === "left" ? "left" : "right" });
    var root = host.attachShadow({ mode: "open" });
    var style = el("style", {}, STYLE);
    var probe = el("span", { hidden: "" });
    root.appendChild(style);
    root.appendChild(probe);
    document.body.appendChild(host);

    var accent = isColor(config.accent_color) ? config.accent_color : DEFAULT_ACCENT;
    var rgb = rgbOf(accent, probe);
    var onAccent = textOn(rgb);
    host.style.setProperty("--accent", accent);
    host.style.setProperty("--on-accent", onAccent);
    // A focus ring visible on both the white panel and the accent: the darker of accent and near-black.
    host.style.setProperty("--ring", contrast(rgb, [255, 255, 255]) >= 3 ? accent : "#111827");

    var title = config.title || "Chat";
    var uid = "cai-" + Math.random().toString(36).slice(2, 10);
    var panel = el("section", { "class": "panel", role: "dialog", "aria-modal": "false", "aria-labelledby": uid + "-title", id: uid + "-panel", hidden: "" });
    var head = el("header", { "class": "head" });
    var heading = el("div");
    heading.appendChild(el("h2", { "class": "title", id: uid + "-title" }, title));
    if (config.subtitle) heading.appendChild(el("p", { "class": "subtitle" }, config.subtitle));
    var close = el("button", { type: "button", "class": "close", "aria-label": "Close chat" }, "\u00d7");
    head.appendChild(heading);
    head.appendChild(close);
    var log = el("div", { "class": "log", role: "log", "aria-live": "polite", "aria-label": "Conversation" });
    var form = el("form", { "aria-label": "Send a message" });
    var label = el("label", { "class": "sr", "for": uid + "-input" }, "Message");
    var input = el("input", { type: "text", id: uid + "-input", autocomplete: "off", placeholder: "Type a message" });
    var send = el("button", { type: "submit", "class": "send" }, "Send");
    form.appendChild(label);
    form.appendChild(input);
    form.appendChild(send);
    panel.appendChild(head);
    panel.appendChild(log);
    panel.appendChild(form);
    var launcher = el("button", { type: "button", "class": "launcher", "aria-expanded": "false", "aria-controls": uid + "-panel", "aria-haspopup": "dialog" }, config.launcher_text || title);
    root.appendChild(panel);
    root.appendChild(launcher);

    if (config.greeting) log.appendChild(el("div", { "class": "msg agent" }, config.greeting));
    (loadSession().messages || []).forEach(function (kept) {
      if ((kept[0] === "user" || kept[0] === "agent") && typeof kept[1] === "string") {
        log.appendChild(el("div", { "class": "msg " + kept[0] }, kept[1]));
      }
    });

    var busy = false;
    function setOpen(open) {
      panel.hidden = !open;
      launcher.setAttribute("aria-expanded", String(open));
      if (open) {
        log.scrollTop = log.scrollHeight;
        input.focus();
      } else {
        launcher.focus();
      }
    }
    function setBusy(value) {
      busy = value;
      input.disabled = value;
      send.disabled = value;
      log.setAttribute("aria-busy", String(value));  // screen readers read the reply once it is complete
      if (!value && !panel.hidden) input.focus();
    }
    function bubble(kind, text) {
      var node = el("div", { "class": "msg " + kind }, text);
      log.appendChild(node);
      log.scrollTop = log.scrollHeight;
      return node;
    }
    function showError(message, retry) {
      var box = el("div", { "class": "msg error", role: "alert" });
      box.appendChild(el("span", {}, message));
      var again = el("button", { type: "button", "class": "retry" }, "Retry");
      again.addEventListener("click", function () {
        box.remove();
        retry();
      });
      box.appendChild(again);
      log.appendChild(box);
      log.scrollTop = log.scrollHeight;
      again.focus();
    }

    launcher.addEventListener("click", function () { setOpen(panel.hidden); });
    close.addEventListener("click", function () { setOpen(false); });
    root.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && !panel.hidden) {
        event.stopPropagation();
        setOpen(false);
      }
    });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var text = input.value.trim();
      if (!text || busy) return;
      input.value = "";
      bubble("user", text);
      keepMessage("user", text);
      ask(text);
    });

    function ask(text) {
      setBusy(true);
      var reply = bubble("agent pending", "");
      var ids = loadSession();
      var body = { message: text };
      if (ids.session_id) body.session_id = ids.session_id;
      if (ids.user_id) body.user_id = ids.user_id;
      function fail(message) {
        reply.remove();
        setBusy(false);
        showError(message, function () { ask(text); });
      }
      fetch(embedUrl + "/invoke", {
        method: "POST",
        mode: "cors",
        credentials: "omit",
        headers: { "Content-Type": "application/json", "Accept": config.streaming ? NDJSON : "application/json" },
        body: JSON.stringify(body)
      }).then(function (response) {
        if (!response.ok) {
          fail(MESSAGES[response.status] || (response.status >= 500 ? MESSAGES.server : MESSAGES[400]));
          return;
        }
        remember(response.headers.get("X-CAI-Session-Id"), response.headers.get("X-CAI-User-Id"));
        var reading = config.streaming && response.body ? readStream(response, reply) : readBuffered(response, reply);
        return reading.then(function (outcome) {
          if (outcome !== true) {
            fail(outcome || MESSAGES.broken);
            return;
          }
          reply.classList.remove("pending");
          keepMessage("agent", reply.textContent);
          setBusy(false);
        });
      }).catch(function () {
        fail(MESSAGES.network);
      });
    }

    function remember(sessionId, userId) {
      if (!sessionId) return;
      saveSession({ session_id: sessionId, user_id: userId || loadSession().user_id || "" });
    }

    // The NDJSON turn: `output` deltas append to the reply as they arrive; `done` ends the turn.
    // Resolves true, or the message to show.
    function readStream(response, reply) {
      var reader = response.body.getReader();
      var decoder = new TextDecoder();
      var pending = "";
      var text = "";
      function handle(line) {
        if (!line.trim()) return null;
        var item;
        try { item = JSON.parse(line); } catch (e) { return MESSAGES.broken; }
        if (item.type === "output" && typeof item.text === "string") {
          text += item.text;
          reply.textContent = text;
          log.scrollTop = log.scrollHeight;
        } else if (item.type === "done") {
          remember(item.session_id, item.user_id);
          return true;
        } else if (item.type === "error") {
          return MESSAGES.server;
        }
        return null;
      }
      function pump() {
        return reader.read().then(function (chunk) {
          if (chunk.done) {
            pending += decoder.decode();
            return handle(pending) || MESSAGES.broken;  // a stream that stops without `done` broke off
          }
          pending += decoder.decode(chunk.value, { stream: true });
          var lines = pending.split("\n");
          pending = lines.pop();
          for (var i = 0; i < lines.length; i++) {
            var outcome = handle(lines[i]);
            if (outcome !== null) {
              reader.cancel().catch(function () {});
              return outcome;
            }
          }
          return pump();
        });
      }
      return pump().catch(function () { return MESSAGES.broken; });
    }

    function readBuffered(response, reply) {
      return response.json().then(function (body) {
        // An agent answers {output, session_id, ...}; a function answers its own value.
        var text = typeof body === "string" ? body : body && typeof body.output === "string" ? body.output : JSON.stringify(body);
        if (body && body.session_id) remember(body.session_id, body.user_id);
        reply.textContent = text;
        return true;
      }, function () { return MESSAGES.broken; });
    }
  }

  function isColor(value) {
    return typeof value === "string" && !!window.CSS && window.CSS.supports("color", value);
  }

  function start() {
    if (document.querySelector("[data-caiplatform-widget=\"" + window.CSS.escape(key) + "\"]")) return;  // one per key
    fetch(embedUrl + "/config", { mode: "cors", credentials: "omit" }).then(function (response) {
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.json();
    }).then(render, function (error) {
      // Unknown, rotated or disabled keys and origins off the allowlist all end here: the browser
      // hides refusals that carry no CORS headers, so one message names every cause.
      console.warn(PREFIX + "no chat widget on this page: the embed config could not be read (" + error.message +
        "). The embed key may be unknown, rotated or disabled, or " + location.origin + " may not be on its allowed origins.");
    });
  }

  if (document.body) start();
  else document.addEventListener("DOMContentLoaded", start);
})();
