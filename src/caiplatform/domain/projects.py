"""A project as the areas see it once access is granted: its ids, its short name and its namespace.

`services.access` resolves it; services, ports and adapters take it (an adapter never imports a service).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from caiplatform.db.models import Project


@dataclass(frozen=True)
class ProjectRef:
    id: str
    org_id: str
    slug: str
    name: str
    short: str

    @property
    def namespace(self) -> str:
        return f"cai-p-{self.short}"

    @classmethod
    def of(cls, project: Project) -> ProjectRef:
        return cls(project.id, project.org_id, project.slug, project.name, project.short)
