"""Renders a run as one Argo Workflow, as the design note says, and checks what the CRD schema cannot.

A task is nodes of the run's DAG: `<task>-w0` (the coordinator, which merges, or an unsplit task's pod),
`<task>-extra` (the extra workers `w1`…, one `withSequence` fan-out that may fail without failing the run) and, for a
plan recorded before the coordinator merged, `<task>-merge` after the coordinator. A downstream task depends on its
inputs' `-w0` (or `-merge`); the runtime waits for each input's merge marker before it computes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from typing import Any

from simrun_core.errors import FailedPrecondition, InvalidArgument

from simrun_tracker.container import SCRATCH, TMP, container_spec
from simrun_tracker.executor import (
    COORDINATOR,
    SIGKILL_EXIT,
    SIGTERM_EXIT,
    PodSpec,
    RunSpec,
    TaskSpec,
)
from simrun_tracker.kubernetes import builders
from simrun_tracker.kubernetes.config import KubernetesSettings
from simrun_tracker.kubernetes.names import (
    PRIORITY_LABEL,
    QUEUE_LABEL,
    RESERVED,
    RUN_LABEL,
    TASK_ANNOTATION,
    TASK_LABEL,
    WORKER_LABEL,
    InvalidName,
    check_dns_label,
    check_label_value,
    quantity_cores,
    quantity_gib,
    task_node,
    workflow_name,
)

Obj = dict[str, Any]

ENTRYPOINT = "run"
STORE_VOLUME = "store"
WORKER_PARAMETER = "worker"
EXTRA_WORKER = "{{inputs.parameters.worker}}"
RETRIED_FOR_MEMORY = f"asInt(retries) > 0 && asInt(lastRetry.exitCode) == {SIGKILL_EXIT}"
"""Argo's expression for "this attempt follows a kill by SIGKILL": it then gets the retry memory and processes."""
EXECUTOR_ACCOUNT = "simrun-executor"
"""The service account whose token only Argo's wait sidecar gets (deploy/ makes it)."""

_EMPTY_DIRS = {TMP: "tmp", SCRATCH: "scratch"}
"""The emptyDir volume of each of the container's empty writable folders."""
_BRANCH = re.compile(r"\{\{=" + re.escape(RETRIED_FOR_MEMORY) + r" \? '([^']*)' : '([^']*)'\}\}")


def render_workflow(run: RunSpec, settings: KubernetesSettings) -> Obj:
    """The Workflow the kubernetes executor submits for a run; `InvalidArgument`/`FailedPrecondition` if unfit.

    Raises:
        InvalidArgument: a name or label Kubernetes would refuse, or tasks that name unknown inputs.
        FailedPrecondition: a pod without an image by digest (and no default image in the settings).
    """
    try:
        name = workflow_name(run.run_id)
        check_label_value(run.run_id, "the run id")
        known = {t.task_id: t for t in run.tasks}
        templates: list[Obj] = []
        dag: list[Obj] = []
        for task in run.tasks:
            for upstream in task.depends_on:
                if upstream not in known:
                    raise InvalidArgument(f"task {task.task_id} depends on {upstream!r}, which the run does not have")
            depends = " && ".join(_exit_node(known[u]) for u in task.depends_on)
            nodes, task_templates = _task(run, task, depends, settings)
            dag.extend(nodes)
            templates.extend(task_templates)
        templates.insert(0, builders.dag_template(ENTRYPOINT, dag))
        workflow = builders.workflow(
            name,
            settings.namespace,
            labels={RUN_LABEL: run.run_id},
            annotations={"simrun.io/run-id": run.run_id},
            entrypoint=ENTRYPOINT,
            templates=templates,
            volumes=[builders.claim_volume(STORE_VOLUME, settings.store_claim)],
        )
        check_workflow(workflow)
    except InvalidName as exc:
        raise InvalidArgument(f"run {run.run_id}: {exc}") from exc
    return workflow


def _exit_node(task: TaskSpec) -> str:
    """The node a downstream task waits for: the legacy merge pod, else the coordinator."""
    node = task_node(task.task_id)
    return f"{node}-merge" if task.merge_pod is not None else f"{node}-w0"


def _task(run: RunSpec, task: TaskSpec, depends: str, settings: KubernetesSettings) -> tuple[list[Obj], list[Obj]]:
    node = task_node(task.task_id)
    coordinators = [p for p in task.pods if p.worker == COORDINATOR]
    if len(coordinators) != 1:
        raise InvalidArgument(f"task {task.task_id} needs exactly one pod {COORDINATOR}, has {len(coordinators)}")
    extras = sorted((p for p in task.pods if p.worker != COORDINATOR), key=lambda p: _worker_index(p))
    expected = [f"w{i}" for i in range(1, len(extras) + 1)]
    if [p.worker for p in extras] != expected:
        got = [p.worker for p in extras]
        raise InvalidArgument(f"task {task.task_id}: extra workers must be {expected}, got {got}")
    nodes = [builders.dag_task(f"{node}-w0", f"{node}-w0", depends)]
    templates = [_template(run, f"{node}-w0", coordinators[0], settings)]
    if extras:
        first = extras[0]
        for other in extras[1:]:
            if _without_worker(other) != _without_worker(first):
                raise InvalidArgument(f"task {task.task_id}: extra workers {first.worker} and {other.worker} differ")
        nodes.append(
            builders.dag_task(
                f"{node}-extra",
                f"{node}-extra",
                depends,
                sequence=(1, len(extras)),
                arguments={WORKER_PARAMETER: "w{{item}}"},
                continue_on_failed=True,
            )
        )
        templates.append(_template(run, f"{node}-extra", first, settings, extra=True))
    if task.merge_pod is not None:
        nodes.append(builders.dag_task(f"{node}-merge", f"{node}-merge", f"{node}-w0"))
        templates.append(_template(run, f"{node}-merge", task.merge_pod, settings))
    return nodes, templates


def _worker_index(pod: PodSpec) -> int:
    match = re.fullmatch(r"w([0-9]+)", pod.worker)
    if not match:
        raise InvalidArgument(f"pod {pod.pod_id}: worker {pod.worker!r} is not w<number>")
    return int(match.group(1))


def _without_worker(pod: PodSpec) -> PodSpec:
    contract = {k: v for k, v in pod.contract.items() if k != "SIMRUN_WORKER"}
    return dataclasses.replace(pod, worker="", contract=contract)


def _template(run: RunSpec, name: str, pod: PodSpec, settings: KubernetesSettings, *, extra: bool = False) -> Obj:
    image = pod.image or settings.default_image
    if not image:
        raise FailedPrecondition(
            f"pod {pod.pod_id} has no image and the kubernetes executor has none: "
            "set executor.kubernetes.default_image (by digest)"
        )
    worker = EXTRA_WORKER if extra else pod.worker
    spec = container_spec(
        pod,
        image=image,
        store_mount=settings.store_mount,
        python=settings.python,
        snapshots=run.snapshots,
        worker=worker,
        user=settings.run_as_user,
    )
    scratch_gb = getattr(pod, "scratch_gb", None) or settings.scratch_gb
    gpus = int(getattr(pod, "gpus", 0) or 0)
    main = builders.container(
        spec.image,
        spec.command,
        builders.env_vars(spec.env),
        builders.resources(quantity_cores(spec.cores), quantity_gib(spec.memory_gb), quantity_gib(scratch_gb), gpus),
        [
            *(
                builders.volume_mount(STORE_VOLUME, m.target, read_only=m.read_only, sub_path=m.subpath)
                for m in spec.mounts
            ),
            *(builders.volume_mount(_EMPTY_DIRS[folder], folder) for folder in spec.tmpfs),
        ],
    )
    labels = {
        RUN_LABEL: run.run_id,
        TASK_LABEL: task_node(pod.task_id),
        WORKER_LABEL: worker,
        QUEUE_LABEL: settings.local_queue,
        PRIORITY_LABEL: pod.priority_class,
    }
    selector = dict(settings.node_selector)
    tolerations = []
    if run.reservation:
        selector[RESERVED] = run.run_id
        tolerations.append(builders.toleration(RESERVED, run.run_id))
    return builders.container_template(
        name,
        labels=labels,
        annotations={TASK_ANNOTATION: pod.task_id},
        main=main,
        priority_class=pod.priority_class,
        retry=builders.retry_strategy(settings.preemption_budget, [SIGKILL_EXIT, SIGTERM_EXIT]),
        pod_spec_patch=retry_patch(pod),
        volumes=[
            builders.empty_dir(_EMPTY_DIRS[TMP], "1Gi"),
            builders.empty_dir(_EMPTY_DIRS[SCRATCH], quantity_gib(scratch_gb)),
        ],
        node_selector=selector,
        tolerations=tolerations,
        security=builders.pod_security(settings.run_as_user),
        executor_service_account=EXECUTOR_ACCOUNT,
        inputs=[builders.input_parameter(WORKER_PARAMETER)] if extra else [],
    )


def retry_patch(pod: PodSpec) -> str:
    """The `podSpecPatch` of every attempt: the grace, and the memory and processes chosen by the last exit.

    After an exit by SIGKILL (137: the OOM killer, or a kill for memory the tracker counts) the attempt gets the
    retry memory (request = limit) and the retry's processes; every other attempt the planned ones.
    """

    def choose(retry: str, base: str) -> str:
        return f"{{{{={RETRIED_FOR_MEMORY} ? '{retry}' : '{base}'}}}}"

    memory = choose(quantity_gib(pod.retry_memory_gb), quantity_gib(pod.memory_gb))
    processes = choose(str(pod.processes_after(True)), str(pod.processes))
    patch = {
        "terminationGracePeriodSeconds": max(1, round(pod.grace_s)),
        "containers": [
            {
                "name": builders.CONTAINER,
                "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}},
                "env": [{"name": "SIMRUN_PROCESSES", "value": processes}],
            }
        ],
    }
    return json.dumps(patch, separators=(",", ":"))


def patch_branches(patch: str) -> dict[str, Obj]:
    """The pod spec patches an attempt can get, `base` and `retry`, with Argo's expressions evaluated."""
    return {
        "retry": json.loads(_BRANCH.sub(lambda m: m.group(1), patch)),
        "base": json.loads(_BRANCH.sub(lambda m: m.group(2), patch)),
    }


def check_workflow(workflow: Obj) -> None:
    """What the CRD schema cannot check, asserted on the rendered object.

    DNS-1123 names of the Workflow, its templates and DAG nodes; unique template and node names; every `depends`
    naming a node of its DAG; memory request = limit in every branch of the retry patch; the Kueue priority label
    equal to `priorityClassName`; every label value a valid value of at most 63 characters.

    Raises:
        InvalidName: a name or label Kubernetes would refuse.
        InvalidArgument: any other broken rule (a bug of the renderer, or an input it cannot express).
    """
    check_dns_label(workflow["metadata"]["name"], "the workflow name")
    _check_labels(workflow["metadata"].get("labels", {}), "the workflow")
    templates = workflow["spec"]["templates"]
    names = [t["name"] for t in templates]
    _unique(names, "template")
    for name in names:
        check_dns_label(name, "template")
    for template in templates:
        if "dag" in template:
            tasks = template["dag"]["tasks"]
            nodes = [t["name"] for t in tasks]
            _unique(nodes, "DAG node")
            for task in tasks:
                check_dns_label(task["name"], "DAG node")
                if task["template"] not in names:
                    raise InvalidArgument(f"DAG node {task['name']} names no template {task['template']!r}")
                for dependency in _depends_names(task.get("depends", "")):
                    if dependency not in nodes:
                        raise InvalidArgument(f"DAG node {task['name']} depends on {dependency!r}, not a node")
            continue
        labels = template.get("metadata", {}).get("labels", {})
        sample = {k: v.replace(EXTRA_WORKER, "w1") for k, v in labels.items()}
        _check_labels(sample, f"template {template['name']}")
        if labels.get(PRIORITY_LABEL) != template.get("priorityClassName"):
            raise InvalidArgument(f"template {template['name']}: Kueue's priority label differs from priorityClassName")
        res = template["container"]["resources"]
        if res["requests"] != res["limits"]:
            raise InvalidArgument(f"template {template['name']}: requests differ from limits")
        for branch, patch in patch_branches(template.get("podSpecPatch", "{}")).items():
            for patched in patch.get("containers", []):
                r = patched.get("resources", {})
                if r.get("requests", {}).get("memory") != r.get("limits", {}).get("memory"):
                    raise InvalidArgument(f"template {template['name']}: the {branch} patch's memory request != limit")


def _check_labels(labels: dict[str, str], where: str) -> None:
    for key, value in labels.items():
        check_label_value(value, f"{where}: label {key}")


def _unique(names: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidArgument(f"two {what}s are named {name!r}")
        seen.add(name)


def _depends_names(depends: str) -> list[str]:
    """The node names of an Argo `depends` expression (`a && (b.Succeeded || c.Failed)`)."""
    words = re.split(r"&&|\|\||[()!\s]+", depends)
    return [w.split(".")[0] for w in words if w.strip()]
