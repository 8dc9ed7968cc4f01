"""The rendered Argo Workflow against the real CRD schema in strict mode, and the rules the schema cannot check."""

from __future__ import annotations

import copy
import dataclasses
import json

import kubernetes_schemas as schemas
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_runs import IMAGE, pod, scan_run, task
from simrun_core.errors import FailedPrecondition, InvalidArgument
from simrun_core.identity import priority_value
from simrun_tracker.executor import RunSpec, TaskSpec
from simrun_tracker.kubernetes.config import KubernetesSettings
from simrun_tracker.kubernetes.names import InvalidName, check_label_value, quantity_gib
from simrun_tracker.kubernetes.render import check_workflow, patch_branches, render_workflow

SETTINGS = KubernetesSettings()
RUN = "20261201-080000-aaaaaa"


def templates(wf: dict) -> dict[str, dict]:
    return {t["name"]: t for t in wf["spec"]["templates"]}


def dag(wf: dict) -> dict[str, dict]:
    return {t["name"]: t for t in templates(wf)["run"]["dag"]["tasks"]}


@st.composite
def runs(draw: st.DrawFn) -> RunSpec:
    suffix = draw(st.text("0123456789abcdef", min_size=6, max_size=6))
    run_id = f"2026120{draw(st.integers(1, 9))}-0800{draw(st.integers(10, 59))}-{suffix}"
    count = draw(st.integers(1, 4))
    tasks: list[TaskSpec] = []
    for index in range(count):
        task_id = draw(st.sampled_from(["fit", "scan", "plot", "sweep-2", "a" * 39])) + str(index)
        split = draw(st.booleans())
        pods = draw(st.integers(1, 8)) if split else 1
        memory = draw(st.sampled_from([0.5, 1.0, 2.0, 3.5, 4.0, 12.0, 64.0]))
        depends = draw(st.lists(st.sampled_from([t.task_id for t in tasks]), unique=True)) if tasks else []
        tasks.append(
            task(
                run_id,
                task_id,
                pods,
                depends,
                split=split,
                legacy_merge=split and draw(st.booleans()),
                memory_gb=memory,
                retry_memory_gb=memory * 1.5,
                processes=draw(st.integers(1, 16)),
                cores=draw(st.integers(1, 64)),
                priority=draw(st.sampled_from(["owner", "standard", "agent"])),
            )
        )
    snapshots = draw(st.lists(st.sampled_from(["snapshots/model/" + "1f" * 32, "snapshots/lib/" + "2e" * 32])))
    return RunSpec(run_id, tasks, draw(st.sampled_from([None, "node-a"])), snapshots)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_every_rendered_workflow_validates_strictly_against_the_crd(run: RunSpec) -> None:
    wf = render_workflow(run, SETTINGS)
    assert wf["apiVersion"] == "argoproj.io/v1alpha1" and wf["kind"] == "Workflow"
    assert schemas.errors(wf) == []
    check_workflow(wf)
    nodes = dag(wf)
    for spec in run.tasks:
        prefix = spec.task_id
        extras = len(spec.pods) - 1
        assert (f"{prefix}-extra" in nodes) == (extras > 0)
        if extras:
            assert nodes[f"{prefix}-extra"]["withSequence"] == {"start": "1", "end": str(extras)}
            assert nodes[f"{prefix}-extra"]["continueOn"] == {"failed": True}
        assert (f"{prefix}-merge" in nodes) == (spec.merge_pod is not None)
        for upstream in spec.depends_on:
            upstream_spec = next(t for t in run.tasks if t.task_id == upstream)
            exit_node = f"{upstream}-merge" if upstream_spec.merge_pod is not None else f"{upstream}-w0"
            assert exit_node in nodes[f"{prefix}-w0"]["depends"]
    for template in wf["spec"]["templates"][1:]:
        labels = template["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/priority-class"] == template["priorityClassName"]
        priority_value(template["priorityClassName"])
        assert labels["kueue.x-k8s.io/queue-name"] == SETTINGS.local_queue
        if run.reservation:
            assert template["nodeSelector"]["simrun/reserved"] == run.run_id
            assert template["tolerations"] == [
                {"key": "simrun/reserved", "operator": "Equal", "value": run.run_id, "effect": "NoExecute"}
            ]
        for branch, patch in patch_branches(template["podSpecPatch"]).items():
            errors = [e.message for e in schemas.container_validator().iter_errors(patch["containers"][0])]
            assert errors == [], (branch, errors)


def test_the_retry_patch_gives_the_retry_memory_and_processes_after_exit_137_only() -> None:
    wf = render_workflow(scan_run(RUN, memory_gb=4.0, retry_memory_gb=6.0, processes=3), SETTINGS)
    template = templates(wf)["scan-w0"]
    assert "lastRetry.exitCode) == 137" in template["podSpecPatch"]
    branches = patch_branches(template["podSpecPatch"])
    retry, base = branches["retry"]["containers"][0], branches["base"]["containers"][0]
    assert retry["resources"] == {"requests": {"memory": "6Gi"}, "limits": {"memory": "6Gi"}}
    assert base["resources"] == {"requests": {"memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert retry["env"] == [{"name": "SIMRUN_PROCESSES", "value": "2"}]
    assert base["env"] == [{"name": "SIMRUN_PROCESSES", "value": "3"}]
    assert branches["base"]["terminationGracePeriodSeconds"] == 30
    strategy = template["retryStrategy"]
    assert strategy["retryPolicy"] == "Always" and int(strategy["limit"]) == SETTINGS.preemption_budget
    assert "137" in strategy["expression"] and "143" in strategy["expression"]


def test_the_container_schema_catches_a_bad_quantity_in_a_patch_branch() -> None:
    patch = {"name": "main", "resources": {"limits": {"memory": "6 GiB"}}}
    assert list(schemas.container_validator().iter_errors(patch))


def test_strict_mode_catches_a_misspelled_field_and_a_float_quantity() -> None:
    wf = render_workflow(scan_run(RUN), SETTINGS)
    typo = copy.deepcopy(wf)
    typo["spec"]["templates"][1]["contaner"] = typo["spec"]["templates"][1].pop("container")
    assert any("contaner" in e for e in schemas.errors(typo))
    floaty = copy.deepcopy(wf)
    floaty["spec"]["templates"][1]["container"]["resources"]["limits"]["cpu"] = 0.5
    assert schemas.errors(floaty)
    policy = copy.deepcopy(wf)
    policy["spec"]["templates"][1]["retryStrategy"]["retryPolicy"] = "Sometimes"
    assert schemas.errors(policy)


def test_pods_see_their_run_only_with_a_read_only_root_and_no_token() -> None:
    snapshots = ["snapshots/montecarlo/" + "1f" * 32, "snapshots/tinylib/" + "2e" * 32]
    run = dataclasses.replace(scan_run(RUN), snapshots=snapshots)
    wf = render_workflow(run, SETTINGS)
    assert wf["spec"]["automountServiceAccountToken"] is False
    assert wf["spec"]["volumes"] == [{"name": "store", "persistentVolumeClaim": {"claimName": "simrun-store"}}]
    for template in wf["spec"]["templates"][1:]:
        main = template["container"]
        task_id = template["metadata"]["annotations"]["simrun.io/task-id"]
        store_mounts = [m for m in main["volumeMounts"] if m["name"] == "store"]
        mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
        # DESIGN's containment: the run read-only, its task's folder the only writable part of the store (mounted
        # after the run, over it), the run's own snapshots read-only; never the whole store or other snapshots.
        assert store_mounts[0] == {
            "name": "store",
            "mountPath": f"/store/runs/{RUN}",
            "readOnly": True,
            "subPath": f"runs/{RUN}",
        }
        assert [m for m in store_mounts if not m.get("readOnly")] == [
            {
                "name": "store",
                "mountPath": f"/store/runs/{RUN}/tasks/{task_id}",
                "subPath": f"runs/{RUN}/tasks/{task_id}",
            }
        ]
        assert {m["subPath"] for m in store_mounts[2:]} == set(snapshots)
        assert all(mounts[f"/store/{s}"]["readOnly"] is True for s in snapshots)
        assert {"/tmp", "/scratch"} <= set(mounts)
        volumes = {v["name"]: v for v in template["volumes"]}
        assert "emptyDir" in volumes["tmp"] and "emptyDir" in volumes["scratch"]
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert template["securityContext"]["runAsNonRoot"] is True
        assert template["automountServiceAccountToken"] is False
        env = {e["name"]: e["value"] for e in main["env"]}
        fixed = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}
        assert {k: env[k] for k in fixed} == fixed and env["HOME"] == env["TMPDIR"] == env["SIMRUN_SCRATCH"]
        assert set(env) - set(fixed) - {"HOME", "TMPDIR"} == {n for n in env if n.startswith("SIMRUN_")}
        assert env["HOME"] in mounts and "emptyDir" in {v["name"]: v for v in template["volumes"]}["scratch"]
        assert env["SIMRUN_RUN_DIR"] == f"/store/runs/{RUN}"
        assert env["SIMRUN_PROVENANCE"].startswith(f"/store/runs/{RUN}/tasks/")
        assert main["image"] == IMAGE and main["command"][:2] == ["python", "-m"]
        res = main["resources"]
        assert res["requests"] == res["limits"] and res["limits"]["memory"] == "4Gi"


def test_extra_workers_are_one_fan_out_named_by_their_item() -> None:
    wf = render_workflow(scan_run(RUN, pods=4), SETTINGS)
    extra = templates(wf)["scan-extra"]
    assert extra["metadata"]["labels"]["simrun.io/worker"] == "{{inputs.parameters.worker}}"
    assert {"name": "SIMRUN_WORKER", "value": "{{inputs.parameters.worker}}"} in extra["container"]["env"]
    assert extra["priorityClassName"] == "simrun-standard-extra"
    assert templates(wf)["scan-w0"]["priorityClassName"] == "simrun-standard-base"
    assert dag(wf)["scan-extra"]["arguments"] == {"parameters": [{"name": "worker", "value": "w{{item}}"}]}
    assert dag(wf)["plot-w0"]["depends"] == "scan-w0"
    env = {e["name"]: e["value"] for e in templates(wf)["scan-w0"]["container"]["env"]}
    assert env["SIMRUN_MERGE"] == "1" and env["SIMRUN_WORKER"] == "w0"


def test_bad_runs_are_refused_with_what_to_fix() -> None:
    with pytest.raises(InvalidArgument, match="depends on 'nope'"):
        render_workflow(RunSpec(RUN, [task(RUN, "a", 1, ["nope"])]), SETTINGS)
    with pytest.raises(InvalidArgument, match="extra workers must be"):
        render_workflow(RunSpec(RUN, [TaskSpec("a", [pod(RUN, "a", "w0"), pod(RUN, "a", "w2")])]), SETTINGS)
    with pytest.raises(InvalidArgument, match="differ"):
        pods = [pod(RUN, "a", "w0"), pod(RUN, "a", "w1"), pod(RUN, "a", "w2", memory_gb=8.0)]
        render_workflow(RunSpec(RUN, [TaskSpec("a", pods)]), SETTINGS)
    with pytest.raises(FailedPrecondition, match="no image"):
        render_workflow(scan_run(RUN, image=""), SETTINGS)
    defaulted = KubernetesSettings(default_image=IMAGE)
    assert schemas.errors(render_workflow(scan_run(RUN, image=""), defaulted)) == []
    with pytest.raises(InvalidArgument, match="not a snapshot folder"):
        render_workflow(dataclasses.replace(scan_run(RUN), snapshots=["snapshots/../../etc"]), SETTINGS)
    with pytest.raises(InvalidArgument, match="not a snapshot folder"):
        render_workflow(dataclasses.replace(scan_run(RUN), snapshots=["runs/other"]), SETTINGS)
    strange = pod(RUN, "a", "w0")
    strange.contract["LD_PRELOAD"] = "/x.so"
    with pytest.raises(InvalidArgument, match="not a variable of the runtime contract"):
        render_workflow(RunSpec(RUN, [TaskSpec("a", [strange])]), SETTINGS)


def test_check_workflow_asserts_what_the_schema_cannot() -> None:
    wf = render_workflow(scan_run(RUN), SETTINGS)
    twice = copy.deepcopy(wf)
    twice["spec"]["templates"].append(copy.deepcopy(twice["spec"]["templates"][1]))
    with pytest.raises(InvalidArgument, match="two templates"):
        check_workflow(twice)
    dangling = copy.deepcopy(wf)
    dangling["spec"]["templates"][0]["dag"]["tasks"][-1]["depends"] = "scan-w0 && (ghost.Succeeded)"
    with pytest.raises(InvalidArgument, match="ghost"):
        check_workflow(dangling)
    unequal = copy.deepcopy(wf)
    unequal["spec"]["templates"][1]["container"]["resources"]["limits"]["memory"] = "8Gi"
    with pytest.raises(InvalidArgument, match="requests differ"):
        check_workflow(unequal)
    mislabelled = copy.deepcopy(wf)
    mislabelled["spec"]["templates"][1]["priorityClassName"] = "simrun-owner-base"
    with pytest.raises(InvalidArgument, match="priority label"):
        check_workflow(mislabelled)
    patched = copy.deepcopy(wf)
    patch = json.loads(patched["spec"]["templates"][1]["podSpecPatch"].replace("'6Gi'", "'7Gi'", 1))
    patched["spec"]["templates"][1]["podSpecPatch"] = json.dumps(patch)
    with pytest.raises(InvalidArgument, match="retry patch"):
        check_workflow(patched)
    long_label = copy.deepcopy(wf)
    long_label["spec"]["templates"][1]["metadata"]["labels"]["simrun.io/task"] = "x" * 64
    with pytest.raises(InvalidName):
        check_workflow(long_label)
    with pytest.raises(InvalidName):
        check_label_value("-bad", "a label")


def test_quantities_are_strings_kubernetes_accepts() -> None:
    assert [quantity_gib(g) for g in (6, 1.5, 0.375, 64)] == ["6Gi", "1536Mi", "384Mi", "64Gi"]
