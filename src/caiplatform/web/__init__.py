"""What the platform's server, the harness and MCP servers share on the HTTP side: request bodies and head
limits (`http.py`), how uvicorn runs an app (`serving.py`). Light imports: the harness loads it on every
cold start."""
