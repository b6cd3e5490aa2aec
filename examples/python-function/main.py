"""A function: the JSON request body arrives as `event`; the return value is the answer."""

import os


def handle(event, context):
    greeting = os.environ.get("GREETING", "hello")
    return {"greeting": greeting, "echo": event.get("message"), "keys": sorted(event)}
