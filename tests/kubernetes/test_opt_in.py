"""The opt-in real-cluster run of the HTTP scenario (tests/kubernetes/test_e2e_serve.py, `kind=cluster`) up
to where it would reach the cluster: what it needs from the environment, what the server is given and how
the test reads the cluster. Without `CAI_TEST_KUBECONFIG` it is skipped, saying why; nothing here
pretends to be a cluster."""

from __future__ import annotations

import pytest

from caiplatform.adapters.kubernetes.client import KubeClient, cluster_settings
from caiplatform.settings import Settings
from caiplatform.testing.serve import ServeProcess
from tests.conformance.kube_support import OPT_IN, cluster_serve_env

from .test_e2e_serve import target

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://203.0.113.7:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: not-a-secret}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: default}}]
current-context: x
"""


def test_without_a_kubeconfig_the_real_cluster_run_is_skipped_and_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv("CAI_TEST_KUBECONFIG", raising=False)
    with pytest.raises(LookupError, match="opt-in: set CAI_TEST_KUBECONFIG"):
        cluster_serve_env({})
    with pytest.raises(pytest.skip.Exception) as skipped, target("cluster", tmp_path):
        pass
    assert skipped.value.msg == OPT_IN


def test_the_build_context_must_be_the_clusters_volume():
    with pytest.raises(LookupError, match="build-context volume"):
        cluster_serve_env({"CAI_TEST_KUBECONFIG": "/somewhere/config"})


def test_the_server_and_the_test_both_use_the_kubeconfig(tmp_path, monkeypatch):
    config = tmp_path / "config"
    config.write_text(KUBECONFIG)
    monkeypatch.setenv("CAI_TEST_KUBECONFIG", str(config))
    monkeypatch.setenv("CAI_BUILD_CONTEXT_DIR", "/mnt/build-context")
    monkeypatch.setenv("CAI_KUBE_API_URL", "http://127.0.0.1:1")  # an emulator's, say: the server must not use it
    monkeypatch.setenv("CAI_HARNESS_IMAGE", "registry.example/harness:1")
    with target("cluster", tmp_path) as on:
        assert on.emulated is None and on.patience > 60
        server = ServeProcess(tmp_path / "data", env=on.env, unset=on.unset)  # made, not started
        assert server.env["CAI_RUNTIME"] == "kubernetes" and server.env["CAI_KUBECONFIG"] == str(config)
        assert server.env["CAI_BUILD_CONTEXT_DIR"] == "/mnt/build-context" and "CAI_KUBE_API_URL" not in server.env
        assert server.env["CAI_HARNESS_IMAGE"] == "registry.example/harness:1"  # the platform's own variables pass
        # What the server makes of that environment: the kubeconfig's cluster, not an API address.
        monkeypatch.delenv("CAI_KUBE_API_URL")
        monkeypatch.setenv("CAI_KUBECONFIG", server.env["CAI_KUBECONFIG"])
        served = cluster_settings(Settings())
        assert served.kubeconfig == str(config) and served.host is None
        assert served.harness_image == "registry.example/harness:1"
        # The test's own reads go to the same cluster.
        assert on.settings.kubeconfig == str(config) and on.settings.host is None
        kube = KubeClient(on.settings)
        assert kube.api.configuration.host == "https://203.0.113.7:6443"
        kube.api.close()
