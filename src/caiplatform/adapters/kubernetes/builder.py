"""Builds on a cluster: a Kubernetes Job running an in-cluster image builder (rootless BuildKit) per build.

The checked source (the same entry-file checks and content hash as every builder, `build.prepare`) is
packed with a generated Containerfile into `<hash>.tar.gz` on a volume the control plane shares with the
build Jobs (a ReadWriteMany PersistentVolumeClaim, `CAI_BUILD_CONTEXT_CLAIM`, mounted in the control
plane at `CAI_BUILD_CONTEXT_DIR`), so no ConfigMap size limit applies. The Job, in the platform's build
namespace, runs BuildKit on that tarball and pushes `{registry_host}/cai-<short>-<workload>:<hash>`;
the Job writes the pushed image's digest (from BuildKit's metadata file) to the termination log, which the builder reads from the pod.
The Job is the build's record: a successful one is labelled with its image digest, so `resolve` finds
it and an identical source for the same workload reuses it. A failed build's message is the tail of the
builder's log, cut as the spec says (`BuildError`).
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
from pathlib import Path
from typing import Any

import anyio

from caiplatform.adapters.kubernetes.client import MERGE_PATCH, PART_LABEL, ClusterSettings, KubeClient, owned
from caiplatform.build.languages import function_env
from caiplatform.build.prepare import check_request
from caiplatform.ports.builder import Builder, BuildError, BuildLog, BuildRequest, Image

SOURCE_LABEL = "caiplatform.dev/source-digest"
IMAGE_LABEL = "caiplatform.dev/image-digest"
REPOSITORY_ANNOTATION = "caiplatform.dev/repository"
FRAMEWORK_ANNOTATION = "caiplatform.dev/framework"
RUNTIME_ANNOTATION = "caiplatform.dev/runtime"
CODE_DIR = "/app/code"
BIN_DIR = "/app/bin"
BUILD_CACHE_DIR = "/tmp/cai-build-cache"
LANGUAGE_FRAMEWORKS = ("function-go", "function-nodejs", "function-ruby")
#: Images built by `build_context` from a Containerfile of the caller's (hosted MCP tool sets), not the harness's.
OWN_CONTAINERFILE_FRAMEWORKS = ("mcp",)
HARNESS_COMMAND = ["python", "-m", "caiplatform.harness"]
LOG_TAIL_LINES = 200
DOCKER_CONFIG_DIR = "/home/user/.docker"  # the rootless BuildKit image's user is `user` (uid 1000)


def containerfile(harness_image: str, framework: str, runtime: str | None) -> str:
    """The Containerfile BuildKit builds: the harness image, the code, its `requirements.txt`, then the
    language step of a function in another language (`language_step`)."""
    env = " ".join(f"{k}={v}" for k, v in image_env(framework, runtime).items())
    return "\n".join([
        f"FROM {harness_image}",
        f"COPY --chown=1000:1000 code/ {CODE_DIR}/",
        # From the code directory, as the local builder runs it: relative paths in it are relative to the code.
        f"RUN cd {CODE_DIR} && if [ -f requirements.txt ]; then pip install --no-cache-dir -r requirements.txt; fi",
        *language_step(framework),
        f"ENV {env}",
        "USER 1000",
        "",
    ])


def language_step(framework: str) -> list[str]:
    """The language step of a function in Go, Node.js or Ruby: the very code the local builder runs
    (`caiplatform.build.languages`, in the harness image), as the image's user on the image's own copy of
    the code: Go compiled into `/app/bin/function` and checked, `ruby -c` and `bundle install` into
    `vendor/bundle`, `npm install --omit=dev`. Its output, a failure's message included, is the Job's log,
    whose tail is the build's message. Nothing for Python (`requirements.txt` is installed above)."""
    if framework not in LANGUAGE_FRAMEWORKS:
        return []
    return [
        # The harness image ends as `USER 1000` and `/app` is root's: the directories are made as root.
        "USER root",
        f"RUN mkdir -p {BIN_DIR} {BUILD_CACHE_DIR} && chown 1000:1000 {BIN_DIR} {BUILD_CACHE_DIR}",
        "USER 1000",
        f"RUN HOME={BUILD_CACHE_DIR} python -m caiplatform.build.languages {framework} {CODE_DIR} {BIN_DIR} --cache-dir {BUILD_CACHE_DIR}"
        f" && rm -rf {BUILD_CACHE_DIR}",
        "USER root",
    ]


def pack_context(source: Path, dockerfile: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
        archive.add(str(source), arcname="code", filter=lambda entry: None if entry.issym() or entry.islnk() else entry)
    return buffer.getvalue()


def image_env(framework: str, runtime: str | None) -> dict[str, str]:
    return {"CAI_FRAMEWORK": framework, "CAI_CODE_DIR": CODE_DIR, **({"CAI_RUNTIME": runtime} if runtime else {}),
            **function_env(framework, Path(BIN_DIR))}


class BuildKitJobBuilder(Builder):
    name = "kubernetes"

    def __init__(self, kube: KubeClient | None = None, *, settings: ClusterSettings | None = None,
                 registry_host: str = "registry.local", context_dir: str | Path | None = None,
                 context_claim: str = "caiplatform-build-context", timeout_seconds: float = 1800.0,
                 delete_timeout_seconds: float = 300.0, **_: object):
        self.kube = kube or KubeClient(settings)
        self.registry_host = registry_host
        self.context_dir = Path(context_dir or "/var/lib/caiplatform/build-context")
        self.context_claim = context_claim
        self.timeout_seconds = timeout_seconds
        self.delete_timeout_seconds = delete_timeout_seconds  # a Job's finalizers (its pods' tracking) run out

    @property
    def namespace(self) -> str:
        return self.kube.settings.build_namespace

    def _image(self, job: dict[str, Any], reused: bool) -> Image:
        meta = job["metadata"]
        annotations = meta.get("annotations") or {}
        digest = "sha256:" + annotations[IMAGE_LABEL].removeprefix("sha256:")
        framework, runtime = annotations[FRAMEWORK_ANNOTATION], annotations.get(RUNTIME_ANNOTATION) or None
        harness = framework not in OWN_CONTAINERFILE_FRAMEWORKS  # else its Containerfile's ENV says how it starts
        return Image(reference=f"{annotations[REPOSITORY_ANNOTATION]}@{digest}", digest=digest, framework=framework,
                     runtime=runtime, command=list(HARNESS_COMMAND) if harness else [],
                     env=image_env(framework, runtime) if harness else {},
                     location=f"{self.namespace}/{meta['name']}", reused=reused)

    def _job(self, name: str, repository: str, source_hex: str, framework: str, runtime: str | None) -> dict[str, Any]:
        """A Job running rootless BuildKit (`buildctl-daemonless.sh`, moby/buildkit's own rootless image) on
        the context tarball: it pushes `<repository>:<source hash>` and writes the pushed digest as its
        termination message. Rootless BuildKit needs seccomp and AppArmor unconfined (it makes its own user
        namespace) but no privilege: uid 1000, no privilege escalation, no capabilities."""
        labels = owned({PART_LABEL: "build", SOURCE_LABEL: source_hex[:62]})
        settings = self.kube.settings
        output = f"type=image,name={repository}:{source_hex[:64]},push=true,rewrite-timestamp=true"
        config = ""
        if settings.build_insecure_registry:
            output += ",registry.insecure=true"
            hosts = sorted({repository.split("/", 1)[0], settings.harness_image.split("/", 1)[0]})
            config = "mkdir -p ~/.config/buildkit && printf '%s' " + shlex.quote("".join(
                f'[registry."{host}"]\n  http = true\n  insecure = true\n' for host in hosts)) + \
                " > ~/.config/buildkit/buildkitd.toml\n"
        script = (
            f"{config}mkdir -p /tmp/context && tar -xzf /workspace/{source_hex}.tar.gz -C /tmp/context\n"
            "buildctl-daemonless.sh build --frontend dockerfile.v0 --local context=/tmp/context "
            "--local dockerfile=/tmp/context --opt build-arg:SOURCE_DATE_EPOCH=0 "
            f"--output {shlex.quote(output)} --metadata-file /tmp/metadata.json\n"
            # The pushed digest, for the control plane to read as the container's termination message.
            "sed -n 's/.*\"containerimage.digest\": *\"\\(sha256:[0-9a-f]*\\)\".*/\\1/p' /tmp/metadata.json "
            "> /dev/termination-log\n")
        mounts: list[dict[str, Any]] = [{"name": "context", "mountPath": "/workspace", "readOnly": True}]
        volumes: list[dict[str, Any]] = [{"name": "context", "persistentVolumeClaim": {
            "claimName": self.context_claim, "readOnly": True}}]
        if settings.build_push_secret:  # BuildKit reads its registry credentials from $DOCKER_CONFIG/config.json
            mounts.append({"name": "push-credentials", "mountPath": DOCKER_CONFIG_DIR, "readOnly": True})
            volumes.append({"name": "push-credentials", "secret": {
                "secretName": settings.build_push_secret, "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}})
        builder = {
            "name": "build", "image": settings.builder_image, "command": ["sh", "-ec", script], "volumeMounts": mounts,
            "env": [{"name": "BUILDKITD_FLAGS", "value": "--oci-worker-no-process-sandbox"},
                    {"name": "DOCKER_CONFIG", "value": DOCKER_CONFIG_DIR}],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
                                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "Unconfined"}, "appArmorProfile": {"type": "Unconfined"}},
        }
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels,
                             "annotations": {REPOSITORY_ANNOTATION: repository, FRAMEWORK_ANNOTATION: framework,
                                             RUNTIME_ANNOTATION: runtime or ""}},
                "spec": {"backoffLimit": 0, "activeDeadlineSeconds": int(self.timeout_seconds),
                         "template": {"metadata": {"labels": labels}, "spec": {
                             "restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [builder],
                             "volumes": volumes}}}}

    async def build(self, request: BuildRequest, log: BuildLog | None = None) -> Image:
        checked = await check_request(request, self.registry_host, toolchains=False)
        dockerfile = containerfile(self.kube.settings.harness_image, checked.framework, request.runtime)
        return await self.build_context(checked.reference.rpartition("@")[0], checked.digest, checked.source, dockerfile,
                                        checked.framework, request.runtime, log)

    async def build_context(self, repository: str, source_digest: str, source: Path, dockerfile: str, framework: str,
                            runtime: str | None = None, log: BuildLog | None = None) -> Image:
        """Build `source` (as `code/`) with `dockerfile` into `repository`, or reuse the image a Job of the
        same repository and source already pushed. `source_digest` names the source (a content hash)."""
        source_hex = source_digest.removeprefix("sha256:")
        name = "build-" + hashlib.sha256(f"{repository}\0{source_hex}".encode()).hexdigest()[:40]
        existing = await self.kube.get(self.kube.batch.read_namespaced_job, name, self.namespace)
        if existing is not None and IMAGE_LABEL in (existing["metadata"].get("annotations") or {}):
            return self._image(existing, reused=True)
        if existing is not None:  # a failed or interrupted build of this source: build it again
            await self.kube.delete(self.kube.batch.delete_namespaced_job, name, self.namespace)
            await self._gone(name)
        context = await anyio.to_thread.run_sync(pack_context, source, dockerfile)
        await anyio.to_thread.run_sync(self._write_context, source_hex, context)
        await self.kube.call(self.kube.batch.create_namespaced_job, self.namespace,
                             self._job(name, repository, source_hex, framework, runtime))
        job = await self._finished(name)
        lines = await self._log(name)
        for line in lines:
            if log:
                log(line)
        if not any(c.get("type") == "Complete" and c.get("status") == "True" for c in self._conditions(job)):
            failure = next((c.get("message", "") for c in self._conditions(job) if c.get("type") == "Failed"), "")
            raise BuildError("\n".join(lines[-LOG_TAIL_LINES:]) or failure or "the image build failed")
        digest = await self._digest(name)
        if not digest:
            raise BuildError("the image builder finished without reporting the pushed image's digest")
        await self.kube.call(self.kube.batch.patch_namespaced_job, name, self.namespace,
                             {"metadata": {"labels": {IMAGE_LABEL: digest.removeprefix("sha256:")[:62]},
                                           "annotations": {IMAGE_LABEL: digest}}}, _content_type=MERGE_PATCH)
        return self._image(await self.kube.call(self.kube.batch.read_namespaced_job, name, self.namespace), reused=False)

    def _write_context(self, source_hex: str, context: bytes) -> None:
        self.context_dir.mkdir(parents=True, exist_ok=True)
        target = self.context_dir / f"{source_hex}.tar.gz"
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(context)
        partial.replace(target)  # a Job never sees half a context

    @staticmethod
    def _conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
        return list((job.get("status") or {}).get("conditions") or [])

    async def _finished(self, name: str) -> dict[str, Any]:
        """The Job once it completed or failed, watched (not polled)."""
        def ended(job: dict[str, Any]) -> bool:
            return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in self._conditions(job))

        try:
            return await self.kube.wait_for(self.kube.batch.list_namespaced_job, self.namespace, name, ended,
                                            self.timeout_seconds + 60)
        except TimeoutError:
            raise BuildError(f"the image build did not finish within {self.timeout_seconds:g} s") from None
        except LookupError:
            raise BuildError("the build Job was deleted before it finished") from None

    async def _gone(self, name: str) -> None:
        """Once the deleted Job `name` is gone (its finalizers done): watched from a list, never re-read."""
        try:
            await self.kube.wait_gone(self.kube.batch.list_namespaced_job, self.namespace, name, self.delete_timeout_seconds)
        except TimeoutError:
            raise BuildError(f"the previous build Job {name} was not deleted within {self.delete_timeout_seconds:g} s") from None

    async def _pod(self, name: str) -> dict[str, Any] | None:
        pods = await self.kube.items(self.kube.core.list_namespaced_pod, self.namespace, labels={"job-name": name})
        return pods[-1] if pods else None

    async def _log(self, name: str) -> list[str]:
        pod = await self._pod(name)
        if pod is None:
            return []
        text = await self.kube.call(self.kube.core.read_namespaced_pod_log, pod["metadata"]["name"], self.namespace,
                                    container="build", tail_lines=LOG_TAIL_LINES)
        return str(text or "").splitlines()

    async def _digest(self, name: str) -> str:
        pod = await self._pod(name)
        for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
            message = ((status.get("state") or {}).get("terminated") or {}).get("message", "").strip()
            if message.startswith("sha256:"):
                return str(message)
        return ""

    async def _jobs_of(self, reference: str) -> list[dict[str, Any]]:
        repository, _, digest = reference.partition("@")
        if not digest.startswith("sha256:"):
            return []
        jobs = await self.kube.items(self.kube.batch.list_namespaced_job, self.namespace,
                                     labels={PART_LABEL: "build", IMAGE_LABEL: digest.removeprefix("sha256:")[:62]})
        return [j for j in jobs if (j["metadata"].get("annotations") or {}).get(REPOSITORY_ANNOTATION) == repository
                and j["metadata"]["annotations"].get(IMAGE_LABEL) == digest]

    async def resolve(self, reference: str) -> Image | None:
        jobs = await self._jobs_of(reference)
        return self._image(jobs[0], reused=True) if jobs else None

    async def remove(self, reference: str) -> None:
        """Forget the build (its Job and context); the registry keeps the pushed image until its own
        garbage collection."""
        for job in await self._jobs_of(reference):
            await self.kube.delete(self.kube.batch.delete_namespaced_job, job["metadata"]["name"], self.namespace)
            await self._gone(job["metadata"]["name"])
            source_hex = (job["metadata"].get("labels") or {}).get(SOURCE_LABEL, "")
            for tarball in self.context_dir.glob(f"{source_hex}*.tar.gz") if source_hex else []:
                tarball.unlink(missing_ok=True)

    async def close(self) -> None:
        await self.kube.close()
