"""A chat function for the embeddable widget: it sends the session's conversation to the platform's
model and streams the answer back as it arrives (each yielded string is one `output` delta).

Standard library only, so the deploy needs no dependency install. The model comes from the
environment the platform hands every revision (`MODEL_BASE_URL`, `MODEL_API_KEY`, `MODEL_NAME`).
"""

import json
import os
import urllib.request

SYSTEM = os.environ.get("SYSTEM_PROMPT", "You are a helpful assistant on a website. Answer briefly.")


def conversation(history, message):
    """The transcript events of the session so far, plus the new message, as chat messages."""
    messages = [{"role": "system", "content": SYSTEM}]
    for event in history:
        text = "".join(part.get("text", "") for part in event.get("content", {}).get("parts", [])
                       if isinstance(part, dict) and not part.get("thought"))
        if text:
            messages.append({"role": "user" if event.get("author") == "user" else "assistant", "content": text})
    messages.append({"role": "user", "content": message})
    return messages


def stream_answer(request):
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:  # Server-Sent Events, one `data:` line per delta
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                return
            choices = json.loads(data).get("choices") or [{}]
            delta = (choices[0].get("delta") or {}).get("content")
            if delta:
                yield delta


def handle(event, context):
    base_url = os.environ.get("MODEL_BASE_URL", "").rstrip("/")
    if not base_url:
        raise RuntimeError("MODEL_BASE_URL is not set on the platform")
    body = {"model": os.environ.get("MODEL_NAME", "default"), "stream": True,
            "messages": conversation(context.history, str(event.get("message", "")))}
    request = urllib.request.Request(
        base_url + "/chat/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ.get("MODEL_API_KEY", "")})
    return stream_answer(request)
