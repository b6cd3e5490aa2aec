"""One sanitizing rule for the agents' and the serverless services' spec documents."""

from __future__ import annotations

from caiplatform.domain.spec_document import REDACTED, sanitize_spec


def test_both_env_shapes_are_redacted_and_cluster_bookkeeping_is_stripped():
    document = {
        "metadata": {
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"},
        },
        "spec": {"containers": [{"env": [{"name": "DB_PASSWORD", "value": "hunter2"}, {"name": "MODE", "value": "x"},
                                         {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}]},
        "env": {"private_token": "t", "REGION": "eu"},
    }
    clean = sanitize_spec(document)
    assert "managedFields" not in clean["metadata"]
    assert clean["metadata"]["annotations"] == {"keep": "me"}
    env = clean["spec"]["containers"][0]["env"]
    assert env[0]["value"] == REDACTED and env[1]["value"] == "x" and "value" not in env[2]
    assert clean["env"] == {"private_token": REDACTED, "REGION": "eu"}
    assert document["spec"]["containers"][0]["env"][0]["value"] == "hunter2"  # the input is left alone
