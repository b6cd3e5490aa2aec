"""The Grafana dashboard under backends/observability/ queries only series the platform exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from caiplatform.metrics import Metrics

pytestmark = pytest.mark.unit

DASHBOARD = Path(__file__).resolve().parents[2] / "backends" / "observability" / "grafana-dashboard.json"


def _exported() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "histogram":
            names.update(f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_every_queried_series_is_exported_and_the_panels_are_distinct():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    queried = {name for expr in exprs for name in re.findall(r"\bcai_[a-z_]+", expr)}
    queried |= {name for v in dashboard["templating"]["list"] if v["type"] == "query"
                for name in re.findall(r"\bcai_[a-z_]+", v["definition"])}
    assert queried and queried <= _exported(), queried - _exported()
    covered = {re.sub(r"_(bucket|total)$", "", name) for name in queried}
    assert covered >= {"cai_http_requests", "cai_http_request_duration_seconds", "cai_agent_invokes",
                       "cai_agent_invoke_duration_seconds", "cai_agent_cold_starts", "cai_agent_instances",
                       "cai_instance_start_duration_seconds", "cai_builds", "cai_build_duration_seconds",
                       "cai_messages_published", "cai_push_deliveries", "cai_subscription_backlog"}
    assert len({p["id"] for p in panels}) == len(panels)
    assert all("route=~" not in e and "path" not in e for e in exprs)  # templates only, never raw paths
