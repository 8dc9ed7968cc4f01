"""End to end through `simrun server` with `executor.kind: containers`: every pod a podman container of the run's
image, which the builder built with buildah from the Debian base of the tests and pushed to a registry on loopback.

A split task on three containers (the coordinator and two extra workers) and an unsplit task downstream give
outputs byte-identical to the same run on the local executor; a container killed with SIGKILL mid-unit has its
units computed again; a container past its memory is a kill for memory, retried with more; a pod writes nothing of
the store but its task's folder, nothing of the image, and reads no token.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from e2e_support import git_repo, wait_final
from images import PODMAN, BaseImage, Registry
from simrun.v1 import common_pb2
from simrun_core.config import ContainersConfig, EnvironmentsConfig, ExecutorConfig, ImagesConfig
from simrun_runtime.layout import StoreLayout

pytestmark = [pytest.mark.slow, pytest.mark.network, pytest.mark.timeout(900)]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
THREE_NODES = [{"name": f"node-{c}", "cores": 1, "memory_gb": 2} for c in "abc"]

PYPROJECT = """[project]
name = "cmodel"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["numpy"]

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
"""

TASKS = """
import json, os, sys, time
from pathlib import Path

import numpy as np
from simrun_runtime import ExecContext, MergeContext, ResourceHint, SplitTaskType, TaskSettings, UnitContext
from simrun_runtime import UnsplitTaskType


class ScanSettings(TaskSettings):
    units: int = 6
    seconds: float = 0.5
    seed: int = 1


class Scan(SplitTaskType):
    Settings = ScanSettings
    outputs = ("values",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.25)

    def count_units(self, settings):
        return settings.units

    def compute_unit(self, settings, index, unit: UnitContext):
        time.sleep(settings.seconds)
        rng = np.random.default_rng([settings.seed, index])
        mean = float(rng.normal(size=10_000).mean())
        (unit.result_dir / "value.json").write_text(json.dumps({"index": index, "mean": mean}))

    def merge(self, settings, merge: MergeContext):
        values = [json.loads((p / "value.json").read_text()) for _, p in merge.units()]
        values.sort(key=lambda v: v["index"])
        (merge.outputs["values"] / "values.json").write_text(json.dumps(values))
        return {"units": len(values), "numpy": np.__version__}


class Total(UnsplitTaskType):
    class Settings(TaskSettings):
        pass

    inputs = ("values",)
    outputs = ("total",)

    def run(self, settings, context: ExecContext):
        values = json.loads((context.inputs["values"] / "values.json").read_text())
        total = float(np.sum([v["mean"] for v in values]))
        (context.outputs["total"] / "total.json").write_text(json.dumps(total))
        return {"total": total}


class HogSettings(TaskSettings):
    mib: int = 100


class Hog(SplitTaskType):
    Settings = HogSettings
    outputs = ("sizes",)
    resources = ResourceHint(base_memory_gb=0.25, per_worker_gb=0.25)

    def count_units(self, settings):
        return 1

    def compute_unit(self, settings, index, unit: UnitContext):
        block = np.ones(settings.mib * 1024 * 1024, dtype=np.uint8)
        time.sleep(0.3)
        (unit.result_dir / "size.json").write_text(json.dumps({"mib": int(block.sum()) // (1024 * 1024)}))

    def merge(self, settings, merge: MergeContext):
        return {"mib": [json.loads((p / "size.json").read_text())["mib"] for _, p in merge.units()]}


class ProbeSettings(TaskSettings):
    secrets: list[str] = []


class Probe(UnsplitTaskType):
    Settings = ProbeSettings
    outputs = ("report",)

    def run(self, settings, context: ExecContext):
        import cmodel

        run_dir = Path(os.environ["SIMRUN_RUN_DIR"])
        targets = {
            "own task": context.outputs["report"] / "written.txt",
            "other task": run_dir / "tasks" / "scan" / "forged.txt",
            "run": run_dir / "forged.txt",
            "snapshot": Path(cmodel.__file__).parent / "forged.py",
            "image": Path(sys.prefix) / "forged.txt",
            "root": Path("/forged.txt"),
        }
        report = {}
        for name, path in targets.items():
            try:
                path.write_text("x")
                report[name] = "written"
            except OSError as exc:
                report[name] = type(exc).__name__
        for path in settings.secrets:
            try:
                Path(path).read_bytes()
                report[path] = "read"
            except OSError as exc:
                report[path] = type(exc).__name__
        report["variables"] = sorted(k for k in os.environ if "TOKEN" in k or "PASSWORD" in k)
        report["uid"] = os.getuid()
        report["model"] = cmodel.__file__
        report["python"] = sys.prefix
        return report
"""

WORKFLOW = """name: scan
tasks:
  scan:
    type: cmodel.tasks:Scan
    settings: {units: 6, seconds: %(seconds)s, seed: 3}
  total:
    type: cmodel.tasks:Total
    inputs: {values: scan.values}
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("cmodel-source")
    (source / "cmodel").mkdir()
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "cmodel" / "__init__.py").write_text("")
    (source / "cmodel" / "tasks.py").write_text(TASKS)
    for seconds in ("0.5", "3"):
        (source / f"scan-{seconds}.yaml").write_text(WORKFLOW % {"seconds": seconds})
    (source / "hog.yaml").write_text(
        "name: hog\ntasks:\n  hog:\n    type: cmodel.tasks:Hog\n    settings: {mib: 1500}\n"
    )
    return git_repo(source, tmp_path_factory.mktemp("cmodel") / "model")


def containers_server(start_server, home: Path, base_image: BaseImage, oci_registry: Registry, nodes: list[dict]):
    environments = EnvironmentsConfig(
        kind="image",
        images=ImagesConfig(
            builder="buildah",
            registry=oci_registry.address,
            base_images={base_image.python_version: base_image.pushed},
            insecure=True,
            ca_bundle=CA_BUNDLE,
        ),
        uv_cache_dir=home.parent / "uv-cache",
        compile_bytecode=False,
    )
    executor = ExecutorConfig(kind="containers", containers=ContainersConfig(tls_verify=False))
    return start_server(nodes=nodes, home=home, environments=environments, executor=executor)


def outputs(store: StoreLayout, run_id: str) -> dict[str, bytes]:
    """Every file of the run's task outputs and summaries, by path below `tasks/` (the merge markers left out)."""
    tasks = store.run(run_id).root / "tasks"
    return {
        str(path.relative_to(tasks)): path.read_bytes()
        for path in sorted(tasks.glob("*/out/**/*"))
        if path.is_file() and path.name != ".merged"
    }


def record(store: StoreLayout, run_id: str) -> dict:
    return json.loads(store.run(run_id).record.read_text())


def test_a_split_task_on_three_containers_and_one_downstream_give_the_local_executor_s_bytes(
    start_server, client_for, model: Path, tmp_path: Path, base_image: BaseImage, oci_registry: Registry
) -> None:
    server = containers_server(start_server, tmp_path / "containers", base_image, oci_registry, THREE_NODES)
    client = client_for(server)
    run = client.submit(model / "scan-0.5.yaml")
    final = wait_final(client, run.run_id, timeout_s=600)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    scan = next(t for t in final.tasks if t.task_id == "scan")
    assert scan.plan.pods == 3
    store = StoreLayout(server.config.store)
    logs = store.run(run.run_id).task("scan").logs
    for worker in ("w0", "w1", "w2"):
        first = (logs / f"{worker}.log").read_text().splitlines()[0]
        assert "container of " in first and "@sha256:" in first, first
    summary = json.loads(store.run(run.run_id).task("scan").summary.read_text())
    assert summary["units"] == 6

    local = start_server(nodes=THREE_NODES, home=tmp_path / "local", environments=EnvironmentsConfig())
    local_client = client_for(local)
    again = local_client.submit(model / "scan-0.5.yaml", reuse="never")
    done = wait_final(local_client, again.run_id, timeout_s=600)
    assert done.state == common_pb2.RUN_STATE_SUCCEEDED, done.message
    mine = outputs(store, run.run_id)
    assert {"scan/out/values/values.json", "total/out/total/total.json", "total/out/summary.json"} <= mine.keys()
    assert mine == outputs(StoreLayout(local.config.store), again.run_id)
    left = [*PODMAN, "ps", "--all", "--quiet", "--filter", f"label=io.simrun.run={run.run_id}"]
    assert subprocess.run(left, capture_output=True, text=True).stdout.strip() == "", "no container is left behind"


def test_a_container_killed_mid_unit_has_its_units_computed_again_and_the_run_succeeds(
    start_server, client_for, model: Path, tmp_path: Path, base_image: BaseImage, oci_registry: Registry
) -> None:
    server = containers_server(start_server, tmp_path / "home", base_image, oci_registry, THREE_NODES)
    client = client_for(server)
    run = client.submit(model / "scan-3.yaml")
    name = f"simrun-{run.run_id}-scan-w1-1"
    deadline = time.monotonic() + 600
    while subprocess.run([*PODMAN, "container", "exists", name]).returncode != 0:
        assert time.monotonic() < deadline, "the extra worker's container never started"
        assert client.get_run(run.run_id).state < 4, client.get_run(run.run_id).message
        time.sleep(0.1)
    time.sleep(1.5)  # inside its first unit of three seconds
    subprocess.run([*PODMAN, "kill", "--signal", "KILL", name], check=True, capture_output=True)
    final = wait_final(client, run.run_id, timeout_s=300)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    store = StoreLayout(server.config.store)
    task = record(store, run.run_id)["tasks"]["scan"]
    assert task["sigkills"].get("w1") == 1 and task["attempts"]["w1"] == 2, task
    assert final.oom_kills == [], "a SIGKILL without evidence is not a kill for memory"
    values = json.loads((store.run(run.run_id).task("scan").out_port("values") / "values.json").read_text())
    assert [v["index"] for v in values] == list(range(6))


def test_a_container_past_its_memory_is_a_kill_for_memory_and_is_retried_with_more(
    start_server, client_for, model: Path, tmp_path: Path, base_image: BaseImage, oci_registry: Registry
) -> None:
    server = containers_server(
        start_server, tmp_path / "home", base_image, oci_registry, [{"name": "node-a", "cores": 1, "memory_gb": 4}]
    )
    client = client_for(server)
    run = client.submit(model / "hog.yaml")
    final = wait_final(client, run.run_id, timeout_s=600)
    plan = final.tasks[0].plan
    assert plan.shape.memory_gb * 1024 < 1500 < plan.shape.retry_memory_gb * 1024 - 200, plan
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    assert [(k.worker, k.memory_gb) for k in final.oom_kills] == [("w0", plan.shape.memory_gb)]
    log = (StoreLayout(server.config.store).run(run.run_id).task("hog").logs / "w0.log").read_text()
    assert "killed for memory (cgroup" in log, log


def test_a_container_writes_only_its_task_s_folder_and_reads_no_token(
    start_server, client_for, model: Path, tmp_path: Path, base_image: BaseImage, oci_registry: Registry
) -> None:
    server = containers_server(start_server, tmp_path / "home", base_image, oci_registry, THREE_NODES)
    secrets = [str(server.config.tokens_file), str(server.config.home / "token")]
    (model / "probe.yaml").write_text(
        "name: probe\ntasks:\n  probe:\n    type: cmodel.tasks:Probe\n"
        f"    settings: {{secrets: {json.dumps(secrets)}}}\n"
    )
    client = client_for(server)
    run = client.submit(model / "probe.yaml")
    final = wait_final(client, run.run_id, timeout_s=600)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    report = json.loads(StoreLayout(server.config.store).run(run.run_id).task("probe").summary.read_text())
    assert report["own task"] == "written"
    for place in ("other task", "run", "snapshot", "image", "root"):
        assert report[place] in ("OSError", "PermissionError", "FileNotFoundError"), (place, report)
    for secret in secrets:
        assert report[secret] == "FileNotFoundError", report
    assert report["variables"] == [] and report["uid"] == 1000
    assert report["model"].startswith("/store/snapshots/"), "the model, installed editable from its snapshot"
    assert report["python"] == "/opt/simrun/venv"
