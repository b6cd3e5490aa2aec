"""What the platform's server, the harness and MCP servers share on the HTTP side: request bodies and head
limits (`http.py`), how uvicorn runs an app (`serving.py`), the error envelope (`envelope.py`); and the
platform's own HTTP clients: the pooled HTTP/1.1 client to harnesses (`harness_http.py`) and the httpx
transport to services' private hostnames (`internal_transport.py`). Light imports: the harness loads it on
every cold start."""
