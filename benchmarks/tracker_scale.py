"""The tracker as runs pile up: listing every page, submitting under concurrency, idling with a queue.

1. ListRuns, every page of 50, through a real gRPC server, at 1,000 / 5,000 / 20,000 recorded runs, beside one
   GetIdentity round trip per page (the floor of a call). Goal: linear in the runs, under 1 s at 5,000.
2. SubmitRun latency (p50, p99) and submissions per second with 1 and 10 concurrent clients (each a process of its
   own), the driver on, under three loads:
   queued: the runs wait behind a holder run (the driver plans, records and queues each, no pod computes);
   computing: their pods compute on the same 2 cores as the server and the clients (reuse off, so each does);
   reused: a first run has computed the workflow, so every submission reuses its results and ends at once, while
   the runs of that key pile up (an agent sending the same experiment again and again).
   The clients first submit a few runs together (the warm-up: what a first burst starts once, a model's second
   describer, is not timed); beside GetIdentity from the same clients at once (the floor of any call at that
   concurrency on this machine, then).
   Goal: p99 under 100 ms at 10 clients. On this machine the store's file system bounds it: /tmp is ext4 without
   a journal, where every new file or folder skips the inodes freed in the last minutes (`recently_deleted`,
   `find_get_block_common`, `ext4_get_group_desc`, `find_inode_bit` under `ext4_create` and `ext4_mkdir`: 28% of
   the server's CPU in `perf record` during the timed submissions). So beside each figure is the median time to
   create a small file in a new folder of the stores' file system just before (about 15 us on a tmpfs, from 20 us
   to 1 ms on this ext4, as the inodes freed there in the last minutes vary; each store is kept until the end, so
   no part is timed in the wake of another's removal). `--dir` on a tmpfs shows the same runs without that.
3. SubmitRun from one client, the driver off, of a model of a few files and of the same model with 5,000 more
   (data files, committed): the median latency of each and their ratio. Goal: flat (a submission reads what it
   needs of a snapshot once, not its whole listing again).
4. The tracker's CPU (driver, local executor) over an idle period with 0 and with 1,000 queued runs, their pods
   waiting for the one node, which an owner's pod holds. Goal: both under 2% of one core.
5. Finding the result to reuse for a task's key as the ended runs of that key pile up (10, 1,000, 10,000, 100,000
   rows in the task key index, the newest run's outputs whole), beside the same with one earlier run: the median
   of a find and the ratio. Goal: flat (a find reads the newest rows, not the key's whole history).

    uv run --frozen python benchmarks/tracker_scale.py [--sizes 1000,5000,20000] [--idle-s 20] [--only PART] [--dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import resource
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_submit import MODEL, TOKEN, config, model_repo, model_repo_at, percentile
from file_systems import file_system
from simrun.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, tracker_pb2, tracker_pb2_grpc
from simrun_client.client import Client
from simrun_client.snapshots import upload_snapshot
from simrun_core.config import ServerConfig
from simrun_core.identity import Identity as CoreIdentity
from simrun_core.identity import IdentityKind, Priority
from simrun_core.key_index import KeyIndex
from simrun_core.resources import ResolvedResources, SplitMode
from simrun_core.rpc.auth import bearer_metadata
from simrun_core.rpc.serving import settle_heap
from simrun_core.snapshots.convert import snapshot_to_proto
from simrun_gateway.embedded import start_embedded
from simrun_planner import Node, plan_task
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Identity, RunRecord, RunState, TaskRecord, TaskState
from simrun_tracker.describer import SubprocessDescriber
from simrun_tracker.executor import PodRole, PodSpec
from simrun_tracker.local import LocalExecutor
from simrun_tracker.ports import ServerEnvironments
from simrun_tracker.tracker import RunTracker
from tracker_seams import NoLearner

WARM_SUBMISSIONS = 3
"""Submissions each client makes together with the others before the timed ones."""
WARM_SETTLE_S = 1.0
"""Seconds left after the warming submissions for what they started in the background (a second describer)."""


def seed(store: StoreLayout, count: int, state: RunState, priority: Priority = Priority.OWNER) -> None:
    """`count` run records written straight into the store (the server's start indexes them)."""
    plan = plan_task(
        SimpleNamespace(id="fit"),
        SimpleNamespace(name="e2etasks.tasks:Slow", split=False),
        ResolvedResources(base_memory_gb=0.5, per_worker_gb=0.5),
        [Node("node-a", cores=2, memory_gb=8)],
        SplitMode.SINGLE_SERVER,
        priority,
        None,
        run_id="r",
    )
    identity = Identity(name="bench", kind="owner", priority=priority.value)
    for index in range(count):
        task = TaskRecord(task_id="fit", type="e2etasks.tasks:Slow", plan=dataclasses.asdict(plan))
        record = RunRecord(
            run_id=f"seed-{index:06d}", identity=identity, tasks={"fit": task}, environment="default", state=state
        )
        record.save(store.run(record.run_id))


def list_all(root: Path, count: int) -> tuple[float, float, int]:
    cfg = config(root, cores=2)
    seed(StoreLayout(cfg.store), count, RunState.SUCCEEDED)
    server = start_embedded(cfg, drive_runs=False)
    try:
        with Client(server.address, TOKEN) as client:
            stub = tracker_pb2_grpc.RunTrackerServiceStub(client.channel)
            gateway = gateway_pb2_grpc.GatewayServiceStub(client.channel)
            metadata = bearer_metadata(TOKEN)
            start = time.perf_counter()
            token, pages, seen = "", 0, 0
            while True:
                response = stub.ListRuns(tracker_pb2.ListRunsRequest(page_token=token), metadata=metadata)
                seen += len(response.runs)
                pages += 1
                token = response.next_page_token
                if not token:
                    break
            listing = time.perf_counter() - start
            assert seen == count, (seen, count)
            start = time.perf_counter()
            for _ in range(pages):
                gateway.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=metadata)
            floor = time.perf_counter() - start
        return listing, floor, pages
    finally:
        server.stop()


def load_config(root: Path) -> ServerConfig:
    """The benchmark's server: every submission counts against the identity's bound of active runs until it
    ends, so the bound is lifted for the load."""
    cfg = config(root, cores=2)
    return cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"active_runs_per_identity": 100_000})})


def submit_concurrently(
    root: Path, clients: int, per_client: int, load: str
) -> tuple[float, float, float, float, float]:
    """SubmitRun latencies (p50, p99) and submissions per second, the driver on; then the p50 and p99 of GetIdentity
    from the same clients at once (the floor of a call at that concurrency on this machine, now). Under "queued",
    a holder run first takes the node's cores with units that sleep, so the driver plans, records and queues every
    submitted run's pod (the tracker's whole work) while no pod computes on the cores the server and its clients
    share ("queued"); "computing" turns reuse off, so every run's pod computes; "reused" first runs the workflow
    once, so every submission reuses it (see the module's docstring)."""
    server = start_embedded(load_config(root))
    settle_heap()  # as `simrun server` does once started (`serve`)
    try:
        model = model_repo(root / "model")
        with Client(server.address, TOKEN) as client:
            snapshot = snapshot_to_proto(upload_snapshot(model, client.channel).snapshot)
        if load == "queued":
            holder = "tasks:\n  hold:\n    type: e2etasks.tasks:Slow\n    settings: {units: 2, seconds: 600}\n"
            with Client(server.address, TOKEN) as client:
                stub = tracker_pb2_grpc.RunTrackerServiceStub(client.channel)
                held = stub.SubmitRun(
                    tracker_pb2.SubmitRunRequest(workflow=holder, snapshots=[snapshot]), metadata=bearer_metadata(TOKEN)
                )
                deadline = time.monotonic() + 60
                while client.get_run(held.run.run_id).state != common_pb2.RUN_STATE_RUNNING:
                    assert time.monotonic() < deadline, "the holder run did not start"
                    time.sleep(0.1)
        workflow = "tasks:\n  scan:\n    type: e2etasks.tasks:Slow\n    settings: {units: 2, seconds: 0.01}\n"
        reuse = common_pb2.REUSE_POLICY_NEVER if load == "computing" else common_pb2.REUSE_POLICY_UNSPECIFIED
        request = tracker_pb2.SubmitRunRequest(workflow=workflow, snapshots=[snapshot], reuse=reuse)
        if load == "reused":
            with Client(server.address, TOKEN) as client:
                stub = tracker_pb2_grpc.RunTrackerServiceStub(client.channel)
                first = stub.SubmitRun(request, metadata=bearer_metadata(TOKEN)).run.run_id
                ended = client.wait(first, timeout_s=60)
                assert ended.state == common_pb2.RUN_STATE_SUCCEEDED, f"the run to reuse did not succeed: {ended}"
        # Each client is a process of its own, as agents are: client threads in the server's process would share
        # its interpreter lock and count the clients' work as the server's.
        context = multiprocessing.get_context("spawn")
        warm_go, go, floor_go, results = context.Event(), context.Event(), context.Event(), context.Queue()
        processes = [
            context.Process(
                target=submitter,
                args=(server.address, request.SerializeToString(), per_client, (warm_go, go, floor_go), results),
            )
            for _ in range(clients)
        ]
        for process in processes:
            process.start()
        assert all(results.get(timeout=120) == "connected" for _ in processes)
        # The clients warm the server together, as they will load it: the model's second describer, which a
        # server starts once for concurrent submissions, is started and warm before the timed submissions.
        warm_go.set()
        ready = [results.get(timeout=120) for _ in processes]
        assert all(r == "ready" for r in ready), ready
        time.sleep(WARM_SETTLE_S)
        began = time.perf_counter()
        go.set()
        latencies = [latency for _ in processes for latency in results.get(timeout=600)]
        elapsed = time.perf_counter() - began
        floor_go.set()
        floor = [latency for _ in processes for latency in results.get(timeout=600)]
        for process in processes:
            process.join(timeout=30)
        return (
            statistics.median(latencies),
            percentile(latencies, 0.99),
            len(latencies) / elapsed,
            statistics.median(floor),
            percentile(floor, 0.99),
        )
    finally:
        server.stop()


def submit_by_model_size(root: Path, extra_files: int, submissions: int) -> float:
    """The median SubmitRun latency (one client, driver off) of the benchmark model with `extra_files` more."""
    server = start_embedded(load_config(root), drive_runs=False)
    try:
        model = root / "model"
        shutil.copytree(MODEL, model, ignore=shutil.ignore_patterns("__pycache__"))
        for number in range(extra_files):
            folder = model / "data" / f"{number // 100:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"sample-{number}.csv").write_text(f"sample,{number}\n")
        model_repo_at(model)
        with Client(server.address, TOKEN) as client:
            snapshot = snapshot_to_proto(upload_snapshot(model, client.channel).snapshot)
            stub = tracker_pb2_grpc.RunTrackerServiceStub(client.channel)
            workflow = "tasks:\n  scan:\n    type: e2etasks.tasks:Slow\n    settings: {units: 2, seconds: 0.01}\n"
            request = tracker_pb2.SubmitRunRequest(workflow=workflow, snapshots=[snapshot])
            stub.SubmitRun(request, metadata=bearer_metadata(TOKEN))  # the cold one: the describer starts
            latencies = []
            for _ in range(submissions):
                start = time.perf_counter()
                stub.SubmitRun(request, metadata=bearer_metadata(TOKEN))
                latencies.append(time.perf_counter() - start)
        return statistics.median(latencies)
    finally:
        server.stop()


def submitter(address: str, request: bytes, count: int, events: tuple[Any, Any, Any], results: Any) -> None:
    """A client process: `WARM_SUBMISSIONS` warming submissions once the first event is set, then `count` timed
    ones once the second is, then `count` timed GetIdentity calls once the third is; puts the seconds of each."""
    warm_go, go, floor_go = events
    submission = tracker_pb2.SubmitRunRequest.FromString(request)
    with Client(address, TOKEN) as client:
        stub = tracker_pb2_grpc.RunTrackerServiceStub(client.channel)
        results.put("connected")
        warm_go.wait()
        for _ in range(WARM_SUBMISSIONS):
            stub.SubmitRun(submission, metadata=bearer_metadata(TOKEN))
        results.put("ready")
        go.wait()
        latencies = []
        for _ in range(count):
            start = time.perf_counter()
            stub.SubmitRun(submission, metadata=bearer_metadata(TOKEN))
            latencies.append(time.perf_counter() - start)
        results.put(latencies)
        gateway = gateway_pb2_grpc.GatewayServiceStub(client.channel)
        floor_go.wait()
        latencies = []
        for _ in range(count):
            start = time.perf_counter()
            gateway.GetIdentity(gateway_pb2.GetIdentityRequest(), metadata=bearer_metadata(TOKEN))
            latencies.append(time.perf_counter() - start)
    results.put(latencies)


def idle_with_queue(root: Path, queued: int, seconds: float, settle_s: float = 10.0) -> float:
    """The tracker's CPU (driver, local executor, read side) with `queued` runs whose pods wait for the one node,
    which an owner's pod holds; they are of lower priority, so they wait and nothing changes."""
    store = StoreLayout(root / "store")
    seed(store, queued, RunState.QUEUED, priority=Priority.AGENT)
    node = Node("node-a", cores=2, memory_gb=8)

    def launch(spec: PodSpec) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(600)" if spec.run_id == "blocker" else "pass"]

    executor = LocalExecutor(store.root, launch, [node])  # memory cgroups where the machine has them, as a server
    blocker = PodSpec(
        run_id="blocker",
        task_id="hold",
        worker="w0",
        role=PodRole.EXECUTE,
        environment_id="default",
        contract={},
        cores=2,
        memory_gb=1,
        processes=1,
        retry_memory_gb=1.5,
        priority_class="simrun-owner-base",
    )
    executor.start_pods([blocker])
    environments = ServerEnvironments()
    tracker = RunTracker(store, executor, NoLearner(), SubprocessDescriber(), environments, environments).start()
    try:
        deadline = time.monotonic() + 120
        while sum(len(executor.pods(f"seed-{i:06d}")) for i in range(queued)) < queued:
            assert time.monotonic() < deadline, "the driver did not queue every run's pod"
            time.sleep(0.5)
        time.sleep(settle_s)
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.monotonic()
        time.sleep(seconds)
        after = resource.getrusage(resource.RUSAGE_SELF)
        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return 100.0 * used / (time.monotonic() - start)
    finally:
        tracker.close()


def new_folder(work: Path) -> Path:
    """A new empty folder under `work` for one store, left in place (`main` removes them all at the end)."""
    return Path(tempfile.mkdtemp(dir=work))


def file_creation(work: Path, files: int = 200) -> float:
    """The median seconds to create, write and close a small file in a new folder under `work`, as a store's new
    files are: on ext4 without a journal, the inodes freed there in the last minutes make it slower (the files are
    kept, so the probe frees none itself)."""
    folder = Path(tempfile.mkdtemp(dir=work, prefix="probe-"))
    seconds = []
    for number in range(files):
        start = time.perf_counter()
        with open(folder / f"file-{number}", "wb") as f:
            f.write(b"{}\n")
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def find_with_history(root: Path, earlier: int, finds: int = 300) -> float:
    """The median seconds of a task key index find (in its SQLite file, as the tracker keeps it) for a key that
    `earlier` ended runs had, the newest of which has its outputs whole on disk; records come from memory, as the
    tracker's run store gives them."""
    store = StoreLayout(root / "store")
    store.runs.mkdir(parents=True)
    index = KeyIndex(store, root / "task-keys.sqlite")
    owner = Identity(name="bench", kind="owner", priority=Priority.OWNER.value)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    records = {}
    for number in range(earlier):
        run_id = f"run-{number:07d}"
        task = TaskRecord(task_id="scan", type="m:Scan", split=True, units=10, state=TaskState.SUCCEEDED, key="k")
        task.ended_at = start + timedelta(seconds=number)
        records[run_id] = RunRecord(run_id=run_id, identity=owner, state=RunState.SUCCEEDED, tasks={"scan": task})
    index.rebuild(records.values())
    newest = store.run(f"run-{earlier - 1:07d}").task("scan")
    (newest.out_port("samples")).mkdir(parents=True)
    (newest.out_port("samples") / "a.bin").write_bytes(b"\x00")
    newest.summary.write_text("{}")
    newest.merge_marker.write_text("")
    caller = CoreIdentity("bench", IdentityKind.OWNER, Priority.OWNER)
    times = []
    for _ in range(finds):
        began = time.perf_counter()
        found = index.find("k", caller, load=records.get)
        times.append(time.perf_counter() - began)
        assert found is not None and found.run_id == f"run-{earlier - 1:07d}", found
    index.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--per-client", type=int, default=40)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each submission figure (median)")
    parser.add_argument("--only", choices=["list", "submit", "model", "idle", "reuse"], help="one part only")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the stores go (default: the system's temporary folder); e.g. a tmpfs, to see what the file "
        "system costs (on this machine /tmp is ext4 without a journal: see the module's docstring)",
    )
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        tempfile.tempdir = str(args.dir)
    print(f"stores under {tempfile.gettempdir()} ({file_system(Path(tempfile.gettempdir()))})")
    # Every store is kept until the end: removing one frees its inodes, and on ext4 without a journal every file
    # created in the next minutes pays for them (see the module's docstring), so a part would be timed in the
    # wake of the one before.
    work = Path(tempfile.mkdtemp(prefix="tracker-scale-"))
    try:
        run_parts(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_parts(args: argparse.Namespace, work: Path) -> None:
    """The parts `args` asks for, each store a new folder under `work`."""
    if args.only in (None, "list"):
        print("ListRuns, every page of 50:")
        for size in (int(s) for s in args.sizes.split(",")):
            listing, floor, pages = list_all(new_folder(work), size)
            print(
                f"  {size:6d} runs: {listing:6.2f} s for {pages} pages ({listing / pages * 1e3:5.2f} ms a page); "
                f"GetIdentity x{pages}: {floor:5.2f} s; ratio {listing / floor:5.1f}"
            )
    if args.only in (None, "submit"):
        print("SubmitRun with the driver on:")
        for load, what in (
            ("queued", "the runs queued behind a holder"),
            ("computing", "the runs' pods computing on the same 2 cores (reuse off)"),
            ("reused", "every run reusing an earlier run's results"),
        ):
            print(f"  {what}:")
            for clients in (1, 10):
                figures = []
                creating = file_creation(work)
                for _ in range(args.repeats):
                    figures.append(submit_concurrently(new_folder(work), clients, args.per_client, load))
                p50, p99, rate, floor50, floor99 = (statistics.median(f[i] for f in figures) for i in range(5))
                print(
                    f"    {clients:2d} clients: p50 {p50 * 1e3:6.1f} ms  p99 {p99 * 1e3:6.1f} ms"
                    f"  {rate:6.1f} submissions/s;"
                    f" GetIdentity from as many clients: p50 {floor50 * 1e3:5.1f} ms  p99 {floor99 * 1e3:5.1f} ms;"
                    f" p99 ratio {p99 / floor99:5.1f}; a new file in the store {creating * 1e6:5.0f} us"
                    f" (medians of {args.repeats})"
                )
    if args.only in (None, "model"):
        print("SubmitRun by the model's size (one client, the driver off):")
        small, large = [], []
        for _ in range(args.repeats):  # alternated, so both sizes see the same machine
            for extra, figures in ((0, small), (5000, large)):
                figures.append(submit_by_model_size(new_folder(work), extra, 60))
        alone, more = statistics.median(small), statistics.median(large)
        print(
            f"  the model alone: median {alone * 1e3:6.1f} ms; with 5,000 more files: {more * 1e3:6.1f} ms;"
            f" ratio {more / alone:4.2f} (medians of {args.repeats}; goal: about 1)"
        )
    if args.only in (None, "idle"):
        print(f"server CPU over {args.idle_s:.0f} s idle (percent of one core; goal < 2%):")
        for queued in (0, 1000):
            print(f"  {queued:5d} queued runs: {idle_with_queue(new_folder(work), queued, args.idle_s):5.2f}%")
    if args.only in (None, "reuse"):
        print("finding the result to reuse for a key, as its ended runs pile up (median of a find):")
        alone = find_with_history(new_folder(work) / "alone", 1)
        for earlier in (10, 1000, 10_000, 100_000):
            seconds = find_with_history(new_folder(work), earlier)
            print(
                f"  {earlier:7d} earlier runs: {seconds * 1e6:7.1f} us; with one: {alone * 1e6:7.1f} us;"
                f" ratio {seconds / alone:5.2f} (goal: flat)"
            )


if __name__ == "__main__":
    main()
