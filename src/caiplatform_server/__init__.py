"""The thin ASGI layer over caiplatform's services."""
