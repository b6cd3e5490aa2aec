"""The code sandbox route on the in-memory platform: who may call, and every malformed body is a 4xx that
runs nothing (no sandbox is taken from the pool)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from caiplatform.db.models import Project


@pytest.fixture
async def project_and_key(platform):
    project_id = await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
    key = await platform.service_accounts.mint_workload_key(project_id, "coder")
    return project_id, {"Authorization": f"Bearer {key}"}


BAD_BODIES = [
    (b"", 400, "invalid JSON body: the body is empty"),
    (b"[1]", 400, "invalid JSON body: expected a JSON object"),
    (b"{nope", 400, None),
    (b'{"code": ""}', 400, "code is required"),
    (b'{"code": 5}', 400, "code is required"),
    (b'{"code": "x", "timeout_s": 61}', 400, "timeout_s must be between 1 and 60"),
    (b'{"code": "x", "timeout_s": null, "language": "cobol"}', 400, None),
    (b'{"code": "x", "files": {}}', 400, None),
    (b'{"code": "x", "files": [{"path": "../up", "content": ""}]}', 400, None),
    (b'{"code": "x", "files": [{"path": "/abs", "content": ""}]}', 400, None),
    (b'{"code": "x", "files": [{"path": "a", "content": "%%", "encoding": "base64"}]}', 400, None),
    (b'{"code": "x", "files": [{"path": "a", "content": "", "encoding": "utf-16"}]}', 400, None),
    (b'{"code": "x", "files": [7]}', 400, None),
]


async def test_a_malformed_body_is_a_clear_400_and_runs_nothing(client, platform, project_and_key):
    project_id, headers = project_and_key
    for raw, status, message in BAD_BODIES:  # one platform for all (its start is most of the time)
        response = await client.post(f"/v1/projects/{project_id}/sandbox/execute", content=raw,
                                     headers={**headers, "Content-Type": "application/json"})
        assert response.status_code == status, (raw, response.text)
        if message:
            assert response.json()["error"] == message, raw
    assert platform.code_sandbox.pool.describe()["served"] == 0


async def test_callers_other_than_the_projects_workloads_are_refused(client, platform, project_and_key, admin_headers):
    project_id, headers = project_and_key
    url = f"/v1/projects/{project_id}/sandbox/execute"
    assert (await client.post(url, json={"code": "print(1)"})).status_code == 401
    refused = await client.post(url, json={"code": "print(1)"}, headers=admin_headers)
    assert refused.status_code == 403
    for other in ("00000000-0000-4000-8000-000000000000", "not-a-uuid"):
        response = await client.post(f"/v1/projects/{other}/sandbox/execute", json={"code": "x"}, headers=headers)
        assert response.status_code == 404
    too_big = await client.post(url, content=b"x" * (8 * 1024 * 1024 + 1), headers=headers)
    assert too_big.status_code == 413
    assert (await client.post(f"/v1/projects/{project_id}/sandbox/tool-calls", json={"module_path": "a.py",
            "function": "f", "timeout_s": 0}, headers=headers)).json()["error"] == "timeout_s must be between 1 and 120"
