"""The settings of the kubernetes executor: `executor: {kind: kubernetes, kubernetes: {...}}` of the server config."""

from __future__ import annotations

from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class SidecarRequests(BaseModel):
    """What Argo's `wait` sidecar requests per pod; pinned in the controller config so Kueue and the planner agree."""

    model_config = ConfigDict(extra="forbid")
    cores: float = Field(default=0.1, ge=0, description="Cores of the wait sidecar.")
    memory_gb: float = Field(default=0.125, ge=0, description="Memory of the wait sidecar, GiB.")


class KubernetesSettings(BaseModel):
    """How the kubernetes executor reaches the cluster and what its Workflows and pods look like."""

    model_config = ConfigDict(extra="forbid")
    namespace: str = Field(default="simrun", pattern=DNS_LABEL, description="Where Workflows and pods live.")
    kubeconfig: str | None = Field(default=None, description="A kubeconfig file; None: in-cluster, else ~/.kube.")
    context: str | None = Field(default=None, description="The kubeconfig context; None: its current one.")
    local_queue: str = Field(default="simrun", pattern=DNS_LABEL, description="Kueue's LocalQueue of the pods.")
    store_claim: str = Field(default="simrun-store", pattern=DNS_LABEL, description="The run store's PVC.")
    store_mount: str = Field(default="/store", description="Where a pod mounts the store (absolute).")
    default_image: str = Field(
        default="", description="The image of a run whose model has no pyproject.toml, by digest (`repo@sha256:…`)."
    )
    python: str = Field(default="python", description="The interpreter of the image that runs the runtime.")
    node_selector: dict[str, str] = Field(
        default_factory=lambda: {"simrun.io/worker": "true"},
        description="The label of the nodes that run simrun's pods; `nodes()` lists these.",
    )
    sidecar: SidecarRequests = Field(default_factory=SidecarRequests)
    preemption_budget: int = Field(
        default=50, ge=2, description="Argo's retry limit: preemptions count against it (argo#1796)."
    )
    scratch_gb: float = Field(default=1.0, gt=0, description="The emptyDir for /tmp and scratch when a task asks none.")
    run_as_user: int = Field(default=1000, ge=1, description="The non-root user of the pods.")
    watch_timeout_s: int = Field(default=300, ge=1, description="Seconds of one watch request before it is renewed.")
    request_timeout_s: float = Field(default=10.0, gt=0, description="Seconds of one API call.")
    backoff_max_s: float = Field(default=30.0, gt=0, description="The longest wait between two failed API calls.")

    @field_validator("store_mount")
    @classmethod
    def _absolute(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError(f"store_mount must be an absolute path, not {value!r}")
        return str(path)

    @field_validator("default_image")
    @classmethod
    def _by_digest(cls, value: str) -> str:
        if value and "@sha256:" not in value:
            raise ValueError(f"default_image must name an image by digest (repo@sha256:…), not {value!r}")
        return value
