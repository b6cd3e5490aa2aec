"""Every manifest in backends/kubernetes/base is valid for the two newest Kubernetes minor versions (strict:
an unknown field fails), and so is every object the overlays render with `kubectl kustomize`; the ClusterRole
grants no more than the adapters use."""

from __future__ import annotations

from pathlib import Path

import pytest

from caiplatform.testing.kube_schemas import load_documents, newest_versions, validate_object

KUBERNETES = Path(__file__).resolve().parents[2] / "backends" / "kubernetes"
BACKEND = KUBERNETES / "base"
DOCUMENTS = [(path.name, i, doc) for path in sorted(BACKEND.glob("*.yaml")) if path.name != "kustomization.yaml"
             for i, doc in enumerate(load_documents(path))]
OVERLAYS = ("single", "replicated")


def test_every_file_has_documents():
    assert {"namespace.yaml", "rbac.yaml", "config.yaml", "deployment.yaml"} <= {name for name, _, _ in DOCUMENTS}
    assert (KUBERNETES / "Containerfile.platform").is_file() and (KUBERNETES / "Containerfile.harness").is_file()


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


def rendered(directory: Path) -> list[dict]:
    import shutil
    import subprocess

    import yaml

    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl renders the overlays (Debian's kubernetes-client, or kubectl on PATH)"
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.process
@pytest.mark.parametrize("overlay", [*OVERLAYS, "replicated-gvisor"])
def test_an_overlay_renders_objects_a_cluster_accepts(overlay: str):
    """`kubectl kustomize` of each overlay (and of one with the gVisor component): every object valid for the
    schemas and for the API server's metadata rules, the replicas the overlay says, the RBAC and the sandbox
    namespace included."""
    from caiplatform.testing.kube_admission import admit

    objects = rendered(KUBERNETES / "overlays" / overlay)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("Namespace", "caiplatform"), ("Namespace", "caiplatform-sandbox"), ("ClusterRole", "caiplatform"),
            ("ClusterRole", "caiplatform-project"), ("ValidatingAdmissionPolicy", "caiplatform-own-namespaces"),
            ("Deployment", "caiplatform"), ("RoleBinding", "caiplatform-project")} <= kinds
    for obj in objects:
        validate_object(obj)
        plural = obj["kind"].lower() + ("es" if obj["kind"].endswith("s") else "s")
        admit(plural, obj["apiVersion"].rpartition("/")[0] if "/" in obj["apiVersion"] else "", obj)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == (1 if overlay == "single" else 3)
    sandbox = next(o for o in objects if o["kind"] == "Namespace" and o["metadata"]["name"] == "caiplatform-sandbox")
    assert sandbox["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    if overlay.endswith("gvisor"):
        config = next(o for o in objects if o["kind"] == "ConfigMap")
        assert config["data"]["CAI_KNATIVE_FEATURES"] == "kubernetes.podspec-runtimeclassname"
        assert ("RuntimeClass", "gvisor") in kinds
