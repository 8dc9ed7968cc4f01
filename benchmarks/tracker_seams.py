"""The tracker's seams: reads do not wait for a slow executor, and an idle server costs almost nothing.

1. GetRun latency (p50, p99) through a real gRPC server on loopback, of one of 20 active runs, while the driver
   drives all 20 against a scripted executor whose `pods()` takes 0.3 s (as a cluster API can), beside the same
   with an instant executor, in one run. Goal: the ratio at most 1.2.
2. The embedded server's own CPU (its process, pods excluded) over an idle period with no run, and with one
   running run whose pod sleeps. Goal: both under 2% of one core.

    uv run --frozen python benchmarks/tracker_seams.py [--calls 300] [--idle-s 30]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services" / "tracker" / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_submit import TOKEN, config, model_repo, percentile
from fake_executor import FakeExecutor
from simrun.v1 import tracker_pb2, tracker_pb2_grpc
from simrun_client.client import Client
from simrun_core.identity import Priority, TokenRegistry
from simrun_core.resources import ResolvedResources, SplitMode
from simrun_gateway.embedded import start_embedded
from simrun_planner import Node, plan_task
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Identity, RunRecord, TaskRecord
from simrun_tracker.describer import SubprocessDescriber
from simrun_tracker.ports import ServerEnvironments
from simrun_tracker.runstore import RunStore
from simrun_tracker.server import create_server
from simrun_tracker.tracker import RunTracker

NODES = [Node(f"n{i}", cores=2, memory_gb=8) for i in range(10)]
ACTIVE_RUNS = 20


class NoLearner:
    def resolve(self, key: object, hint: ResolvedResources) -> ResolvedResources:
        return hint

    def record_reports(self, record: object, task_id: str, succeeded: bool) -> int:
        return 0

    def estimate(self, *args: object) -> float | None:
        return None

    def close(self) -> None:
        return None


def seed_runs(store: StoreLayout) -> list[str]:
    """Twenty recorded runs of one unsplit task each, which the driver picks up at start."""
    runs = RunStore(store)
    plan = plan_task(
        SimpleNamespace(id="fit"),
        SimpleNamespace(name="m:T", split=False),
        ResolvedResources(base_memory_gb=0.5, per_worker_gb=0.5),
        NODES,
        SplitMode.SINGLE_SERVER,
        Priority.STANDARD,
        None,
        run_id="r",
    )
    identity = Identity(name="bench", kind="person", priority="standard")
    ids = []
    for index in range(ACTIVE_RUNS):
        task = TaskRecord(task_id="fit", type="m:T", plan=dataclasses.asdict(plan))
        record = RunRecord(run_id=f"run-{index:02d}", identity=identity, tasks={"fit": task}, environment="default")
        runs.create(record, lambda staging: staging.tasks.mkdir(parents=True))
        ids.append(record.run_id)
    runs.close()
    return ids


def get_run_latency(root: Path, pods_delay_s: float, calls: int) -> tuple[float, float, int]:
    store = StoreLayout(root / "store")
    run_ids = seed_runs(store)
    executor = FakeExecutor(list(NODES), pods_delay_s=pods_delay_s)
    environments = ServerEnvironments()
    tracker = RunTracker(store, executor, NoLearner(), SubprocessDescriber(), environments, environments).start()
    # Every call carries an identity (the read policy needs one): the owner's token, as `simrun` sends it.
    tokens = TokenRegistry.from_mapping({"owner": "bench", "tokens": {TOKEN: {"name": "bench"}}})
    bound = create_server(tracker, "127.0.0.1:0", tokens).start()
    try:
        with Client(f"127.0.0.1:{bound.port}", TOKEN) as client:
            stub = tracker_pb2_grpc.RunTrackerServiceStub(client.channel)
            time.sleep(1.0)  # the driver is busy with its steps
            latencies = []
            for index in range(calls):
                start = time.perf_counter()
                stub.GetRun(tracker_pb2.GetRunRequest(run_id=run_ids[index % len(run_ids)]))
                latencies.append(time.perf_counter() - start)
        return statistics.median(latencies), percentile(latencies, 0.99), tracker.driver.steps
    finally:
        bound.stop()
        tracker.close()


def idle_cpu(root: Path, seconds: float, with_run: bool) -> float:
    """Percent of one core the server's process used over `seconds`."""
    import resource

    server = start_embedded(config(root, cores=2))
    try:
        if with_run:
            model = model_repo(root / "model")
            workflow = model / "wait.yaml"
            units = int(seconds * 2) + 20
            workflow.write_text(
                f"tasks:\n  wait:\n    type: e2etasks.tasks:Slow\n    settings: {{units: {units}, seconds: 1.0}}\n"
            )
            with Client(server.address, TOKEN) as client:
                run = client.submit(workflow, single_server=True)
                while client.get_run(run.run_id).state != 3:  # RUNNING
                    time.sleep(0.1)
        time.sleep(1.0)
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.monotonic()
        time.sleep(seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
        elapsed = time.monotonic() - start
        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return 100.0 * used / elapsed
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    slow, fast, ratios = [], [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            s = get_run_latency(Path(a), 0.3, args.calls)
            f = get_run_latency(Path(b), 0.0, args.calls)
        slow.append(s)
        fast.append(f)
        ratios.append(s[0] / f[0])
    print(f"GetRun of one of {ACTIVE_RUNS} active runs, {args.calls} calls, medians of {args.repeats} repeats:")
    print(
        f"  pods() 0.3 s : p50 {statistics.median(x[0] for x in slow) * 1e3:6.2f} ms  "
        f"p99 {statistics.median(x[1] for x in slow) * 1e3:6.2f} ms  (driver steps {slow[-1][2]})"
    )
    print(
        f"  pods() 0 s   : p50 {statistics.median(x[0] for x in fast) * 1e3:6.2f} ms  "
        f"p99 {statistics.median(x[1] for x in fast) * 1e3:6.2f} ms  (driver steps {fast[-1][2]})"
    )
    print(f"  ratio p50 slow/instant: {statistics.median(ratios):.2f} (goal <= 1.2)")
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        idle = idle_cpu(Path(a), args.idle_s, with_run=False)
        waiting = idle_cpu(Path(b), args.idle_s, with_run=True)
    print(f"server CPU over {args.idle_s:.0f} s (percent of one core; goal < 2%):")
    print(f"  no run          : {idle:5.2f}%")
    print(f"  one running run : {waiting:5.2f}%")


if __name__ == "__main__":
    main()
