# Generated from caiplatform/client/_async by `python -m caiplatform.client.generate`: edit that.
"""Vector indexes (document 3): `client.indexes`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from caiplatform.client._sync.resources import Resource
from caiplatform.client._base import body_of
from caiplatform.models.vector import Index, IndexCreate, IndexCredential, IndexList, IndexPatch


def _indexes(project_id: str) -> str:
    return f"/v1/projects/{project_id}/indexes"


class Indexes(Resource):
    def create(self, project_id: str, body: IndexCreate | None = None, /, **fields: Any) -> Index:
        """Create an index (state `pending` until its collection exists): a model or its fields."""
        model = body or IndexCreate.parse(fields)
        return self._client.request("POST", _indexes(project_id), Index, json=body_of(model))

    def get(self, project_id: str, name: str) -> Index:
        return self._client.request("GET", f"{_indexes(project_id)}/{name}", Index)

    def list(self, project_id: str, *, page_size: int | None = None) -> Iterator[Index]:
        """Every index of the project, following pages."""
        return self._client.paginate(_indexes(project_id), IndexList, page_size=page_size)

    def list_page(self, project_id: str, *, page_size: int | None = None,
                        page_token: str | None = None) -> IndexList:
        return self._client.request("GET", _indexes(project_id), IndexList,
                                          params={"page_size": page_size, "page_token": page_token})

    def update(self, project_id: str, name: str, body: IndexPatch | None = None, /, **fields: Any) -> Index:
        model = body or IndexPatch.parse(fields)
        return self._client.request("PATCH", f"{_indexes(project_id)}/{name}", Index, json=body_of(model))

    def delete(self, project_id: str, name: str) -> None:
        self._client.request_none("DELETE", f"{_indexes(project_id)}/{name}")

    def credentials(self, project_id: str) -> IndexCredential:
        return self._client.request("GET", f"/v1/projects/{project_id}/vectordb/credentials", IndexCredential)
