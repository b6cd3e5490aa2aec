"""Adapters that run projects, workloads, builds and memory stores on a Kubernetes cluster with Knative
Serving (docs/kubernetes.md). Every call of the synchronous `kubernetes` client runs in a worker thread
(`KubeClient.call`), and every object carries the labels of `labels.py` so the adapters find and reap
what they own."""
