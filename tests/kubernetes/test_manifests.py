"""Every manifest in backends/kubernetes/ is valid for the two newest Kubernetes minor versions (strict:
an unknown field fails), and the ClusterRole grants no more than the adapters use."""

from __future__ import annotations

from pathlib import Path

import pytest

from caiplatform.testing.kube_schemas import load_documents, newest_versions, validate_object

BACKEND = Path(__file__).resolve().parents[2] / "backends" / "kubernetes"
DOCUMENTS = [(path.name, i, doc) for path in sorted(BACKEND.glob("*.yaml")) for i, doc in enumerate(load_documents(path))]


def test_every_file_has_documents():
    assert {"namespace.yaml", "rbac.yaml", "config.yaml", "deployment.yaml"} <= {name for name, _, _ in DOCUMENTS}
    assert (BACKEND / "Containerfile.platform").is_file() and (BACKEND / "Containerfile.harness").is_file()


@pytest.mark.parametrize("version", newest_versions())
@pytest.mark.parametrize(("name", "index", "doc"), DOCUMENTS, ids=[f"{n}#{i}" for n, i, _ in DOCUMENTS])
def test_manifest_is_valid(name, index, doc, version):
    validate_object(doc, [version])


def test_a_field_kubernetes_does_not_define_fails():
    deployment = next(doc for _, _, doc in DOCUMENTS if doc["kind"] == "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(Exception, match="replica"):
        validate_object(broken)


def test_the_control_plane_runs_two_replicas_probed_on_healthz():
    deployment = next(doc for _, _, doc in DOCUMENTS if doc["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "caiplatform"
